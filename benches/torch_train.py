#!/usr/bin/env python3
"""The PyTorch baseline of the training workload `mlp_step` (benches/workloads.md, "Training").

Builds `mlp_step` exactly as braze's workload does (crates/workloads/src/workload.rs,
`mlp_training_step`): 4 layers of `x = layer_norm(x + gelu(x @ w1 + b1) @ w2 + b2, g, beta)`
with `w1: [hidden, 4 hidden]`, `w2: [4 hidden, hidden]` scaled by 1/sqrt(fan_in), zero biases,
unit norm weights; the loss `mean((x - target)^2)`; backward; AdamW (lr 1e-3, PyTorch's default
betas, eps and weight decay). Parameters, activations and the loss in bf16.

    python3 benches/torch_train.py --json torch_train.json --write /tmp/mlp_step
    python3 benches/torch_train.py --variants eager,compile,compile-max-autotune-no-cudagraphs
    python3 benches/torch_train.py --device cpu --rows 64 --hidden 64 --write /tmp/small --variants ""

Each variant (eager; torch.compile of the forward and loss, fullgraph, in a mode; all with
`AdamW(fused=True)` on CUDA) is timed as `braze bench` times its step: triton's do_bench (25 ms
warm-up, `--rep-ms` of repetitions, L2 flushed before each, the median). The peak memory is
torch.cuda.max_memory_allocated over 3 steps after warm-up, less what was allocated before the
inputs and parameters were made: the figure `braze bench` reports for its step. Rows use braze's
keys (workload, shape, dtype, variant), so benches/compare.py joins them.

`--write DIR` saves what `braze bench --torch-weights DIR` (or `braze train-check`) reads, as
safetensors: `weights.safetensors`, the initial parameters under braze's names
(`layers.{l}.{w1,b1,w2,b2,g,beta}`) with the sizes in its metadata, and for each of the first
`--write-steps` steps `step-{k}.safetensors`: that step's inputs `x` and `target`, the parameters
it starts from `param.{name}`, the eager bf16 `loss` and gradients `grad.{name}`, `f32.loss` and
`f32.grad.{name}` (the same step in f32 from the same parameters, the bf16 ones widened, which
both bf16 results are measured against), and `updated.{name}`, the parameters after the step's
AdamW update, which the next step starts from.
"""
import argparse
import gc
import json
import math
import os
import time

import torch
import torch.nn.functional as F

WORKLOAD = "mlp_step"
LAYERS = 4
LR = 1e-3
EPS = 1e-5
NAMES = ("w1", "b1", "w2", "b2", "g", "beta")
VARIANTS = {
    "eager": None,
    "compile": "default",
    "compile-reduce-overhead": "reduce-overhead",
    "compile-max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs",
}
WARM_STEPS, PEAK_STEPS = 2, 3


def init_params(rows, hidden, dtype, device, seed):
    """The parameters by braze's names, in its order; seeded, so every variant starts alike."""
    torch.manual_seed(seed)
    inner = 4 * hidden
    params = {}
    for l in range(LAYERS):
        layer = {
            "w1": torch.randn(hidden, inner, device=device) / math.sqrt(hidden),
            "b1": torch.zeros(inner, device=device),
            "w2": torch.randn(inner, hidden, device=device) / math.sqrt(inner),
            "b2": torch.zeros(hidden, device=device),
            "g": torch.ones(hidden, device=device),
            "beta": torch.zeros(hidden, device=device),
        }
        for name in NAMES:
            params[f"layers.{l}.{name}"] = layer[name].to(dtype).requires_grad_()
    return params


def loss_fn(params, x, target):
    """braze_workloads::definition::mlp_block per layer, then the mean squared error."""
    for l in range(LAYERS):
        w1, b1, w2, b2, g, beta = (params[f"layers.{l}.{n}"] for n in NAMES)
        h = F.gelu(x @ w1 + b1) @ w2 + b2  # exact (erf) GELU, as braze's
        x = F.layer_norm(x + h, (x.shape[-1],), g, beta, EPS)
    error = x - target
    return (error * error).mean()


def adamw(params, device):
    return torch.optim.AdamW(params.values(), lr=LR, fused=device == "cuda")


def shape_key(rows, hidden):
    """braze bench's shape string for mlp_step."""
    return f"{rows}x{hidden} h{4 * hidden} L{LAYERS}"


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def write(a, device, dtype):
    """The initial weights, then per step: inputs, eager loss and grads, and the f32 reference."""
    from safetensors.torch import save_file

    os.makedirs(a.write, exist_ok=True)
    params = init_params(a.rows, a.hidden, dtype, device, a.seed)
    meta = {"workload": WORKLOAD, "rows": str(a.rows), "hidden": str(a.hidden), "layers": str(LAYERS),
            "dtype": "bf16", "lr": str(LR), "steps": str(a.write_steps), "torch": torch.__version__}
    save_file({n: p.detach().contiguous() for n, p in params.items()}, os.path.join(a.write, "weights.safetensors"),
              metadata=meta)
    opt = adamw(params, device)
    generator = torch.Generator(device=device).manual_seed(a.seed + 1000)
    for k in range(a.write_steps):
        x = torch.randn(a.rows, a.hidden, device=device, generator=generator).to(dtype)
        target = torch.randn(a.rows, a.hidden, device=device, generator=generator).to(dtype)
        wide = {n: p.detach().float().requires_grad_() for n, p in params.items()}
        wide_loss = loss_fn(wide, x.float(), target.float())
        wide_loss.backward()
        loss = loss_fn(params, x, target)
        loss.backward()
        out = {"x": x, "target": target, "loss": loss.detach(), "f32.loss": wide_loss.detach()}
        for n, p in params.items():
            out[f"param.{n}"] = p.detach().clone()
            out[f"grad.{n}"] = p.grad
            out[f"f32.grad.{n}"] = wide[n].grad
        opt.step()
        for n, p in params.items():
            out[f"updated.{n}"] = p.detach()
        save_file({n: t.contiguous() for n, t in out.items()}, os.path.join(a.write, f"step-{k}.safetensors"))
        print(f"step {k}: loss {loss.item():.6f} (f32 {wide_loss.item():.6f})", flush=True)
        opt.zero_grad(set_to_none=True)
    print(f"wrote {a.write_steps} steps of {shape_key(a.rows, a.hidden)} to {a.write}", flush=True)


