"""PyTorch's own DistributedDataParallel on the same models, for bench/ddp.

Run under torchrun (torch.distributed.run); prints one line
  RESULT <model> <median seconds per step>
from rank 0. Same shapes, batch, optimizer, threads and data as the C++ side.
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_group import init_process_group  # noqa: E402


def make_model(name):
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Linear(128, 10))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                             nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
    raise SystemExit("unknown model " + name)


def timed_steps(model, iters, warmup, batch, device=torch.device("cpu")):
    """Median seconds per step of `model` (DDP-wrapped) under SGD momentum on
    this rank's 8 fixed batches, after `warmup` untimed steps. Every rank
    waits for the slowest in each step's all-reduce, so rank 0's median,
    taken after a barrier, is the job's."""
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(dist.get_rank())
    images = torch.randn(8, batch, 1, 28, 28, generator=gen).to(device)
    labels = torch.randint(0, 10, (8, batch), generator=gen).to(device)
    times = []
    for i in range(iters + warmup):
        start = time.perf_counter()
        sgd.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images[i % 8]), labels[i % 8])
        loss.backward()
        sgd.step()
        loss.item()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    dist.barrier()
    return statistics.median(times)


def main():
    name, iters, warmup, batch, view = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
    torch.set_num_threads(1)
    # BENCH_DEVICE=cuda: one GPU per rank over NCCL, as the C++ side.
    cuda = os.environ.get("BENCH_DEVICE", "cpu") != "cpu"
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(make_model(name).to(device), gradient_as_bucket_view=view,
                                                device_ids=[device.index] if cuda else None)
    median = timed_steps(model, iters, warmup, batch, device)
    if dist.get_rank() == 0:
        print("RESULT", name, median, flush=True)
    # Not destroy_process_group(): PyTorch 1.13 can deadlock tearing a DDP's
    # Gloo group down (its destructor joins a thread that waits for the GIL
    # the destructor holds). The results are printed; leave.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()
