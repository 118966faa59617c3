#!/usr/bin/env bash
# One device call: every GPU test of the busy, smoke and graph suites (graphs that do not hold
# their inputs, eager kernels compiled once for every size, skipped steps read without a sync, a
# pageable copy's log line); the busy gpt2_step loops beside PyTorch's naive and tuned loops; eager
# multisum after the shared module table; `braze demo` on the GPU; `braze train` with its loss
# curve.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  for t in gpu_graph gpu_busy gpu_smoke; do
    echo "== $t tests"; timeout 60 .stage/bin/$t 2>&1 | grep -E "^test |panicked|address|replays|not in the log|test result" -A3 | head -n 40
  done
} > "$out/tests.log" 2>&1
cat "$out/tests.log"
{ echo "== braze bench --only busy_gpt2"
  timeout 130 .stage/bin/braze bench --only busy_gpt2 --json "$out/braze-busy.json" 2>&1 | grep -E "loop +[0-9]|info gaps" | head -n 6
  echo "== torch_busy.py --model gpt2"
  timeout 130 python3 .stage/torch_busy.py --model gpt2 --steps 100 --json "$out/torch-busy.json" 2>&1 | grep -E '^\{' | tail -n 3
} > "$out/busy.log" 2>&1
cat "$out/busy.log"
{ echo "== braze bench --only multisum --no-autotune"
  timeout 100 .stage/bin/braze bench --only multisum --no-autotune --json "$out/braze-multisum.json" 2>&1 | grep -E "^multisum" | head -n 8
  echo "== torch_baseline.py --only multisum"; timeout 50 python3 .stage/torch_baseline.py --only multisum 2>&1 | grep -E "^multisum" | head -n 6
} > "$out/multisum.log" 2>&1
cat "$out/multisum.log"
{ echo "== braze train --device cuda --autocast bf16"
  timeout 60 .stage/bin/braze train --device cuda --autocast bf16 --n-layer 4 --n-head 4 --n-embd 256 \
    --block-size 64 --batch 64 --steps 400 --log-every 25 2>&1 | tail -n 4
  echo "== braze demo"; timeout 100 .stage/bin/braze demo 2>&1 | tail -n 40
} > "$out/train-demo.log" 2>&1
cat "$out/train-demo.log"
