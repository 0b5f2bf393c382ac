#!/usr/bin/python3
"""PyTorch's side of lockstep's differential suite (tests/differential).

PyTorch (Debian's python3-torch) trains a model from given initial weights on
the batches lockstep's loader would give each rank, with torch's own
DistributedDataParallel over Gloo, one process per rank, and writes the final
weights. The C++ test trains the same case through `lockstep train` and
compares the two files tensor by tensor. Nothing here comes from lockstep:
the model, the data order, the optimizer, the schedulers, clipping, autocast
and DDP are PyTorch's.

  pytorch_reference.py init CASE.json OUT.safetensors     initial weights (torch.manual_seed(CASE.seed))
  pytorch_reference.py train CASE.json INIT OUT           trains CASE from INIT, writes OUT
  pytorch_reference.py batch JOBS.json                     [{"case": CASE, "init": INIT, "out": OUT}, ...]:
                                                           init then train each, in one interpreter
  pytorch_reference.py compare A B                         prints {"name": relative difference, ...}
  pytorch_reference.py dcp_load CASE.json WORLD DIR OUT    dcp.load of DIR (model and optimizer) at WORLD ranks;
                                                           OUT: the whole state, torch.save'd, OUT.json: param_groups

A case this PyTorch cannot run gets OUT.unsupported, a line saying why,
instead of OUT (the test skips it with that reason): Debian's PyTorch 2.14
reduces no float16 or bfloat16 over Gloo ("Invalid scalar type"), so
fp16_compress and bf16_compress have no reference there.

CASE is JSON:
  {"model": {"type": "ConvNet", "channels": [8, 16], "hidden": 32, "batch_norm": false}
            | {"type": "ScriptedConvNet", ... as ConvNet, "extras": true (optional: a depthwise
               conv, a DeformConv2d and a 1-D scale after the features)}
            | {"type": "DCGAN", "latent_dim": 16, "generator_channels": 8, "discriminator_channels": 8}
              (examples/gan: two networks, one optimizer each, separate DDP),
   "world": 2, "batch": 16, "iters": 20, "accumulate": 1, "seed": 0,
   "optimizer": {"type": "SGD"|"Adam"|"AdamW"|"Adagrad", "lr": ..., ...},  (Adam, AdamW: "capturable"; SGD, Adam, AdamW: "foreach")
   "clip": {"max_norm": 1.0, "norm_type": 2.0} | null  (mmengine's clip_grad: one norm over every gradient;
           "type": "norm_per_parameter": detectron2's CLIP_TYPE "norm", each parameter against its own),
   "schedulers": [{"type": "LinearLR", "start_factor": 0.1, "total_iters": 5},
                  {"type": "CosineAnnealingLR", "T_max": 20, "eta_min": 0.001}],
   "amp": null | "bf16" | "fp16" (autocast; fp16 with a GradScaler),
   "paramwise": {"norm_decay_mult": 0, "bias_decay_mult": 0, "bias_lr_mult": 2} (optional; any key of
                 mmengine's paramwise_cfg, applied as its DefaultOptimWrapperConstructor applies it),
   "comm_hook": null | "fp16_compress" | {"type": "PowerSGD", "matrix_approximation_rank": 4, ...},
   "gradient_as_bucket_view": false | true (optional, DDP's argument),
   "data_root": "/usr/share/datasets/fashion-mnist",
   "device": "cpu" | "cuda" (optional; cuda: GPU 0 for every rank, deterministic algorithms on, NCCL),
   "loss_scale": {"init_scale": ..., "growth_interval": ...} (optional; fp16's GradScaler),
   "frozen": ["features.0"] (optional: those parameters, or those modules' parameters, requires_grad_(False)
              before wrapping; lockstep's model.frozen_parameters),
   "frozen_dtype": "bf16" (optional: the frozen parameters stored in it; lockstep's model.frozen_dtype),
   "fully_shard": {"modules": ["Conv2d", "Linear"], "reshard_after_forward": true, "mesh": [2, 2] (optional, HSDP),
                   "mp_policy": {"param_dtype": "bf16", "reduce_dtype": "fp32", "output_dtype": "fp32"}} (optional: PyTorch's
                   FSDP2 instead of DDP, on the modules of those classes and then the root; 2.14 only),
   "start_iter": 5 (optional: the run begins at that iteration, its batches as iteration 5 takes them),
   "dcp_load": DIR, "dcp_save": DIR (optional: dcp.load of the model and optimizer before training,
               dcp.save of them after it, as {"model": get_model_state_dict, "optim": get_optimizer_state_dict})}

The data order is lockstep's DefaultSampler with shuffle false: rank r's
samples are r, r + world, r + 2 world, ...; iteration i takes the next `batch`
of them. One iteration is one micro-step: with accumulation, the optimizer
steps every `accumulate` iterations and at the last one (mmengine's
semantics, a last window it does not divide included) and the earlier
micro-steps run under no_sync. Clipping sees the gradients in the
optimizer's group order, as mmengine's OptimWrapper hands them over.
Schedulers step once per iteration, after it.
"""
import contextlib
import functools
import gzip
import json
import os
import struct
import sys
import tempfile

