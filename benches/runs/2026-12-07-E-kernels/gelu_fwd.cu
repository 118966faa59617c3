// braze kernel `pointwise_gelu_erf_bf16_1`: pointwise over [8192,4096] (33554432 elements)
// config: pointwise block=256 vec=16 grid_limit=135168
// loads: v0 = in0 vector
// source ops:
//   gelu_erf       crates/workloads/src/definition.rs:138:36
// buffers:
//   in0 = b77: 33554432 x bf16
//   out0 = b78: 33554432 x bf16
// launches:
//   pointwise_gelu_erf_bf16_1<<<8192, 256, 0>>>(in0, out0)

typedef unsigned idx_t;  // 32-bit index math: every extent and offset is below 2^31

// bf16 lives in memory as its 16-bit pattern and in registers as float.
typedef unsigned short bf16_t;
__device__ __forceinline__ float bf16_to_f32(unsigned short bits) { return __uint_as_float((unsigned)bits << 16); }
// Round to nearest even in hardware; a NaN becomes the canonical quiet NaN.
__device__ __forceinline__ unsigned short f32_to_bf16_bits(float x) {
  unsigned short bits;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(x));
  return bits;
}
// `hi` and `lo` rounded to bf16 in one instruction, `hi` in the upper half.
__device__ __forceinline__ unsigned bf16x2_bits(float hi, float lo) {
  unsigned bits;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(bits) : "f"(hi), "f"(lo));
  return bits;
}
__device__ __forceinline__ float round_to_bf16(float x) { return bf16_to_f32(f32_to_bf16_bits(x)); }

// Q(t), a degree-10 fit of erfc(z) exp(z^2) / t for t = 1 / (1 + z / 2), z >= 0.
__device__ __forceinline__ float erfcx_fit_f32(float t) {
  float q = 0.042352594f;
  q = fmaf(q, t, -0.23085766f);
  q = fmaf(q, t, 0.48617887f);
  q = fmaf(q, t, -0.4469775f);
  q = fmaf(q, t, 0.12708952f);
  q = fmaf(q, t, -0.057232507f);
  q = fmaf(q, t, 0.09300059f);
  q = fmaf(q, t, 0.17537683f);
  q = fmaf(q, t, 0.2468806f);
  q = fmaf(q, t, 0.28209385f);
  q = fmaf(q, t, 0.2820948f);
  return q;
}

// Phi(x) and in *gauss exp(-x^2 / 2), for a result rounded to 16 bits (see normal_cdf_f32).
__device__ __forceinline__ float normal_cdf_narrow_f32(float x, float* gauss) {
  const float a = fminf(fabsf(x), 15.0f);
  const float g = __expf(-0.5f * a * a);
  *gauss = g;
  const float z = a * 0.70710678f;
  const float t = __fdividef(1.0f, fmaf(0.5f, z, 1.0f));
  const float tail = 0.5f * t * erfcx_fit_f32(t) * g;
  return x >= 0.0f ? 1.0f - tail : tail;
}

// x Phi(x) for a result rounded to 16 bits.
__device__ __forceinline__ float gelu_erf_narrow_f32(float x) {
  float gauss;
  return x * normal_cdf_narrow_f32(x, &gauss);
}

// 8 bf16 elements from one 16-byte aligned load.
__device__ __forceinline__ void load_bf16x8(const bf16_t* p, float* v) {
  const uint4 w = *reinterpret_cast<const uint4*>(p);
  v[0] = bf16_to_f32((unsigned short)(w.x & 0xffffu));
  v[1] = bf16_to_f32((unsigned short)((w.x >> 16) & 0xffffu));
  v[2] = bf16_to_f32((unsigned short)(w.y & 0xffffu));
  v[3] = bf16_to_f32((unsigned short)((w.y >> 16) & 0xffffu));
  v[4] = bf16_to_f32((unsigned short)(w.z & 0xffffu));
  v[5] = bf16_to_f32((unsigned short)((w.z >> 16) & 0xffffu));
  v[6] = bf16_to_f32((unsigned short)(w.w & 0xffffu));
  v[7] = bf16_to_f32((unsigned short)((w.w >> 16) & 0xffffu));
}

// 8 bf16 elements with one 16-byte aligned store.
__device__ __forceinline__ void store_bf16x8(bf16_t* p, const float* v) {
  uint4 w;
  w.x = bf16x2_bits(v[1], v[0]);
  w.y = bf16x2_bits(v[3], v[2]);
  w.z = bf16x2_bits(v[5], v[4]);
  w.w = bf16x2_bits(v[7], v[6]);
  *reinterpret_cast<uint4*>(p) = w;
}

extern "C" __global__ void __launch_bounds__(256, 1) pointwise_gelu_erf_bf16_1(const bf16_t* __restrict__ in0, bf16_t* __restrict__ out0) {
  constexpr idx_t NUMEL = 33554432u;
  // 16 consecutive elements per thread and step
  for (idx_t vector = (idx_t)blockIdx.x * 256u + threadIdx.x; vector < NUMEL / 16u; vector += (idx_t)gridDim.x * 256u) {
    const idx_t i0 = vector * 16u;
    float ld0[16];
    load_bf16x8(in0 + i0, ld0);
    load_bf16x8(in0 + (i0 + 8u), ld0 + 8u);
    float st0[16];
    #pragma unroll
    for (unsigned k = 0u; k < 16u; ++k) {
      const float v0 = ld0[k];
      const float v1 = gelu_erf_narrow_f32(v0);
      st0[k] = v1;
    }
    store_bf16x8(out0 + i0, st0);
    store_bf16x8(out0 + (i0 + 8u), st0 + 8);
  }
}
