"""Loads the module lockstep trained (ckpt export --format torchscript) with
Python's torch.jit.load and prints its Fashion-MNIST test accuracy.

    python3 examples/torchscript/check.py work_dirs/torchscript/trained.pt
"""
import gzip
import sys

import numpy as np
import torch

ROOT = "/usr/share/datasets/fashion-mnist"


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def main():
    module = torch.jit.load(sys.argv[1])
    module.eval()
    images = torch.from_numpy(idx(f"{ROOT}/t10k-images-idx3-ubyte.gz").copy()).float().unsqueeze(1)
    labels = torch.from_numpy(idx(f"{ROOT}/t10k-labels-idx1-ubyte.gz").copy()).long()
    images = (images - 72.94) / 90.02  # the config's ImgDataPreprocessor
    correct = 0
    with torch.no_grad():
        # Batches of 100: batches of 1000 take 5 times as long on the CPU,
        # their activations allocated afresh from the kernel each time.
        for start in range(0, len(labels), 100):
            logits = module(images[start:start + 100])
            correct += (logits.argmax(1) == labels[start:start + 100]).sum().item()
    print(f"test accuracy (Python, torch.jit.load): {correct / len(labels):.4f}")


if __name__ == "__main__":
    main()
