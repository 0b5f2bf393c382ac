"""PyTorch's DistributedDataParallel across namespace hosts, for bench/multihost.

Run under torchrun (torch.distributed.run) on every host; prints a line
  RESULT <mode> <model> <median seconds per step>
per mode from rank 0. The models are bench/ddp_peer.py's (the same as the
C++ side's bench/ddp_models.h); batch, optimizer, threads and data are those
of bench/ddp_peer.py and of bench_multihost's workers.

  python3 -m torch.distributed.run --nnodes 2 --node_rank R --nproc_per_node 2 --master_addr 10.213.0.1 \
      --master_port 29600 --redirects 1 --tee 1 bench/multihost_peer.py MODES MODEL ITERS WARMUP BATCH

MODES is a comma-separated list (default,fp16,powersgd): one after the other
in the same processes, each on a fresh model, optimizer and DDP, each printing
its RESULT line when done.
  default   no communication hook (flat all-reduce of fp32 buckets)
  fp16      default_hooks.fp16_compress_hook
  powersgd  powerSGD_hook, PowerSGDState(matrix_approximation_rank=4, start_powerSGD_iter=2), the rest default,
            its buckets reduced one after the other (see in_bucket_order)
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no bench/__pycache__ from importing ddp_peer
from ddp_peer import make_model, timed_steps  # noqa: E402  (the same models and loop as bench/ddp)


def in_bucket_order(hook):
    """The hook, started for each bucket only once the previous bucket's reduction is over.

    Gloo pairs the collectives of the ranks by the order in which they are
    issued. powerSGD_hook issues its second and third all-reduces (of P and Q)
    from completion callbacks, so with several buckets each rank interleaves
    them with the next bucket's first all-reduce in its own order, and Gloo
    fails ("op.preamble.length <= op.nbytes") or sums unrelated tensors. Here
    bucket i's hook starts from the completion of bucket i-1's, so every rank
    issues the same sequence; the backward pass goes on meanwhile.
    """
    previous = [None]

    def ordered(state, bucket):
        before = previous[0]
        if before is None or before.done():
            result = hook(state, bucket)
        else:
            result = torch.futures.Future()

            def start(_):
                try:
                    hook(state, bucket).add_done_callback(settle)
                except Exception as error:  # noqa: BLE001 -- surfaces in DDP's wait
                    result.set_exception(error)

            def settle(inner):
                try:
                    result.set_result(inner.wait())
                except Exception as error:  # noqa: BLE001
                    result.set_exception(error)

            before.add_done_callback(start)
        previous[0] = result
        return result

    return ordered


def train(mode, name, iters, warmup, batch):
    """Median step time of one mode, on a fresh model, optimizer and DDP."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(make_model(name), gradient_as_bucket_view=True)
    if mode == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif mode == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=2)
        model.register_comm_hook(state, in_bucket_order(powerSGD_hook.powerSGD_hook))
    elif mode != "default":
        raise SystemExit("unknown mode " + mode)
    return timed_steps(model, iters, warmup, batch)


def main():
    modes, name = sys.argv[1].split(","), sys.argv[2]
    iters, warmup, batch = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    for mode in modes:
        seconds = train(mode, name, iters, warmup, batch)
        if dist.get_rank() == 0:
            print("RESULT", mode, name, seconds, flush=True)
    # Not destroy_process_group(): PyTorch 1.13 can deadlock tearing a DDP's
    # Gloo group down (its destructor joins a thread that waits for the GIL
    # the destructor holds). The results are printed; leave.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()
