#!/usr/bin/python3
"""PyTorch eager's side of scripts/gpu-check.sh's bench-eager step.

--model convnet: the demo's ConvNet (examples/fashion_mnist/cnn.yaml: channels
[32, 64] with BatchNorm, hidden 128; built by
tests/differential/pytorch_reference.py, layer for layer lockstep's), trained
the way a plain PyTorch loop does: batches of 64 uint8 28x28 images from
memory, copied to the device each step, normalised, forward, cross-entropy,
backward, SGD (lr 0.05, momentum 0.9, nesterov, weight decay 5e-4; PyTorch's
defaults otherwise, so foreach on CUDA).

--model gpt: examples/gpt's GPT as examples/gpt/gpt_fsdp.yaml builds it (4
blocks 96 wide, 4 heads, 64 characters of context; bench/gpt_reference.py,
layer for layer gpt_model.h's) with bf16 autocast: batches of 32
sequences of random characters from memory, AdamW (lr 0.003, betas 0.9/0.99,
weight decay 0.01), gradients clipped to norm 1.

Either reads the loss every `--log-every` steps as a logger would, and prints
the median seconds per step over windows of `--log-every` steps, after
`--warmup`.

  python3 bench/eager_step.py --device cuda --iters 600 [--model gpt]
"""
import argparse
import importlib.util
import os
import statistics
import time

import torch
import torch.nn.functional as F


def sibling_module(name, relative_path):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), relative_path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def convnet_step(device, batch):
    """The ConvNet, its optimizer, and a step(i) that trains on batch i of images in memory."""
    reference = sibling_module("pytorch_reference", os.path.join("..", "tests", "differential", "pytorch_reference.py"))
    model = reference.build_model({"type": "ConvNet", "channels": [32, 64], "hidden": 128,
                                   "batch_norm": True}).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.0005)
    images = torch.randint(0, 256, (4096, 1, 28, 28), dtype=torch.uint8)
    labels = torch.randint(0, 10, (4096,))
    if device.type == "cuda":
        images, labels = images.pin_memory(), labels.pin_memory()
    mean = torch.tensor([reference.MEAN], device=device).view(1, 1, 1, 1)
    std = torch.tensor([reference.STD], device=device).view(1, 1, 1, 1)

    def step(i):
        first = (i * batch) % (images.shape[0] - batch)
        x = images[first:first + batch].to(device, non_blocking=True)
        y = labels[first:first + batch].to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model((x.float() - mean) / std), y)
        loss.backward()
        optimizer.step()
        return loss
    return step


def gpt_step(device, batch):
    """examples/gpt's GPT in bf16 autocast, AdamW with clipping, and a step(i) on batch i of characters."""
    reference = sibling_module("gpt_reference", "gpt_reference.py")
    model = reference.GPT(n_layer=4, n_head=4, d=96).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.003, betas=(0.9, 0.99), weight_decay=0.01)
    text = torch.randint(0, reference.VOCAB, (128, batch, reference.BLOCK_SIZE + 1))
    if device.type == "cuda":
        text = text.pin_memory()

    def step(i):
        sequences = text[i % text.shape[0]].to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(sequences[:, :-1], sequences[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss
    return step


def time_windows(step, iters, warmup, log_every):
    """Runs step(i) for i < iters; after `warmup` steps, the seconds per step of
    each window of `log_every` steps, ended by a logger's read of the loss
    step(i) returned (which also waits for the window's work)."""
    windows, start = [], None
    for i in range(iters):
        if i == warmup:
            start = time.perf_counter()
        loss = step(i)
        if start is not None and (i - warmup + 1) % log_every == 0:
            loss.item()
            now = time.perf_counter()
            windows.append((now - start) / log_every)
            start = now
    return windows


def parse_arguments(with_device):
    """The options eager_step.py and graph_step.py share."""
    parser = argparse.ArgumentParser()
    if with_device:
        parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", choices=["convnet", "gpt"], default="convnet")
    parser.add_argument("--iters", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=None, help="64 images, or 32 sequences")
    args = parser.parse_args()
    args.batch = args.batch or (64 if args.model == "convnet" else 32)
    return args


def report(kind, args, device, windows):
    """The lines gpu-check reads: what ran, then the median window."""
    print("%s: %s, %d steps of batch %d on %s, PyTorch %s" % (kind, args.model, args.iters, args.batch, device,
                                                              torch.__version__))
    print("RESULT %s seconds per step (median of %d windows of %d) = %.6f"
          % (kind, len(windows), args.log_every, statistics.median(windows)))


def main():
    args = parse_arguments(with_device=True)
    device = torch.device(args.device)
    torch.manual_seed(0)
    step = (convnet_step if args.model == "convnet" else gpt_step)(device, args.batch)
    report("eager", args, device, time_windows(step, args.iters, args.warmup, args.log_every))


if __name__ == "__main__":
    main()