import numpy as np

MEAN = 72.94   # the ImgDataPreprocessor mean/std of lockstep's Fashion-MNIST configs
STD = 90.02
DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8}


def fail(message):
    sys.stderr.write("pytorch_reference: " + message + "\n")
    sys.exit(1)


# --- files ------------------------------------------------------------------

def read_arrays(path):
    """{name: numpy array} of a safetensors file (numpy only: compare needs no torch)."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    header.pop("__metadata__", None)
    body = data[8 + length:]
    arrays = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        if entry["dtype"] == "BF16":  # numpy has no bfloat16: its bits are a float32's upper half, exactly
            bits = np.frombuffer(body[begin:end], dtype=np.uint16).astype(np.uint32) << 16
            arrays[name] = bits.view(np.float32).reshape(entry["shape"])
            continue
        if entry["dtype"] not in DTYPES:
            fail("%s: %s has dtype %s, which this reader does not take" % (path, name, entry["dtype"]))
        arrays[name] = np.frombuffer(body[begin:end], dtype=DTYPES[entry["dtype"]]).reshape(entry["shape"])
    return arrays


def read_safetensors(path):
    import torch
    return {name: torch.from_numpy(array.copy()) for name, array in read_arrays(path).items()}


def write_safetensors(path, tensors):
    import torch
    names = sorted(tensors)
    codes = {np.dtype(v): k for k, v in DTYPES.items()}
    header, blobs, offset = {}, [], 0
    for name in names:
        tensor = tensors[name].detach().cpu().contiguous()
        if tensor.dtype == torch.bfloat16:  # as its bits (read_arrays widens them)
            array, code = tensor.view(torch.int16).numpy(), "BF16"
        else:
            array = tensor.numpy()
            code = codes[array.dtype]
        blob = array.tobytes()
        header[name] = {"dtype": code, "shape": list(tensor.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


# --- models -----------------------------------------------------------------

def scripted_path(init):
    """Where the ScriptedConvNet of a case lives: beside its initial weights."""
    return init.replace(".safetensors", ".scripted.pt")


_EXTRAS = {}


def extras_classes():
    """The extras' module classes, made once: mmengine tells a deformable
    convolution by isinstance (against_mmengine.py hands this class to it as
    mmcv's)."""
    if _EXTRAS:
        return _EXTRAS
    import torch
    import torch.nn as nn

    class DeformConv2d(nn.Module):
        """mmcv's class name, so that paramwise_cfg's dcn rules see it: a
        weight of its own and its offsets' conv, conv_offset (not a real
        deformable convolution: only its parameters' names matter here)."""
        def __init__(self, channels):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(channels, channels, 1, 1) * 0.1)
            self.conv_offset = nn.Conv2d(channels, channels, 3, padding=1)

        def forward(self, x):
            return torch.nn.functional.conv2d(x, self.weight) + self.conv_offset(x)

    class Scale(nn.Module):
        """A 1-D parameter that is neither a bias nor a norm's (flat_decay_mult)."""
        def __init__(self, channels):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(channels))

        def forward(self, x):
            return x * self.scale.view(1, -1, 1, 1)

    _EXTRAS.update(DeformConv2d=DeformConv2d, Scale=Scale)
    return _EXTRAS


