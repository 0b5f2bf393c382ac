"""PyTorch's own FullyShardedDataParallel on bench/fsdp's GPT, for comparison with lockstep's FSDP.

    python3 -m torch.distributed.run --standalone --nproc-per-node N bench/fsdp_peer.py STEPS TOKENS [fully_shard]
    lockstep run --standalone --nproc-per-node N -- python3 bench/fsdp_peer.py STEPS TOKENS [fully_shard]

With `fully_shard`: FSDP2 instead, PyTorch's fully_shard on every Block and
then on the root (reshard_after_forward true, its default prefetching), and
the line says PYTORCH_FULLY_SHARD.

The model is examples/gpt/gpt_model.h's GPT with bench/fsdp's options (vocab
96, block_size 64, 14 blocks 768 wide, 12 heads, no dropout, the output layer
tied to the token embedding), with the same parameter names and GPT-2
initialisation. Like bench/fsdp's FULL_SHARD worker: Gloo on CPU, one torch
thread, FSDP FULL_SHARD with one unit per Block (the rest in the root unit),
backward_prefetch BACKWARD_PRE, Adam (lr 1e-4), one sequence of TOKENS tokens
per rank (more than 64 come as several sequences of 64), two fixed batches
drawn per rank and used in turn, one warm-up step and then STEPS timed steps,
each after a barrier. Prints one line per rank, in rank order, in bench/fsdp's
format:

    RESULT PYTORCH_FSDP rank params grads optimizer total hwm step unit1 unit2 numel activation

params, grads and total are -1 (PyTorch's FSDP keeps no such account); optimizer is
the bytes of this rank's Adam state at the end (constant after the first
step, so also its peak); hwm is the process's VmHWM in bytes; step the median
seconds of the timed steps; unit1 and unit2 the float32 bytes of the two
largest blocks' parameters; numel the model's parameter count; activation 0.

BENCH_SMALL=1 shrinks the model to 2 blocks 64 wide (4 heads), for a smoke test.

Any torchrun-style launcher will do: the script reads RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT and TORCHELASTIC_USE_AGENT_STORE; its store is made
without libuv, which Debian's torch 2.x lacks (peer_group.py).
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_reference import BLOCK_SIZE, GPT, VOCAB, Block  # noqa: E402
from peer_group import init_process_group  # noqa: E402

WARMUP = 1


def build_model():
    """bench/fsdp's GPT (14 x 768, 12 heads), or 2 x 64 with BENCH_SMALL=1."""
    if os.environ.get("BENCH_SMALL", "0") == "1":
        return GPT(n_layer=2, n_head=4, d=64)
    return GPT(n_layer=14, n_head=12, d=768)


def largest_two_blocks_bytes(model):
    """The float32 bytes of the two largest blocks' parameters."""
    sizes = sorted((sum(p.numel() for p in block.parameters()) * 4 for block in model.blocks), reverse=True)
    return (sizes + [0, 0])[:2]


def batches(tokens):
    """Two fixed batches of this rank's random token ids, [2][sequences, length + 1]."""
    length = min(tokens, BLOCK_SIZE)
    sequences = max(1, tokens // length)
    generator = torch.Generator().manual_seed(dist.get_rank() + 1)
    return torch.randint(0, VOCAB, (2, sequences, length + 1), generator=generator)


def timed_steps(model, adam, data, steps):
    """Seconds of each step after the warm-up (forward, backward, Adam, zero_grad), each after a barrier."""
    times = []
    for i in range(steps + WARMUP):
        sequence = data[i % 2]
        dist.barrier()
        start = time.perf_counter()
        loss = model(sequence[:, :-1], sequence[:, 1:])
        loss.backward()
        adam.step()
        adam.zero_grad(set_to_none=True)
        loss.item()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return times


def optimizer_bytes(adam):
    """The bytes of the optimizer's state tensors on this rank (Adam's moments of the local shards, its step counts)."""
    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t  # fully_shard's state is DTensors
    return sum(local(t).numel() * local(t).element_size() for state in adam.state.values() for t in state.values()
               if torch.is_tensor(t))


def vm_hwm_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return -1


def main():
    steps, tokens = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    init_process_group("gloo")
    torch.manual_seed(0)
    model = build_model()
    numel = sum(p.numel() for p in model.parameters())
    unit1, unit2 = largest_two_blocks_bytes(model)
    per_parameter = len(sys.argv) > 3 and sys.argv[3] == "fully_shard"
    if per_parameter:
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    else:
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), sharding_strategy=ShardingStrategy.FULL_SHARD,
                     backward_prefetch=BackwardPrefetch.BACKWARD_PRE, device_id=torch.device("cpu"),
                     sync_module_states=False, use_orig_params=False, limit_all_gathers=True)
    adam = torch.optim.Adam(model.parameters(), lr=1e-4)
    step = statistics.median(timed_steps(model, adam, batches(tokens), steps))
    rank = dist.get_rank()
    for r in range(dist.get_world_size()):
        if r == rank:
            name = "PYTORCH_FULLY_SHARD" if per_parameter else "PYTORCH_FSDP"
            print(f"RESULT {name} {rank} -1 -1 {optimizer_bytes(adam)} -1 {vm_hwm_bytes()} {step:.6f} "
                  f"{unit1} {unit2} {numel} 0", flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
