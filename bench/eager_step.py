#!/usr/bin/python3
"""PyTorch eager's side of scripts/gpu-check.sh's bench-eager step.

Trains the demo's ConvNet (examples/fashion_mnist/cnn.yaml: channels [32, 64]
with BatchNorm, hidden 128; built by tests/differential/pytorch_reference.py,
layer for layer lockstep's) the way a plain PyTorch loop does: batches of 64
uint8 28x28 images from memory, copied to the device each step, normalised,
forward, cross-entropy, backward, SGD (lr 0.05, momentum 0.9, nesterov,
weight decay 5e-4; PyTorch's defaults otherwise, so foreach on CUDA), and the
loss read every `--log-every` steps as a logger would. Prints the median
seconds per step over windows of `--log-every` steps, after `--warmup`.

  python3 bench/eager_step.py --device cuda --iters 600
"""
import argparse
import importlib.util
import os
import statistics
import time

import torch
import torch.nn.functional as F


def reference_module():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "differential",
                        "pytorch_reference.py")
    spec = importlib.util.spec_from_file_location("pytorch_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    device = torch.device(args.device)
    reference = reference_module()
    torch.manual_seed(0)
    model = reference.build_model({"type": "ConvNet", "channels": [32, 64], "hidden": 128,
                                   "batch_norm": True}).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.0005)
    images = torch.randint(0, 256, (4096, 1, 28, 28), dtype=torch.uint8)
    labels = torch.randint(0, 10, (4096,))
    if device.type == "cuda":
        images, labels = images.pin_memory(), labels.pin_memory()
    mean = torch.tensor([reference.MEAN], device=device).view(1, 1, 1, 1)
    std = torch.tensor([reference.STD], device=device).view(1, 1, 1, 1)
    windows, start = [], None
    for step in range(args.iters):
        if step == args.warmup:
            start = time.perf_counter()
        first = (step * args.batch) % (images.shape[0] - args.batch)
        x = images[first:first + args.batch].to(device, non_blocking=True)
        y = labels[first:first + args.batch].to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model((x.float() - mean) / std), y)
        loss.backward()
        optimizer.step()
        if start is not None and (step - args.warmup + 1) % args.log_every == 0:
            loss.item()  # a logger's read, which also waits for the window's work
            now = time.perf_counter()
            windows.append((now - start) / args.log_every)
            start = now
    print("eager: %d steps of batch %d on %s, PyTorch %s" % (args.iters, args.batch, device, torch.__version__))
    print("RESULT eager seconds per step (median of %d windows of %d) = %.6f"
          % (len(windows), args.log_every, statistics.median(windows)))


if __name__ == "__main__":
    main()
