#!/usr/bin/env bash
# Call F's mlp_step again on the same warm machine, PyTorch before and after braze: call F's
# torch.compile figure (3800.7 us) was far off every earlier run's (3437-3464 us).
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
s="$out/summary.log"
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; date -u
  for i in 1 2; do
    echo "== torch_train.py --variants compile ($i)"; date -u
    timeout 70 python3 .stage/torch_train.py --write "$w/mlp" --variants compile --rep-ms 300 > "$out/torch-mlp-$i.log" 2>&1
    grep -E "^mlp_step" "$out/torch-mlp-$i.log"
    echo "== braze bench --only mlp_step --no-autotune ($i)"; date -u
    timeout 90 .stage/bin/braze bench --only mlp_step --no-autotune --rep-ms 300 > "$out/mlp-braze-$i.log" 2>&1
    grep -E "^mlp_step.*(braze|host per step)" "$out/mlp-braze-$i.log" | head -n 8
  done
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; date -u
} > "$s" 2>&1
cat "$s"
