// braze kernel `row_mean_sub_add_mul_f32_47`: row kernel over 8192 rows of 1024 columns (outer [8192], inner [1024])
// config: row threads_per_row=128 rows_per_block=2 cached
// 1 reduction pass(es); 8 elements per thread and chunk; 1 chunk(s) per thread held in registers
// in registers across passes: v2, v3, v14, v15, v19
// source ops:
//   cast           crates/workloads/src/definition.rs:139:16
//   mean/add       crates/workloads/src/definition.rs:139:7
//   cast           crates/workloads/src/definition.rs:139:16
//   sub            crates/workloads/src/definition.rs:139:16
//   mean/add       crates/workloads/src/definition.rs:139:7
//   cast           crates/workloads/src/definition.rs:139:16
//   mean/sub       crates/workloads/src/definition.rs:139:16
//   add            crates/workloads/src/definition.rs:139:16
//   cast           crates/workloads/src/definition.rs:139:16
//   mul            crates/workloads/src/definition.rs:139:16
//   mean/sum       crates/workloads/src/definition.rs:139:16
//   mean/mul       crates/workloads/src/definition.rs:139:16
//   mean/mul       crates/workloads/src/definition.rs:139:16
//   mul            crates/workloads/src/definition.rs:139:16
//   mean/sum       crates/workloads/src/definition.rs:139:16
//   mean/mul       crates/workloads/src/definition.rs:139:16
//   sub            crates/workloads/src/definition.rs:139:16
//   mean/mul       crates/workloads/src/definition.rs:139:16
//   mul            crates/workloads/src/definition.rs:139:16
//   sub            crates/workloads/src/definition.rs:139:16
//   mul            crates/workloads/src/definition.rs:139:16
//   cast           crates/workloads/src/definition.rs:139:16
// buffers:
//   in0 = b6: 1024 x bf16
//   in1 = b0: 8388608 x bf16
//   in2 = b79: 8388608 x bf16
//   in3 = b92: 8192 x f32
//   in4 = b162: 8388608 x bf16
//   in5 = b181: 8388608 x bf16
//   in6 = b94: 8192 x f32
//   out0 = b182: 8388608 x bf16
//   out1 = b290: 1048576 x f32
//   out2 = b291: 1048576 x f32
//   out3 = b292: 1048576 x f32
// launches:
//   row_mean_sub_add_mul_f32_47<<<1024, 256, 0>>>(in0, in1, in2, in3, in4, in5, in6, out0, out1, out2, out3)

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

