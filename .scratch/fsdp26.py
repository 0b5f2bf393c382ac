import os, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
def run(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", USE_LIBUV="0")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    f = FSDP(m, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True, device_id=torch.device("cpu"))
    opt = torch.optim.AdamW(f.parameters(), lr=1e-3)
    for i in range(3):
        loss = f(torch.randn(4, 64)).sum(); loss.backward(); opt.step(); opt.zero_grad()
    print(rank, "ok", float(loss), [p.numel() for p in f.parameters()])
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2)
