# Compiles a generated kernel (.cu) with NVRTC to an sm_90 cubin and prints its SASS, with no GPU:
# register and spill counts (ptxas -v) on stderr, the disassembly on stdout.
#   python3 sass.py kernel.cu [nvrtc options...]
# NVRTC from .ci/install-nvrtc.sh ($BRAZE_NVRTC_DIR, default ~/.cache/braze-nvrtc, with
# LD_LIBRARY_PATH set as it exports); nvdisasm from the nvidia-cuda-nvdisasm wheel ($NVDISASM).
import ctypes, os, sys, subprocess
lib = ctypes.CDLL(os.path.join(os.environ.get("BRAZE_NVRTC_DIR", os.path.expanduser("~/.cache/braze-nvrtc")), "nvidia/cu13/lib/libnvrtc.so.13"))
src = open(sys.argv[1], "rb").read()
prog = ctypes.c_void_p()
assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None) == 0
inc = os.path.join(os.environ.get("BRAZE_NVRTC_DIR", os.path.expanduser("~/.cache/braze-nvrtc")), "nvidia/cu13/include")
opts = [b"--gpu-architecture=sm_90", b"--include-path=" + inc.encode(), b"--ptxas-options=-v", b"-std=c++17"] + [a.encode() for a in sys.argv[2:]]
arr = (ctypes.c_char_p * len(opts))(*opts)
rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
n = ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n)); log = ctypes.create_string_buffer(n.value); lib.nvrtcGetProgramLog(prog, log)
sys.stderr.write(log.value.decode())
assert rc == 0, rc
lib.nvrtcGetCUBINSize(prog, ctypes.byref(n)); buf = ctypes.create_string_buffer(n.value); lib.nvrtcGetCUBIN(prog, buf)
open("/tmp/k.cubin", "wb").write(buf.raw)
print(subprocess.run([os.environ.get("NVDISASM", "nvdisasm"), "-c", "/tmp/k.cubin"], capture_output=True, text=True).stdout)
