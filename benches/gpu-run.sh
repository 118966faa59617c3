#!/usr/bin/env bash
# Runs on the GPU machine from the repository root after benches/stage-gpu.sh staged .stage/.
# Order: conformance (plain, then under compute-sanitizer), braze benchmarks, then the PyTorch
# baselines right after on the same GPU, and a ratio table. Everything is logged under $OUT.
set -uo pipefail
out=${OUT:-.stage/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d)
export PYTHONUNBUFFERED=1
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
what=${1:-all}
if [ "$what" = all ] || [ "$what" = tests ]; then
  for t in .stage/bin/gpu_* .stage/bin/conformance; do
    [ -x "$t" ] || continue
    echo "== $t"
    "$t" --test-threads=4 2>&1 | tail -n 40 | tee -a "$out/tests.log" || status=1
  done
  if command -v compute-sanitizer >/dev/null && [ -x .stage/bin/conformance ]; then
    for tool in memcheck racecheck; do
      echo "== compute-sanitizer --tool $tool conformance"
      compute-sanitizer --tool "$tool" --error-exitcode 9 .stage/bin/conformance --test-threads=1 sanitizer_ \
        > "$out/sanitizer-$tool.log" 2>&1
      echo "exit $? ($tool)"; tail -n 5 "$out/sanitizer-$tool.log"
    done
  fi
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  .stage/bin/braze bench --json "$out/braze.json" 2>&1 | tee "$out/bench.log" || status=1
  python3 .stage/torch_anchors.py --json "$out/torch.json" 2>&1 | tee "$out/torch.log" || status=1
  python3 .stage/compare.py "$out/braze.json" "$out/torch.json" | tee "$out/compare.txt"
fi
exit $status
