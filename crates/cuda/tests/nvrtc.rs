//! NVRTC compilation; runs wherever libnvrtc loads, no GPU needed.

mod common;

use braze_cuda::{compile, nvrtc_version, CompileOptions, CudaError, ImageKind};

const SAXPY: &str = r#"
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"#;

const BF16_SCALE: &str = r#"
#include <cuda_bf16.h>
extern "C" __global__ void scale_bf16(__nv_bfloat16* out, const __nv_bfloat16* in, float s, int n) {
    __shared__ float tile[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? __bfloat162float(in[i]) * s : 0.0f;
    __syncthreads();
    if (i < n) out[i] = __float2bfloat16(tile[threadIdx.x]);
}
"#;

const ELF_MAGIC: &[u8] = b"\x7fELF";

#[test]
fn compiles_a_kernel_to_cubin_with_resources() {
    if !common::nvrtc_ready() {
        return;
    }
    let module = compile(SAXPY, "saxpy.cu", &CompileOptions::default()).unwrap();
    assert_eq!(module.kind, ImageKind::Cubin);
    assert!(module.image.starts_with(ELF_MAGIC), "CUBIN is an ELF image");
    let saxpy = module.resources_of("saxpy").expect("ptxas figures for saxpy");
    assert!(saxpy.registers > 0, "{saxpy:?}");
    assert_eq!((saxpy.spill_stores, saxpy.spill_loads), (0, 0));
    assert!(module.compile_ms > 0.0);
    assert!(module.log.contains("ptxas"), "log: {}", module.log);
}

#[test]
fn compiles_a_bf16_kernel_with_cuda_headers() {
    if !common::nvrtc_ready() {
        return;
    }
    let opts = CompileOptions::default();
    assert!(!opts.include_dirs.is_empty(), "no CUDA include directory found; set BRAZE_CUDA_INCLUDE");
    let module = compile(BF16_SCALE, "scale_bf16.cu", &opts).unwrap();
    assert!(module.image.starts_with(ELF_MAGIC));
    let figures = module.resources_of("scale_bf16").unwrap();
    assert!(figures.registers > 0);
    assert_eq!(figures.shared_bytes, 256 * 4);
}

#[test]
fn compiles_to_ptx_on_request() {
    if !common::nvrtc_ready() {
        return;
    }
    let opts = CompileOptions { output: ImageKind::Ptx, ..CompileOptions::default() };
    let module = compile(SAXPY, "saxpy.cu", &opts).unwrap();
    assert_eq!(module.kind, ImageKind::Ptx);
    let text = String::from_utf8(module.image).unwrap();
    assert!(text.contains(".entry saxpy"), "{text}");
    assert!(text.contains(".target sm_90"));
    assert!(!text.ends_with('\0'));
    assert!(module.resources.is_empty());
}

#[test]
fn reports_stack_frames_and_spills() {
    if !common::nvrtc_ready() {
        return;
    }
    // A local array written and read at data-dependent indices must live on the stack.
    let stack_source = r#"
extern "C" __global__ void local_array(float* out, const int* index) {
    float values[64];
    for (int j = 0; j < 64; ++j) values[(j * index[0]) & 63] = out[j];
    out[threadIdx.x] = values[index[threadIdx.x] & 63];
}
"#;
    let module = compile(stack_source, "local_array.cu", &CompileOptions::default()).unwrap();
    let figures = module.resources_of("local_array").unwrap();
    assert!(figures.stack_bytes >= 256, "{figures:?}\n{}", module.log);

    // Many simultaneously live values under a register cap must spill (ptxas raises a cap of
    // 16 to its minimum of 24 on sm_90, which is still far too few).
    let spill_source = r#"
extern "C" __global__ void pressure(float* out, const float* in) {
    float acc[24];
    #pragma unroll
    for (int j = 0; j < 24; ++j) acc[j] = in[threadIdx.x * 24 + j];
    #pragma unroll
    for (int r = 0; r < 8; ++r) {
        #pragma unroll
        for (int j = 0; j < 24; ++j) acc[j] = acc[j] * acc[(j + r + 1) % 24] + 1.0f;
    }
    float sum = 0.0f;
    #pragma unroll
    for (int j = 0; j < 24; ++j) sum += acc[j] * (j + 1);
    out[threadIdx.x] = sum;
}
"#;
    let capped = CompileOptions { extra: vec!["--maxrregcount=16".into()], ..CompileOptions::default() };
    let module = compile(spill_source, "pressure.cu", &capped).unwrap();
    let figures = module.resources_of("pressure").unwrap();
    assert!(figures.spill_stores > 0 && figures.spill_loads > 0, "{figures:?}\n{}", module.log);
}

#[test]
fn syntax_error_reports_log_and_numbered_source() {
    if !common::nvrtc_ready() {
        return;
    }
    let source = "extern \"C\" __global__ void broken(float* x) {\n    x[0] = 1.0f +;\n}\n";
    let err = compile(source, "broken.cu", &CompileOptions::default()).unwrap_err();
    let CudaError::Compile { name, log, source_code } = &err else {
        panic!("expected a compile error, got {err:?}");
    };
    assert_eq!(name, "broken.cu");
    assert_eq!(source_code, source);
    assert!(log.contains("broken.cu(2)"), "log names the line: {log}");
    let message = err.to_string();
    assert!(message.contains(log.trim_end()), "{message}");
    assert!(message.contains("2 |     x[0] = 1.0f +;"), "{message}");
}

#[test]
fn rejects_bad_input_without_panicking() {
    if !common::nvrtc_ready() {
        return;
    }
    let opts = CompileOptions::default();
    assert!(matches!(compile("int a;\0", "nul.cu", &opts), Err(CudaError::InvalidArgument(_))));
    let bad_arch = CompileOptions { arch: "compute_90".into(), ..CompileOptions::default() };
    assert!(matches!(compile(SAXPY, "saxpy.cu", &bad_arch), Err(CudaError::InvalidArgument(_))));
    let bad_option = CompileOptions { extra: vec!["--no-such-option".into()], ..CompileOptions::default() };
    let err = compile(SAXPY, "saxpy.cu", &bad_option).unwrap_err();
    assert!(matches!(err, CudaError::Compile { .. }), "{err:?}");
}

#[test]
fn reports_the_nvrtc_version() {
    if !common::nvrtc_ready() {
        return;
    }
    let (major, minor) = nvrtc_version().unwrap();
    assert!(major >= 12 && minor >= 0, "{major}.{minor}");
}

/// The occupancy hint's macro as generated kernels define it, before a kernel that asks for
/// eight 256-thread blocks an SM (32 registers a thread).
const HINT: &str = r#"
#ifdef BRAZE_NO_OCCUPANCY_HINT
#define BRAZE_MIN_BLOCKS(n)
#else
#define BRAZE_MIN_BLOCKS(n) , n
#endif
"#;

/// Holds 64 loaded values until each is used twice in reverse order: far more than 32 registers.
const HEAVY: &str = r#"
extern "C" __global__ void __launch_bounds__(256 BRAZE_MIN_BLOCKS(8)) heavy(float* out, const float* in) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    float v[64];
    #pragma unroll
    for (int k = 0; k < 64; ++k) v[k] = in[i * 64 + k];
    float acc = 0.0f;
    #pragma unroll
    for (int k = 63; k >= 0; --k) acc = acc * v[k] + v[63 - k];
    #pragma unroll
    for (int k = 0; k < 64; ++k) out[i * 64 + k] = v[k] * acc;
}
"#;

