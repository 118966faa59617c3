#!/usr/bin/env bash
# One device call: mlp_step after the recompute pass's wider rule (a layer norm's normalized
# value recomputed from x + y in bf16, gelu(h) recomputed beside its gradient, the loss reduced
# apart from the gradients' checks) beside torch.compile from the same weights, its peak memory
# against PyTorch's; gpt2_step beside torch.compile; the bf16-autocast GPT-2 check (logits and
# a 50-step loss curve against PyTorch's).
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== torch_train.py --variants eager,compile"
  timeout 120 python3 .stage/torch_train.py --write "$w/mlp" --variants eager,compile --rep-ms 100 2>&1 | grep -v "^#" | tail -n 6
  echo "== braze bench --only mlp_step --no-autotune"
  timeout 150 .stage/bin/braze bench --only mlp_step --no-autotune --torch-weights "$w/mlp" --rep-ms 100 --json "$out/braze-mlp.json" 2>&1 | grep -vE "^#   +[0-9]" | tail -n 20
} > "$out/mlp.log" 2>&1
{ echo "== torch_gpt2.py --only gpt2_step --write --autocast bf16"
  timeout 150 python3 .stage/torch_gpt2.py --only gpt2_step --write "$w/gpt2-bf16" --autocast bf16 2>&1 | tail -n 4
  echo "== braze gpt2-check (bf16 autocast)"; timeout 120 .stage/bin/braze gpt2-check --torch-weights "$w/gpt2-bf16" 2>&1 | tail -n 14
  echo "== braze bench --only gpt2_step --no-autotune"
  timeout 100 .stage/bin/braze bench --only gpt2_step --no-autotune --json "$out/braze-gpt2.json" 2>&1 | grep -E "^gpt2_step" | head -n 6
} > "$out/gpt2.log" 2>&1
cat "$out/mlp.log"; cat "$out/gpt2.log"
