#!/usr/bin/env bash
# One short device call (the session's last minutes of device time): the busy gpt2_step loops in
# braze after the pinned pool's change (a new buffer before a busy one), with each loop's largest
# GPU gaps and the loop with direct launches.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/busy.log"
timeout 190 .stage/bin/braze bench --only busy_gpt2 --json "$out/braze-busy.json" 2>&1 | grep -vE "^#" >> "$out/busy.log"
grep -E "busy_gpt2|NVIDIA" "$out/busy.log" | head -n 12
