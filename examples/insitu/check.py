"""Loads the surrogate the in-situ example trained, exported to TorchScript,
and checks it on a temperature field it never saw: its one-step prediction
must beat "nothing changes" by far.

    lockstep ckpt export work_dirs/insitu/model_final.ckpt --format torchscript -o work_dirs/insitu/trained.pt
    python3 examples/insitu/check.py work_dirs/insitu/trained.pt
"""
import sys

import torch

ALPHA_DT = 0.2  # alpha * dt / dx^2 of heat.F90 and heat.c


def step(u):
    """One explicit step of the solvers, zero temperature on the boundary."""
    padded = torch.nn.functional.pad(u, (1, 1, 1, 1))
    laplacian = (padded[..., :-2, 1:-1] + padded[..., 2:, 1:-1] + padded[..., 1:-1, :-2] + padded[..., 1:-1, 2:]
                 - 4 * u)
    return u + ALPHA_DT * laplacian


def main():
    model = torch.jit.load(sys.argv[1])
    model.eval()
    y, x = torch.meshgrid(torch.linspace(0, 1, 34), torch.linspace(0, 1, 64), indexing="ij")
    u = (torch.sin(3.1 * x) * torch.sin(2.3 * y) + torch.exp(-60 * ((x - 0.3) ** 2 + (y - 0.6) ** 2)))
    u = u.reshape(1, 1, 34, 64).float()
    truth = step(u)
    with torch.no_grad():
        predicted = model(u)
    error = ((predicted - truth) ** 2).mean() / ((u - truth) ** 2).mean()
    print(f"relative one-step error of the exported surrogate: {error.item():.4f}")
    sys.exit(0 if error.item() < 0.1 else 1)


if __name__ == "__main__":
    main()