extern "C" __global__ void __launch_bounds__(256) row_mean_sub_add_mul_f32_47(const bf16_t* __restrict__ in0, const bf16_t* __restrict__ in1, const bf16_t* __restrict__ in2, const float* __restrict__ in3, const bf16_t* __restrict__ in4, const bf16_t* __restrict__ in5, const float* __restrict__ in6, bf16_t* __restrict__ out0, float* __restrict__ out1, float* __restrict__ out2, float* __restrict__ out3) {
  constexpr idx_t ROWS = 8192u;
  constexpr idx_t COLS = 1024u;
  __shared__ float red_v16[2][4];  // one partial per warp
  __shared__ float red_v21[2][4];  // one partial per warp
  // 128 threads cooperate on each row, 2 rows per block
  const unsigned t = threadIdx.x % 128u;
  const unsigned group = threadIdx.x / 128u;
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = t >> 5;
  float pacc0[8];  // partial sum of v31 over this block's rows
  #pragma unroll
  for (unsigned i = 0u; i < 8u; ++i) pacc0[i] = 0.0f;
  float pacc1[8];  // partial sum of v14 over this block's rows
  #pragma unroll
  for (unsigned i = 0u; i < 8u; ++i) pacc1[i] = 0.0f;
  float pacc2[8];  // partial sum of v32 over this block's rows
  #pragma unroll
  for (unsigned i = 0u; i < 8u; ++i) pacc2[i] = 0.0f;
  const idx_t row_begin = (idx_t)blockIdx.x * 8u;
  const idx_t row_end = row_begin + 8u < ROWS ? row_begin + 8u : ROWS;
  for (idx_t row = row_begin + group; row < row_end; row += 2u) {
    const float v6 = in3[row];
    const float v17 = in6[row];
    const float v22 = 0.0009765625f;
    const idx_t v2_row = row * 1024u;
    // pass 1 of 2: reduce v16, v21
    float acc_v16 = 0.0f;
    float acc_v21 = 0.0f;
    float v2_c[8];
    float v3_c[8];
    float v14_c[8];
    float v15_c[8];
    float v19_c[8];
    #pragma unroll
    for (unsigned c = 0u; c < 1u; ++c) {
      const idx_t col0 = (idx_t)(c * 128u + t) * 8u;
      float v0_l[8];
      load_bf16x8(in0 + col0, v0_l);
      load_bf16x8(in1 + (v2_row + col0), v2_c + (c * 8u));
      load_bf16x8(in2 + (v2_row + col0), v3_c + (c * 8u));
      float v11_l[8];
      load_bf16x8(in4 + (v2_row + col0), v11_l);
      float v12_l[8];
      load_bf16x8(in5 + (v2_row + col0), v12_l);
      #pragma unroll
      for (unsigned u = 0u; u < 8u; ++u) {
        const float v0 = v0_l[u];
        const float v1 = v0;
        const float v2 = v2_c[c * 8u + u];
        const float v3 = v3_c[c * 8u + u];
        const float v4 = v2 + v3;
        const float v5 = round_to_bf16(v4);
        const float v7 = v5 - v6;
        const float v11 = v11_l[u];
        const float v12 = v12_l[u];
        const float v13 = v11 + v12;
        const float v14 = round_to_bf16(v13);
        const float v15 = __fmul_rn(v14, v1);
        const float v19 = __fmul_rn(v7, v17);
        const float v20 = __fmul_rn(v15, v19);
        v14_c[c * 8u + u] = v14;
        v15_c[c * 8u + u] = v15;
        v19_c[c * 8u + u] = v19;
        acc_v16 = acc_v16 + v15;
        acc_v21 = acc_v21 + v20;
      }
    }
    // combine across the row's threads: butterfly within each warp, then the 4 warp partials in warp order
    #pragma unroll
    for (unsigned offset = 16u; offset > 0u; offset >>= 1) {
      const float acc_v16_other = __shfl_xor_sync(0xffffffffu, acc_v16, offset);
      acc_v16 = acc_v16 + acc_v16_other;
      const float acc_v21_other = __shfl_xor_sync(0xffffffffu, acc_v21, offset);
      acc_v21 = acc_v21 + acc_v21_other;
    }
    if (lane == 0u) {
      red_v16[group][warp] = acc_v16;
      red_v21[group][warp] = acc_v21;
    }
    asm volatile("bar.sync %0, %1;" :: "r"(group + 1u), "r"(128u) : "memory");
    acc_v16 = red_v16[group][0];
    #pragma unroll
    for (unsigned w = 1u; w < 4u; ++w) {
      acc_v16 = acc_v16 + red_v16[group][w];
    }
    acc_v21 = red_v21[group][0];
    #pragma unroll
    for (unsigned w = 1u; w < 4u; ++w) {
      acc_v21 = acc_v21 + red_v21[group][w];
    }
    const float v16 = acc_v16;
    const float v21 = acc_v21;
    const float v23 = __fmul_rn(v16, v22);
    const float v25 = __fmul_rn(v21, v22);
    asm volatile("" ::: "memory");  // keep later passes' loads out of registers until needed
    // pass 2 of 2: element outputs
    #pragma unroll
    for (unsigned c = 0u; c < 1u; ++c) {
      const idx_t col0 = (idx_t)(c * 128u + t) * 8u;
      float st0[8];
      #pragma unroll
      for (unsigned u = 0u; u < 8u; ++u) {
        const float v2 = v2_c[c * 8u + u];
        const float v3 = v3_c[c * 8u + u];
        const float v8 = v2 + v3;
        const float v9 = round_to_bf16(v8);
        const float v10 = v9 - v6;
        const float v14 = v14_c[c * 8u + u];
        const float v15 = v15_c[c * 8u + u];
        const float v18 = __fmul_rn(v10, v17);
        const float v19 = v19_c[c * 8u + u];
        const float v24 = v15 - v23;
        const float v26 = __fmul_rn(v18, v25);
        const float v27 = v24 - v26;
        const float v28 = __fmul_rn(v17, v27);
        const float v29 = round_to_bf16(v28);
        const float v30 = v29;
        const float v31 = v30;
        const float v32 = __fmul_rn(v14, v19);
        st0[u] = v29;
        pacc0[c * 8u + u] = pacc0[c * 8u + u] + v31;
        pacc1[c * 8u + u] = pacc1[c * 8u + u] + v14;
        pacc2[c * 8u + u] = pacc2[c * 8u + u] + v32;
      }
      store_bf16x8(out0 + (row * COLS + col0), st0);
    }
    asm volatile("bar.sync %0, %1;" :: "r"(group + 1u), "r"(128u) : "memory");  // the next row reuses the shared partials
  }
  // the block's 2 row groups fold their partials in group order
  __shared__ float partial_row[COLS];
  for (unsigned g = 1u; g < 2u; ++g) {
    if (group == g) {
      #pragma unroll
      for (unsigned c = 0u; c < 1u; ++c) {
        #pragma unroll
        for (unsigned u = 0u; u < 8u; ++u) {
          const unsigned i = c * 8u + u;
          const idx_t col = (idx_t)(c * 128u + t) * 8u + u;
          if (col < COLS) partial_row[col] = pacc0[i];
        }
      }
    }
    __syncthreads();
    if (group == 0u) {
      #pragma unroll
      for (unsigned c = 0u; c < 1u; ++c) {
        #pragma unroll
        for (unsigned u = 0u; u < 8u; ++u) {
          const unsigned i = c * 8u + u;
          const idx_t col = (idx_t)(c * 128u + t) * 8u + u;
          if (col < COLS) pacc0[i] = pacc0[i] + partial_row[col];
        }
      }
    }
    __syncthreads();
  }
  for (unsigned g = 1u; g < 2u; ++g) {
    if (group == g) {
      #pragma unroll
      for (unsigned c = 0u; c < 1u; ++c) {
        #pragma unroll
        for (unsigned u = 0u; u < 8u; ++u) {
          const unsigned i = c * 8u + u;
          const idx_t col = (idx_t)(c * 128u + t) * 8u + u;
          if (col < COLS) partial_row[col] = pacc1[i];
        }
      }
    }
    __syncthreads();
    if (group == 0u) {
      #pragma unroll
      for (unsigned c = 0u; c < 1u; ++c) {
        #pragma unroll
        for (unsigned u = 0u; u < 8u; ++u) {
          const unsigned i = c * 8u + u;
          const idx_t col = (idx_t)(c * 128u + t) * 8u + u;
          if (col < COLS) pacc1[i] = pacc1[i] + partial_row[col];
        }
      }
    }
    __syncthreads();
  }
  for (unsigned g = 1u; g < 2u; ++g) {
    if (group == g) {
      #pragma unroll
      for (unsigned c = 0u; c < 1u; ++c) {
        #pragma unroll
        for (unsigned u = 0u; u < 8u; ++u) {
          const unsigned i = c * 8u + u;
          const idx_t col = (idx_t)(c * 128u + t) * 8u + u;
          if (col < COLS) partial_row[col] = pacc2[i];
        }
      }
    }
    __syncthreads();
    if (group == 0u) {
      #pragma unroll
      for (unsigned c = 0u; c < 1u; ++c) {
        #pragma unroll
        for (unsigned u = 0u; u < 8u; ++u) {
          const unsigned i = c * 8u + u;
          const idx_t col = (idx_t)(c * 128u + t) * 8u + u;
          if (col < COLS) pacc2[i] = pacc2[i] + partial_row[col];
        }
      }
    }
    __syncthreads();
  }
  if (group == 0u) {
    #pragma unroll
    for (unsigned c = 0u; c < 1u; ++c) {
      #pragma unroll
      for (unsigned u = 0u; u < 8u; ++u) {
        const unsigned i = c * 8u + u;
        const idx_t col = (idx_t)(c * 128u + t) * 8u + u;
        if (col < COLS) out1[(idx_t)blockIdx.x * COLS + col] = pacc0[i];
      }
    }
    #pragma unroll
    for (unsigned c = 0u; c < 1u; ++c) {
      #pragma unroll
      for (unsigned u = 0u; u < 8u; ++u) {
        const unsigned i = c * 8u + u;
        const idx_t col = (idx_t)(c * 128u + t) * 8u + u;
        if (col < COLS) out2[(idx_t)blockIdx.x * COLS + col] = pacc1[i];
      }
    }
    #pragma unroll
    for (unsigned c = 0u; c < 1u; ++c) {
      #pragma unroll
      for (unsigned u = 0u; u < 8u; ++u) {
        const unsigned i = c * 8u + u;
        const idx_t col = (idx_t)(c * 128u + t) * 8u + u;
        if (col < COLS) out3[(idx_t)blockIdx.x * COLS + col] = pacc2[i];
      }
    }
  }
}
