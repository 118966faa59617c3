// braze kernel `row_layer_norm_relu_add_bf16_0`: row kernel over 65536 rows of 768 columns (outer [65536], inner [768])
// config: row threads_per_row=32 rows_per_block=8 cached
// 2 reduction pass(es); 8 elements per thread and chunk; 3 chunk(s) per thread held in registers
// in registers across passes: v1, v5
// source ops:
//   layer_norm/cast crates/workloads/src/definition.rs:58:7
//   layer_norm/sum crates/workloads/src/definition.rs:58:7
//   layer_norm/mul crates/workloads/src/definition.rs:58:7
//   layer_norm/sub crates/workloads/src/definition.rs:58:7
//   layer_norm/sum crates/workloads/src/definition.rs:58:7
//   layer_norm/mul crates/workloads/src/definition.rs:58:7
//   layer_norm/sum crates/workloads/src/definition.rs:58:7
//   layer_norm/div crates/workloads/src/definition.rs:58:7
//   layer_norm/sub crates/workloads/src/definition.rs:58:7
//   layer_norm/mul crates/workloads/src/definition.rs:58:7
//   layer_norm/min crates/workloads/src/definition.rs:58:7
//   layer_norm/sub crates/workloads/src/definition.rs:58:7
//   layer_norm/mul crates/workloads/src/definition.rs:58:7
//   layer_norm/max crates/workloads/src/definition.rs:58:7
//   layer_norm/add crates/workloads/src/definition.rs:58:7
//   layer_norm/rsqrt crates/workloads/src/definition.rs:58:7
//   layer_norm/mul crates/workloads/src/definition.rs:58:7
//   layer_norm/cast crates/workloads/src/definition.rs:58:7
//   layer_norm/mul crates/workloads/src/definition.rs:58:7
//   layer_norm/cast crates/workloads/src/definition.rs:58:7
//   layer_norm/add crates/workloads/src/definition.rs:58:7
//   layer_norm/cast crates/workloads/src/definition.rs:58:7
//   relu           crates/workloads/src/definition.rs:58:30
//   add            crates/workloads/src/definition.rs:58:38
// buffers:
//   in0 = b0: 50331648 x bf16
//   in1 = b1: 768 x bf16
//   in2 = b2: 768 x bf16
//   in3 = b3: 50331648 x bf16
//   out0 = b4: 50331648 x bf16
// launches:
//   row_layer_norm_relu_add_bf16_0<<<8192, 256, 0>>>(in0, in1, in2, in3, out0)

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

// NaN-propagating maximum (fmaxf would drop the NaN).
__device__ __forceinline__ float max_f32(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }

// NaN-propagating minimum (fminf would drop the NaN).
__device__ __forceinline__ float min_f32(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }

// relu(NaN) = NaN and relu(-0) = +0.
__device__ __forceinline__ float relu_f32(float x) { return (x > 0.0f || x != x) ? x : 0.0f; }

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

extern "C" __global__ void __launch_bounds__(256) row_layer_norm_relu_add_bf16_0(const bf16_t* __restrict__ in0, const bf16_t* __restrict__ in1, const bf16_t* __restrict__ in2, const bf16_t* __restrict__ in3, bf16_t* __restrict__ out0) {
  constexpr idx_t ROWS = 65536u;
  constexpr idx_t COLS = 768u;
  // 32 threads cooperate on each row, 8 row(s) per block
  const unsigned t = threadIdx.x % 32u;
  const unsigned group = threadIdx.x / 32u;
  const idx_t row = (idx_t)blockIdx.x * 8u + group;
  if (row < ROWS) {
    const float v3 = 0.0013020834f;
    const float v9 = 768.0f;
    const float v13 = 3.4028235e38f;
    const float v17 = 0.0f;
    const float v19 = 1e-5f;
    const idx_t v0_row = row * 768u;
    // pass 1 of 3: reduce v2
    float acc_v2 = 0.0f;
    float v1_c[24];
    #pragma unroll
    for (unsigned c = 0u; c < 3u; ++c) {
      const idx_t col0 = (idx_t)(c * 32u + t) * 8u;
      float v0_l[8];
      load_bf16x8(in0 + (v0_row + col0), v0_l);
      #pragma unroll
      for (unsigned u = 0u; u < 8u; ++u) {
        const float v0 = v0_l[u];
        const float v1 = v0;
        v1_c[c * 8u + u] = v1;
        acc_v2 = acc_v2 + v1;
      }
    }
    // combine across the row's threads: butterfly over the row's 32 lanes
    #pragma unroll
    for (unsigned offset = 16u; offset > 0u; offset >>= 1) {
      const float acc_v2_other = __shfl_xor_sync(0xffffffffu, acc_v2, offset);
      acc_v2 = acc_v2 + acc_v2_other;
    }
    const float v2 = acc_v2;
    const float v4 = __fmul_rn(v2, v3);
    // pass 2 of 3: reduce v6, v8
    float acc_v6 = 0.0f;
    float acc_v8 = 0.0f;
    float v5_c[24];
    #pragma unroll
    for (unsigned c = 0u; c < 3u; ++c) {
      #pragma unroll
      for (unsigned u = 0u; u < 8u; ++u) {
        const float v1 = v1_c[c * 8u + u];
        const float v5 = v1 - v4;
        const float v7 = __fmul_rn(v5, v5);
        v5_c[c * 8u + u] = v5;
        acc_v6 = acc_v6 + v5;
        acc_v8 = acc_v8 + v7;
      }
    }
    // combine across the row's threads: butterfly over the row's 32 lanes
    #pragma unroll
    for (unsigned offset = 16u; offset > 0u; offset >>= 1) {
      const float acc_v6_other = __shfl_xor_sync(0xffffffffu, acc_v6, offset);
      acc_v6 = acc_v6 + acc_v6_other;
      const float acc_v8_other = __shfl_xor_sync(0xffffffffu, acc_v8, offset);
      acc_v8 = acc_v8 + acc_v8_other;
    }
    const float v6 = acc_v6;
    const float v8 = acc_v8;
    const float v10 = v6 / v9;
    const float v12 = __fmul_rn(v6, v10);
    const float v14 = min_f32(v12, v13);
    const float v15 = v8 - v14;
    const float v16 = __fmul_rn(v15, v3);
    const float v18 = max_f32(v16, v17);
    const float v20 = v18 + v19;
    const float v21 = rsqrtf(v20);
    // pass 3 of 3: element outputs
    #pragma unroll
    for (unsigned c = 0u; c < 3u; ++c) {
      const idx_t col0 = (idx_t)(c * 32u + t) * 8u;
      float v23_l[8];
      load_bf16x8(in1 + col0, v23_l);
      float v26_l[8];
      load_bf16x8(in2 + col0, v26_l);
      float v31_l[8];
      load_bf16x8(in3 + (v0_row + col0), v31_l);
      float st0[8];
      #pragma unroll
      for (unsigned u = 0u; u < 8u; ++u) {
        const float v5 = v5_c[c * 8u + u];
        const float v11 = v5 - v10;
        const float v22 = __fmul_rn(v11, v21);
        const float v23 = v23_l[u];
        const float v24 = v23;
        const float v25 = __fmul_rn(v22, v24);
        const float v26 = v26_l[u];
        const float v27 = v26;
        const float v28 = v25 + v27;
        const float v29 = round_to_bf16(v28);
        const float v30 = relu_f32(v29);
        const float v31 = v31_l[u];
        const float v32 = v30 + v31;
        st0[u] = v32;
      }
      store_bf16x8(out0 + (row * COLS + col0), st0);
    }
  }
}
