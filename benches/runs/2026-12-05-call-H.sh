#!/usr/bin/env bash
# One device call: the GPU busy tests (the prefetch test with its batches made beforehand; the
# new test that batches land at a few addresses and replay as graphs) and the GPU smoke tests (an
# eager op compiles once for every size); the busy gpt2_step loops beside PyTorch's, now that the
# prefetcher lands batches in the buffers of earlier ones; multisum with eager K=2000 beside
# PyTorch's.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== gpu_busy tests"; timeout 40 .stage/bin/gpu_busy 2>&1 | grep -E "^test |panicked|enqueued|replays|address|test result" -A2 | head -n 30
  echo "== gpu_smoke tests"; timeout 60 .stage/bin/gpu_smoke 2>&1 | grep -E "^test |panicked|test result" -A2 | head -n 30
  echo "== braze bench --only busy_gpt2"
  timeout 100 .stage/bin/braze bench --only busy_gpt2 --json "$out/braze-busy.json" 2>&1 | grep -E "loop +[0-9]|info gaps" | head -n 6
  echo "== torch_busy.py --model gpt2"
  timeout 70 python3 .stage/torch_busy.py --model gpt2 --steps 100 --json "$out/torch-busy.json" 2>&1 | grep -E '^\{' | tail -n 2
} > "$out/busy.log" 2>&1
cat "$out/busy.log"
{ echo "== braze bench --only multisum --no-autotune"
  timeout 120 .stage/bin/braze bench --only multisum --no-autotune --json "$out/braze-multisum.json" 2>&1 | grep -E "^multisum" | head -n 8
  echo "== torch_baseline.py --only multisum"; timeout 60 python3 .stage/torch_baseline.py --only multisum 2>&1 | grep -E "^multisum" | head -n 6
} > "$out/multisum.log" 2>&1
cat "$out/multisum.log"
