#!/usr/bin/env bash
# One device call: mlp_step beside torch.compile from the same weights with the narrow GELU
# only where no exact Gaussian shares the kernel (the forward GELUs), every kernel timed; the GPU
# smoke and eager tests.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== torch_train.py --variants compile"
  timeout 90 python3 .stage/torch_train.py --write "$w/mlp" --variants compile --rep-ms 100 2>&1 | grep -v "^#" | tail -n 2
  echo "== braze bench --only mlp_step"; date -u
  timeout 150 .stage/bin/braze bench --only mlp_step --torch-weights "$w/mlp" --rep-ms 100 > "$out/mlp-full.log" 2>&1
  grep -E "^mlp_step|kernels alone" "$out/mlp-full.log" | head -n 8
  grep -E "^#  +[0-9].*(gelu|column)" "$out/mlp-full.log" | head -n 20; date -u
  for t in gpu_smoke gpu_eager; do
    echo "== $t tests"; timeout 60 .stage/bin/$t 2>&1 | grep -E "^test .*FAILED|panicked|test result" -A3 | head -n 20
  done
} > "$out/summary.log" 2>&1
cat "$out/summary.log"
