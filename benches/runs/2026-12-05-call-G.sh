#!/usr/bin/env bash
# One device call: the GPU busy tests (the prefetch test with four long matmuls a step, each
# step's host time reported); mlp_step beside PyTorch eager and torch.compile from the same
# weights, default and max-autotune (call E's torch.compile was slower than eager); the busy
# gpt2_step loops beside
# PyTorch's.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== gpu_busy tests"; timeout 60 .stage/bin/gpu_busy 2>&1 | grep -E "^test |panicked|enqueued|test result" -A2 | head -n 30
} > "$out/busy-tests.log" 2>&1
cat "$out/busy-tests.log"
{ echo "== torch_train.py --variants eager,compile"
  timeout 100 python3 .stage/torch_train.py --write "$w/mlp" --variants eager,compile --rep-ms 100 2>&1 | grep -v "^#" | tail -n 6
  echo "== braze bench --only mlp_step (default, reduce-overhead, max-autotune)"
  timeout 150 .stage/bin/braze bench --only mlp_step --torch-weights "$w/mlp" --rep-ms 100 --json "$out/braze-mlp.json" 2>&1 | grep -vE "^#   +[0-9]" | grep -E "^mlp_step|^#" | head -n 16
} > "$out/mlp.log" 2>&1
cat "$out/mlp.log"
{ echo "== braze bench --only busy_gpt2"
  timeout 130 .stage/bin/braze bench --only busy_gpt2 --json "$out/braze-busy.json" 2>&1 | grep -E "loop +[0-9]|info gaps" | head -n 6
  echo "== torch_busy.py --model gpt2"
  timeout 100 python3 .stage/torch_busy.py --model gpt2 --steps 100 --json "$out/torch-busy.json" 2>&1 | grep -E '^\{' | tail -n 2
} > "$out/busy.log" 2>&1
cat "$out/busy.log"
