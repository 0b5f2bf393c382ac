"""How bench's Python peers (ddp_peer.py, fsdp_peer.py) join their process group.

    from peer_group import init_process_group
    init_process_group("gloo")   # under torchrun or lockstep run: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT

Debian's torch 2.6 and 2.14 are built without libuv, and their env://
rendezvous asks for a libuv TCPStore (2.6 whatever USE_LIBUV says:
rendezvous.py reads the variable, _create_c10d_store drops it; 2.14 fails
unless USE_LIBUV=0). From torch 2 on the peer makes the store itself, without
libuv, over the launcher's agent store where it has one
(TORCHELASTIC_USE_AGENT_STORE=True), as env:// does; torch 1.13's env:// has
no libuv and runs unchanged. The store's backend is not on the timed path.
"""
import os

import torch
import torch.distributed as dist


def init_process_group(backend):
    if int(torch.__version__.split(".")[0]) < 2:
        dist.init_process_group(backend)
        return
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=rank == 0 and not agent_store, use_libuv=False)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
