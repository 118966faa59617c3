# Times kernels as `braze compile-time WORKLOAD --no-nvrtc --dump DIR` (or BRAZE_DUMP) writes
# them, alone, on the GPU machine: the header's buffers are allocated (float inputs random,
# integer inputs zero, scratch zeroed), each launch line is run in order, and the time and the
# bandwidth over the kernel's input and output bytes are printed as JSON, one line a kernel.
# Kernels that take tables (multi-reduce work lists, gather tables) are skipped.
#   python3 dumped.py KERNEL.cu... [--sub 'OLD=>NEW']...   # --sub: a textual variant of each kernel
import json, re, sys, ctypes
import torch
sys.path.insert(0, __import__("os").path.dirname(__file__))
from driver import chk, compile, cuda  # noqa: E402

FLUSH = None


def bench_flushed(fn, iters=40):
    """Median time of `fn` in microseconds, L2 flushed (a 256 MB write) before each run."""
    global FLUSH
    if FLUSH is None:
        FLUSH = torch.empty(64 << 20, dtype=torch.float32, device="cuda")
    fn(); torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for s, e in events:
        FLUSH.zero_()
        s.record(); fn(); e.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) * 1e3 for s, e in events)[iters // 2]

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i32": torch.int32,
          "i64": torch.int64, "bool": torch.bool, "u8": torch.uint8}


def parse(src):
    buffers, launches = {}, []
    for m in re.finditer(r"^//   ((?:in|out)\d+) = b\d+: (\d+) x (\w+)", src, re.M):
        buffers[m.group(1)] = ("tensor", int(m.group(2)), m.group(3))
    for m in re.finditer(r"^//   (scratch\d+): (\d+) bytes", src, re.M):
        buffers[m.group(1)] = ("scratch", int(m.group(2)), "u8")
    for m in re.finditer(r"^//   (\w+)<<<\(?([\d, ]+)\)?, (\d+), (\d+)>>>\(([^)]*)\)", src, re.M):
        grid = [int(x) for x in m.group(2).split(",")] + [1, 1]
        launches.append((m.group(1), grid[:3], int(m.group(3)), int(m.group(4)), [a.strip() for a in m.group(5).split(",")]))
    return buffers, launches


def allocate(buffers):
    tensors = {}
    for name, (kind, n, dt) in buffers.items():
        if kind == "scratch":
            tensors[name] = torch.zeros(n, dtype=torch.uint8, device="cuda")
        elif DTYPES[dt].is_floating_point:
            tensors[name] = torch.randn(n, device="cuda").to(DTYPES[dt])
        else:
            tensors[name] = torch.zeros(n, dtype=DTYPES[dt], device="cuda")
    return tensors


def run(path, subs):
    src = open(path).read()
    for old, new in subs:
        src = src.replace(old, new)
    buffers, launches = parse(src)
    if not launches or any(a not in buffers for l in launches for a in l[4]):
        print(json.dumps(dict(kernel=path, skipped="arguments other than in/out/scratch buffers")), flush=True)
        return
    tensors = allocate(buffers)
    calls = []
    for name, grid, block, shared, args in launches:
        f = compile(src, name)
        chk(cuda.cuFuncSetAttribute(f, 8, shared), "smem attr")
        ptrs = [ctypes.c_uint64(tensors[a].data_ptr()) for a in args]
        params = (ctypes.c_void_p * len(ptrs))(*[ctypes.cast(ctypes.byref(p), ctypes.c_void_p) for p in ptrs])
        calls.append((f, grid, block, shared, params, ptrs))

    def go():
        for f, grid, block, shared, params, _ in calls:
            chk(cuda.cuLaunchKernel(f, grid[0], grid[1], grid[2], block, 1, 1, shared, None, params, None), "launch")
    us = bench_flushed(go)
    moved = sum(t.numel() * t.element_size() for n, t in tensors.items() if not n.startswith("scratch"))
    print(json.dumps(dict(kernel=path.split("/")[-1], subs=[o for o, _ in subs], us=round(us, 2),
                          gbps=round(moved / us / 1e3, 1), mb=round(moved / 1e6, 1))), flush=True)


if __name__ == "__main__":
    paths, subs, args = [], [], sys.argv[1:]
    while args:
        a = args.pop(0)
        if a == "--sub":
            old, new = args.pop(0).split("=>")
            subs.append((old, new))
        else:
            paths.append(a)
    for p in paths:
        try:
            run(p, subs)
        except Exception as e:  # one kernel's failure must not hide the others' times
            print(json.dumps(dict(kernel=p, error=str(e)[:300])), flush=True)
