// braze kernel `row_eq_and_sum_max_bf16_162`: row kernel over 16384 rows of 50304 columns (outer [16384], inner [50304])
// config: row threads_per_row=1024 rows_per_block=1 uncached
// 2 reduction pass(es); 8 elements per thread and chunk; every pass re-reads its inputs
// source ops:
//   reshape        crates/nn/src/train.rs:36:68
//   reshape        crates/nn/src/train.rs:36:68
//   reshape        crates/nn/src/train.rs:36:68
//   eq             crates/nn/src/train.rs:36:68
//   and            crates/nn/src/train.rs:36:68
//   cast           crates/nn/src/train.rs:36:68
//   sum            crates/nn/src/train.rs:36:68
//   max            crates/nn/src/train.rs:36:68
//   reshape        crates/nn/src/train.rs:36:68
//   cast           crates/nn/src/train.rs:36:68
//   cross_entropy/max crates/nn/src/train.rs:36:68
//   sub            crates/nn/src/train.rs:36:68
//   exp            crates/nn/src/train.rs:36:68
//   sum            crates/nn/src/train.rs:36:68
//   div            crates/nn/src/train.rs:36:68
//   mul            crates/nn/src/train.rs:36:68
//   sub            crates/nn/src/train.rs:36:68
//   where          crates/nn/src/train.rs:36:68
//   where          crates/nn/src/train.rs:36:68
//   mul            crates/nn/src/train.rs:36:68
//   cast           crates/nn/src/train.rs:36:68
//   cross_entropy/log crates/nn/src/train.rs:36:68
//   cross_entropy/where crates/nn/src/train.rs:36:68
//   cross_entropy/sum crates/nn/src/train.rs:36:68
//   cross_entropy/mul crates/nn/src/train.rs:36:68
//   cross_entropy/sub crates/nn/src/train.rs:36:68
//   cross_entropy/where crates/nn/src/train.rs:36:68
//   cross_entropy/where crates/nn/src/train.rs:36:68
// buffers:
//   in0 = b552: 16384 x i32
//   in1 = b150: 50304 x i32
//   in2 = b551: 16384 x bool
//   in3 = b786: 824180736 x bf16
//   in4 = b553: 16384 x bool
//   in5 = b555: 1 x f32
//   out0 = b787: 824180736 x bf16
//   out1 = b788: 16384 x f32
// launches:
//   row_eq_and_sum_max_bf16_162<<<16384, 1024, 0>>>(in0, in1, in2, in3, in4, in5, out0, out1)

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

