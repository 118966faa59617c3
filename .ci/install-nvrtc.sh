#!/usr/bin/env bash
# Installs NVRTC 13.0 (and the CUDA headers it needs) from PyPI, with no GPU and no CUDA toolkit.
#
#   source .ci/install-nvrtc.sh   # installs if needed and exports LD_LIBRARY_PATH, BRAZE_CUDA_INCLUDE
#   bash .ci/install-nvrtc.sh     # installs if needed and prints the export lines to eval
#
# The target directory is $BRAZE_NVRTC_DIR, default ~/.cache/braze-nvrtc. NVRTC stays at 13.0.x
# because newer NVRTC emits PTX that a CUDA 13.0 driver may refuse. Running it again is cheap:
# an existing install is detected and reused.

# Sourced scripts must not change the caller's shell options, so the body runs in a function
# that reports failure through its return status instead of `set -e`.
braze_install_nvrtc() {
    local dir="${BRAZE_NVRTC_DIR:-$HOME/.cache/braze-nvrtc}"
    local lib="$dir/nvidia/cu13/lib"
    local include="$dir/nvidia/cu13/include"

    if [ -e "$lib/libnvrtc.so.13" ] && [ -e "$lib/libnvrtc-builtins.so.13.0" ] \
        && [ -e "$include/cuda_bf16.h" ] && [ -e "$include/cuda_runtime.h" ]; then
        echo "NVRTC already installed in $dir" >&2
    else
        echo "Installing NVRTC 13.0 into $dir" >&2
        mkdir -p "$dir" || return 1
        python3 -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
            --target "$dir" \
            nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 || return 1
        if [ ! -e "$lib/libnvrtc.so.13" ] || [ ! -e "$include/cuda_bf16.h" ]; then
            echo "NVRTC install in $dir is incomplete (no $lib/libnvrtc.so.13 or cuda_bf16.h)" >&2
            return 1
        fi
    fi

    case ":${LD_LIBRARY_PATH:-}:" in
        *":$lib:"*) ;;
        *) LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
    esac
    export LD_LIBRARY_PATH
    export BRAZE_CUDA_INCLUDE="$include"
    echo "export LD_LIBRARY_PATH=\"$LD_LIBRARY_PATH\""
    echo "export BRAZE_CUDA_INCLUDE=\"$BRAZE_CUDA_INCLUDE\""
}

if (return 0 2>/dev/null); then
    # Sourced: the exports above land in the caller's shell.
    if braze_install_nvrtc; then
        unset -f braze_install_nvrtc
    else
        unset -f braze_install_nvrtc
        return 1
    fi
else
    set -euo pipefail
    braze_install_nvrtc
fi
