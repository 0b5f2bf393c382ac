"""Scripts a small CNN with Python's PyTorch for lockstep to train.

    python3 examples/torchscript/export.py work_dirs/torchscript/cnn_scripted.pt
    lockstep train examples/torchscript/cnn_ddp.yaml --nproc 2
    lockstep ckpt export work_dirs/torchscript/model_final.ckpt --format torchscript -o work_dirs/torchscript/trained.pt
    python3 examples/torchscript/check.py work_dirs/torchscript/trained.pt

The same layers as lockstep's ConvNet of examples/fashion_mnist (two conv +
BatchNorm + ReLU + max-pool blocks, two fully connected layers), defined in
Python: forward(image) returns the logits; lockstep computes the loss.
"""
import os
import sys

import torch
from torch import nn


class FashionCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(image))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "work_dirs/torchscript/cnn_scripted.pt"
    torch.manual_seed(0)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    torch.jit.script(FashionCNN()).save(out)
    print("wrote", out)


if __name__ == "__main__":
    main()
