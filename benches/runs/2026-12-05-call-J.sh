#!/usr/bin/env bash
# One device call: the eager compile-once test in its own binary; mlp_step beside PyTorch eager
# and torch.compile from the same weights (default, reduce-overhead, max-autotune); the bf16
# GPT-2 check (logits and 50 steps against PyTorch's from the same weights) and gpt2_step beside
# torch.compile; attention beside SDPA.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== gpu_eager tests"; timeout 40 .stage/bin/gpu_eager 2>&1 | grep -E "^test |panicked|left|right|test result" | head -n 12
} > "$out/tests.log" 2>&1
cat "$out/tests.log"
{ echo "== torch_train.py --variants eager,compile"; date -u
  timeout 90 python3 .stage/torch_train.py --write "$w/mlp" --variants eager,compile --rep-ms 100 2>&1 | grep -v "^#" | tail -n 6
  echo "== braze bench --only mlp_step (default, reduce-overhead, max-autotune)"; date -u
  timeout 130 .stage/bin/braze bench --only mlp_step --torch-weights "$w/mlp" --rep-ms 100 --json "$out/braze-mlp.json" 2>&1 | grep -vE "^#   +[0-9]" | grep -E "^mlp_step|^#" | head -n 16
} > "$out/mlp.log" 2>&1
cat "$out/mlp.log"
{ echo "== torch_gpt2.py --only gpt2_step --write --autocast bf16"; date -u
  timeout 120 python3 .stage/torch_gpt2.py --only gpt2_step --write "$w/gpt2-bf16" --autocast bf16 2>&1 | tail -n 4
  echo "== braze gpt2-check (bf16 autocast)"; date -u; timeout 100 .stage/bin/braze gpt2-check --torch-weights "$w/gpt2-bf16" 2>&1 | tail -n 14
  echo "== braze bench --only gpt2_step --no-autotune"; date -u
  timeout 80 .stage/bin/braze bench --only gpt2_step --no-autotune --json "$out/braze-gpt2.json" 2>&1 | grep -E "^gpt2_step" | head -n 6
} > "$out/gpt2.log" 2>&1
cat "$out/gpt2.log"
{ echo "== torch_baseline.py --only attention"; date -u; timeout 40 python3 .stage/torch_baseline.py --only attention 2>&1 | tail -n 3
  echo "== braze bench --only attention --no-autotune"
  timeout 60 .stage/bin/braze bench --only attention --no-autotune 2>&1 | grep -E "^attention" | head -n 4; date -u
} > "$out/attention.log" 2>&1
cat "$out/attention.log"
