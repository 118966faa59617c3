# Times variants of braze's fused cross-entropy row kernel of gpt2_step (its loss and logit
# gradients, 16384 rows of 50304 bf16 logits) beside torch.compile of the same math, on the GPU
# machine. `ce.cu` beside this file is the kernel as `braze compile-time gpt2_step --no-nvrtc
# --dump DIR` writes it (row_eq_and_sum_max_bf16_*.cu). Variants: class ids computed from the
# column instead of loaded (`iota`), fast exp and division (`fast`).
#   python3 cross_entropy.py [KERNEL.cu [base]]   # `base`: time the kernel as generated only
import ctypes, glob, json, os, re, sys
import torch
cuda = ctypes.CDLL("libcuda.so.1")
nvrtc = ctypes.CDLL(glob.glob("/usr/local/cuda/lib64/libnvrtc.so.1*")[0])
def chk(rc, what):
    if rc != 0: raise RuntimeError(f"{what}: {rc}")
def compile(src, name):
    prog = ctypes.c_void_p()
    chk(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None), "create")
    opts = [b"--gpu-architecture=sm_90", b"--include-path=/usr/local/cuda/include", b"-std=c++17"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t(); nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n)); log = ctypes.create_string_buffer(n.value); nvrtc.nvrtcGetProgramLog(prog, log)
    chk(rc, "compile " + log.value.decode()[-2000:])
    nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(n)); buf = ctypes.create_string_buffer(n.value); nvrtc.nvrtcGetCUBIN(prog, buf)
    mod = ctypes.c_void_p(); chk(cuda.cuModuleLoadData(ctypes.byref(mod), buf), "load")
    f = ctypes.c_void_p(); chk(cuda.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()), "getfunc")
    return f
HERE = os.path.dirname(__file__)
src0 = open(sys.argv[1] if len(sys.argv) > 1 else f"{HERE}/ce.cu").read()
VARIANTS = [dict()] if len(sys.argv) > 2 and sys.argv[2] == "base" else [dict(), dict(iota=True), dict(fast=True), dict(iota=True, fast=True)]
name = re.search(r'__global__ void __launch_bounds__\(\d+\) (\w+)\(', src0).group(1)
def variant(iota=False, fast=False):
    s = src0
    if iota:
        s = re.sub(r"load_i32x4\(in1 \+ col0, v1_l\);\s*load_i32x4\(in1 \+ \(col0 \+ 4u\), v1_l \+ 4u\);",
                   "for (int q = 0; q < 8; ++q) v1_l[q] = (int)(col0 + q);", s)
    if fast:
        s = s.replace("expf(", "__expf(").replace("const float v14 = v12 / v13;", "const float v14 = __fdividef(v12, v13);")
    return s
R, V = 16384, 50304
torch.manual_seed(0)
tg = torch.randint(0, V, (R,), device="cuda", dtype=torch.int32)
cls = torch.arange(V, device="cuda", dtype=torch.int32)
ones = torch.ones(R, device="cuda", dtype=torch.uint8)
x = torch.randn(R, V, device="cuda", dtype=torch.bfloat16) * 3
g = torch.full((1,), 1.0 / R, device="cuda", dtype=torch.float32)
out = torch.empty_like(x); loss = torch.empty(R, device="cuda", dtype=torch.float32)
def bench(go, iters=10):
    go(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = 1e9
    for _ in range(3):
        s.record()
        for _ in range(iters): go()
        e.record(); torch.cuda.synchronize(); best = min(best, s.elapsed_time(e) * 1e3 / iters)
    return best
ref = None
for kw in VARIANTS:
    f = compile(variant(**kw), name)
    ptrs = [ctypes.c_uint64(t.data_ptr()) for t in (tg, cls, ones, x, ones, g, out, loss)]
    params = (ctypes.c_void_p * len(ptrs))(*[ctypes.cast(ctypes.byref(p), ctypes.c_void_p) for p in ptrs])
    go = lambda: chk(cuda.cuLaunchKernel(f, R, 1, 1, 1024, 1, 1, 0, None, params, None), "launch")
    us = bench(go)
    o = out.float().clone()
    if ref is None: ref = o
    print(json.dumps(dict(cfg=kw, us=us, gbps=(2 * R * V * 2) / us / 1e3, max_diff=(o - ref).abs().max().item())), flush=True)
# torch: the same math (softmax - onehot) * g, and logsumexp, eager and compiled
def tfn(x, tg):
    lse = torch.logsumexp(x.float(), 1, keepdim=True)
    p = torch.exp(x.float() - lse)
    p.scatter_add_(1, tg.long()[:, None], -torch.ones(R, 1, device="cuda"))
    return (p * g).to(torch.bfloat16), lse
cf = torch.compile(tfn)
print(json.dumps(dict(torch_compile_us=bench(lambda: cf(x, tg)))), flush=True)