def time_us(step, device, rep_ms):
    if device == "cuda":
        from triton.testing import do_bench
        return do_bench(step, warmup=25, rep=rep_ms, return_mode="median") * 1e3
    times = []
    for _ in range(max(3, int(rep_ms // 50))):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e6)
    return sorted(times)[len(times) // 2]


def measure(a, device, dtype, variant):
    """One variant from fresh parameters: cold first step, steady-state peak memory, step time."""
    torch._dynamo.reset()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated() if device == "cuda" else 0
    params = init_params(a.rows, a.hidden, dtype, device, a.seed)
    x = torch.randn(a.rows, a.hidden, device=device).to(dtype)
    target = torch.randn(a.rows, a.hidden, device=device).to(dtype)
    opt = adamw(params, device)
    mode = VARIANTS[variant]
    f = loss_fn if mode is None else torch.compile(loss_fn, fullgraph=True, mode=mode)

    def step():
        loss = f(params, x, target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    start = time.perf_counter()
    step()
    sync(device)
    cold = time.perf_counter() - start
    for _ in range(WARM_STEPS):
        step()
    sync(device)
    peak = None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        for _ in range(PEAK_STEPS):
            step()
        sync(device)
        peak = torch.cuda.max_memory_allocated() - base
    us = time_us(step, device, a.rep_ms)
    if a.profile and device == "cuda":
        try:
            print_kernel_profile(variant, step)
        except Exception as e:  # the profile is a diagnostic: never lose the timing to it
            print(f"# {variant}: no kernel profile ({type(e).__name__}: {e})")
    rows, hidden = a.rows, a.hidden
    flops = 3 * 2 * 2 * rows * hidden * 4 * hidden * LAYERS  # forward 2 matmuls a layer, backward twice that
    return {"workload": WORKLOAD, "shape": shape_key(rows, hidden), "dtype": "bf16",
            "variant": variant.replace("-", " ", 1) if variant != "eager" else "eager",
            "us": us, "gbps": None, "tflops": flops / (us * 1e-6) / 1e12, "cold_s": cold,
            "peak_bytes": peak, "peak_mb": peak / 1e6 if peak is not None else None,
            "optimizer": f"AdamW(lr={LR}, fused={device == 'cuda'})"}


def print_kernel_profile(variant, step, steps=3):
    """The GPU kernels of `steps` steps under torch.profiler, by name, per step: what the step
    spends its GPU time on, to set beside `braze bench`'s kernel profile."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in events) / steps
    print(f"# {variant}: kernels {total:.1f} us a step ({steps} steps profiled)")
    for e in events[:40]:
        print(f"#   {e.device_time_total / steps:9.1f} us  x{e.count // steps:<3d} {e.key[:110]}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write {'env': ..., 'rows': [...]} here (rewritten after every row)")
    p.add_argument("--write", metavar="DIR", help="save weights, inputs, losses and grads of the first steps here")
    p.add_argument("--write-steps", type=int, default=3)
    p.add_argument("--variants", default="eager,compile",
                   help="comma-separated, in order: " + ", ".join(VARIANTS) + " (empty: none)")
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rep-ms", type=float, default=200.0, help="milliseconds of timed repetitions (do_bench's rep)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--profile", action="store_true", help="print each variant's GPU kernel times per step (torch.profiler)")
    a = p.parse_args()
    variants = [v for v in a.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device (use --device cpu for a small run)")
    # f32 matmuls exact, as braze's (the f32 reference depends on it); bf16 ones as PyTorch's default.
    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = torch.bfloat16
    env = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        "timing": f"triton do_bench: 25 ms warm-up, {a.rep_ms} ms of repetitions, L2 flushed before each, median",
        "peak": f"max_memory_allocated over {PEAK_STEPS} steps after {WARM_STEPS + 1}, less what was allocated before",
    }
    print(json.dumps(env), flush=True)
    if a.write:
        write(a, a.device, dtype)
    rows = []
    for variant in variants:
        try:
            row = measure(a, a.device, dtype, variant)
        except Exception as e:  # one variant failing (a compile error) must not lose the others
            row = {"workload": WORKLOAD, "shape": shape_key(a.rows, a.hidden), "dtype": "bf16",
                   "variant": f"info {variant}", "us": None, "gbps": None,
                   "note": f"not measured (error): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        rows.append(row)
        peak = f"{row['peak_mb']:9.1f} MB peak" if row.get("peak_mb") is not None else ""
        time_text = f"{row['us']:12.1f} us" if row.get("us") is not None else row.get("note", "")
        print(f"{row['workload']:10s} {row['shape']:22s} {row['dtype']:5s} {row['variant']:36s} {time_text} {peak}",
              flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"env": env, "rows": rows}, f, indent=1)
    if a.json:
        print(f"wrote {len(rows)} rows to {a.json}")


if __name__ == "__main__":
    main()
