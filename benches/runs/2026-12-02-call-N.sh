#!/usr/bin/env bash
# One device call: the tensor-core attention backward checked (gpu_attention: every shape,
# dtype and candidate config against the oracle, outputs poisoned) and timed beside PyTorch's
# SDPA, and the GPT-2 workloads that use it.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== gpu_attention"; timeout 200 .stage/bin/gpu_attention 2>&1 | grep -E "^test |test result|panicked|FAILED|output [0-9]|worst|first" | tail -n 40
  echo "== braze bench --only attention,block_fwd,block_step,gpt2_step"
  timeout 200 .stage/bin/braze bench --only attention,block_fwd,block_step,gpt2_step --json "$out/braze.json" > "$out/bench.log" 2>&1
  grep -vE "^#   " "$out/bench.log" | tail -n 40; grep -E "^#   [a-z_]+ +[0-9]+ kernels" "$out/bench.log"
  echo "== torch_baseline.py --only attention"; timeout 60 python3 .stage/torch_baseline.py --only attention 2>&1 | tail -n 3
} > "$out/attn.log" 2>&1
tail -n 60 "$out/attn.log"
