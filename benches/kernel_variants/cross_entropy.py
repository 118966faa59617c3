# Times variants of braze's fused cross-entropy row kernel of gpt2_step (its loss and logit
# gradients, 16384 rows of 50304 bf16 logits) beside torch.compile of the same math, on the GPU
# machine. `ce.cu` beside this file is the kernel as `braze compile-time gpt2_step --no-nvrtc
# --dump DIR` writes it (row_eq_and_sum_max_bf16_*.cu). Variants: class ids computed from the
# column instead of loaded (`iota`), fast exp and division (`fast`).
#   python3 cross_entropy.py [KERNEL.cu [base]]   # `base`: time the kernel as generated only
import json, os, re, sys
import torch
sys.path.insert(0, os.path.dirname(__file__))
from driver import bench, launcher, name_of  # noqa: E402
HERE = os.path.dirname(__file__)
src0 = open(sys.argv[1] if len(sys.argv) > 1 else f"{HERE}/ce.cu").read()
VARIANTS = [dict()] if len(sys.argv) > 2 and sys.argv[2] == "base" else [dict(), dict(iota=True), dict(fast=True), dict(iota=True, fast=True)]
name = name_of(src0)
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
ref = None
for kw in VARIANTS:
    go = launcher(variant(**kw), name, dict(grid=R, block=1024, shared=0), [tg, cls, ones, x, ones, g, out, loss])
    us = bench(go, 10)
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
print(json.dumps(dict(torch_compile_us=bench(lambda: cf(x, tg), 10))), flush=True)
