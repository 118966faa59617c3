#!/usr/bin/env bash
# One device call: the occupancy hint (row kernels under 512 threads ask for 1024 threads an SM,
# pointwise kernels for 1536; dropped where it spills or keeps a stack), packed upload staging,
# and AdamW with its moments in bf16 (as torch.optim keeps them for bf16 parameters) beside the
# f32-state step, against 7141e6d (staged as braze-base): mlp_step beside torch.compile from the
# same weights with the host clock per step, gpt2_step of both builds beside torch.compile, the
# bf16 GPT-2 check, a GPU fuzz range and the CUDA runtime tests (uploads among them).
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
s="$out/summary.log"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > "$s"
{ echo "== torch_train.py --variants compile"; date -u
  timeout 70 python3 .stage/torch_train.py --write "$w/mlp" --variants compile --rep-ms 100 > "$out/torch-mlp.log" 2>&1
  grep -E "^mlp_step" "$out/torch-mlp.log"
  for b in braze braze-base; do
    echo "== $b bench --only mlp_step --no-autotune"; date -u
    timeout 90 .stage/bin/$b bench --only mlp_step --no-autotune --torch-weights "$w/mlp" --rep-ms 100 > "$out/mlp-$b.log" 2>&1
    grep -E "^mlp_step|^3 steps|^#  +[a-z_]+ +[0-9]+ kernels|us  (multi_pointwise|row_gelu|pointwise_gelu|matmul_bias_bf16_0)" "$out/mlp-$b.log" | head -n 60
  done
} >> "$s" 2>&1
{ echo "== torch_gpt2.py --only gpt2_step --write --autocast bf16"; date -u
  timeout 100 python3 .stage/torch_gpt2.py --only gpt2_step --write "$w/gpt2" --autocast bf16 2>&1 | tail -n 3
  for b in braze braze-base; do
    echo "== $b bench --only gpt2_step --no-autotune"; date -u
    timeout 50 .stage/bin/$b bench --only gpt2_step --no-autotune > "$out/gpt2-$b.log" 2>&1
    grep -E "^gpt2_step|^#  +[a-z_]+ +[0-9]+ kernels" "$out/gpt2-$b.log" | head -n 12
  done
  echo "== braze gpt2-check"; date -u; timeout 45 .stage/bin/braze gpt2-check --torch-weights "$w/gpt2" 2>&1 | tail -n 6
} > "$out/gpt2.log" 2>&1
cat "$out/gpt2.log" >> "$s"
{ date -u; echo "== GPU fuzz, 150 graphs from seed 104000000"
  BRAZE_FUZZ_SEED=104000000 BRAZE_FUZZ_GPU_GRAPHS=150 timeout 30 .stage/bin/fuzz --exact gpu_random_graphs_match_the_reference --nocapture 2>&1 | tail -n 12
  echo "== gpu_runtime"; timeout 60 .stage/bin/gpu_runtime 2>&1 | tail -n 20
  date -u; } > "$out/tests.log" 2>&1
cat "$out/tests.log" >> "$s"
cat "$s"