def build_model(spec, script=True):
    """The case's model; a ScriptedConvNet scripted unless `script` is false
    (the same module in Python, as an mmengine user would train it)."""
    import torch.nn as nn
    if spec["type"] == "ScriptedConvNet":
        # The same layers as a Python class that torch.jit.script accepts;
        # both sides train the file init_weights writes (TorchScriptModel in lockstep).
        import torch
        extras = extras_classes()

        class ConvNetModule(nn.Module):
            def __init__(self):
                super().__init__()
                convnet = build_model(dict(spec, type="ConvNet"))
                self.features, self.head = convnet.features, convnet.head
                # "extras": a depthwise conv, a deformable conv and a scale after
                # the features, for every key of paramwise_cfg.
                channels = spec["channels"][-1]
                self.extras = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, groups=channels),
                                            extras["DeformConv2d"](channels), extras["Scale"](channels)) \
                    if spec.get("extras") else nn.Identity()

            def forward(self, x):
                return self.head(self.extras(self.features(x)))

        return torch.jit.script(ConvNetModule()) if script else ConvNetModule()
    if spec["type"] == "ConvNet":
        # lockstep's ConvNet (lockstep/builtin_models/classifiers.cpp), pooling after each conv.
        layers, channels, size = [], 1, 28
        for out in spec["channels"]:
            layers.append(nn.Conv2d(channels, out, 3, padding=1, bias=not spec["batch_norm"]))
            if spec["batch_norm"]:
                layers.append(nn.BatchNorm2d(out))
            layers += [nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            channels, size = out, size // 2
        model = nn.Module()
        model.features = nn.Sequential(*layers)
        model.head = nn.Sequential(nn.Flatten(), nn.Linear(channels * size * size, spec["hidden"]),
                                   nn.ReLU(inplace=True), nn.Linear(spec["hidden"], 10))
        model.forward = lambda x: model.head(model.features(x))
        return model
    if spec["type"] == "DCGAN":
        # examples/gan/dcgan.h: two networks in one model.
        g, d, latent = spec["generator_channels"], spec["discriminator_channels"], spec["latent_dim"]
        model = nn.Module()
        model.generator = nn.Sequential(
            nn.Linear(latent, 2 * g * 7 * 7, bias=False), nn.Unflatten(1, (2 * g, 7, 7)), nn.BatchNorm2d(2 * g),
            nn.ReLU(), nn.ConvTranspose2d(2 * g, g, 4, stride=2, padding=1, bias=False), nn.BatchNorm2d(g),
            nn.ReLU(), nn.ConvTranspose2d(g, 1, 4, stride=2, padding=1), nn.Tanh())
        model.discriminator = nn.Sequential(
            nn.Conv2d(1, d, 4, stride=2, padding=1), nn.LeakyReLU(0.2),
            nn.Conv2d(d, 2 * d, 4, stride=2, padding=1, bias=False), nn.BatchNorm2d(2 * d), nn.LeakyReLU(0.2),
            nn.Flatten(), nn.Linear(2 * d * 7 * 7, 1))
        return model
    fail("unknown model type " + spec["type"])


def init_weights(case, out):
    import torch
    torch.manual_seed(case.get("seed", 0))
    model = build_model(case["model"])
    write_safetensors(out, model.state_dict())
    if case["model"]["type"] == "ScriptedConvNet":
        model.save(scripted_path(out))


# --- training ---------------------------------------------------------------

def rank_batches(case, rank):
    """Yields (images, labels) per iteration: lockstep's DefaultSampler(shuffle=false) order."""
    import torch
    root = case.get("data_root", "/usr/share/datasets/fashion-mnist")
    images = read_idx(os.path.join(root, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(root, "train-labels-idx1-ubyte.gz"))
    world, batch = case["world"], case["batch"]
    mine = np.arange(rank, len(images), world)
    for i in range(case.get("start_iter", 0), case["iters"]):
        index = mine[i * batch:(i + 1) * batch]
        assert len(index) == batch, "the case runs past one epoch"
        x = torch.from_numpy(images[index].copy()).unsqueeze(1)
        y = torch.from_numpy(labels[index].astype(np.int64))
        yield x, y


MASK64 = 2 ** 64 - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def batch_seed(seed, epoch, batch_in_epoch):
    """The seed lockstep's loader hands a dataset for one batch (lockstep/data/data_loader.h)."""
    return splitmix64(splitmix64(splitmix64(seed) ^ (epoch & MASK64)) ^ (batch_in_epoch & MASK64))


def latent_noise(case, rank, iteration):
    """examples/gan's WithLatentNoise: N(0, 1) from the batch's seed (epoch 0 here)."""
    import torch
    loader_seed = batch_seed(case["seed"], rank, -1)
    generator = torch.Generator()
    generator.manual_seed(batch_seed(loader_seed, 0, iteration) ^ 0x9E3779B97F4A7C15)
    return torch.randn(case["batch"], case["model"]["latent_dim"], generator=generator)


def preprocess(x, mean=MEAN, std=STD):
    import torch
    mean = torch.tensor([mean], dtype=torch.float32, device=x.device).view(1, 1, 1, 1)
    std = torch.tensor([std], dtype=torch.float32, device=x.device).view(1, 1, 1, 1)
    return (x.to(torch.float32) - mean) / std


def case_device(case):
    """The case's device; on cuda, PyTorch's deterministic algorithms (cuBLAS needs its workspace fixed first).

    A CPU case hides CUDA from this worker (a forked process of its own) on a GPU
    host: PowerSGD's decompress calls torch.cuda.synchronize whenever CUDA is
    available, on CPU tensors too, and fails there."""
    import torch
    device = torch.device(case.get("device", "cpu"))
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.cuda.set_device(0)
    else:
        torch.cuda.is_available = lambda: False
    return device


def backend_for(device):
    """NCCL on the GPU, as lockstep's GPU cases; Gloo on the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def dtype_of(name):
    """torch's dtype for a case's "bf16", "fp16" or "fp32" (amp, frozen_dtype, mp_policy)."""
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def grad_scaler(case):
    """PyTorch's GradScaler for an fp16 case with lockstep's loss_scale keys; None otherwise."""
    import torch
    if case.get("amp") != "fp16":
        return None
    args = dict(case.get("loss_scale") or {})
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", **args)
    return torch.cuda.amp.GradScaler(**args)


def clip_grad_norm(params, clip):
    """torch.nn.utils.clip_grad_norm_ as the case says; `foreach` only where
    this PyTorch takes it (1.13's clip has one path, which on the CPU is the
    foreach one's arithmetic)."""
    import inspect
    import torch
    kwargs = {}
    if "foreach" in clip and "foreach" in inspect.signature(torch.nn.utils.clip_grad_norm_).parameters:
        kwargs["foreach"] = clip["foreach"]
    torch.nn.utils.clip_grad_norm_(params, clip["max_norm"], clip.get("norm_type", 2.0), **kwargs)


def build_optimizer(spec, params):
    import torch
    kind = spec["type"]
    if kind == "SGD":
        return torch.optim.SGD(params, lr=spec["lr"], momentum=spec.get("momentum", 0.0),
                               weight_decay=spec.get("weight_decay", 0.0), nesterov=spec.get("nesterov", False),
                               foreach=spec.get("foreach"))
    # foreach as the case says; unsaid, PyTorch's own default (None), as
    # lockstep's (Note [foreach as Python chooses it]).
    if kind == "Adam":
        return torch.optim.Adam(params, lr=spec["lr"], betas=tuple(spec.get("betas", (0.9, 0.999))),
                                eps=spec.get("eps", 1e-8), weight_decay=spec.get("weight_decay", 0.0),
                                foreach=spec.get("foreach"), capturable=spec.get("capturable", False))
    if kind == "AdamW":
        return torch.optim.AdamW(params, lr=spec["lr"], betas=tuple(spec.get("betas", (0.9, 0.999))),
                                 eps=spec.get("eps", 1e-8), weight_decay=spec.get("weight_decay", 0.01),
                                 foreach=spec.get("foreach"), capturable=spec.get("capturable", False))
    if kind == "Adagrad":
        return torch.optim.Adagrad(params, lr=spec["lr"], lr_decay=spec.get("lr_decay", 0.0),
                                   weight_decay=spec.get("weight_decay", 0.0),
                                   initial_accumulator_value=spec.get("initial_accumulator_value", 0.0),
                                   eps=spec.get("eps", 1e-10), foreach=False)
    fail("unknown optimizer " + kind)


def param_groups(model, case):
    """The parameters as mmengine's DefaultOptimWrapperConstructor hands them to
    the optimizer: model.parameters() without a paramwise_cfg; with one, a group
    per parameter from its add_params (mmengine/optim/optimizer/
    default_constructor.py, ported line for line; a deformable convolution is a
    module whose class is named DeformConv2d or ModulatedDeformConv2d, as mmcv's)."""
    paramwise = case.get("paramwise")
    if not paramwise:
        return model.parameters()
    import torch
    import torch.nn as nn
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.instancenorm import _InstanceNorm
    base_lr = case["optimizer"]["lr"]
    base_wd = case["optimizer"].get("weight_decay")
    custom_keys = paramwise.get("custom_keys", {})
    sorted_keys = sorted(sorted(custom_keys.keys()), key=len, reverse=True)
    bias_lr_mult = paramwise.get("bias_lr_mult")
    bias_decay_mult = paramwise.get("bias_decay_mult")
    norm_decay_mult = paramwise.get("norm_decay_mult")
    dwconv_decay_mult = paramwise.get("dwconv_decay_mult")
    flat_decay_mult = paramwise.get("flat_decay_mult")
    bypass_duplicate = paramwise.get("bypass_duplicate", False)
    dcn_offset_lr_mult = paramwise.get("dcn_offset_lr_mult")

    def original_name(module):
        # A scripted module's class keeps the Python class's name at its end.
        name = module.original_name if isinstance(module, torch.jit.ScriptModule) else type(module).__name__
        return name

    def is_norm(module):
        if isinstance(module, torch.jit.ScriptModule):
            return original_name(module) in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm",
                                             "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "GroupNorm",
                                             "LayerNorm")
        return isinstance(module, (_BatchNorm, _InstanceNorm, nn.GroupNorm, nn.LayerNorm))

    def is_conv2d(module):
        return isinstance(module, nn.Conv2d) or original_name(module) == "Conv2d"

    def add_params(params, module, prefix="", is_dcn_module=None):
        norm = is_norm(module)
        is_dwconv = is_conv2d(module) and module.in_channels == module.groups
        for name, param in module.named_parameters(recurse=False):
            param_group = {"params": [param]}
            if bypass_duplicate and any(p is param for g in params for p in g["params"]):
                continue
            if not param.requires_grad:
                continue
            is_custom = False
            for key in sorted_keys:
                if key in f"{prefix}.{name}":
                    is_custom = True
                    lr_mult = custom_keys[key].get("lr_mult", 1.)
                    param_group["lr"] = base_lr * lr_mult
                    if base_wd is not None:
                        decay_mult = custom_keys[key].get("decay_mult", 1.)
                        param_group["weight_decay"] = base_wd * decay_mult
                    for k, v in custom_keys[key].items():
                        param_group[k] = tuple(v) if isinstance(v, list) else v
                    break
            if not is_custom:
                if name == "bias" and not (norm or is_dcn_module) and bias_lr_mult is not None:
                    param_group["lr"] = base_lr * bias_lr_mult
                if (prefix.find("conv_offset") != -1 and is_dcn_module and dcn_offset_lr_mult is not None
                        and is_conv2d(module)):
                    param_group["lr"] = base_lr * dcn_offset_lr_mult
                if base_wd is not None:
                    if norm and norm_decay_mult is not None:
                        param_group["weight_decay"] = base_wd * norm_decay_mult
                    elif name == "bias" and not is_dcn_module and bias_decay_mult is not None:
                        param_group["weight_decay"] = base_wd * bias_decay_mult
                    elif is_dwconv and dwconv_decay_mult is not None:
                        param_group["weight_decay"] = base_wd * dwconv_decay_mult
                    elif param.ndim == 1 and not is_dcn_module and flat_decay_mult is not None:
                        param_group["weight_decay"] = base_wd * flat_decay_mult
            params.append(param_group)
        is_dcn = original_name(module) in ("DeformConv2d", "ModulatedDeformConv2d")
        for child_name, child_mod in module.named_children():
            child_prefix = f"{prefix}.{child_name}" if prefix else child_name
            add_params(params, child_mod, prefix=child_prefix, is_dcn_module=is_dcn)

    groups = []
    add_params(groups, model)
    return groups


def clip_order(optimizer):
    """The gradients mmengine's OptimWrapper._clip_grad clips, in its order:
    the optimizer's parameters group by group, those with a gradient."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return [p for p in params if p.requires_grad and p.grad is not None]


def build_schedulers(specs, optimizer):
    import torch.optim.lr_scheduler as sched
    result = []
    for spec in specs or []:
        args = {k: v for k, v in spec.items() if k != "type"}
        result.append(getattr(sched, spec["type"])(optimizer, **args))
    return result


def register_comm_hook(ddp, spec):
    """PyTorch's own hooks for lockstep's model_wrapper.comm_hook names."""
    if spec is None:
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    if isinstance(spec, str):
        spec = {"type": spec}
    kind = spec["type"]
    args = {k: v for k, v in spec.items() if k != "type"}
    simple = {"allreduce": default_hooks.allreduce_hook, "fp16_compress": default_hooks.fp16_compress_hook,
              "bf16_compress": default_hooks.bf16_compress_hook}
    if kind in simple:
        ddp.register_comm_hook(None, simple[kind])
    elif kind == "PowerSGD":
        ddp.register_comm_hook(powersgd.PowerSGDState(process_group=None, **args), powersgd.powerSGD_hook)
    elif kind == "BatchedPowerSGD":
        # torch 1.13's batched hook hands _orthogonalize a 2-D matrix, which
        # fails its assertion (it takes a batch): make it a batch of one.
        orthogonalize = powersgd._orthogonalize
        powersgd._orthogonalize = lambda m, epsilon=0: orthogonalize(m.unsqueeze(0) if m.dim() == 2 else m, epsilon)
        ddp.register_comm_hook(powersgd.PowerSGDState(process_group=None, **args), powersgd.batched_powerSGD_hook)
    else:
        fail("no PyTorch comm hook for " + kind)


def leave_worker():
    """Ends a worker without tearing its process group down.

    PyTorch 1.13 can deadlock there: ~ProcessGroupGloo joins its worker thread
    while holding the GIL, and that thread, freeing a tensor that has a Python
    object, waits for the GIL (seen as a hang of the whole batch). Everything
    the worker owes is on disk and every rank has passed the barrier."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train_rank(rank, case, init, out, init_method):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    device = case_device(case)
    dist.init_process_group(backend_for(device), init_method=init_method, rank=rank, world_size=case["world"])
    if case["model"]["type"] == "ScriptedConvNet":
        model = torch.jit.load(scripted_path(init))
    else:
        model = build_model(case["model"])
    model.load_state_dict(read_safetensors(init))
    freeze(model, case.get("frozen", []))
    if case.get("frozen_dtype"):  # lockstep's model.frozen_dtype
        for param in model.parameters():
            if not param.requires_grad and param.is_floating_point():
                param.data = param.data.to(dtype_of(case["frozen_dtype"]))
    model.to(device)
    memory_format = case["model"].get("memory_format")
    if memory_format:
        memory_format = getattr(torch, memory_format)
        model.to(memory_format=memory_format)
    sharded = case.get("fully_shard")
    if sharded is not None:
        ddp = apply_fully_shard(model, sharded)
    else:
        ddp = DDP(model, gradient_as_bucket_view=case.get("gradient_as_bucket_view", False))
        register_comm_hook(ddp, case.get("comm_hook"))
    optimizer = build_optimizer(case["optimizer"], param_groups(model, case))
    if case.get("dcp_load"):
        load_dcp(model, optimizer, case["dcp_load"])
    schedulers = build_schedulers(case.get("schedulers"), optimizer)
    accumulate = case.get("accumulate", 1)
    # mmengine's OptimWrapper: with accumulative_counts, the last window of a
    # run whose length it does not divide is shorter, and its losses are
    # divided by its own length (_remainder_counts).
    remainder = case["iters"] % accumulate
    amp = case.get("amp")
    scaler = grad_scaler(case)
    for i, (x, y) in enumerate(rank_batches(case, rank), start=case.get("start_iter", 0)):
        x, y = x.to(device), y.to(device)
        last_micro_step = (i + 1) % accumulate == 0 or i + 1 == case["iters"]
        loss_factor = accumulate if i < case["iters"] - remainder else remainder
        # fully_shard reduces every micro-step by default (lockstep's FSDP too).
        context = ddp.no_sync() if not last_micro_step and sharded is None else contextlib.nullcontext()
        with context:
            x = preprocess(x) if not memory_format else preprocess(x).to(memory_format=memory_format)
            if amp:
                with torch.autocast(device.type, dtype=dtype_of(amp)):
                    loss = F.cross_entropy(ddp(x), y)
            else:
                loss = F.cross_entropy(ddp(x), y)
            loss = loss / loss_factor if accumulate > 1 else loss
            (scaler.scale(loss) if scaler else loss).backward()
        if last_micro_step:
            clip = case.get("clip")
            if clip:
                if scaler:
                    scaler.unscale_(optimizer)
                if clip.get("type") == "norm_per_parameter":
                    # detectron2's per-parameter clipper (CLIP_TYPE "norm",
                    # solver/build.py): clip_grad_norm_(p) for every parameter
                    # of every group, inside optimizer.step, after unscaling.
                    for group in optimizer.param_groups:
                        for p in group["params"]:
                            torch.nn.utils.clip_grad_norm_(p, clip["max_norm"], clip.get("norm_type", 2.0))
                else:
                    clip_grad_norm(clip_order(optimizer), clip)
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        for scheduler in schedulers:
            scheduler.step()
    if case.get("dcp_save"):
        save_dcp(model, optimizer, case["dcp_save"])
    state = model.state_dict() if sharded is None else full_model_state_dict(model)
    if rank == 0:
        write_safetensors(out, state)
    dist.barrier()
    leave_worker()


def dcp_state(model, optimizer):
    """What torchtitan and PyTorch's DCP recipes save: the model's and the
    optimizer's state dicts, with their FQNs, under "model" and "optim"."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}


def save_dcp(model, optimizer, directory):
    import torch.distributed.checkpoint as dcp
    dcp.save(dcp_state(model, optimizer), checkpoint_id=directory)


def load_dcp(model, optimizer, directory):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    state = dcp_state(model, optimizer)
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])


def dcp_load_rank(rank, world, case, directory, out, init_method):
    """dcp.load of `directory` into the case's model and optimizer at `world`
    ranks (fully_shard when more than one), then rank 0 torch.saves the whole
    state, flattened as DCP names it, and the param_groups' options as JSON."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    torch.manual_seed(1)  # other values than the checkpoint's, which dcp.load must replace
    model = build_model(case["model"])
    if world > 1:
        apply_fully_shard(model, case["fully_shard"])
    optimizer = build_optimizer(case["optimizer"], param_groups(model, case))
    load_dcp(model, optimizer, directory)
    whole = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=whole)
    optim_state = get_optimizer_state_dict(model, optimizer, options=whole)
    if rank == 0:
        flat = {"model." + name: value for name, value in model_state.items()}
        for name, buffers in optim_state["state"].items():
            flat.update({"optim.state.%s.%s" % (name, key): value for key, value in buffers.items()})
        torch.save(flat, out)
        with open(out + ".json", "w") as f:
            json.dump([{key: value for key, value in group.items() if key != "params"} | {"params": group["params"]}
                       for group in optim_state["param_groups"]], f)
    dist.barrier()
    leave_worker()


def dcp_load(case, world, directory, out):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as scratch:
        init_method = "file://" + os.path.join(scratch, "rendezvous")
        mp.start_processes(dcp_load_rank, args=(world, case, directory, out, init_method), nprocs=world,
                           start_method="fork")


def freeze(model, names):
    """requires_grad_(False) on the parameters named, or inside modules named, in `names`
    (lockstep's model.frozen_parameters)."""
    for name, param in model.named_parameters():
        if any(name == frozen or name.startswith(frozen + ".") for frozen in names):
            param.requires_grad_(False)


def apply_fully_shard(model, spec):
    """PyTorch's FSDP2: fully_shard on every module whose class is named in
    spec["modules"], then on the root, with spec's reshard_after_forward and
    mp_policy ({"param_dtype": "bf16", "reduce_dtype": "fp32"})."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = {key: dtype_of(name) for key, name in (spec.get("mp_policy") or {}).items()}
    args = {"reshard_after_forward": spec.get("reshard_after_forward", True),
            "mp_policy": MixedPrecisionPolicy(**policy)}
    if spec.get("mesh"):  # HSDP: replicate across the first dimension, shard along the second
        from torch.distributed.device_mesh import init_device_mesh
        args["mesh"] = init_device_mesh("cpu", tuple(spec["mesh"]), mesh_dim_names=("replicate", "shard"))
    sharded = [fully_shard(module, **args) for module in list(model.modules())[1:]
               if type(module).__name__ in spec["modules"]]
    sharded.append(fully_shard(model, **args))
    if policy.get("param_dtype") in (torch.bfloat16, torch.float16) and not gloo_gathers_bf16():
        for module in sharded:
            module.set_custom_all_gather(byte_all_gather())
    return sharded[-1]


def byte_all_gather():
    """fully_shard's all-gather, moving 16-bit floats as their bytes.

    Debian 2.14's Gloo all-gathers no bf16 ("Invalid scalar type"). An all-gather
    only copies, so gathering the same memory as uint8 (what fully_shard itself
    does when a unit mixes dtypes) gives every rank the same bits; the
    reduce-scatter, where arithmetic happens, stays in reduce_dtype. lockstep's
    process groups carry bf16 over such a Gloo the same way."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather

    class ByteAllGather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            return dist.all_gather_single(output_tensor.view(torch.uint8), input_tensor.view(torch.uint8),
                                          group=group, async_op=async_op)
    return ByteAllGather()


def full_model_state_dict(model):
    """The whole weights of a fully_shard model, on every rank. A Gloo that
    gathers no 16-bit floats (Debian 2.14's) cannot gather a bf16 DTensor, so
    then each rank's rows are gathered as pickled objects and concatenated:
    the same bits, moved another way."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor
    state = model.state_dict()
    low = any(isinstance(v, DTensor) and v.dtype in (torch.bfloat16, torch.float16) for v in state.values())
    if not low or gloo_gathers_bf16():
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    full = {}
    for name, value in state.items():
        if isinstance(value, DTensor):
            assert value.device_mesh.ndim == 1, "%s: rows gathered over a 1-D mesh only" % name
            rows = [None] * dist.get_world_size()
            dist.all_gather_object(rows, value.to_local().detach().cpu())
            value = torch.cat(rows)
        full[name] = value.detach().cpu()
    return full


def train_gan_rank(rank, case, init, out, init_method):
    """examples/gan/dcgan.h's train_step under separate DDP: one DDP per network."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=case["world"])
    model = build_model(case["model"])
    model.load_state_dict(read_safetensors(init))
    G, D = model.generator, model.discriminator
    ddp_g, ddp_d = DDP(G), DDP(D)
    g_opt = build_optimizer(case["optimizer"], G.parameters())
    d_opt = build_optimizer(case["optimizer"], D.parameters())
    for i, (x, _) in enumerate(rank_batches(case, rank)):
        real = preprocess(x, 127.5, 127.5)
        noise = latent_noise(case, rank, i)
        # The discriminator: one DDP forward (rank 0's buffers broadcast once, as
        # lockstep does at optim_context), then the fake batch through the same module.
        with torch.no_grad():
            fake = G(noise)
        real_logits = ddp_d(real)
        fake_logits = D(fake)
        d_loss = (F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits)) +
                  F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits)))
        d_loss.backward()
        d_opt.step()
        d_opt.zero_grad(set_to_none=True)
        # The generator, through the frozen discriminator.
        D.requires_grad_(False)
        logits = D(ddp_g(noise))
        g_loss = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))
        g_loss.backward()
        g_opt.step()
        g_opt.zero_grad(set_to_none=True)
        D.requires_grad_(True)
    if rank == 0:
        write_safetensors(out, model.state_dict())
    dist.barrier()
    leave_worker()


