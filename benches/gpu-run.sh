#!/usr/bin/env bash
# Runs on the GPU machine from the repository root after benches/stage-gpu.sh staged .stage/.
# Order: braze benchmarks, then the PyTorch baselines right after on the same GPU (the training
# one writes its first steps, which braze's mlp_step is then checked against) and the ratio
# table, then the GPU tests (several tests at once: captures are gated against other threads'
# launches), then compute-sanitizer (memcheck, racecheck) over the conformance suite's
# `sanitizer_` tests, one at a time. Each step is bounded in time so the whole run ends inside
# one device call; everything is logged under $OUT (at most 7 files). `fuzz` (not part of `all`:
# it takes a device call of its own) runs the random-graph fuzz on 10,000 graphs
# (BRAZE_FUZZ_GPU_GRAPHS, from BRAZE_FUZZ_SEED, default 0) and logs it to $OUT/fuzz.log.
# `sweep` (not part of `all`) runs one sweep of benches/workloads.md ("Sweeps"): SWEEP=rows or
# pointwise (default rows), SWEEP_ONLY=workloads of it (comma-separated; default all),
# SWEEP_MAX_MB=cap on the bytes of a call, TORCH_SWEEP_AUTOTUNE=0 to leave out torch.compile's
# max-autotune (its tuning dominates the PyTorch side). braze, then PyTorch on the same cases, then
# compare.py; each program writes its JSON after every case, so one stopped by its time limit
# still leaves the cases it measured to compare. Logged to $OUT/sweep.log, joined in
# $OUT/compare-sweep.txt. `training` (not part of `all`: a device call of its own) runs the
# training workloads beside PyTorch (see its comment below); `attention` times and checks every
# attention kernel candidate (see its comment).
set -uo pipefail
out=${OUT:-.stage/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d)
export PYTHONUNBUFFERED=1
status=0
what=${1:-all}
if [ "$what" = all ] || [ "$what" = bench ]; then
  { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > "$out/bench.log"
  timeout 240 .stage/bin/braze bench --skip mlp_step --json "$out/braze.json" >> "$out/bench.log" 2>&1 || status=1
  tail -n 40 "$out/bench.log"
  timeout 240 python3 .stage/torch_baseline.py --json "$out/torch.json" 2>&1 | tail -n 30 || status=1
  # Training: PyTorch's mlp_step first (it writes the initial weights, inputs, losses and grads of
  # its first steps, hundreds of MB, outside $OUT), then braze's from the same weights. Their rows
  # join braze.json and torch.json, so $OUT keeps its number of files.
  train=$(mktemp -d)
  timeout 200 python3 .stage/torch_train.py --write "$train/weights" --json "$train/torch.json" \
    --variants eager,compile,compile-reduce-overhead,compile-max-autotune-no-cudagraphs 2>&1 | tail -n 12 || status=1
  { echo "== braze bench --only mlp_step --torch-weights"; timeout 150 .stage/bin/braze bench --only mlp_step \
    --torch-weights "$train/weights" --json "$train/braze.json"; } >> "$out/bench.log" 2>&1 || status=1
  sed -n '/^== braze bench --only mlp_step/,$p' "$out/bench.log" | tail -n 25
  python3 .stage/compare.py --append "$out/braze.json" "$train/braze.json"
  python3 .stage/compare.py --append "$out/torch.json" "$train/torch.json"
  rm -rf "$train"
  base=()
  if [ -x .stage/bin/braze-base ]; then
    # An earlier build (BRAZE_BASE_BIN at staging), timed in the same call for before/after ratios.
    # mlp_step is left out where the earlier build knows --skip (its training rows are not compared).
    skip=(); .stage/bin/braze-base bench --help | grep -q -- --skip && skip=(--skip mlp_step)
    timeout 240 .stage/bin/braze-base bench "${skip[@]}" --json "$out/base.json" > "$out/base.log" 2>&1 || status=1
    base=("$out/base.json")
  fi
  python3 .stage/compare.py "$out/braze.json" "$out/torch.json" "${base[@]}" | tee "$out/compare.txt"
fi
if [ "$what" = all ] || [ "$what" = tests ]; then
  for t in .stage/bin/gpu_* .stage/bin/conformance; do
    [ -x "$t" ] || continue
    echo "== $t" | tee -a "$out/tests.log"
    # gpu_attention compiles and times every candidate at GPT-2's shape: it needs longer.
    limit=150; [ "$(basename "$t")" = gpu_attention ] && limit=300
    timeout "$limit" "$t" >> "$out/tests.log" 2>&1 || status=1
    grep -E "^test result|FAILED|panicked" "$out/tests.log" | tail -n 5
  done
  if command -v compute-sanitizer >/dev/null && [ -x .stage/bin/conformance ]; then
    for tool in memcheck racecheck; do
      echo "== compute-sanitizer --tool $tool conformance sanitizer_"
      timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 .stage/bin/conformance --test-threads=1 sanitizer_ \
        > "$out/sanitizer-$tool.log" 2>&1
      echo "exit $? ($tool)"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$out/sanitizer-$tool.log" | tail -n 3
    done
  fi
fi
if [ "$what" = sweep ]; then
  args=(--sweep "${SWEEP:-rows}")
  [ -n "${SWEEP_ONLY:-}" ] && args+=(--only "$SWEEP_ONLY")
  [ -n "${SWEEP_MAX_MB:-}" ] && args+=(--sweep-max-mb "$SWEEP_MAX_MB")
  torch_args=()
  # Time limits: without max-autotune PyTorch's side takes about 90 s for the rows sweep, so
  # braze (its CPU reference checks dominate) gets the rest of the call.
  braze_limit=270 torch_limit=290
  if [ "${TORCH_SWEEP_AUTOTUNE:-1}" = 0 ]; then
    torch_args+=(--no-autotune)
    braze_limit=400 torch_limit=160
  fi
  { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > "$out/sweep.log"
  .stage/bin/braze bench "${args[@]}" --list >> "$out/sweep.log" 2>&1
  echo "== braze bench ${args[*]}" >> "$out/sweep.log"
  timeout "$braze_limit" .stage/bin/braze bench "${args[@]}" --json "$out/braze-sweep.json" >> "$out/sweep.log" 2>&1 || status=1
  echo "== torch_baseline.py ${args[*]} ${torch_args[*]}" >> "$out/sweep.log"
  timeout "$torch_limit" python3 .stage/torch_baseline.py "${args[@]}" "${torch_args[@]}" --json "$out/torch-sweep.json" \
    >> "$out/sweep.log" 2>&1 || status=1
  grep -E "FAIL|error|problem" "$out/sweep.log" | tail -n 20
  python3 .stage/compare.py "$out/braze-sweep.json" "$out/torch-sweep.json" | tee "$out/compare-sweep.txt"
fi
if [ "$what" = attention ]; then
  # The attention kernels alone: every candidate's time at GPT-2's shape (the autotune log of the
  # bench's max-autotune rows), block_step and gpt2_step at the defaults, SDPA beside them, then
  # every candidate checked against the reference (gpu_attention). Logged to $OUT/attention.log.
  { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
    echo "== BRAZE_LOG=autotune braze bench --only attention,block_step,gpt2_step"
    BRAZE_LOG=autotune timeout 200 .stage/bin/braze bench --only attention,block_step,gpt2_step \
      --json "$out/braze.json" 2>&1 | grep -vE "^#   +[0-9]"
    echo "== torch_baseline.py --only attention"; timeout 60 python3 .stage/torch_baseline.py --only attention 2>&1 | tail -n 3
    echo "== gpu_attention"; timeout 240 .stage/bin/gpu_attention 2>&1 | grep -E "^test |test result|panicked" | tail -n 8
  } > "$out/attention.log" 2>&1 || status=1
  grep -vE "autotune|^\s*$" "$out/attention.log" | tail -n 40
fi
if [ "$what" = training ]; then
  # The training workloads beside PyTorch, each step alone on the GPU: GPT-2 (nanoGPT's weights
  # written by PyTorch, the logits and 50-step loss curves compared in f32 and under bf16
  # autocast; block_fwd, block_step, gpt2_step and attention timed beside torch.compile and
  # SDPA, with each kernel's time in one step), mlp_step from PyTorch's weights, the busy loops,
  # the cold compile of gpt2_step, braze train. Logged to $OUT/gpt2.log, train.log, tests.log
  # (the bench's every-kernel profile in kernels.log); braze's rows in $OUT/braze.json.
  w=$(mktemp -d)
  { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
    echo "== torch_gpt2.py --write (f32 check files) and timing"
    timeout 200 python3 .stage/torch_gpt2.py --write "$w/gpt2" --json "$w/torch_gpt2.json" 2>&1 | tail -n 15
    echo "== braze gpt2-check (f32)"; timeout 120 .stage/bin/braze gpt2-check --torch-weights "$w/gpt2" 2>&1 | tail -n 25
    echo "== torch_gpt2.py --write --autocast bf16 --no-time"
    timeout 120 python3 .stage/torch_gpt2.py --only gpt2_step --write "$w/gpt2-bf16" --autocast bf16 --no-time 2>&1 | tail -n 3
    echo "== braze gpt2-check (bf16 autocast)"; timeout 120 .stage/bin/braze gpt2-check --torch-weights "$w/gpt2-bf16" 2>&1 | tail -n 25
    echo "== braze bench --only block_fwd,block_step,gpt2_step,attention"
    timeout 300 .stage/bin/braze bench --only block_fwd,block_step,gpt2_step,attention --json "$out/braze.json" 2>&1 |
      tee "$out/kernels.log" | grep -vE "^#   +[0-9]" | tail -n 60
    echo "== torch_baseline.py --only attention"; timeout 60 python3 .stage/torch_baseline.py --only attention 2>&1 | tail -n 3
  } > "$out/gpt2.log" 2>&1 || status=1
  tail -n 50 "$out/gpt2.log"
  { echo "== torch_train.py --variants compile"
    timeout 100 python3 .stage/torch_train.py --write "$w/mlp" --variants compile --rep-ms 100 2>&1 | grep -v "^#" | tail -n 5
    echo "== braze bench --only mlp_step"
    timeout 160 .stage/bin/braze bench --only mlp_step --torch-weights "$w/mlp" --rep-ms 100 2>&1 | grep -vE "^#   +[0-9]" | tail -n 20
  } > "$out/train.log" 2>&1 || status=1
  tail -n 20 "$out/train.log"
  # The GPU test suites run in `tests` (with them here the call overran its 600 s).
  { echo "== braze compile-time gpt2_step (cold: trace, passes, fusion, codegen, NVRTC on every core)"
    timeout 60 .stage/bin/braze compile-time gpt2_step 2>&1 | tail -n 16
    echo "== braze bench --only busy"; timeout 60 .stage/bin/braze bench --only busy 2>&1 | grep -vE "^#" | tail -n 12
    echo "== torch_busy.py"; timeout 60 python3 .stage/torch_busy.py 2>&1 | grep '^{' | tail -n 3
    echo "== braze bench --only busy_gpt2"
    timeout 180 .stage/bin/braze bench --only busy_gpt2 2>&1 | grep -vE "^#" | tail -n 12
    echo "== torch_busy.py --model gpt2"; timeout 180 python3 .stage/torch_busy.py --model gpt2 --steps 100 2>&1 | grep '^{' | tail -n 3
    echo "== braze train --autocast bf16"
    timeout 60 .stage/bin/braze train --device cuda --autocast bf16 --n-layer 4 --n-head 4 --n-embd 256 \
      --block-size 64 --batch 64 --steps 400 2>&1 | tail -n 15
  } > "$out/tests.log" 2>&1 || status=1
  grep -E "^==|test result|FAILED|panicked" "$out/tests.log" | tail -n 30
  rm -rf "$w"
fi
if [ "$what" = fuzz ]; then
  echo "== .stage/bin/fuzz gpu_random_graphs_match_the_reference" | tee "$out/fuzz.log"
  BRAZE_FUZZ_GPU_GRAPHS=${BRAZE_FUZZ_GPU_GRAPHS:-10000} timeout 560 .stage/bin/fuzz --exact \
    gpu_random_graphs_match_the_reference --nocapture >> "$out/fuzz.log" 2>&1 || status=1
  echo "exit status $status" >> "$out/fuzz.log"
  grep -vE "^(  |graph|input|\})" "$out/fuzz.log" | tail -n 30
fi
exit $status
