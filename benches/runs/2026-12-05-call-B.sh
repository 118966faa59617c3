#!/usr/bin/env bash
# One device call: the attention backward both ways (one kernel adding dq from the key tiles'
# blocks; the deterministic dq and dk/dv kernels), every candidate timed (max-autotune's log),
# beside SDPA; gpt2_step both ways beside torch.compile; the busy gpt2_step loops in braze and
# PyTorch; GPU fuzz of a fresh range (the plan's kernels now share their zeroed workspaces).
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u
  echo "== BRAZE_LOG=autotune braze bench --only attention"
  BRAZE_LOG=autotune timeout 150 .stage/bin/braze bench --only attention --json "$out/braze-att.json" 2>&1 | grep -vE "^#   +[0-9]"
  echo "== torch_baseline.py --only attention"; timeout 60 python3 .stage/torch_baseline.py --only attention 2>&1 | tail -n 3
  echo "== braze bench --only gpt2_step --no-autotune"
  timeout 90 .stage/bin/braze bench --only gpt2_step --no-autotune 2>&1 | grep -E "^gpt2_step" | head -n 4
  echo "== BRAZE_DETERMINISTIC=1 braze bench --only gpt2_step --no-autotune"
  BRAZE_DETERMINISTIC=1 timeout 90 .stage/bin/braze bench --only gpt2_step --no-autotune 2>&1 | grep -E "^gpt2_step" | head -n 4
  echo "== torch_gpt2.py --only gpt2_step"; timeout 100 python3 .stage/torch_gpt2.py --only gpt2_step 2>&1 | tail -n 3
} > "$out/attention.log" 2>&1
{ echo "== braze bench --only busy_gpt2"; timeout 200 .stage/bin/braze bench --only busy_gpt2 --json "$out/braze-busy.json" 2>&1 | grep -vE "^#"
  echo "== torch_busy.py --model gpt2"; timeout 120 python3 .stage/torch_busy.py --model gpt2 --steps 100 --json "$out/torch-busy.json" 2>&1 | tail -n 4
} > "$out/busy.log" 2>&1
{ echo "== fuzz (GPU) seeds 93,000,000.."
  BRAZE_FUZZ_GPU_GRAPHS=600 BRAZE_FUZZ_SEED=93000000 timeout 120 .stage/bin/fuzz --exact gpu_random_graphs_match_the_reference --nocapture 2>&1 | grep -vE "^(  |graph|input|\})" | tail -n 25
} > "$out/fuzz.log" 2>&1
grep -vE "autotune|^\s*$" "$out/attention.log" | tail -n 30; grep -E "attention_backward|dq_dk" "$out/attention.log" | head -n 30; tail -n 14 "$out/busy.log"; tail -n 8 "$out/fuzz.log"
