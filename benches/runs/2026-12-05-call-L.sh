#!/usr/bin/env bash
# One device call: mlp_step's every kernel timed (default) and every autotune candidate's time
# (BRAZE_LOG=autotune), beside torch.compile from the same weights; eager multisum after eager
# plans stopped consulting the autotune store.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== torch_train.py --variants compile"
  timeout 90 python3 .stage/torch_train.py --write "$w/mlp" --variants compile --rep-ms 100 2>&1 | grep -v "^#" | tail -n 2
  echo "== BRAZE_LOG=autotune braze bench --only mlp_step"; date -u
  BRAZE_LOG=autotune timeout 200 .stage/bin/braze bench --only mlp_step --torch-weights "$w/mlp" --rep-ms 100 > "$out/mlp-full.log" 2>&1
  grep -E "^mlp_step|kernels alone" "$out/mlp-full.log" | head -n 12; date -u
  echo "== braze bench --only multisum --no-autotune"
  timeout 100 .stage/bin/braze bench --only multisum --no-autotune 2>&1 | grep -E "^multisum.*eager" | head -n 4
} > "$out/summary.log" 2>&1
cat "$out/summary.log"
