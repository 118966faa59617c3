# Variants of the dumped braze attention forward kernel, by substitution of its constants.
import re
EX2 = '__device__ __forceinline__ float ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }\n'
def fwd_variant(src, kt=64, mt=2, warps=4, ftz=False, seq=1024, dim=64, minblocks=0):
    rows = warps * 16 * mt
    s = src
    s = s.replace("ROWS = 128,", f"ROWS = {rows},").replace("KT = 64,", f"KT = {kt},").replace("MT = 2,", f"MT = {mt},")
    s = s.replace("const int tiles = 8;", f"const int tiles = {seq // rows};")
    s = re.sub(r"__launch_bounds__\(\d+\)", f"__launch_bounds__({warps*32}{', ' + str(minblocks) if minblocks else ''})", s)
    if ftz:
        s = s.replace("typedef unsigned idx_t;", EX2 + "typedef unsigned idx_t;", 1).replace("exp2f(", "ex2(")
    stride = dim + 8
    shared = (rows + 2 * kt * 2) * stride * 2
    return s, dict(grid=192 * (seq // rows), block=warps * 32, shared=shared)

def bwd_variant(src, kind, wt=64, mt=1, warps=4, ftz=False, stages=1, seq=1024, dim=64, minblocks=0):
    rows = warps * 16 * mt
    s = src
    s = re.sub(r"ROWS = \d+,", f"ROWS = {rows},", s)
    s = re.sub(r"WT = \d+,", f"WT = {wt},", s)
    s = re.sub(r"MT = \d+,", f"MT = {mt},", s)
    s = re.sub(r"const int tiles = \d+;", f"const int tiles = {seq // rows};", s)
    s = re.sub(r"__launch_bounds__\(\d+\)", f"__launch_bounds__({warps*32}{', ' + str(minblocks) if minblocks else ''})", s)
    if ftz:
        s = s.replace("typedef unsigned idx_t;", EX2 + "typedef unsigned idx_t;", 1).replace("exp2f(", "ex2(")
    stride = dim + 8
    per_stage = 2 * wt * stride * 2 + (0 if kind == "dq" else 2 * wt * 4)
    shared = 2 * rows * stride * 2 + stages * per_stage
    return s, dict(grid=192 * (seq // rows), block=warps * 32, shared=shared)
