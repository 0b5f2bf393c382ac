#!/usr/bin/python3
"""bench/data's baseline: torchvision's ImageFolder + torch's DataLoader.

    bench/data_torchvision.py ROOT --workers W --batches B --warmup K [--batch-size 64]

Decode (PIL), RandomResizedCrop(224), RandomHorizontalFlip(), PILToTensor
(uint8, no normalisation: lockstep's loader gives uint8 too), batches of 64,
shuffled, W worker processes (persistent, default prefetch), one torch thread.
Times B batches after K warm-up batches (the warm-up covers starting the
workers) and prints

    RESULT torchvision W IMAGES_PER_SECOND
"""
import argparse
import time

import torch
import torchvision
from torchvision import transforms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--batches", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    transform = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.PILToTensor(),
    ])
    dataset = torchvision.datasets.ImageFolder(args.root, transform=transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                         num_workers=args.workers, persistent_workers=args.workers > 0)

    def batches():
        while True:  # epochs one after another, like lockstep's endless stream
            yield from loader

    stream = batches()
    for _ in range(args.warmup):
        next(stream)
    images = 0
    start = time.perf_counter()
    for _ in range(args.batches):
        batch, _ = next(stream)
        assert batch.dtype == torch.uint8 and batch.shape[1:] == (3, 224, 224), batch.shape
        images += batch.shape[0]
    seconds = time.perf_counter() - start
    print(f"RESULT torchvision {args.workers} {images / seconds:.3f}", flush=True)


if __name__ == "__main__":
    main()
