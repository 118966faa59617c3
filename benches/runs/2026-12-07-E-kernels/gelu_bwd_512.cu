// braze kernel `row_gelu_erf_grad_gelu_erf_mul_bf16_25`: row kernel over 8192 rows of 4096 columns (outer [8192], inner [4096])
// config: row threads_per_row=256 rows_per_block=1 cached
// 0 reduction pass(es); 8 elements per thread and chunk; 2 chunk(s) per thread held in registers
// source ops:
//   cast           crates/workloads/src/definition.rs:138:36
//   gelu_erf_grad  crates/workloads/src/definition.rs:138:36
//   gelu_erf       crates/workloads/src/definition.rs:138:36
//   cast           crates/workloads/src/definition.rs:138:36
//   mul            crates/workloads/src/definition.rs:138:36
//   cast           crates/workloads/src/definition.rs:138:36
// buffers:
//   in0 = b115: 33554432 x bf16
//   in1 = b133: 33554432 x bf16
//   out0 = b134: 33554432 x bf16
//   out1 = b135: 33554432 x bf16
//   out2 = b281: 4194304 x f32
// launches:
//   row_gelu_erf_grad_gelu_erf_mul_bf16_25<<<1024, 512, 0>>>(in0, in1, out0, out1, out2)

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

// erfc(z) exp(z^2) for z >= 0 (z up to ~1e19: t stays finite), as t Q(t), t = 1 / (1 + z / 2).
__device__ __forceinline__ float erfcx_nonneg_f32(float z) {
  const float d = fmaf(0.5f, z, 1.0f);
  const float r = __fdividef(1.0f, d);
  const float t = fmaf(r, fmaf(-d, r, 1.0f), r);
  return t * erfcx_fit_f32(t);
}
// exp(-(hi + lo)) for lo below hi's last place (hi + lo an exact square).
__device__ __forceinline__ float exp_neg_split_f32(float hi, float lo) {
  const float e = expf(-hi);
  return fmaf(e, -lo, e);
}

// Phi(x), the standard normal CDF, and in *gauss exp(-x^2 / 2): Phi(-|x|) = erfc(|x| / sqrt 2) / 2
// with the square taken from x itself (no rounding of x / sqrt 2 in the exponent), so the
// tails keep their relative accuracy. |x| is held at 15, where exp(-x^2 / 2) is 0 in f32.
__device__ __forceinline__ float normal_cdf_f32(float x, float* gauss) {
  const float a = fminf(fabsf(x), 15.0f);
  const float hi = a * a;
  const float g = exp_neg_split_f32(0.5f * hi, 0.5f * fmaf(a, a, -hi));
  *gauss = g;
  const float tail = 0.5f * erfcx_nonneg_f32(a * 0.70710678f) * g;
  return x >= 0.0f ? 1.0f - tail : tail;
}

// x Phi(x). A kernel with the derivative too computes normal_cdf_f32 once for both.
__device__ __forceinline__ float gelu_erf_f32(float x) {
  float gauss;
  return x * normal_cdf_f32(x, &gauss);
}

// Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi), from one Gaussian.
__device__ __forceinline__ float gelu_erf_grad_f32(float x) {
  float gauss;
  const float cdf = normal_cdf_f32(x, &gauss);
  return fmaf(x, 0.39894228f * gauss, cdf);
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

extern "C" __global__ void __launch_bounds__(512) row_gelu_erf_grad_gelu_erf_mul_bf16_25(const bf16_t* __restrict__ in0, const bf16_t* __restrict__ in1, bf16_t* __restrict__ out0, bf16_t* __restrict__ out1, float* __restrict__ out2) {
  constexpr idx_t ROWS = 8192u;
  constexpr idx_t COLS = 4096u;
  // the 256 threads of the block cooperate on one row
  const unsigned t = threadIdx.x;
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  float pacc0[8];  // partial sum of v9 over this block's rows
  #pragma unroll
  for (unsigned i = 0u; i < 8u; ++i) pacc0[i] = 0.0f;
  const idx_t row_begin = (idx_t)blockIdx.x * 8u;
  const idx_t row_end = row_begin + 8u < ROWS ? row_begin + 8u : ROWS;
  for (idx_t row = row_begin; row < row_end; row += 1u) {
    const idx_t v0_row = row * 4096u;
    // pass 1 of 1: element outputs
    #pragma unroll
    for (unsigned c = 0u; c < 1u; ++c) {
      const idx_t col0 = (idx_t)(c * 512u + t) * 8u;
      float v0_l[8];
      load_bf16x8(in0 + (v0_row + col0), v0_l);
      float v4_l[8];
      load_bf16x8(in1 + (v0_row + col0), v4_l);
      float st0[8];
      float st1[8];
      #pragma unroll
      for (unsigned u = 0u; u < 8u; ++u) {
        const float v0 = v0_l[u];
        const float v1 = v0;
        const float v2 = gelu_erf_grad_f32(v1);
        const float v3 = gelu_erf_f32(v0);
        const float v4 = v4_l[u];
        const float v5 = v4;
        const float v6 = __fmul_rn(v5, v2);
        const float v7 = round_to_bf16(v6);
        const float v8 = v7;
        const float v9 = v8;
        st0[u] = v3;
        st1[u] = v7;
        pacc0[c * 8u + u] = pacc0[c * 8u + u] + v9;
      }
      store_bf16x8(out0 + (row * COLS + col0), st0);
      store_bf16x8(out1 + (row * COLS + col0), st1);
    }
  }
  #pragma unroll
  for (unsigned c = 0u; c < 1u; ++c) {
    #pragma unroll
    for (unsigned u = 0u; u < 8u; ++u) {
      const unsigned i = c * 8u + u;
      const idx_t col = (idx_t)(c * 512u + t) * 8u + u;
      if (col < COLS) out2[(idx_t)blockIdx.x * COLS + col] = pacc0[i];
    }
  }
}
