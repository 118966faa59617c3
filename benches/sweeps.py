"""The sweeps of benches/workloads.md ("Sweeps") for torch_baseline.py --sweep: the same cases as
`braze bench --sweep` (crates/cli/src/bench/sweep.rs), with the same row keys, so compare.py joins
them. `sweep_cases` is pure (no PyTorch): `--list` prints what `braze bench --sweep ... --list`
prints.
"""
import math

HIDDEN_SIZES = [768, 1024, 2048, 3072, 4096, 5120, 8192, 50257]
DTYPES = ["f32", "bf16", "f16"]
SIZE = {"f32": 4, "bf16": 2, "f16": 2}
ROWS_MAX_MB = 400.0
LONG_ROWS = (64, 65536)
POINTWISE_ELEMENTS = [1 << 24, 1 << 26, 1 << 28]
POINTWISE_COLUMNS = 4096
EPS = 1e-5

# Row workloads: the full-size tensors a call reads and writes per row element.
ROW_OPS = {"ln_gelu_res": 3, "rms_silu_res": 3, "softmax_mask": 2}
BROADCASTS = {"row": "pw_row", "column": "pw_col", "outer": "pw_outer", "scalar": "pw_scalar"}
SWEEP_WORKLOADS = {"rows": list(ROW_OPS), "pointwise": list(BROADCASTS.values())}


def row_case(workload, rows, hidden, dtype):
    s = SIZE[dtype]
    full = rows * hidden * s
    inputs, nbytes = {
        "ln_gelu_res": ([[rows, hidden], [hidden], [hidden], [rows, hidden]], 3 * full + 2 * hidden * s),
        "rms_silu_res": ([[rows, hidden], [hidden], [rows, hidden]], 3 * full + hidden * s),
        "softmax_mask": ([[rows, hidden], [hidden]], 2 * full + hidden * s),
    }[workload]
    return {"workload": workload, "rows": rows, "cols": hidden, "dtype": dtype, "inputs": inputs, "bytes": nbytes}


