#!/usr/bin/env bash
# One device call, in order of need: the GPU busy tests; the busy gpt2_step loops after the
# pinned pool's fix beside PyTorch's two loops; mlp_step after the wider recompute beside
# torch.compile from the same weights (peak memory against PyTorch's); attention beside SDPA.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== gpu_busy tests"; timeout 60 .stage/bin/gpu_busy 2>&1 | tail -n 12
  echo "== braze bench --only busy_gpt2"
  timeout 150 .stage/bin/braze bench --only busy_gpt2 --json "$out/braze-busy.json" 2>&1 | grep -vE "^#"
  echo "== torch_busy.py --model gpt2"
  timeout 120 python3 .stage/torch_busy.py --model gpt2 --steps 100 --json "$out/torch-busy.json" 2>&1 | grep -E '^\{|Error|error' | tail -n 6
} > "$out/busy.log" 2>&1
cat "$out/busy.log"
{ echo "== torch_train.py --variants eager,compile"
  timeout 100 python3 .stage/torch_train.py --write "$w/mlp" --variants eager,compile --rep-ms 100 2>&1 | grep -v "^#" | tail -n 6
  echo "== braze bench --only mlp_step --no-autotune"
  timeout 100 .stage/bin/braze bench --only mlp_step --no-autotune --torch-weights "$w/mlp" --rep-ms 100 --json "$out/braze-mlp.json" 2>&1 | grep -vE "^#   +[0-9]" | tail -n 20
} > "$out/mlp.log" 2>&1
cat "$out/mlp.log"
{ echo "== braze bench --only attention --no-autotune"
  timeout 70 .stage/bin/braze bench --only attention --no-autotune --json "$out/braze-att.json" 2>&1 | grep -vE "^#"
  echo "== torch_baseline.py --only attention"; timeout 50 python3 .stage/torch_baseline.py --only attention 2>&1 | tail -n 4
} > "$out/attention.log" 2>&1
grep -E "^attention|^==|torch" "$out/attention.log" | tail -n 14
