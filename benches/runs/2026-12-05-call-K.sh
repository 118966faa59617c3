#!/usr/bin/env bash
# One device call: the GPU fuzz on a fresh seed range after this session's executor changes
# (captured graphs that read their inputs without holding them, functions shared device-wide);
# the GPU tests of eager ops, the busy loop, graphs and threads.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  for t in gpu_eager gpu_smoke gpu_busy gpu_graph gpu_threads; do
    echo "== $t tests"; timeout 60 .stage/bin/$t 2>&1 | grep -E "^test .*FAILED|panicked|test result" -A3 | head -n 20
  done
} > "$out/tests.log" 2>&1
cat "$out/tests.log"
echo "== fuzz gpu_random_graphs_match_the_reference (seeds from 91,000,000)" > "$out/fuzz.log"
BRAZE_FUZZ_SEED=91000000 BRAZE_FUZZ_GPU_GRAPHS=5000 timeout 330 .stage/bin/fuzz --exact \
  gpu_random_graphs_match_the_reference --nocapture >> "$out/fuzz.log" 2>&1; echo "exit status $?" >> "$out/fuzz.log"
grep -vE "^(  |graph|input|\})" "$out/fuzz.log" | tail -n 30
