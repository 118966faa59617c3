#!/usr/bin/env bash
# One device call, in order of need, each step bounded in time: a GPU fuzz range; mlp_step
# beside torch.compile from the same weights (PyTorch after braze, not first on a fresh
# machine); gpt2_step beside torch.compile; the rows sweep in default mode (cases capped at
# 100 MB) beside PyTorch eager and torch.compile default; then what time is left, the previous
# build (braze-base, 10351fa) on mlp_step and gpt2_step. The build: residual prefetch in row
# kernels, the occupancy hint's new rule (plain launch bounds where dropped, one block an SM
# where that spills too; a kernel at its cap keeps the hint only if it needs at most an eighth
# more left to itself and fits no more blocks), softmax by one reciprocal a row, gelu_tanh as
# PyTorch computes it (0.5 x (1 + tanh(u)): its backward kernel evaluates one tanh an element,
# 1128 instructions a thread where it had 1984, by the SASS of its cubin).
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
s="$out/summary.log"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > "$s"
{ echo "== GPU fuzz, 150 graphs from seed 105000000"
  BRAZE_FUZZ_SEED=105000000 BRAZE_FUZZ_GPU_GRAPHS=150 timeout 35 .stage/bin/fuzz --exact gpu_random_graphs_match_the_reference --nocapture 2>&1 | tail -n 8
  echo "== torch_train.py --write (eager, weights and first steps)"; date -u
  timeout 40 python3 .stage/torch_train.py --write "$w/mlp" --variants eager --rep-ms 20 > "$out/torch-mlp-0.log" 2>&1
  grep -E "^mlp_step" "$out/torch-mlp-0.log"
  echo "== braze bench --only mlp_step --no-autotune"; date -u
  timeout 75 .stage/bin/braze bench --only mlp_step --no-autotune --torch-weights "$w/mlp" --rep-ms 200 > "$out/mlp-braze.log" 2>&1
  grep -E "^mlp_step|^3 steps|^#  +[a-z_]+ +[0-9]+ kernels" "$out/mlp-braze.log" | head -n 24
  echo "== torch_train.py --variants compile"; date -u
  timeout 60 python3 .stage/torch_train.py --variants compile --rep-ms 200 > "$out/torch-mlp.log" 2>&1
  grep -E "^mlp_step" "$out/torch-mlp.log"
  echo "== torch_gpt2.py --only gpt2_step --autocast bf16"; date -u
  timeout 80 python3 .stage/torch_gpt2.py --only gpt2_step --autocast bf16 > "$out/torch-gpt2.log" 2>&1; tail -n 3 "$out/torch-gpt2.log"
  echo "== braze bench --only gpt2_step --no-autotune"; date -u
  timeout 45 .stage/bin/braze bench --only gpt2_step --no-autotune > "$out/gpt2-braze.log" 2>&1
  grep -E "^gpt2_step|^#  +[a-z_]+ +[0-9]+ kernels" "$out/gpt2-braze.log" | head -n 12
} >> "$s" 2>&1
args=(--sweep rows --sweep-max-mb 100)
{ echo "== braze bench ${args[*]} --no-autotune"; date -u
  timeout 110 .stage/bin/braze bench "${args[@]}" --no-autotune --json "$out/braze-sweep.json" > "$out/sweep-braze.log" 2>&1
  echo "== torch_baseline.py ${args[*]} --no-autotune"; date -u
  timeout 100 python3 .stage/torch_baseline.py "${args[@]}" --no-autotune --json "$out/torch-sweep.json" > "$out/sweep-torch.log" 2>&1
  python3 .stage/compare.py "$out/braze-sweep.json" "$out/torch-sweep.json" > "$out/compare-sweep.txt" 2>&1
  grep -E "FAIL|error|problem" "$out"/sweep-*.log | tail -n 10
  echo "== braze-base bench --only mlp_step --no-autotune"; date -u
  timeout 60 .stage/bin/braze-base bench --only mlp_step --no-autotune --rep-ms 200 > "$out/mlp-base.log" 2>&1
  grep -E "^mlp_step" "$out/mlp-base.log" | head -n 8
  echo "== braze-base bench --only gpt2_step --no-autotune"; date -u
  timeout 40 .stage/bin/braze-base bench --only gpt2_step --no-autotune > "$out/gpt2-base.log" 2>&1
  grep -E "^gpt2_step" "$out/gpt2-base.log" | head -n 4
  date -u
} >> "$s" 2>&1
cat "$s"; head -c 6000 "$out/compare-sweep.txt"
