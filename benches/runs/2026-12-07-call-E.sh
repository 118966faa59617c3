#!/usr/bin/env bash
# One device call: where mlp_step's time goes beside torch.compile's. PyTorch's kernel profile;
# braze's step with the system cuBLASLt and with the cuBLASLt PyTorch ships (the matmul totals
# differ by library version or by heuristic); mlp_step's row and GELU kernels alone with variants
# (launch bounds, prefetch, threads a row, group size; benches/runs/2026-12-07-E-kernels); ncu of
# the GELU and layer norm backward rows, and of 16-bit layer norm rows at 768 and 4096 columns.
set -u
out=${OUT:-.stage/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} BRAZE_CUDA_INCLUDE=/usr/local/cuda/include
export BRAZE_REQUIRE_CUDA=1 BRAZE_CACHE_DIR=$(mktemp -d) PYTHONUNBUFFERED=1
w=$(mktemp -d)
s="$out/summary.log"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > "$s"
{ date -u; echo "== dumped mlp_step kernels and hand variants alone (benches/runs/2026-12-07-E-kernels)"
  d=benches/kernel_variants/dumped.py k=benches/runs/2026-12-07-E-kernels
  lb() { echo "--sub"; echo "__launch_bounds__($1)=>__launch_bounds__($1,$2)"; }
  timeout 60 python3 $d $k/gelu_bwd.cu $k/gelu_bwd_pf.cu $k/gelu_bwd_512.cu $k/gelu_bwd_g16.cu $k/gelu_fwd.cu $k/ln_bwd.cu $k/ln768_bf16.cu
  timeout 40 python3 $d $k/gelu_bwd.cu $k/gelu_bwd_pf.cu $k/gelu_bwd_g16.cu $k/ln_bwd.cu $k/ln768_bf16.cu $(lb 256 4)
  timeout 30 python3 $d $k/gelu_bwd.cu $k/gelu_bwd_g16.cu $k/ln768_bf16.cu $(lb 256 5)
  timeout 20 python3 $d $k/ln768_bf16.cu $(lb 256 6)
  timeout 20 python3 $d $k/gelu_fwd.cu --sub "__launch_bounds__(256, 1)=>__launch_bounds__(256, 6)"
  timeout 20 python3 $d $k/gelu_fwd.cu --sub "__launch_bounds__(256, 1)=>__launch_bounds__(256, 8)"
} >> "$s" 2>&1
torch_lt=$(python3 -c 'import glob, os, torch; d = os.path.dirname(os.path.dirname(torch.__file__)); print(sorted(glob.glob(d + "/nvidia/**/libcublasLt.so*", recursive=True))[0])' 2>/dev/null)
mkdir -p "$w/lt" && ln -sf "$torch_lt" "$w/lt/libcublasLt.so"
{ echo "system cuBLASLt: $(readlink -f /usr/local/cuda/lib64/libcublasLt.so)"; echo "PyTorch's cuBLASLt: $(readlink -f "$torch_lt")"
  echo "== torch_train.py --variants compile --profile"; date -u
  timeout 90 python3 .stage/torch_train.py --write "$w/mlp" --variants compile --rep-ms 100 --profile > "$out/torch-mlp.log" 2>&1
  grep -E "^mlp_step|^# " "$out/torch-mlp.log" | head -n 40
  echo "== braze bench --only mlp_step --no-autotune"; date -u
  timeout 50 .stage/bin/braze bench --only mlp_step --no-autotune --torch-weights "$w/mlp" --rep-ms 100 > "$out/mlp-braze.log" 2>&1
  grep -E "^mlp_step.*(compiled|reduce-overhead) |^#  +[a-z_]+ +[0-9]+ kernels" "$out/mlp-braze.log" | head -n 12
  echo "== the same with PyTorch's cuBLASLt"; date -u
  LD_LIBRARY_PATH="$w/lt:$LD_LIBRARY_PATH" timeout 50 .stage/bin/braze bench --only mlp_step --no-autotune --rep-ms 100 > "$out/mlp-braze-torch-lt.log" 2>&1
  grep -E "^mlp_step.*(compiled|reduce-overhead) |^#  +[a-z_]+ +[0-9]+ kernels" "$out/mlp-braze-torch-lt.log" | head -n 12
} >> "$s" 2>&1
{ date -u; echo "== ncu of mlp_step's backward rows"
  timeout 100 ncu --clock-control none -k 'regex:row_gelu_erf_gelu_erf_grad|row_mean_sub_add_mul' -c 2 --set full \
    .stage/bin/braze bench --only mlp_step --no-autotune --rep-ms 10 > "$out/ncu-mlp.log" 2>&1; echo "exit $?"
  for c in "bf16 65536 768" "f32 32768 768" "bf16 16384 4096"; do set -- $c
    echo "== ncu ln_relu_res $1 $2x$3"; date -u
    timeout 40 ncu --clock-control none -k regex:row_ -c 1 --set full .stage/bin/braze explain ln_relu_res --device cuda \
      --dtype $1 --rows $2 --hidden $3 > "$out/ncu-ln-$1-$3.log" 2>&1; echo "exit $?"
  done
  grep -hE "^  [a-z_0-9]+\(|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit Reg|^    Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Warp Cycles Per Issued" "$out"/ncu-*.log
} >> "$s" 2>&1
cat "$s"
