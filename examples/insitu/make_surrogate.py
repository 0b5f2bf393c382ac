"""Scripts the surrogate the in-situ examples train: a small CNN that maps a
temperature field u(t) to u(t + dt) of a 2D heat solver.

    python3 examples/insitu/make_surrogate.py work_dirs/insitu/surrogate.pt

It predicts the change, u + net(u), so that "nothing moves" is where it
starts; two 3x3 convolutions see the 5-point stencil the solver applies.
forward(input) returns the prediction; lockstep computes the loss (mse).
"""
import os
import sys

import torch
from torch import nn


class HeatSurrogate(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.Tanh(), nn.Conv2d(8, 1, 3, padding=1))
        # Starts at "nothing changes": the last layer outputs zero until trained.
        nn.init.zeros_(self.net[2].weight)
        nn.init.zeros_(self.net[2].bias)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input + self.net(input)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "work_dirs/insitu/surrogate.pt"
    torch.manual_seed(0)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    torch.jit.script(HeatSurrogate()).save(out)
    print("wrote", out)


if __name__ == "__main__":
    main()
