# Times braze's generated attention kernels of two builds, and variants of them, beside torch SDPA
# on the GPU machine (NVRTC and the driver through ctypes; PyTorch allocates and checks).
#
#   braze compile-time gpt2_step --no-nvrtc --dump DIR     # here, once per build
#   copy DIR's attention_causal_bf16_*.cu, attention_backward_dq_bf16_*.cu and
#   attention_backward_dk_dv_bf16_*.cu into src/ (one build) and src2/ (the other) beside this file
#   python3 attention.py [all | torch | ncu]                # there; one JSON line per kernel
#
# Variants (variants.py) change only constants a kernel's copies do not depend on (launch
# bounds); configs themselves are timed by the autotuner (`BRAZE_LOG=autotune`).
import glob, json, os, sys
import torch
sys.path.insert(0, os.path.dirname(__file__))
from variants import fwd_variant, bwd_variant
HERE = os.path.dirname(__file__)
from driver import bench, launcher, name_of  # noqa: E402
torch.manual_seed(0)
BH, T, D = 192, 1024, 64
q, k, v, do = [torch.randn(16, 12, T, D, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
mode = sys.argv[1] if len(sys.argv) > 1 else "all"
res = {}
flops_f = 4 * BH * T * T * D / 2
if mode in ("all", "torch"):
    qr, kr, vr = [x.clone().requires_grad_() for x in (q, k, v)]
    o_ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
    o_ref.backward(do)
    refs_dq, refs_dk, refs_dv = qr.grad.clone(), kr.grad.clone(), vr.grad.clone()
    o2 = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
    res["sdpa_bwd_us"] = bench(lambda: torch.autograd.grad(o2, (qr, kr, vr), do, retain_graph=True), 10)
    res["sdpa_fwd_us"] = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    def fb():
        o = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=True); o.backward(do)
    res["sdpa_fwdbwd_us"] = bench(fb, 10)
    print(json.dumps(res), flush=True)
    if mode == "torch": sys.exit()
def srcs(d):
    return [open(glob.glob(f"{HERE}/{d}/{n}_bf16_*.cu")[0]).read() for n in ("attention_causal", "attention_backward_dq", "attention_backward_dk_dv")]
SRC = {"old": srcs("src"), "new": srcs("src2")}
out = torch.empty_like(q); lse = torch.empty(BH, T, device="cuda", dtype=torch.float32)
fvars = [("old", {}), ("new", {}), ("new", dict(minblocks=2))]
if mode == "ncu":
    fvars = [("new", {})]
    qr, kr, vr = [x.clone().requires_grad_() for x in (q, k, v)]
    o_ = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=True); o_.backward(do); torch.cuda.synchronize()
for which, kw in fvars:
    src, l = fwd_variant(SRC[which][0], **kw)
    out.fill_(float("nan"))
    go = launcher(src, name_of(src), l, [q, k, v, out, lse]); go(); torch.cuda.synchronize()
    err = (out.float() - o_ref.float()).abs().max().item() if mode != "ncu" else -1
    us = bench(go) if mode != "ncu" else -1
    print(json.dumps(dict(kernel="fwd", src=which, cfg=kw, us=us, tflops=flops_f / us / 1e6, max_err=err)), flush=True)
src, l = fwd_variant(SRC["old"][0]); go = launcher(src, name_of(src), l, [q, k, v, out, lse]); go(); torch.cuda.synchronize()
delta = (do.float() * out.float()).sum(-1).reshape(BH, T).contiguous()
dq = torch.empty_like(q); dk = torch.empty_like(q); dv = torch.empty_like(q)
bvars = {"dq": [("old", {}), ("new", {}), ("new", dict(minblocks=4)), ("new", dict(minblocks=3))],
         "dkdv": [("old", {}), ("new", {}), ("new", dict(minblocks=3))]}
if mode == "ncu": bvars = {"dq": [("new", {})], "dkdv": [("new", {})]}
for kind, idx, st in (("dq", 1, 1), ("dkdv", 2, 2)):
    for which, kw in bvars[kind]:
        src, l = bwd_variant(SRC[which][idx], kind, stages=st, **kw)
        outs = [dq] if kind == "dq" else [dk, dv]
        for o_ in outs: o_.fill_(float("nan"))
        go = launcher(src, name_of(src), l, [q, k, v, lse, delta, do] + outs); go(); torch.cuda.synchronize()
        if mode != "ncu":
            refs = [refs_dq] if kind == "dq" else [refs_dk, refs_dv]
            err = max((a.float() - b.float()).abs().max().item() for a, b in zip(outs, refs))
            us = bench(go)
        else: err = us = -1
        print(json.dumps(dict(kernel=kind, src=which, cfg=kw, us=us, max_err=err)), flush=True)