def train(case, init, out):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as scratch:
        init_method = "file://" + os.path.join(scratch, "rendezvous")
        target = train_gan_rank if case["model"]["type"] == "DCGAN" else train_rank
        mp.start_processes(target, args=(case, init, out, init_method), nprocs=case["world"], start_method="fork")


def compare(a, b):
    """Largest |a - b| over largest |b|, per tensor; exact zeros mean bitwise equal."""
    left, right = read_arrays(a), read_arrays(b)
    if sorted(left) != sorted(right):
        fail("%s and %s hold different names: %s vs %s" % (a, b, sorted(left), sorted(right)))
    result = {}
    for name in sorted(left):
        x, y = left[name].astype(np.float64), right[name].astype(np.float64)
        if x.shape != y.shape:
            fail("%s: shape %s vs %s" % (name, list(x.shape), list(y.shape)))
        scale = float(np.abs(y).max()) if y.size else 0.0
        result[name] = float(np.abs(x - y).max()) / (scale or 1.0) if x.size else 0.0
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


@functools.lru_cache(maxsize=None)
def gloo_runs(call):
    """Whether this PyTorch's Gloo runs `call` on a one-rank `group`, asked in a process of
    its own (a Gloo group started here would leave threads behind in the forking parent)."""
    import subprocess
    probe = ("import datetime, torch, torch.distributed as dist\n"
             "group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))\n"
             + call + ".wait()\n")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def gloo_reduces_16_bit():
    return gloo_runs("group.allreduce([torch.ones(1, dtype=torch.float16)])")