// Operands through an identity permute: ptxas 13.0 drops a negation it folds into VIMNMX3.
__device__ __forceinline__ int max_i32(int a, int b) {
  asm("prmt.b32 %0, %0, 0, 0x3210;" : "+r"(a));
  asm("prmt.b32 %0, %0, 0, 0x3210;" : "+r"(b));
  return a > b ? a : b;
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

// 4 i32 elements from one 16-byte aligned load.
__device__ __forceinline__ void load_i32x4(const int* p, int* v) {
  const uint4 w = *reinterpret_cast<const uint4*>(p);
  v[0] = (int)w.x;
  v[1] = (int)w.y;
  v[2] = (int)w.z;
  v[3] = (int)w.w;
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

extern "C" __global__ void __launch_bounds__(1024) row_eq_and_sum_max_bf16_162(const int* __restrict__ in0, const int* __restrict__ in1, const unsigned char* __restrict__ in2, const bf16_t* __restrict__ in3, const unsigned char* __restrict__ in4, const float* __restrict__ in5, bf16_t* __restrict__ out0, float* __restrict__ out1) {
  constexpr idx_t ROWS = 16384u;
  constexpr idx_t COLS = 50304u;
  __shared__ float red_v6[32];  // one partial per warp
  __shared__ int red_v7[32];  // one partial per warp
  __shared__ float red_v10[32];  // one partial per warp
  __shared__ float red_v13[32];  // one partial per warp
  __shared__ float red_v27[32];  // one partial per warp
  // the 1024 threads of the block cooperate on one row
  const unsigned t = threadIdx.x;
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  const idx_t row = (idx_t)blockIdx.x;
  if (row < ROWS) {
    const int v0 = in0[row];
    const bool v3 = (in2[row] != 0);
    const float v17 = __int_as_float(0x7fc00000);
    const bool v19 = (in4[row] != 0);
    const float v20 = 0.0f;
    const float v22 = in5[0u];
    const idx_t v8_row = row * 50304u;
    // pass 1 of 3: reduce v6, v7, v10
    float acc_v6 = 0.0f;
    int acc_v7 = 0;
    float acc_v10 = __int_as_float(0xff800000);
    #pragma unroll 4
    for (idx_t col0 = (idx_t)t * 8u; col0 < COLS; col0 += 8192u) {
      int v1_l[8];
      load_i32x4(in1 + col0, v1_l);
      load_i32x4(in1 + (col0 + 4u), v1_l + 4u);
      float v8_l[8];
      load_bf16x8(in3 + (v8_row + col0), v8_l);
      #pragma unroll
      for (unsigned u = 0u; u < 8u; ++u) {
        const int v1 = v1_l[u];
        const bool v2 = v0 == v1;
        const bool v4 = v3 && v2;
        const float v5 = (v4 ? 1.0f : 0.0f);
        const float v8 = v8_l[u];
        const float v9 = v8;
        acc_v6 = acc_v6 + v5;
        acc_v7 = max_i32(acc_v7, (int)v4);
        acc_v10 = max_f32(acc_v10, v9);
      }
    }
    // combine across the row's threads: butterfly within each warp, then the 32 warp partials in warp order
    #pragma unroll
    for (unsigned offset = 16u; offset > 0u; offset >>= 1) {
      const float acc_v6_other = __shfl_xor_sync(0xffffffffu, acc_v6, offset);
      acc_v6 = acc_v6 + acc_v6_other;
      const int acc_v7_other = __shfl_xor_sync(0xffffffffu, acc_v7, offset);
      acc_v7 = max_i32(acc_v7, acc_v7_other);
      const float acc_v10_other = __shfl_xor_sync(0xffffffffu, acc_v10, offset);
      acc_v10 = max_f32(acc_v10, acc_v10_other);
    }
    if (lane == 0u) {
      red_v6[warp] = acc_v6;
      red_v7[warp] = acc_v7;
      red_v10[warp] = acc_v10;
    }
    __syncthreads();
    acc_v6 = red_v6[0];
    #pragma unroll
    for (unsigned w = 1u; w < 32u; ++w) {
      acc_v6 = acc_v6 + red_v6[w];
    }
    acc_v7 = red_v7[0];
    #pragma unroll
    for (unsigned w = 1u; w < 32u; ++w) {
      acc_v7 = max_i32(acc_v7, red_v7[w]);
    }
    acc_v10 = red_v10[0];
    #pragma unroll
    for (unsigned w = 1u; w < 32u; ++w) {
      acc_v10 = max_f32(acc_v10, red_v10[w]);
    }
    const float v6 = acc_v6;
    const bool v7 = (acc_v7 != 0);
    const float v10 = acc_v10;
    // pass 2 of 3: reduce v13, v27
    float acc_v13 = 0.0f;
    float acc_v27 = 0.0f;
    #pragma unroll 4
    for (idx_t col0 = (idx_t)t * 8u; col0 < COLS; col0 += 8192u) {
      int v1_l[8];
      load_i32x4(in1 + col0, v1_l);
      load_i32x4(in1 + (col0 + 4u), v1_l + 4u);
      float v8_l[8];
      load_bf16x8(in3 + (v8_row + col0), v8_l);
      #pragma unroll
      for (unsigned u = 0u; u < 8u; ++u) {
        const int v1 = v1_l[u];
        const bool v2 = v0 == v1;
        const bool v4 = v3 && v2;
        const float v8 = v8_l[u];
        const float v9 = v8;
        const float v11 = v9 - v10;
        const float v12 = expf(v11);
        const float v26 = v4 ? v11 : v20;
        acc_v13 = acc_v13 + v12;
        acc_v27 = acc_v27 + v26;
      }
    }
    // combine across the row's threads: butterfly within each warp, then the 32 warp partials in warp order
    #pragma unroll
    for (unsigned offset = 16u; offset > 0u; offset >>= 1) {
      const float acc_v13_other = __shfl_xor_sync(0xffffffffu, acc_v13, offset);
      acc_v13 = acc_v13 + acc_v13_other;
      const float acc_v27_other = __shfl_xor_sync(0xffffffffu, acc_v27, offset);
      acc_v27 = acc_v27 + acc_v27_other;
    }
    if (lane == 0u) {
      red_v13[warp] = acc_v13;
      red_v27[warp] = acc_v27;
    }
    __syncthreads();
    acc_v13 = red_v13[0];
    #pragma unroll
    for (unsigned w = 1u; w < 32u; ++w) {
      acc_v13 = acc_v13 + red_v13[w];
    }
    acc_v27 = red_v27[0];
    #pragma unroll
    for (unsigned w = 1u; w < 32u; ++w) {
      acc_v27 = acc_v27 + red_v27[w];
    }
    const float v13 = acc_v13;
    const float v27 = acc_v27;
    const float v25 = logf(v13);
    const float v28 = __fmul_rn(v6, v25);
    const float v29 = v28 - v27;
    const float v30 = v7 ? v29 : v17;
    const float v31 = v19 ? v30 : v20;
    // pass 3 of 3: element outputs
    #pragma unroll 4
    for (idx_t col0 = (idx_t)t * 8u; col0 < COLS; col0 += 8192u) {
      int v1_l[8];
      load_i32x4(in1 + col0, v1_l);
      load_i32x4(in1 + (col0 + 4u), v1_l + 4u);
      float v8_l[8];
      load_bf16x8(in3 + (v8_row + col0), v8_l);
      float st0[8];
      #pragma unroll
      for (unsigned u = 0u; u < 8u; ++u) {
        const int v1 = v1_l[u];
        const bool v2 = v0 == v1;
        const bool v4 = v3 && v2;
        const float v5 = (v4 ? 1.0f : 0.0f);
        const float v8 = v8_l[u];
        const float v9 = v8;
        const float v11 = v9 - v10;
        const float v12 = expf(v11);
        const float v14 = v12 / v13;
        const float v15 = __fmul_rn(v6, v14);
        const float v16 = v15 - v5;
        const float v18 = v7 ? v16 : v17;
        const float v21 = v19 ? v18 : v20;
        const float v23 = __fmul_rn(v21, v22);
        const float v24 = round_to_bf16(v23);
        st0[u] = v24;
      }
      store_bf16x8(out0 + (row * COLS + col0), st0);
    }
    if (t == 0u) {
      out1[row] = v31;
    }
  }
}
