# Column kernels of mlp_step (dumped by `braze compile-time mlp_step --rows 8192 --hidden 1024
# --dtype bf16 --no-nvrtc --dump DIR`) alone on the GPU machine, in variants made by substitution:
# more blocks resident per SM (the launch bounds' minimum), more rows of loads in flight per
# thread, both; each timed after a dirty flush (a 256 MB write, as the step's producers leave L2)
# and after a clean one (a 256 MB read), beside the same sums compiled by torch.compile.
#   python3 columns.py DIR
import json, sys, os
import torch
sys.path.insert(0, os.path.dirname(__file__))
import dumped  # noqa: E402

FLUSH = torch.empty(64 << 20, dtype=torch.float32, device="cuda")


def timed(fn, clean, iters=40):
    fn(); torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for s, e in events:
        if clean:
            FLUSH.sum()
        else:
            FLUSH.zero_()
        s.record(); fn(); e.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) * 1e3 for s, e in events)[iters // 2]


def batch_subs(src, depth):
    """Rows of loads in flight per thread: `depth` instead of the kernel's own."""
    import re
    m = re.search(r"float ld\d+\[(\d+)\]\[", src)
    step = re.search(r"r0 \+= (\d+)u\) \{", src)
    rt = re.search(r"row_threads=(\d+)", src)
    if not (m and step and rt):
        return None
    old, rows = int(m.group(1)), int(rt.group(1))
    subs = [(f"[{old}][", f"[{depth}]["), (f"b < {old}u", f"b < {depth}u"),
            (f"r0 += {step.group(1)}u) {{", f"r0 += {rows * depth}u) {{")]
    return subs


def run(path, name, subs):
    src = open(path).read()
    for old, new in subs:
        src = src.replace(old, new)
    buffers, launches = dumped.parse(src)
    tensors = dumped.allocate(buffers)
    calls = []
    for entry, grid, block, shared, args in launches:
        f = dumped.compile(src, entry)
        ptrs = [dumped.ctypes.c_uint64(tensors[a].data_ptr()) for a in args]
        params = (dumped.ctypes.c_void_p * len(ptrs))(*[dumped.ctypes.cast(dumped.ctypes.byref(p), dumped.ctypes.c_void_p) for p in ptrs])
        calls.append((f, grid, block, shared, params, ptrs))

    def go():
        for f, grid, block, shared, params, _ in calls:
            dumped.chk(dumped.cuda.cuLaunchKernel(f, grid[0], grid[1], grid[2], block, 1, 1, shared, None, params, None), "launch")
    moved = sum(t.numel() * t.element_size() for n, t in tensors.items() if not n.startswith("scratch"))
    row = dict(kernel=os.path.basename(path), variant=name, mb=round(moved / 1e6, 1))
    for clean in (False, True):
        us = timed(go, clean)
        row["clean_us" if clean else "dirty_us"] = round(us, 2)
        row["clean_gbps" if clean else "dirty_gbps"] = round(moved / us / 1e3, 1)
    print(json.dumps(row), flush=True)


def torch_rows():
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = 64
    cases = [
        ("sum(0) bf16 8192x4096", lambda a: a.float().sum(0), [(8192, 4096, torch.bfloat16)]),
        ("sum(0) bf16 8192x1024", lambda a: a.float().sum(0), [(8192, 1024, torch.bfloat16)]),
        ("sum(0), sum(a*b, 0) bf16 x3 8192x1024",
         lambda a, b, c: (c.float().sum(0), (c.float() * (a.float() + b.float())).sum(0)),
         [(8192, 1024, torch.bfloat16)] * 3),
    ]
    for name, fn, shapes in cases:
        args = [torch.randn(r, c, device="cuda").to(dt) for r, c, dt in shapes]
        compiled = torch.compile(fn)
        for _ in range(3):
            compiled(*args)
        moved = sum(a.numel() * a.element_size() for a in args)
        row = dict(kernel="torch.compile " + name, mb=round(moved / 1e6, 1))
        for clean in (False, True):
            us = timed(lambda: compiled(*args), clean)
            row["clean_us" if clean else "dirty_us"] = round(us, 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    folder = sys.argv[1]
    for f in sorted(os.listdir(folder)):
        if not f.startswith("column_") or f.split("_")[-1] not in ("21.cu", "22.cu", "26.cu", "30.cu", "31.cu"):
            continue
        path = os.path.join(folder, f)
        src = open(path).read()
        variants = [("base", [])]
        variants.append(("4 blocks/SM", [("__launch_bounds__(256, 2)", "__launch_bounds__(256, 4)")]))
        for depth in (2, 4, 8):
            subs = batch_subs(src, depth)
            if subs:
                variants.append((f"depth {depth}", subs))
                variants.append((f"depth {depth}, 4 blocks/SM", subs + [("__launch_bounds__(256, 2)", "__launch_bounds__(256, 4)")]))
        for name, subs in variants:
            try:
                run(path, name, subs)
            except Exception as e:
                print(json.dumps(dict(kernel=f, variant=name, error=str(e)[:300])), flush=True)
    try:
        torch_rows()
    except Exception as e:
        print(json.dumps(dict(kernel="torch.compile", error=str(e)[:300])), flush=True)
