"""PyTorch's side of tests/differential/dcp_pytorch_test.cpp: torch.distributed.checkpoint
(DCP) files written by dcp.save for lockstep to read, and lockstep's DCP files
read by dcp.load, in one process or in WORLD processes (torch.multiprocessing,
Gloo on the CPU, a file:// rendezvous), where the model is sharded with
FSDP2's fully_shard: every parameter's rows split unevenly across the ranks
(at 3 ranks, one holds none of head.weight's 2 rows), the buffers kept whole.

  python3 dcp_reference.py save WORLD OUT        # OUT/full.pt (torch.save of the whole state dict), OUT/dcp
  python3 dcp_reference.py load WORLD DIR FULL   # dcp.load of DIR into the model, compared bitwise with FULL

Needs torch.distributed.checkpoint and torch.distributed.fsdp.fully_shard
(PyTorch 2.6 and later); exits 3 without them.
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

try:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
except ImportError as missing:
    print(f"dcp_reference: this PyTorch ({torch.__version__}) has no DCP with FSDP2: {missing}")
    sys.exit(3)


class Net(torch.nn.Module):
    """Rows that 3 ranks do not divide: 11, 7, 13 and 2."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 5)
        self.conv = torch.nn.Conv2d(3, 7, 3)
        self.fc = torch.nn.Linear(5, 13)
        self.norm = torch.nn.LayerNorm(13)
        self.head = torch.nn.Linear(13, 2, bias=False)
        self.register_buffer("counts", torch.arange(5, dtype=torch.int64) * 1000003)
        self.register_buffer("scale", torch.randn(3).to(torch.bfloat16))
        self.register_buffer("bias64", torch.randn(2, 2, dtype=torch.float64))


def model(seed, world):
    torch.manual_seed(seed)
    net = Net()
    if world > 1:
        mesh = init_device_mesh("cpu", (world,))
        fully_shard(net.fc, mesh=mesh)
        fully_shard(net, mesh=mesh)
    return net


def save(rank, world, out):
    if rank == 0:
        torch.save(model(0, 1).state_dict(), os.path.join(out, "full.pt"))
    dcp.save(model(0, world).state_dict(), checkpoint_id=os.path.join(out, "dcp"))


def load(rank, world, directory, full_path):
    net = model(1, world)  # other values, which dcp.load must replace
    dcp.load(net.state_dict(), checkpoint_id=directory)
    got = {name: value.full_tensor() if isinstance(value, DTensor) else value for name, value in net.state_dict().items()}
    if rank != 0:
        return
    want = torch.load(full_path, weights_only=True)
    failures = [] if sorted(got) == sorted(want) else [f"names {sorted(got)} != {sorted(want)}"]
    for name in sorted(set(got) & set(want)):
        if got[name].dtype != want[name].dtype or not torch.equal(got[name], want[name]):
            failures.append(f"{name}: {got[name].dtype} {list(got[name].shape)} differs from {want[name].dtype} "
                            f"{list(want[name].shape)}")
    print(f"dcp_reference: dcp.load at {world} ranks of {directory}: "
          + ("bitwise equal" if not failures else "; ".join(failures)), flush=True)
    if failures:
        raise SystemExit(1)


def run(rank, world, rendezvous, action, args):
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank, world_size=world)
    try:
        action(rank, world, *args)
    finally:
        if world > 1:
            dist.barrier()
            dist.destroy_process_group()


def main():
    action = {"save": save, "load": load}[sys.argv[1]]
    world = int(sys.argv[2])
    if world == 1:
        run(0, 1, None, action, sys.argv[3:])
        return
    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(run, args=(world, os.path.join(scratch, "rendezvous"), action, sys.argv[3:]), nprocs=world)


if __name__ == "__main__":
    main()
