#!/usr/bin/env bash
# Builds what the GPU machine runs (it has no Rust toolchain) and stages it in .stage/ (ignored
# by git): the release `braze` binary, the GPU test binaries, the PyTorch baseline scripts and
# the run script. Then, on the GPU machine, from the repository root:
#
#     bash .stage/gpu-run.sh            # conformance, sanitizer, benchmarks, PyTorch baselines
#     bash .stage/gpu-run.sh fuzz       # 10,000 random graphs on the GPU (a device call of its own)
#     bash .stage/gpu-run.sh training   # GPT-2, attention, mlp_step beside PyTorch (a call of its own)
#
# Results land in $OUT (or .stage/out when $OUT is unset).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .stage
mkdir -p .stage/bin
cargo build --release -p braze-cli
cp "${CARGO_TARGET_DIR:-target}/release/braze" .stage/bin/
# An earlier build's binary to time beside this one (before/after ratios), when given.
if [ -n "${BRAZE_BASE_BIN:-}" ]; then
  cp "$BRAZE_BASE_BIN" .stage/bin/braze-base
fi
# Test binaries that hold GPU tests; each skips cleanly where there is no device.
cargo test --release --no-run --message-format=json -p braze-cuda -p braze -p braze-suite --test 'gpu_*' --test conformance --test fuzz 2>/dev/null |
  python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m.get("profile", {}).get("test"):
        continue
    name = m["target"]["name"]
    if name.startswith("gpu_") or name in ("conformance", "fuzz"):
        shutil.copy(m["executable"], os.path.join(".stage/bin", name))
        print("staged test binary", name)
'
cp benches/torch_baseline.py benches/sweeps.py benches/torch_train.py benches/torch_busy.py benches/torch_gpt2.py benches/gpu-run.sh benches/compare.py .stage/
du -sh .stage
