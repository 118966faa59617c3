#!/usr/bin/env bash
# One device call: the attention backward of one kernel (dq added from the key tiles' blocks)
# on the GPU: every attention candidate against the reference (default and deterministic
# plans), attention fwd/bwd beside SDPA, block_step and gpt2_step beside torch.compile (default
# mode only), and the bf16-autocast 50-step loss curve from nanoGPT's weights.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== gpu_attention"; timeout 220 .stage/bin/gpu_attention 2>&1 | grep -E "^test |test result|panicked|FAILED" | tail -n 20
} > "$out/attention-tests.log" 2>&1
{ echo "== braze bench --only attention,block_step,gpt2_step --no-autotune"
  timeout 150 .stage/bin/braze bench --only attention,block_step,gpt2_step --no-autotune --json "$out/braze.json" 2>&1 |
    tee "$out/kernels.log" | grep -vE "^#   +[0-9]" | tail -n 40
  echo "== torch_baseline.py --only attention"; timeout 60 python3 .stage/torch_baseline.py --only attention --json "$w/torch-att.json" 2>&1 | tail -n 3
  echo "== torch_gpt2.py --only block_step,gpt2_step"; timeout 120 python3 .stage/torch_gpt2.py --only block_step,gpt2_step --json "$w/torch-gpt2.json" 2>&1 | tail -n 6
} > "$out/gpt2.log" 2>&1
python3 .stage/compare.py "$out/braze.json" "$w/torch-att.json" > "$out/compare.txt" 2>&1
{ echo "== torch_gpt2.py --write --autocast bf16 --no-time"
  timeout 100 python3 .stage/torch_gpt2.py --only gpt2_step --write "$w/g16" --autocast bf16 --no-time 2>&1 | tail -n 3
  echo "== braze gpt2-check (bf16 autocast)"; timeout 120 .stage/bin/braze gpt2-check --torch-weights "$w/g16" 2>&1 | tail -n 25
} > "$out/check.log" 2>&1
tail -n 12 "$out/attention-tests.log"; grep -vE "^#" "$out/gpt2.log" | tail -n 30; cat "$out/compare.txt" | tail -n 20; tail -n 12 "$out/check.log"
