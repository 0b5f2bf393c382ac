#!/usr/bin/python3
"""PyTorch's side of scripts/gpu-check.sh's cuda-graph step: bench/eager_step.py's
two loops (the demo's ConvNet with nesterov SGD; examples/gpt's GPT in bf16
autocast with AdamW and clipping) with the whole step captured in one CUDA
graph, as PyTorch's documentation captures a whole network:

  - static input tensors on the GPU, into which each step copies its batch;
  - three eager warm-up steps on a side stream, then the gradients set to None;
  - torch.cuda.graph around forward, loss, backward, clipping and the
    optimizer step (AdamW with capturable=True, so its step count lives on
    the GPU; SGD reads nothing from the host but its learning rate, which
    stays constant here);
  - each later step: copy the batch in, replay.

It reads the loss every `--log-every` steps as a logger would, and prints the
median seconds per step over windows of `--log-every` steps after `--warmup`,
in the format of eager_step.py.

  python3 bench/graph_step.py --iters 600 [--model gpt]
"""
import torch
import torch.nn.functional as F

from eager_step import parse_arguments, report, sibling_module, time_windows


def convnet(device, batch):
    reference = sibling_module("pytorch_reference", "../tests/differential/pytorch_reference.py")
    model = reference.build_model({"type": "ConvNet", "channels": [32, 64], "hidden": 128,
                                   "batch_norm": True}).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.0005)
    images = torch.randint(0, 256, (4096, 1, 28, 28), dtype=torch.uint8).pin_memory()
    labels = torch.randint(0, 10, (4096,)).pin_memory()
    mean = torch.tensor([reference.MEAN], device=device).view(1, 1, 1, 1)
    std = torch.tensor([reference.STD], device=device).view(1, 1, 1, 1)
    static_x = torch.empty((batch, 1, 28, 28), dtype=torch.uint8, device=device)
    static_y = torch.empty((batch,), dtype=torch.long, device=device)

    def load(i):
        first = (i * batch) % (images.shape[0] - batch)
        static_x.copy_(images[first:first + batch], non_blocking=True)
        static_y.copy_(labels[first:first + batch], non_blocking=True)

    def body():
        loss = F.cross_entropy(model((static_x.float() - mean) / std), static_y)
        loss.backward()
        optimizer.step()
        return loss
    return optimizer, load, body


def gpt(device, batch):
    reference = sibling_module("gpt_reference", "gpt_reference.py")
    model = reference.GPT(n_layer=4, n_head=4, d=96).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.003, betas=(0.9, 0.99), weight_decay=0.01,
                                  capturable=True)
    text = torch.randint(0, reference.VOCAB, (128, batch, reference.BLOCK_SIZE + 1)).pin_memory()
    static = torch.empty((batch, reference.BLOCK_SIZE + 1), dtype=torch.long, device=device)

    def load(i):
        static.copy_(text[i % text.shape[0]], non_blocking=True)

    def body():
        # A capture needs autocast's cache of cast weights off (PyTorch's CUDA graph notes).
        with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False):
            loss = model(static[:, :-1], static[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss
    return optimizer, load, body


def main():
    args = parse_arguments(with_device=False)
    device = torch.device("cuda")
    torch.manual_seed(0)
    optimizer, load, body = (convnet if args.model == "convnet" else gpt)(device, args.batch)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            load(i)
            optimizer.zero_grad(set_to_none=True)
            body()
    torch.cuda.current_stream().wait_stream(side)
    optimizer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    load(3)
    with torch.cuda.graph(graph):
        static_loss = body()

    def step(i):
        load(i)
        graph.replay()
        return static_loss
    report("graph", args, device, time_windows(step, args.iters, args.warmup, args.log_every))


if __name__ == "__main__":
    main()