def gloo_gathers_bf16():
    return gloo_runs("group._allgather_base(torch.empty(1, dtype=torch.bfloat16), torch.ones(1, dtype=torch.bfloat16))")


def unsupported_reason(case):
    """Why this PyTorch cannot train `case`, or None."""
    if case.get("fully_shard") is not None:
        import torch
        version = tuple(int(part) for part in torch.__version__.split(".")[:2])
        if version < (2, 14):
            return ("fully_shard cases are held to PyTorch 2.14 (Debian forky), FSDP2's reference; this is "
                    "PyTorch %s" % torch.__version__)
    if case.get("comm_hook") in ("fp16_compress", "bf16_compress") and not gloo_reduces_16_bit():
        return ("this PyTorch's Gloo reduces no 16-bit floats (Invalid scalar type), so its %s hook cannot run"
                % case["comm_hook"])
    return None


def train_or_mark(case, init, out):
    """Trains `case` into `out`, or writes `out`.unsupported saying why it cannot."""
    reason = unsupported_reason(case)
    if reason:
        with open(out + ".unsupported", "w") as f:
            f.write(reason + "\n")
        return
    train(case, init, out + ".tmp")
    os.replace(out + ".tmp", out)


def run_batch(jobs):
    """Every job, in as many forked shares as the machine has cores.

    A case's ranks spend much of their time in rendezvous and collectives, so
    one case at a time leaves cores idle while every differential test that
    missed its reference waits (Note [One reference writer]). Each share is
    a child of its own; the cases are dealt out by their size (world times
    iterations), largest first, to the share with the least so far."""
    shares = max(1, min(len(jobs), int(os.environ.get("LOCKSTEP_REFERENCE_JOBS", os.cpu_count() or 1))))
    dealt, load = [[] for _ in range(shares)], [0] * shares
    for job in sorted(jobs, key=lambda j: -j["case"]["world"] * j["case"]["iters"]):
        least = load.index(min(load))
        dealt[least].append(job)
        load[least] += job["case"]["world"] * job["case"]["iters"]
    children = []
    for share in dealt:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            status = 0
            try:
                for job in share:
                    init_weights(job["case"], job["init"])
                    train_or_mark(job["case"], job["init"], job["out"])
            except BaseException:  # noqa: B902 - the child reports whatever ended it, then exits
                import traceback
                traceback.print_exc()
                status = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        children.append(pid)
    failed = [pid for pid in children if os.waitpid(pid, 0)[1] != 0]
    if failed:
        fail("%d of %d reference shares failed (their errors are above)" % (len(failed), len(children)))


def main():
    args = sys.argv[1:]
    if args and args[0] in ("init", "train", "batch"):
        import torch
        # One thread, as every worker: the parent's model init must not start an
        # OpenMP pool that forked workers would inherit half-alive.
        torch.set_num_threads(1)
    if len(args) == 3 and args[0] == "init":
        with open(args[1]) as f:
            init_weights(json.load(f), args[2])
    elif len(args) == 4 and args[0] == "train":
        with open(args[1]) as f:
            train(json.load(f), args[2], args[3])
    elif len(args) == 2 and args[0] == "batch":
        with open(args[1]) as f:
            run_batch(json.load(f))
    elif len(args) == 5 and args[0] == "dcp_load":
        with open(args[1]) as f:
            dcp_load(json.load(f), int(args[2]), args[3], args[4])
    elif len(args) == 3 and args[0] == "compare":
        compare(args[1], args[2])
    else:
        fail(__doc__)


if __name__ == "__main__":
    main()
