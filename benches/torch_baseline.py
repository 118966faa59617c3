#!/usr/bin/env python3
"""The PyTorch baseline of the forward workloads of benches/workloads.md.

Times PyTorch eager and torch.compile on the same workloads, at the same sizes, as
`braze bench --json`, on the same GPU and right after it, so every comparison is a ratio from one
run. The rows use braze's keys (workload, shape, dtype), so benches/compare.py joins the two files.

    python3 benches/torch_baseline.py --json torch.json        # the standard sizes
    python3 benches/torch_baseline.py --quick                   # small sizes, a smoke test
    python3 benches/torch_baseline.py --only multisum --multisum-compile
    python3 benches/torch_baseline.py --print-sizes 2000 1000 300000 0
    python3 benches/torch_baseline.py --sweep rows --json torch-rows.json   # a sweep (workloads.md)
    python3 benches/torch_baseline.py --sweep pointwise --list --sweep-max-mb 20

Timing is triton.testing.do_bench (25 ms warm-up, then `--rep-ms` of repetitions with the L2
cache flushed before each; the median), the method braze's own `bench` reproduces. Bytes are the
fewest a kernel must move: every input read once, every output written once.
"""
import argparse
import json
import math
import time

from sweeps import SWEEP_WORKLOADS, sweep, sweep_cases, sweep_listing

try:
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench
    DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
except ImportError as e:  # `--sweep ... --list` and `--help` still work without PyTorch
    torch, F, do_bench, DTYPES, IMPORT_ERROR = None, None, None, {}, e
EPS = 1e-5


# ---- the workloads: crates/workloads/src/definition.rs, in PyTorch ----------------------------

def ln_relu_res_fn(x, w, b, res):
    return F.relu(F.layer_norm(x, (x.shape[-1],), w, b, EPS)) + res


def ew_chain_fn(x, a, b, c):
    return F.gelu(x * a + b) * c  # exact (erf) GELU, PyTorch's default


def multisum_fn(ts):
    return torch.stack([t.sum() for t in ts])


def tiny_block_fn(x, weights):
    for w, b in weights:
        x = F.relu(F.layer_norm(x, (x.shape[-1],), w, b, EPS)) + x
    return x


def mlp_block_fn(x, w1, b1, w2, b2, g, beta):
    h = F.gelu(x @ w1 + b1) @ w2 + b2
    return F.layer_norm(x + h, (x.shape[-1],), g, beta, EPS)


def multisum_sizes(k, lo, hi, seed):
    """K sizes log-uniform in [lo, hi], truncated. The definition braze reproduces bit for bit
    (braze_workloads::multisum_sizes): PyTorch's CPU MT19937 seeded with `seed`, k float64 draws."""
    generator = torch.Generator().manual_seed(seed)
    u = torch.rand(k, generator=generator, dtype=torch.float64)
    log_lo, log_hi = math.log(lo), math.log(hi)
    return [int(math.exp(log_lo + (log_hi - log_lo) * v)) for v in u.tolist()]


# ---- sizes ------------------------------------------------------------------------------------

