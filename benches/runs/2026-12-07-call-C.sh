#!/usr/bin/env bash
# One device call: groups of 8 rows for the partials (TARGET_GROUPS 2048) against 45bc9e6's
# groups of 16 (staged as braze-base), mlp_step beside torch.compile from the same weights and
# gpt2_step, each build's row kernels listed.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  timeout 60 python3 .stage/torch_train.py --write "$w/mlp" --variants compile --rep-ms 100 2>&1 | grep -E "^mlp_step"
  for b in braze braze-base; do
    echo "== $b bench --only mlp_step --no-autotune"; date -u
    timeout 60 .stage/bin/$b bench --only mlp_step --no-autotune --torch-weights "$w/mlp" --rep-ms 100 > "$out/mlp-$b.log" 2>&1
    grep -E "braze (compiled|reduce)|^3 steps|^#  +[a-z_]+ +[0-9]+ kernels|us  (row|column)_" "$out/mlp-$b.log" | head -n 30
  done
  for b in braze braze-base; do
    echo "== $b bench --only gpt2_step --no-autotune"; date -u
    timeout 45 .stage/bin/$b bench --only gpt2_step --no-autotune > "$out/gpt2-$b.log" 2>&1
    grep -E "braze compiled|^#  +[a-z_]+ +[0-9]+ kernels" "$out/gpt2-$b.log" | head -n 12
    grep -E "us  row_" "$out/gpt2-$b.log" | head -n 8
  done; date -u
} > "$out/summary.log" 2>&1
cat "$out/summary.log"
