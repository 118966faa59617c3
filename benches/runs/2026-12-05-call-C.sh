#!/usr/bin/env bash
# One device call (build with the pinned pool taking a new buffer before a busy one): where the braze gpt2_step loop's GPU waits (the largest gaps of its timeline
# and the host spans during them), beside the same loop with direct launches, and PyTorch's
# naive and tuned gpt2_step loops.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== braze bench --only busy_gpt2"; timeout 230 .stage/bin/braze bench --only busy_gpt2 --json "$out/braze-busy.json" 2>&1 | grep -vE "^#"
} > "$out/busy.log" 2>&1
{ echo "== torch_busy.py --model gpt2"; timeout 200 python3 .stage/torch_busy.py --model gpt2 --steps 100 --json "$out/torch-busy.json" 2>&1 | grep '^{'
} > "$out/torch-busy.log" 2>&1
grep -E "busy_gpt2" "$out/busy.log" | head -n 12; cat "$out/torch-busy.log"