const LIGHT: &str = r#"
extern "C" __global__ void __launch_bounds__(256 BRAZE_MIN_BLOCKS(8)) light(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"#;

#[test]
fn a_kernel_that_spills_under_its_occupancy_hint_is_compiled_again_without_it() {
    if !common::nvrtc_ready() {
        return;
    }
    let source = format!("{HINT}{HEAVY}");
    assert!(braze_codegen::has_occupancy_hint(&source));
    // Eight blocks of 256 threads share 64K registers: 32 a thread.
    let hints = braze_codegen::occupancy_hints(&source);
    assert_eq!(hints.iter().map(|h| (h.kernel.as_str(), h.cap())).collect::<Vec<_>>(), [("heavy", 32)]);
    let opts = CompileOptions::default();
    // With the cap written out (no hint to drop) it spills: the case the fallback exists for.
    let capped = compile(&source.replace(" BRAZE_MIN_BLOCKS(8)", ", 8"), "heavy.cu", &opts).unwrap();
    let r = capped.resources_of("heavy").unwrap();
    assert!(r.spill_stores > 0 && r.registers <= 32, "{r:?}");
    let module = compile(&source, "heavy.cu", &opts).unwrap();
    let r = module.resources_of("heavy").unwrap();
    assert_eq!((r.spill_stores, r.spill_loads), (0, 0), "{r:?}");
    assert!(r.registers > 32, "{r:?}");
    assert!(module.log.starts_with("compiled again without the occupancy hint"), "{}", module.log);
}

#[test]
fn a_kernel_that_fits_its_occupancy_hint_keeps_the_register_cap() {
    if !common::nvrtc_ready() {
        return;
    }
    let module = compile(&format!("{HINT}{LIGHT}"), "light.cu", &CompileOptions::default()).unwrap();
    let r = module.resources_of("light").unwrap();
    assert!(r.registers <= 32 && r.spill_stores == 0, "{r:?}");
    assert!(!module.log.contains("compiled again"), "{}", module.log);
}
