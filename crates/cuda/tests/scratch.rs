#[test]
fn scratch() {
    let src = r#"
#include <cuda_bf16.h>
__device__ __noinline__ float helper(float* p, int i) { float a[64]; for (int j=0;j<64;j++) a[j]=p[j*i]; return a[i%64]; }
extern "C" __global__ void k(float* out, const __nv_bfloat16* x, int n) {
  __shared__ float s[256];
  int i = blockIdx.x*blockDim.x+threadIdx.x;
  s[threadIdx.x] = i < n ? __bfloat162float(x[i]) : 0.f;
  __syncthreads();
  if (i < n) out[i] = s[255-threadIdx.x] + helper(out, i);
}
template<typename T> __global__ void tk(T* o) { o[0] = T(1); }
template __global__ void tk<float>(float*);
"#;
    let m = braze_cuda::nvrtc::compile(src, "scratch.cu", &Default::default()).unwrap();
    println!("{}\n{:?}\n{} bytes {} ms", m.log, m.resources, m.image.len(), m.compile_ms);
    println!("{:?}", braze_cuda::nvrtc::nvrtc_version());
    let e = braze_cuda::nvrtc::compile("extern \"C\" __global__ void k( { }", "bad.cu", &Default::default()).unwrap_err();
    println!("{e}");
}
