#!/usr/bin/env bash
# One device call: the busy gpt2_step loops after the pinned pool's fix (a busy buffer is taken
# back only once the pool has pinned its capacity), beside PyTorch's two loops; the GPU busy
# tests; attention forward and backward beside SDPA.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== gpu_busy tests"; timeout 60 .stage/bin/gpu_busy 2>&1 | tail -n 12
  echo "== braze bench --only busy_gpt2"
  timeout 200 .stage/bin/braze bench --only busy_gpt2 --json "$out/braze-busy.json" 2>&1 | grep -vE "^#"
  echo "== torch_busy.py --model gpt2"
  timeout 150 python3 .stage/torch_busy.py --model gpt2 --steps 100 --json "$out/torch-busy.json" 2>&1 | grep -E '^\{|Error|error' | tail -n 6
} > "$out/busy.log" 2>&1
{ echo "== braze bench --only attention --no-autotune"
  timeout 80 .stage/bin/braze bench --only attention --no-autotune --json "$out/braze-att.json" 2>&1 | grep -vE "^#"
  echo "== torch_baseline.py --only attention"; timeout 60 python3 .stage/torch_baseline.py --only attention 2>&1 | tail -n 4
} > "$out/attention.log" 2>&1
cat "$out/busy.log"; grep -E "^attention|^==|torch" "$out/attention.log" | tail -n 14
