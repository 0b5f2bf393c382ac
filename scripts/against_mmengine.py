#!/usr/bin/python3
"""lockstep against mmengine itself: its Runner and `lockstep train` on the same
cases, the final weights and the logged scalars compared (issue 59).

mmengine is in no package registry CI can reach, so this runs by hand, from
a checkout of its source (it runs on Debian's python3-torch with two shims,
below), and BENCHMARKS.md keeps the table with the commit it ran:

  scripts/against_mmengine.py --mmengine SRC [--addict SRC] [--lockstep build/bin/lockstep]
                              [--world 2,3] [--cases row1,...] [--out work_dirs/against_mmengine]

SRC is a folder holding the `mmengine` package (and `addict`, its one
dependency Debian lacks; it may be the same folder). Debian's python3-yapf,
python3-termcolor, python3-rich, python3-matplotlib and python3-opencv supply
the rest.

Each case is one CASE of tests/differential/pytorch_reference.py (that file
makes the initial weights and the scripted module both sides train, reads
the data and the safetensors files, and compares). mmengine's side: its
Runner with launcher `pytorch` under torchrun (`python3 -m
torch.distributed.run`), its MMDistributedDataParallel over Gloo, its
DefaultOptimWrapperConstructor, OptimWrapper or AmpOptimWrapper, its
parameter schedulers, DefaultSampler(shuffle=False) and LoggerHook; the model
is a BaseModel holding the case's module in Python; lockstep trains its
built-in ConvNet, or, for the case that needs a depthwise conv, a DeformConv2d
and a 1-D scale, the same module scripted (TorchScriptModel), from the same
initial weights. (Under bf16 autocast a scripted module's Linear layers give
their gradients bias first, an eager nn.Linear weight first; at 3 ranks that
order moves DDP's rebuilt buckets and the ring's sums, and the two end 6.9e-9
apart in PyTorch alone. So the bf16 rows train eager modules on both sides,
and lockstep's ConvNet's Linear layers run as Python's: Note [Linear as
Python's nn.Linear].) lockstep's side:
`lockstep train` on a YAML file saying the same, then `lockstep ckpt export`.
Printed per case and world size: the worst relative difference of the final
weights, and whether `loss`, `lr` and `grad_norm` equal mmengine's
scalars.json at every logged iteration.

The shims: mmengine's init_dist calls torch.cuda.set_device, and
AmpOptimWrapper asserts a GPU; on the CPU its GradScaler disables itself
(torch's own warning says so), so bf16 is autocast alone, as lockstep's.
Without mmcv, mmengine's constructor sees no deformable convolution: the
case's DeformConv2d class is given to it as mmcv.ops' own.
"""
import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REFERENCE = os.path.join(ROOT, "tests", "differential", "pytorch_reference.py")


