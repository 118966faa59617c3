#!/usr/bin/env bash
# One device call: the GPU busy tests (the prefetch test now times a loop whose pool is already
# pinned); gpt2_step after the wider recompute beside torch.compile, with the bf16-autocast GPT-2
# check (logits and a 50-step loss curve against PyTorch's from the same weights); attention
# again beside SDPA (call E's SDPA forward and backward took 571 us where run B's took 377).
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== gpu_busy tests"; timeout 60 .stage/bin/gpu_busy 2>&1 | grep -E "^test |panicked|enqueued|test result" -A2 | head -n 30
} > "$out/busy.log" 2>&1
cat "$out/busy.log"
{ echo "== torch_gpt2.py --only gpt2_step --write --autocast bf16"
  timeout 150 python3 .stage/torch_gpt2.py --only gpt2_step --write "$w/gpt2-bf16" --autocast bf16 2>&1 | tail -n 4
  echo "== braze gpt2-check (bf16 autocast)"; timeout 120 .stage/bin/braze gpt2-check --torch-weights "$w/gpt2-bf16" 2>&1 | tail -n 14
  echo "== braze bench --only gpt2_step --no-autotune"
  timeout 100 .stage/bin/braze bench --only gpt2_step --no-autotune --json "$out/braze-gpt2.json" 2>&1 | grep -E "^gpt2_step" | head -n 6
} > "$out/gpt2.log" 2>&1
cat "$out/gpt2.log"
{ echo "== torch_baseline.py --only attention"; timeout 50 python3 .stage/torch_baseline.py --only attention 2>&1 | tail -n 3
  echo "== braze bench --only attention --no-autotune"
  timeout 70 .stage/bin/braze bench --only attention --no-autotune 2>&1 | grep -E "^attention" | head -n 4
} > "$out/attention.log" 2>&1
cat "$out/attention.log"
