#!/usr/bin/env bash
# One device call on build 45bc9e6 (column reductions folded into row kernels' partials) beside
# the build before it (a087a1c, staged as braze-base) and PyTorch: mlp_step from the same
# weights with torch.compile's kernels profiled; the GPU tests of the new row kernels; gpt2_step
# and the bf16 GPT-2 check; a GPU fuzz range.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
s="$out/summary.log"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > "$s"
{ echo "== torch_train.py --variants compile --profile"; date -u
  timeout 90 python3 .stage/torch_train.py --write "$w/mlp" --variants compile --rep-ms 100 --profile > "$out/torch-mlp.log" 2>&1
  grep -E "^mlp_step|^# compile" "$out/torch-mlp.log"
  echo "== braze bench --only mlp_step (new)"; date -u
  timeout 100 .stage/bin/braze bench --only mlp_step --torch-weights "$w/mlp" --rep-ms 100 > "$out/mlp-new.log" 2>&1
  grep -E "^mlp_step|^3 steps|^#  +[a-z_]+ +[0-9]+ kernels|us  (row|column)_" "$out/mlp-new.log" | head -n 40
  echo "== braze-base bench --only mlp_step --no-autotune (a087a1c)"; date -u
  timeout 70 .stage/bin/braze-base bench --only mlp_step --no-autotune --torch-weights "$w/mlp" --rep-ms 100 > "$out/mlp-base.log" 2>&1
  grep -E "^mlp_step|^#  +[a-z_]+ +[0-9]+ kernels|us  (row|column|pointwise)_" "$out/mlp-base.log" | head -n 40
} >> "$s" 2>&1
{ date -u; for t in gpu_smoke conformance; do
    echo "== $t"; timeout 75 .stage/bin/$t 2>&1 | grep -E "^test .*FAILED|panicked|test result" -A3 | head -n 16
  done; } > "$out/tests.log" 2>&1
cat "$out/tests.log" >> "$s"
{ echo "== torch_gpt2.py --only gpt2_step --write --autocast bf16"; date -u
  timeout 100 python3 .stage/torch_gpt2.py --only gpt2_step --write "$w/gpt2" --autocast bf16 2>&1 | tail -n 3
  echo "== braze gpt2-check (new)"; date -u; timeout 60 .stage/bin/braze gpt2-check --torch-weights "$w/gpt2" 2>&1 | tail -n 6
  echo "== braze bench --only gpt2_step --no-autotune (new, then base)"; date -u
  timeout 50 .stage/bin/braze bench --only gpt2_step --no-autotune 2>&1 | grep -E "^gpt2_step|^#  +[a-z_]+ +[0-9]+ kernels" | head -n 12
  timeout 50 .stage/bin/braze-base bench --only gpt2_step --no-autotune 2>&1 | grep -E "^gpt2_step|^#  +[a-z_]+ +[0-9]+ kernels" | head -n 12
} > "$out/gpt2.log" 2>&1
cat "$out/gpt2.log" >> "$s"
{ date -u; echo "== GPU fuzz, 400 graphs from seed 101000000"
  BRAZE_FUZZ_SEED=101000000 BRAZE_FUZZ_GPU_GRAPHS=400 timeout 50 .stage/bin/fuzz --exact gpu_random_graphs_match_the_reference --nocapture 2>&1 | tail -n 12
  for t in gpu_graph gpu_eager gpu_busy; do
    echo "== $t"; timeout 40 .stage/bin/$t 2>&1 | grep -E "^test .*FAILED|panicked|test result" -A3 | head -n 10
  done; date -u; } > "$out/fuzz-tests.log" 2>&1
cat "$out/fuzz-tests.log" >> "$s"
cat "$s"
