#!/usr/bin/env bash
# One device call, each step alone on the GPU: GPT-2 beside PyTorch, mlp_step beside
# torch.compile, the new GPU tests, braze train.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== torch_gpt2.py --write"; timeout 170 python3 .stage/torch_gpt2.py --write "$w/gpt2" --json "$w/torch_gpt2.json" 2>&1 | tail -n 15
  echo "== braze gpt2-check"; timeout 60 .stage/bin/braze gpt2-check --torch-weights "$w/gpt2" 2>&1 | tail -n 15
  echo "== braze bench --only block_fwd,block_step,gpt2_step,attention"; timeout 150 .stage/bin/braze bench --only block_fwd,block_step,gpt2_step,attention --json "$out/braze.json" 2>&1 | grep -vE "^#" | tail -n 30
  echo "== torch_baseline.py --only attention"; timeout 60 python3 .stage/torch_baseline.py --only attention 2>&1 | tail -n 3
} > "$out/gpt2.log" 2>&1
{ echo "== torch_train.py --variants compile"; timeout 100 python3 .stage/torch_train.py --write "$w/mlp" --variants compile --rep-ms 100 2>&1 | grep -v "^#" | tail -n 5
  echo "== braze bench --only mlp_step"; timeout 80 .stage/bin/braze bench --only mlp_step --torch-weights "$w/mlp" --rep-ms 100 2>&1 | grep -vE "^#" | tail -n 10
} > "$out/train.log" 2>&1
{ for t in gpu_model_ops gpu_busy gpu_smoke; do echo "== $t"; timeout 100 .stage/bin/$t 2>&1 | grep -E "test |test result|panicked|FAILED|assert" | tail -n 40; done
  echo "== braze bench --only busy"; timeout 60 .stage/bin/braze bench --only busy 2>&1 | grep -vE "^#" | tail -n 12
  echo "== torch_busy.py"; timeout 60 python3 .stage/torch_busy.py 2>&1 | grep '^{' | tail -n 3
  echo "== braze train"; timeout 60 .stage/bin/braze train --device cuda --dtype bf16 --n-layer 4 --n-head 4 --n-embd 256 --block-size 64 --batch 64 --steps 400 2>&1 | tail -n 15
} > "$out/tests.log" 2>&1