# (workload, parameters), in the order of benches/workloads.md; the shape strings below are the
# ones `braze bench` writes for the same sizes.
STANDARD = [
    ("copy", {"n": 2 * 1024**3 // 4}),
    ("ln_relu_res", {"rows": 16384, "hidden": 4096, "dtype": "f32"}),
    ("ln_relu_res", {"rows": 16384, "hidden": 4096, "dtype": "bf16"}),
    ("ln_relu_res", {"rows": 65536, "hidden": 1024, "dtype": "f32"}),
    ("ew_chain", {"n": 1 << 26, "dtype": "f32"}),
    ("multisum", {"k": 2000, "lo": 1000, "hi": 300_000, "seed": 0, "dtype": "f32"}),
    ("multisum", {"k": 10_000, "lo": 100, "hi": 10_000, "seed": 0, "dtype": "f32"}),
    ("tiny_block", {"layers": 16, "rows": 64, "hidden": 256, "dtype": "f32"}),
    ("mlp_block", {"rows": 8192, "hidden": 1024, "dtype": "bf16"}),
    ("attention", {"b": 16, "h": 12, "t": 1024, "d": 64, "dtype": "bf16"}),
]

QUICK = [
    ("copy", {"n": 16 * 1024**2 // 4}),
    ("ln_relu_res", {"rows": 256, "hidden": 1024, "dtype": "f32"}),
    ("ln_relu_res", {"rows": 256, "hidden": 1024, "dtype": "bf16"}),
    ("ew_chain", {"n": 1 << 16, "dtype": "f32"}),
    ("multisum", {"k": 50, "lo": 10, "hi": 1000, "seed": 0, "dtype": "f32"}),
    ("tiny_block", {"layers": 4, "rows": 64, "hidden": 256, "dtype": "f32"}),
    ("mlp_block", {"rows": 256, "hidden": 256, "dtype": "bf16"}),
    ("attention", {"b": 2, "h": 2, "t": 128, "d": 64, "dtype": "bf16"}),
]


REP_MS, SWEEP_REP_MS = 200.0, 40.0


# ---- measuring --------------------------------------------------------------------------------

class Run:
    def __init__(self, rep_ms, multisum_compile, json_path=None, env=None):
        self.rep_ms = rep_ms
        self.multisum_compile = multisum_compile
        self.rows = []
        self.json_path, self.env = json_path, env

    def save(self):
        """Writes the rows so far to --json's file (after each workload or sweep case, so a run
        stopped by a time limit keeps what it measured)."""
        if self.json_path:
            with open(self.json_path, "w") as f:
                json.dump({"env": self.env, "rows": self.rows}, f, indent=1)

    def time_us(self, fn, rep_ms=None):
        return do_bench(fn, warmup=25, rep=rep_ms or self.rep_ms, return_mode="median") * 1e3

    def emit(self, workload, shape, dtype, variant, us, nbytes=None, **extra):
        gbps = nbytes / (us * 1e-6) / 1e9 if nbytes else None
        row = {"workload": workload, "shape": shape, "dtype": dtype, "variant": variant, "us": us, "gbps": gbps}
        row.update(extra)
        self.rows.append(row)
        bandwidth = f"{gbps:8.0f} GB/s" if gbps else ""
        print(f"{workload:12s} {shape:22s} {dtype:5s} {variant:28s} {us:12.1f} us {bandwidth}", flush=True)

    @staticmethod
    def compile(fn, args, mode="default"):
        """fn compiled (fullgraph) and its cold start: the first calls, compilation included."""
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True, mode=mode)
        start = time.perf_counter()
        for _ in range(3):  # reduce-overhead records its CUDA graph on a later call
            compiled(*args)
        torch.cuda.synchronize()
        return compiled, time.perf_counter() - start


def randn(*shape, dtype, scale=1.0):
    t = torch.randn(*shape, device="cuda", dtype=torch.float32) * scale
    return t.to(DTYPES[dtype])


def rel_err(got, fn, args):
    """||got - fn(args in float64)|| / ||fn(args in float64)||."""
    want = fn(*(a.double() for a in args))
    return ((got.double() - want).norm() / want.norm()).item()


def copy(run, n):
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    nbytes = 2 * n * x.element_size()
    run.emit("copy", str(n), "f32", "torch copy_", run.time_us(lambda: y.copy_(x)), nbytes,
             note=f"{n * 4 / 2**30:.2f} GiB device-to-device copy: the bandwidth ceiling of this run")


def ln_relu_res(run, rows, hidden, dtype):
    x, res = randn(rows, hidden, dtype=dtype), randn(rows, hidden, dtype=dtype)
    w, b = randn(hidden, dtype=dtype), randn(hidden, dtype=dtype)
    args = (x, w, b, res)
    shape, nbytes = f"{rows}x{hidden}", 3 * x.numel() * x.element_size()
    run.emit("ln_relu_res", shape, dtype, "eager", run.time_us(lambda: ln_relu_res_fn(*args)), nbytes)
    compiled, cold = run.compile(ln_relu_res_fn, args)
    run.emit("ln_relu_res", shape, dtype, "compile", run.time_us(lambda: compiled(*args)), nbytes,
             cold_s=cold, rel_err=rel_err(compiled(*args), ln_relu_res_fn, args))


def ew_chain(run, n, dtype):
    args = tuple(randn(n, dtype=dtype) for _ in range(4))
    shape, nbytes = str(n), 5 * n * args[0].element_size()
    run.emit("ew_chain", shape, dtype, "eager", run.time_us(lambda: ew_chain_fn(*args)), nbytes)
    compiled, cold = run.compile(ew_chain_fn, args)
    run.emit("ew_chain", shape, dtype, "compile", run.time_us(lambda: compiled(*args)), nbytes,
             cold_s=cold, rel_err=rel_err(compiled(*args), ew_chain_fn, args))


def multisum(run, k, lo, hi, seed, dtype):
    sizes = multisum_sizes(k, lo, hi, seed)
    ts = [randn(s, dtype=dtype) for s in sizes]
    total = sum(sizes)
    shape, nbytes = f"K={k} {lo}-{hi} s{seed}", total * ts[0].element_size()
    print(f"# multisum {shape}: {total} elements, {nbytes / 1e6:.1f} MB, first sizes {sizes[:4]}", flush=True)
    rep = max(run.rep_ms, 500)  # a call takes milliseconds: more repetitions for a steady median
    run.emit("multisum", shape, dtype, "eager loop", run.time_us(lambda: multisum_fn(ts), rep), nbytes, elements=total)
    # The library paths a PyTorch user has for many sums: the L1 norm of each (the same as the sum
    # only for non-negative data, but the same memory traffic), and one segmented reduction over
    # the concatenation (which pays for the copy).
    run.emit("multisum", shape, dtype, "foreach_norm(ord=1)", run.time_us(lambda: torch._foreach_norm(ts, 1), rep),
             nbytes)
    lengths = torch.tensor(sizes, device="cuda")
    run.emit("multisum", shape, dtype, "cat_segment_reduce",
             run.time_us(lambda: torch.segment_reduce(torch.cat(ts), "sum", lengths=lengths), rep), nbytes)
    if run.multisum_compile:  # the cold compile of K=2000 takes minutes
        compiled, cold = run.compile(multisum_fn, (ts,))
        run.emit("multisum", shape, dtype, "compile", run.time_us(lambda: compiled(ts), rep), nbytes, cold_s=cold)


def tiny_block(run, layers, rows, hidden, dtype):
    x = randn(rows, hidden, dtype=dtype)
    weights = [(randn(hidden, dtype=dtype), randn(hidden, dtype=dtype)) for _ in range(layers)]
    shape = f"{layers}L {rows}x{hidden}"
    run.emit("tiny_block", shape, dtype, "eager", run.time_us(lambda: tiny_block_fn(x, weights)))
    for mode in ("default", "reduce-overhead"):
        compiled, cold = run.compile(tiny_block_fn, (x, weights), mode=mode)
        run.emit("tiny_block", shape, dtype, f"compile {mode}", run.time_us(lambda: compiled(x, weights)),
                 cold_s=cold)


def mlp_block(run, rows, hidden, dtype):
    inner = 4 * hidden
    args = (
        randn(rows, hidden, dtype=dtype),
        randn(hidden, inner, dtype=dtype, scale=1 / math.sqrt(hidden)),
        randn(inner, dtype=dtype),
        randn(inner, hidden, dtype=dtype, scale=1 / math.sqrt(inner)),
        randn(hidden, dtype=dtype),
        randn(hidden, dtype=dtype),
        randn(hidden, dtype=dtype),
    )
    shape, flops = f"{rows}x{hidden} h{inner}", 2 * 2 * rows * hidden * inner
    us = run.time_us(lambda: mlp_block_fn(*args))
    run.emit("mlp_block", shape, dtype, "eager", us, tflops=flops / (us * 1e-6) / 1e12)
    compiled, cold = run.compile(mlp_block_fn, args)
    us = run.time_us(lambda: compiled(*args))
    run.emit("mlp_block", shape, dtype, "compile", us, cold_s=cold, tflops=flops / (us * 1e-6) / 1e12)


def attention(run, b, h, t, d, dtype):
    """Causal scaled dot-product attention (PyTorch picks its flash backend for bf16 on sm_80+),
    forward and forward+backward, as `braze bench --only attention` (the same shape key; FLOPs
    counted as FlashAttention does: 4 B H T^2 D halved by the mask, a backward 2.5 forwards)."""
    q, k, v, dout = (randn(b, h, t, d, dtype=dtype) for _ in range(4))
    shape, flops = f"B{b} H{h} T{t} D{d} causal", 4 * b * h * t * t * d / 2
    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    us = run.time_us(fwd)
    run.emit("attention_fwd", shape, dtype, "torch sdpa", us, tflops=flops / (us * 1e-6) / 1e12)
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))

    def fwd_bwd():
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
        return torch.autograd.grad(out, (qg, kg, vg), dout)

    us = run.time_us(fwd_bwd)
    run.emit("attention_fwd_bwd", shape, dtype, "torch sdpa", us, tflops=3.5 * flops / (us * 1e-6) / 1e12)


WORKLOADS = {
    "copy": copy,
    "ln_relu_res": ln_relu_res,
    "ew_chain": ew_chain,
    "multisum": multisum,
    "tiny_block": tiny_block,
    "mlp_block": mlp_block,
    "attention": attention,
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write {'env': ..., 'rows': [...]} here")
    p.add_argument("--only", default="", help="comma-separated subset: " + ", ".join(WORKLOADS))
    p.add_argument("--quick", action="store_true", help="small sizes: checks the script, measures little")
    p.add_argument("--rep-ms", type=float, default=REP_MS,
                   help=f"milliseconds of timed repetitions (do_bench's rep; a sweep's default: {SWEEP_REP_MS})")
    p.add_argument("--multisum-compile", action="store_true", help="also torch.compile multisum (minutes at K=2000)")
    p.add_argument("--print-sizes", nargs=4, type=int, metavar=("K", "LO", "HI", "SEED"),
                   help="print multisum_sizes(K, LO, HI, SEED) as JSON and exit")
    p.add_argument("--sweep", choices=("rows", "pointwise"),
                   help="time this sweep (the copy anchor, then every case) instead of the standard sizes")
    p.add_argument("--sweep-max-mb", type=float, help="cap on the bytes one sweep call moves, in MB")
    p.add_argument("--list", action="store_true", help="print the sweep's cases and exit (no GPU needed)")
    p.add_argument("--no-autotune", action="store_true",
                   help="sweeps: leave out torch.compile max-autotune-no-cudagraphs (its tuning takes seconds a case)")
    a = p.parse_args()
    if a.print_sizes:
        print(json.dumps(multisum_sizes(*a.print_sizes)))
        return
    if (a.list or a.sweep_max_mb is not None) and not a.sweep:
        p.error("--list and --sweep-max-mb are for a sweep: give --sweep rows|pointwise")
    if a.sweep_max_mb is not None and not a.sweep_max_mb > 0:
        p.error(f"--sweep-max-mb must be a positive number of MB, got {a.sweep_max_mb}")
    known = SWEEP_WORKLOADS[a.sweep] if a.sweep else WORKLOADS
    only = [w for w in a.only.split(",") if w]
    unknown = [w for w in only if w not in known]
    if unknown:
        p.error(f"--only: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    if a.list:
        print(sweep_listing(a.sweep, a.sweep_max_mb, only), end="")
        return
    if torch is None:
        p.error(f"PyTorch and Triton are needed to measure: {IMPORT_ERROR}")
    if a.sweep and a.rep_ms == REP_MS:
        a.rep_ms = SWEEP_REP_MS
    if not torch.cuda.is_available():
        p.error("no CUDA device: nothing to measure")
    env = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "sms": torch.cuda.get_device_properties(0).multi_processor_count,
        "timing": f"triton do_bench: 25 ms warm-up, {a.rep_ms} ms of repetitions, L2 flushed before each, median",
        "sizes": f"sweep {a.sweep}" if a.sweep else "quick" if a.quick else "standard",
        "sweep_max_mb": a.sweep_max_mb,
    }
    print(json.dumps(env), flush=True)
    run = Run(a.rep_ms, a.multisum_compile, a.json, env)
    if a.sweep:
        copy(run, **STANDARD[0][1])
        sweep(run, sweep_cases(a.sweep, a.sweep_max_mb), only, DTYPES, rel_err, autotune=not a.no_autotune)
    for name, params in [] if a.sweep else QUICK if a.quick else STANDARD:
        if not only or name in only:
            WORKLOADS[name](run, **params)
            run.save()
    run.save()
    if a.json:
        print(f"wrote {len(run.rows)} rows to {a.json}")


if __name__ == "__main__":
    main()
