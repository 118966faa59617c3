#!/usr/bin/env bash
# One device call: the GPU fuzz on a fresh seed range after this session's executor changes
# (captured graphs that read their inputs without holding them, functions shared device-wide);
# eager multisum after eager plans stopped consulting the autotune store; the eager test.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== gpu_eager tests"; timeout 40 .stage/bin/gpu_eager 2>&1 | grep -E "^test |panicked|left|right|test result" | head -n 12
  echo "== braze bench --only multisum --no-autotune"
  timeout 100 .stage/bin/braze bench --only multisum --no-autotune 2>&1 | grep -E "^multisum.*eager" | head -n 4
  echo "== torch_baseline.py --only multisum"; timeout 50 python3 .stage/torch_baseline.py --only multisum 2>&1 | grep -E "^multisum.*eager" | head -n 3
} > "$out/eager.log" 2>&1
cat "$out/eager.log"
echo "== fuzz gpu_random_graphs_match_the_reference (seeds from 91,000,000)" > "$out/fuzz.log"
BRAZE_FUZZ_SEED=91000000 BRAZE_FUZZ_GPU_GRAPHS=5000 timeout 330 .stage/bin/fuzz --exact \
  gpu_random_graphs_match_the_reference --nocapture >> "$out/fuzz.log" 2>&1; echo "exit status $?" >> "$out/fuzz.log"
grep -vE "^(  |graph|input|\})" "$out/fuzz.log" | tail -n 30