def reference():
    spec = importlib.util.spec_from_file_location("pytorch_reference", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the cases (issue 59's table) ---------------------------------------------

def base_row():
    """DDP, SGD with momentum and weight decay, accumulative_counts 3 over 20
    iterations (a last window of 2), clip_grad max_norm 1, paramwise_cfg,
    LinearLR warm-up then MultiStepLR, on the ConvNet with BatchNorm: lockstep's
    C++ ConvNet, mmengine's the same layers in Python (both eager)."""
    return {
        "model": {"type": "ConvNet", "channels": [8, 16], "hidden": 32, "batch_norm": True},
        "world": 2, "batch": 16, "iters": 20, "accumulate": 3, "seed": 0,
        "optimizer": {"type": "SGD", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0005},
        "clip": {"max_norm": 1.0, "norm_type": 2.0},
        "paramwise": {"bias_lr_mult": 2, "bias_decay_mult": 0, "norm_decay_mult": 0},
        "schedulers": [{"type": "LinearLR", "start_factor": 0.1, "total_iters": 5},
                       {"type": "MultiStepLR", "milestones": [10, 15], "gamma": 0.1}],
        "amp": None,
    }


def cases():
    row = base_row()
    no_paramwise = dict(row)
    no_paramwise.pop("paramwise")
    no_clip = dict(row, clip=None)
    every_key = dict(row, paramwise={
        "bias_lr_mult": 2, "bias_decay_mult": 0.5, "norm_decay_mult": 0, "dwconv_decay_mult": 0.25,
        "flat_decay_mult": 0.75, "dcn_offset_lr_mult": 0.5, "bypass_duplicate": True,
        "custom_keys": {"head.3": {"lr_mult": 0.5, "momentum": 0.8}}})
    every_key["model"] = dict(row["model"], type="ScriptedConvNet", extras=True)
    return {
        "paramwise_clip": row,
        "no_paramwise": no_paramwise,
        "no_clip": no_clip,
        "paramwise_clip_bf16": dict(row, amp="bf16"),
        "no_paramwise_bf16": dict(no_paramwise, amp="bf16"),
        "every_key": every_key,
    }


# --- mmengine's side ----------------------------------------------------------

def mmengine_worker(case_path, init, out, work_dir):
    """One rank of mmengine's Runner (under torchrun)."""
    import torch
    import torch.nn.functional as F
    ref = reference()
    torch.set_num_threads(1)
    torch.cuda.set_device = lambda *args, **kwargs: None  # shim: init_dist's, for a GPU this host lacks
    import mmengine.optim.optimizer.amp_optimizer_wrapper as amp_wrapper
    amp_wrapper.is_cuda_available = lambda: True  # shim: AmpOptimWrapper's assert (see the docstring)
    from mmengine.dataset import DefaultSampler  # noqa: F401 (registers it)
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    case = json.load(open(case_path))

    # The case's module in Python, as an mmengine user trains it (lockstep
    # trains its scripted twin); its DeformConv2d is handed to mmengine as
    # mmcv's, which its constructor tells by isinstance.
    extras = ref.extras_classes()
    sys.modules["mmcv"] = types.ModuleType("mmcv")
    sys.modules["mmcv.ops"] = types.SimpleNamespace(DeformConv2d=extras["DeformConv2d"],
                                                    ModulatedDeformConv2d=extras["DeformConv2d"])
    import mmengine.optim.optimizer.default_constructor as constructor
    constructor.mmcv_full_available = lambda: True

    class Classifier(BaseModel):
        def __init__(self):
            super().__init__()
            self.net = ref.build_model(case["model"], script=False)
            self.net.load_state_dict(ref.read_safetensors(init))

        def forward(self, inputs, labels, mode="loss"):
            return {"loss": F.cross_entropy(self.net(ref.preprocess(inputs)), labels)}

    class FashionMnist(torch.utils.data.Dataset):
        def __init__(self):
            root = case.get("data_root", "/usr/share/datasets/fashion-mnist")
            self.images = ref.read_idx(os.path.join(root, "train-images-idx3-ubyte.gz"))
            self.labels = ref.read_idx(os.path.join(root, "train-labels-idx1-ubyte.gz"))

        def __len__(self):
            return len(self.images)

        def __getitem__(self, i):
            return (torch.from_numpy(self.images[i].copy()).unsqueeze(0),
                    torch.tensor(int(self.labels[i]), dtype=torch.int64))

    optimizer = dict(case["optimizer"])
    wrapper = dict(type="OptimWrapper", optimizer=optimizer, accumulative_counts=case.get("accumulate", 1))
    if case.get("amp"):
        wrapper.update(type="AmpOptimWrapper", dtype={"bf16": "bfloat16", "fp16": "float16"}[case["amp"]])
    if case.get("clip"):
        wrapper["clip_grad"] = {k: v for k, v in case["clip"].items() if k in ("max_norm", "norm_type")}
    if case.get("paramwise"):
        wrapper["paramwise_cfg"] = case["paramwise"]
    schedulers = []
    for spec in case.get("schedulers") or []:
        if spec["type"] == "LinearLR":
            schedulers.append(dict(type="LinearLR", by_epoch=False, start_factor=spec["start_factor"],
                                   begin=0, end=spec["total_iters"] + 1))
        elif spec["type"] == "MultiStepLR":
            schedulers.append(dict(type="MultiStepLR", by_epoch=False, milestones=spec["milestones"],
                                   gamma=spec["gamma"], begin=0, end=case["iters"]))
    runner = Runner(
        model=Classifier(),
        work_dir=work_dir,
        train_dataloader=dict(batch_size=case["batch"], num_workers=0, dataset=FashionMnist(),
                              sampler=dict(type="DefaultSampler", shuffle=False),
                              collate_fn=dict(type="default_collate")),
        train_cfg=dict(by_epoch=False, max_iters=case["iters"]),
        optim_wrapper=wrapper,
        param_scheduler=schedulers or None,
        default_hooks=dict(logger=dict(type="LoggerHook", interval=5), checkpoint=None),
        log_processor=dict(by_epoch=False),
        launcher="pytorch",
        env_cfg=dict(dist_cfg=dict(backend="gloo"), mp_cfg=dict(mp_start_method="fork")),
        randomness=dict(seed=case.get("seed", 0)),
        # Runner reads model_wrapper_cfg from its cfg; device_ids None: DDP on the CPU.
        cfg=dict(model_wrapper_cfg=dict(type="MMDistributedDataParallel", device_ids=None)),
    )
    runner.train()
    if int(os.environ["RANK"]) == 0:
        ref.write_safetensors(out, runner.model.module.net.state_dict())
        with open(out + ".scalars.path", "w") as f:
            f.write(os.path.join(runner.log_dir, "vis_data", "scalars.json"))
    torch.distributed.barrier()
    ref.leave_worker()


def run_mmengine(case, case_path, init, out, work_dir, src):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(src), OMP_NUM_THREADS="1")
    # Debian bookworm's torchrun (torch 1.13 on Python 3.11) fails on its
    # default --redirects/--tee of 0; non-zero values avoid it (tests/support).
    command = [sys.executable, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1", "--standalone",
               "--nproc_per_node", str(case["world"]), os.path.abspath(__file__), "mmengine-worker", case_path,
               init, out, work_dir]
    log = open(work_dir + ".log", "w")
    subprocess.run(command, env=env, check=True, stdout=log, stderr=subprocess.STDOUT)


# --- lockstep's side ----------------------------------------------------------

def lockstep_yaml(case, init):
    """The same run as `lockstep train` reads it (mmengine's keys)."""
    optimizer = ", ".join(f"{k}: {json.dumps(v)}" for k, v in case["optimizer"].items())
    lines = [
        f"randomness: {{seed: {case.get('seed', 0)}}}",
        "env: {num_threads: 1}",
        "model:",
    ]
    model = case["model"]
    if model["type"] == "ScriptedConvNet":
        lines += ["  type: TorchScriptModel", f"  path: {init[:-len('.safetensors')]}.scripted.pt"]
    else:
        lines += ["  type: ConvNet", f"  channels: {model['channels']}", f"  hidden: {model['hidden']}",
                  f"  batch_norm: {str(model['batch_norm']).lower()}"]
    lines += [
        "  data_preprocessor: {type: ImgDataPreprocessor, mean: [72.94], std: [90.02]}",
        "train_dataloader:",
        f"  batch_size: {case['batch']}",
        "  num_workers: 0",
        "  sampler: {type: DefaultSampler, shuffle: false}",
        "  dataset: {type: FashionMNIST, root: /usr/share/datasets/fashion-mnist, split: train}",
        f"train_cfg: {{max_iters: {case['iters']}}}",
        "optim_wrapper:",
        "  type: " + ("AmpOptimWrapper" if case.get("amp") else "OptimWrapper"),
        f"  optimizer: {{{optimizer}}}",
        f"  accumulative_counts: {case.get('accumulate', 1)}",
    ]
    if case.get("amp"):
        lines.append("  dtype: " + {"bf16": "bfloat16", "fp16": "float16"}[case["amp"]])
    if case.get("clip"):
        lines.append(f"  clip_grad: {json.dumps(case['clip'])}")
    if case.get("paramwise"):
        lines.append(f"  paramwise_cfg: {json.dumps(case['paramwise'])}")
    if case.get("schedulers"):
        lines.append("param_scheduler:")
        for spec in case["schedulers"]:
            if spec["type"] == "LinearLR":
                lines.append(f"  - {{type: LinearLR, by_epoch: false, start_factor: {spec['start_factor']}, "
                             f"begin: 0, end: {spec['total_iters'] + 1}}}")
            elif spec["type"] == "MultiStepLR":
                lines.append(f"  - {{type: MultiStepLR, by_epoch: false, milestones: {spec['milestones']}, "
                             f"gamma: {spec['gamma']}, begin: 0, end: {case['iters']}}}")
    lines += [
        "default_hooks:",
        "  logger: {interval: 5}",
        f"  checkpoint: {{interval: {case['iters']}, by_epoch: false}}",
        f"load_from: {init}",
        "strategy: {type: DDPStrategy, launcher: pytorch, backend: gloo, device: cpu}",
    ]
    return "\n".join(lines) + "\n"


def run_lockstep(case, init, out, work_dir, lockstep):
    config = work_dir + ".yaml"
    with open(config, "w") as f:
        f.write(lockstep_yaml(case, init))
    log = open(work_dir + ".log", "w")
    subprocess.run([lockstep, "train", config, "--work-dir", work_dir, "--nproc", str(case["world"])],
                   check=True, stdout=log, stderr=subprocess.STDOUT)
    subprocess.run([lockstep, "ckpt", "export", os.path.join(work_dir, "model_final.ckpt"), "-o", out],
                   check=True, stdout=log, stderr=subprocess.STDOUT)


# --- the logged scalars ---------------------------------------------------------

def mmengine_scalars(path):
    """{iteration: {key: value}} of mmengine's scalars.json (one JSON per line; `step` is 1-based)."""
    logged = {}
    for line in open(path):
        entry = json.loads(line)
        logged[entry["step"]] = entry
    return logged


def lockstep_scalars(work_dir):
    """{iteration: {key: value}} of lockstep's metrics.jsonl, with 1-based iterations as mmengine's."""
    logged = {}
    path = os.path.join(work_dir, "metrics.jsonl")
    for line in open(path):
        entry = json.loads(line)
        if "iteration" in entry:
            logged[entry["iteration"] + 1] = entry
    return logged


def same_scalars(mm, ls, keys=("loss", "lr", "grad_norm")):
    """'equal' when every key mmengine logged at an iteration lockstep logged the same; else the first difference."""
    for step in sorted(mm):
        for key in keys:
            if key not in mm[step]:
                continue
            theirs = ls.get(step, {}).get(key)
            if theirs is None:
                return f"iteration {step}: mmengine logged {key} = {mm[step][key]!r}, lockstep nothing"
            if not math.isclose(mm[step][key], theirs, rel_tol=0, abs_tol=0):
                return f"iteration {step}: {key} {mm[step][key]!r} (mmengine) vs {theirs!r} (lockstep)"
        extra = [k for k in keys if k in ls.get(step, {}) and k not in mm[step]]
        if extra:
            return f"iteration {step}: lockstep logged {', '.join(extra)}, mmengine did not"
    return "equal"


def worst_difference(ref, a, b):
    """The largest |a - b| over largest |b| of any tensor (pytorch_reference.py's measure); 0: bitwise."""
    import numpy as np
    left, right = ref.read_arrays(a), ref.read_arrays(b)
    if sorted(left) != sorted(right):
        raise SystemExit(f"{a} and {b} hold different names: {sorted(left)} vs {sorted(right)}")
    worst = 0.0
    for name in left:
        x, y = left[name].astype(np.float64), right[name].astype(np.float64)
        if x.size:
            worst = max(worst, float(np.abs(x - y).max()) / (float(np.abs(y).max()) or 1.0))
    return worst


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "mmengine-worker":
        mmengine_worker(*sys.argv[2:6])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mmengine", required=True, help="a folder holding the mmengine package")
    parser.add_argument("--addict", help="a folder holding the addict package (default: --mmengine's)")
    parser.add_argument("--lockstep", default=os.path.join(ROOT, "build", "bin", "lockstep"))
    parser.add_argument("--world", default="2,3")
    parser.add_argument("--cases", default=",".join(cases()))
    parser.add_argument("--out", default=os.path.join(ROOT, "work_dirs", "against_mmengine"))
    args = parser.parse_args()
    src = [os.path.abspath(args.mmengine)] + ([os.path.abspath(args.addict)] if args.addict else [])
    ref = reference()
    os.makedirs(args.out, exist_ok=True)
    print(f"{'case':<22} {'world':>5}  {'weights, worst relative difference':<36} logged loss, lr, grad_norm")
    for name in args.cases.split(","):
        for world in (int(w) for w in args.world.split(",")):
            case = dict(cases()[name], world=world)
            stem = os.path.join(args.out, f"{name}_w{world}")
            case_path, init = stem + ".json", stem + ".init.safetensors"
            with open(case_path, "w") as f:
                json.dump(case, f)
            ref.init_weights(case, init)
            run_mmengine(case, case_path, init, stem + ".mmengine.safetensors", stem + "_mmengine", src)
            run_lockstep(case, init, stem + ".lockstep.safetensors", stem + "_lockstep", args.lockstep)
            worst = worst_difference(ref, stem + ".mmengine.safetensors", stem + ".lockstep.safetensors")
            scalars_path = open(stem + ".mmengine.safetensors.scalars.path").read().strip()
            logged = same_scalars(mmengine_scalars(scalars_path), lockstep_scalars(stem + "_lockstep"))
            verdict = "0 (bitwise)" if worst == 0 else f"{worst:.2g}"
            print(f"{name:<22} {world:>5}  {verdict:<36} {logged}", flush=True)


if __name__ == "__main__":
    main()