def pointwise_case(workload, elements, dtype):
    cols = max(1, min(POINTWISE_COLUMNS, elements))
    rows = max(1, elements // cols)
    s = SIZE[dtype]
    full = rows * cols * s
    inputs, nbytes = {
        "pw_row": ([[rows, cols], [cols]], 2 * full + cols * s),
        "pw_col": ([[rows, cols], [rows, 1]], 2 * full + rows * s),
        "pw_outer": ([[rows, 1], [1, cols]], full + (rows + cols) * s),
        "pw_scalar": ([[rows, cols]], 2 * full),
    }[workload]
    return {"workload": workload, "rows": rows, "cols": cols, "dtype": dtype, "inputs": inputs, "bytes": nbytes}


def rows_within(bytes_per_row, max_bytes, limit):
    """The largest power of two rows (at least 1, at most limit) whose full-size tensors fit."""
    rows = 1
    while rows * 2 <= limit and rows * 2 * bytes_per_row <= max_bytes:
        rows *= 2
    return rows


def sweep_cases(kind, max_mb=None):
    """Every case of a sweep in run order, as sweep.rs's `sweep_cases` lists them."""
    cap = None if max_mb is None else max_mb * 1e6
    cases = []
    if kind == "rows":
        max_bytes = ROWS_MAX_MB * 1e6 if cap is None else min(cap, ROWS_MAX_MB * 1e6)
        for workload, tensors in ROW_OPS.items():
            for dtype in DTYPES:
                for hidden in HIDDEN_SIZES:
                    rows = rows_within(tensors * hidden * SIZE[dtype], max_bytes, math.inf)
                    cases.append(row_case(workload, rows, hidden, dtype))
                rows, hidden = LONG_ROWS
                if cap is not None:
                    rows = rows_within(tensors * hidden * SIZE[dtype], cap, rows)
                cases.append(row_case(workload, rows, hidden, dtype))
    else:
        for workload in BROADCASTS.values():
            for dtype in DTYPES:
                for elements in POINTWISE_ELEMENTS:
                    case = pointwise_case(workload, elements, dtype)
                    while cap is not None and case["bytes"] > cap and case["rows"] > 1:
                        case = pointwise_case(workload, case["rows"] * case["cols"] // 2, dtype)
                    if not cases or cases[-1] != case:  # a cap can shrink several sizes to one
                        cases.append(case)
    return cases


def shape_key(case):
    return f"{case['rows']}x{case['cols']}"


def sweep_listing(kind, max_mb=None, only=()):
    cases = [c for c in sweep_cases(kind, max_mb) if not only or c["workload"] in only]
    lines = [f"{c['workload']:20} {shape_key(c):12} {c['dtype']:5} {c['bytes'] / 1e6:>9.1f} MB  inputs "
             + " ".join("[" + ", ".join(map(str, s)) + "]" for s in c["inputs"]) for c in cases]
    total = sum(c["bytes"] for c in cases)
    return "\n".join(lines) + f"\n{len(cases)} cases, {total / 1e9:.1f} GB moved by one call of each\n"


# ---- the functions, in PyTorch (sweep_run.rs's, in braze) --------------------------------------

def _functions():
    import torch.nn.functional as F

    def chain(t):  # through each of exp, tanh, gelu (exact), sigmoid
        return F.gelu(t) * t.sigmoid() + t.tanh() * (t * -0.5).exp()

    return {
        "ln_gelu_res": lambda x, w, b, res: F.gelu(F.layer_norm(x, (x.shape[-1],), w, b, EPS)) + res,
        "rms_silu_res": lambda x, w, res: F.silu(F.rms_norm(x, (x.shape[-1],), w, EPS)) + res,
        "softmax_mask": lambda x, mask: (x + mask).softmax(-1),
        "pw_row": lambda x, b: chain(x * b),
        "pw_col": lambda x, b: chain(x * b),
        "pw_outer": lambda a, b: chain(a * b),
        "pw_scalar": lambda x: chain(x * 0.5),
    }


def sweep(run, cases, only, torch_dtypes, rel_err, autotune=True):
    """Times each case eager, torch.compile (default) and, with autotune, max-autotune-no-cudagraphs
    (cold_s: its first calls, the tuning included); rel_err against float64. `run`, `torch_dtypes`
    and `rel_err` are torch_baseline.py's."""
    import torch

    functions = _functions()
    modes = ["default"] + (["max-autotune-no-cudagraphs"] if autotune else [])
    print(f"# sweep: {len(cases)} cases, {run.rep_ms} ms of repetitions each", flush=True)
    for case in cases:
        workload, dtype = case["workload"], case["dtype"]
        if only and workload not in only:
            continue
        # Standard normals; a pointwise chain's second operand halved (exp(-0.5 t) stays finite in f16).
        scales = [0.5 if workload.startswith("pw_") and i == 1 else 1.0 for i in range(len(case["inputs"]))]
        args = tuple((torch.randn(*s, device="cuda") * k).to(torch_dtypes[dtype]) for s, k in zip(case["inputs"], scales))
        fn, shape, nbytes = functions[workload], shape_key(case), case["bytes"]
        run.emit(workload, shape, dtype, "eager", run.time_us(lambda: fn(*args)), nbytes)
        for mode in modes:
            compiled, cold = run.compile(fn, args, mode=mode)
            variant = "compile" if mode == "default" else f"compile {mode}"
            extra = {"cold_s": cold}
            if mode != "default":
                extra["tuning_s"] = cold
            run.emit(workload, shape, dtype, variant, run.time_us(lambda: compiled(*args)), nbytes,
                     rel_err=rel_err(compiled(*args), fn, args), **extra)
        del args
        torch.cuda.empty_cache()
        run.save()
