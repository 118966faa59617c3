// The CUDA C that braze generates, run on the CPU: one std::thread per CUDA thread of a block,
// blocks one after another. __syncthreads is a barrier of the block's threads; warp-wide
// operations (shuffles, votes, ldmatrix, mma.sync) meet at a barrier of the warp's threads and
// exchange their operands through a slot per lane. The kernel's inline PTX is translated to
// calls of the emu_* functions below before it is compiled (see emulator.rs).
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)

struct dim3_t { unsigned x = 0, y = 0, z = 0; };
static thread_local dim3_t threadIdx, blockIdx;
static dim3_t blockDim, gridDim;
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct int2 { int x, y; };
struct int4 { int x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct longlong2 { long long x, y; };
struct ulonglong2 { unsigned long long x, y; };
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline float2 make_float2(float x, float y) { return {x, y}; }

// Dynamic shared memory of the running block.
alignas(16) static unsigned char emu_dynamic_shared[256 * 1024];

struct EmuWarp {
  std::unique_ptr<std::barrier<>> bar;
  int size = 32;
  alignas(16) unsigned char slot[32][64];
};
static std::unique_ptr<std::barrier<>> emu_block_barrier;
static std::vector<EmuWarp> emu_warps;
static thread_local int emu_lane = 0;
static thread_local EmuWarp* emu_warp = nullptr;
static std::mutex emu_atomic_mutex;

static inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
// `bar.sync id, count`: barrier `id` (1..15) of the block's `count` threads that use it, made
// at its first use in the block.
static std::unique_ptr<std::barrier<>> emu_named_barriers[16];
static std::mutex emu_named_mutex;
static inline void emu_named_barrier(unsigned id, unsigned count) {
  std::barrier<>* bar;
  {
    std::lock_guard<std::mutex> lock(emu_named_mutex);
    if (!emu_named_barriers[id]) emu_named_barriers[id] = std::make_unique<std::barrier<>>(count);
    bar = emu_named_barriers[id].get();
  }
  bar->arrive_and_wait();
}
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp->bar->arrive_and_wait(); }
static inline void __threadfence() {}
static inline void __threadfence_block() {}

// Every lane of the warp publishes `mine`; `f(value_of)` then reads any lane's.
template <class T, class F>
static inline auto emu_collective(const T& mine, F f) {
  static_assert(sizeof(T) <= 64, "a lane's slot holds 64 bytes");
  std::memcpy(emu_warp->slot[emu_lane], &mine, sizeof(T));
  emu_warp->bar->arrive_and_wait();
  auto value_of = [](int lane) {
    T v;
    std::memcpy(&v, emu_warp->slot[lane], sizeof(T));
    return v;
  };
  auto result = f(value_of);
  emu_warp->bar->arrive_and_wait();
  return result;
}

template <class T>
static inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  return emu_collective(v, [&](auto value_of) {
    int src = emu_lane ^ mask;
    if ((src & ~(width - 1)) != (emu_lane & ~(width - 1)) || src >= emu_warp->size) src = emu_lane;
    return value_of(src);
  });
}
template <class T>
static inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
  return emu_collective(v, [&](auto value_of) {
    int from = (emu_lane & ~(width - 1)) + (src & (width - 1));
    return value_of(from < emu_warp->size ? from : emu_lane);
  });
}
template <class T>
static inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  return emu_collective(v, [&](auto value_of) {
    int from = emu_lane + (int)delta;
    bool inside = (from & ~(width - 1)) == (emu_lane & ~(width - 1)) && from < emu_warp->size;
    return value_of(inside ? from : emu_lane);
  });
}
template <class T>
static inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  return emu_collective(v, [&](auto value_of) {
    int from = emu_lane - (int)delta;
    bool inside = from >= 0 && (from & ~(width - 1)) == (emu_lane & ~(width - 1));
    return value_of(inside ? from : emu_lane);
  });
}
static inline unsigned __ballot_sync(unsigned, int pred) {
  return emu_collective(pred != 0, [&](auto value_of) {
    unsigned bits = 0;
    for (int l = 0; l < emu_warp->size; ++l) bits |= (unsigned)value_of(l) << l;
    return bits;
  });
}
static inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
static inline int __all_sync(unsigned m, int pred) {
  unsigned full = emu_warp->size == 32 ? 0xffffffffu : ((1u << emu_warp->size) - 1);
  return __ballot_sync(m, pred) == full;
}

static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
static inline int __float_as_int(float f) { int x; std::memcpy(&x, &f, 4); return x; }
static inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned x; std::memcpy(&x, &f, 4); return x; }
static inline double __longlong_as_double(long long x) { double d; std::memcpy(&d, &x, 8); return d; }
static inline long long __double_as_longlong(double d) { long long x; std::memcpy(&x, &d, 8); return x; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float emu_ex2_ftz(float x);
// __expf as the hardware computes it: ex2.approx.ftz of x log2(e) (a macro: the C library
// declares a __expf of its own).
static inline float emu_expf(float x) { return emu_ex2_ftz(x * 1.44269504f); }
#define __expf emu_expf
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
template <class T>
static inline T __ldg(const T* p) { return *p; }
template <class T>
static inline T __ldcg(const T* p) { return *p; }
// Float to integer toward zero as the GPU converts: saturating, NaN to 0.
static inline int __float2int_rz(float x) {
  if (x != x) return 0;
  if (x >= 2147483648.0f) return 2147483647;
  if (x <= -2147483648.0f) return (int)-2147483647 - 1;
  return (int)x;
}
static inline long long __float2ll_rz(float x) {
  if (x != x) return 0;
  if (x >= 9223372036854775808.0f) return 9223372036854775807LL;
  if (x <= -9223372036854775808.0f) return (long long)-9223372036854775807LL - 1;
  return (long long)x;
}
// An integer to float rounded toward zero (long double holds every i64 exactly).
static inline float __ll2float_rz(long long x) {
  long double exact = (long double)x;
  float f = (float)exact;
  if (std::fabs((long double)f) > std::fabs(exact)) f = std::nextafter(f, 0.0f);
  return f;
}
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
using std::min;
using std::max;
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

template <class T>
static inline T atomicAdd(T* p, T v) { std::lock_guard<std::mutex> g(emu_atomic_mutex); T old = *p; *p = old + v; return old; }
template <class T>
static inline T atomicMax(T* p, T v) { std::lock_guard<std::mutex> g(emu_atomic_mutex); T old = *p; if (v > old) *p = v; return old; }
template <class T>
static inline T atomicMin(T* p, T v) { std::lock_guard<std::mutex> g(emu_atomic_mutex); T old = *p; if (v < old) *p = v; return old; }
template <class T>
static inline T atomicExch(T* p, T v) { std::lock_guard<std::mutex> g(emu_atomic_mutex); T old = *p; *p = v; return old; }
template <class T>
static inline T atomicCAS(T* p, T cmp, T v) { std::lock_guard<std::mutex> g(emu_atomic_mutex); T old = *p; if (old == cmp) *p = v; return old; }
template <class T>
static inline T atomicOr(T* p, T v) { std::lock_guard<std::mutex> g(emu_atomic_mutex); T old = *p; *p = old | v; return old; }

// Conversions as the PTX cvt instructions do them: round to nearest even, NaN to the canonical
// quiet NaN.
static inline unsigned short emu_f32_to_bf16(float x) {
  unsigned bits = __float_as_uint(x);
  if (x != x) return 0x7fff;
  return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
static inline float emu_bf16_to_f32(unsigned short b) { return __uint_as_float((unsigned)b << 16); }
// ex2.approx.ftz.f32: 2^x with results below the normal range flushed to zero.
static inline float emu_ex2_ftz(float x) {
  const float y = std::exp2(x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}
static inline float emu_f16_to_f32(unsigned short h) {
  unsigned sign = (h >> 15) & 1u, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  float magnitude;
  if (exponent == 0) magnitude = std::ldexp((float)mantissa, -24);
  else if (exponent == 31) magnitude = mantissa ? NAN : INFINITY;
  else magnitude = std::ldexp((float)(mantissa | 0x400u), (int)exponent - 25);
  return sign ? -magnitude : magnitude;
}
static inline unsigned short emu_f32_to_f16(float x) {
  if (x != x) return 0x7fff;
  unsigned sign = std::signbit(x) ? 0x8000u : 0u;
  double a = std::fabs((double)x);
  if (a >= 65520.0) return (unsigned short)(sign | 0x7c00u);
  if (a < std::ldexp(1.0, -14)) {  // subnormal: a multiple of 2^-24, rounded to nearest even
    double q = std::nearbyint(a * std::ldexp(1.0, 24));
    return (unsigned short)(sign | (unsigned)q);
  }
  int e;
  double m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  double q = std::nearbyint(m * 2048.0);  // 11 significant bits
  if (q == 2048.0) { q = 1024.0; e += 1; }
  if (e + 14 >= 31) return (unsigned short)(sign | 0x7c00u);
  return (unsigned short)(sign | ((unsigned)(e + 14) << 10) | ((unsigned)q - 1024u));
}
static inline unsigned emu_pack(float hi, float lo, bool bf16) {
  unsigned h = bf16 ? emu_f32_to_bf16(hi) : emu_f32_to_f16(hi);
  unsigned l = bf16 ? emu_f32_to_bf16(lo) : emu_f32_to_f16(lo);
  return (h << 16) | l;
}
static inline float emu_unpack(unsigned word, int half, bool bf16) {
  unsigned short bits = (unsigned short)(half ? word >> 16 : word & 0xffffu);
  return bf16 ? emu_bf16_to_f32(bits) : emu_f16_to_f32(bits);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: lane l = 4 g + t holds A rows g and g + 8,
// columns 2t, 2t + 1 (a0, a1) and 2t + 8, 2t + 9 (a2, a3); B rows (k) 2t, 2t + 1 (b0) and
// 2t + 8, 2t + 9 (b1) of column g; C rows g (c0, c1) and g + 8 (c2, c3), columns 2t, 2t + 1.
struct EmuMmaOperands { unsigned a[4]; unsigned b[2]; };
static inline void emu_mma(float* c, const unsigned* a, unsigned b0, unsigned b1, bool bf16) {
  EmuMmaOperands mine = {{a[0], a[1], a[2], a[3]}, {b0, b1}};
  float d[4];
  emu_collective(mine, [&](auto value_of) {
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
      EmuMmaOperands o = value_of(l);
      int g = l >> 2, t = l & 3;
      for (int h = 0; h < 2; ++h) {
        A[g][2 * t + h] = emu_unpack(o.a[0], h, bf16);
        A[g + 8][2 * t + h] = emu_unpack(o.a[1], h, bf16);
        A[g][2 * t + 8 + h] = emu_unpack(o.a[2], h, bf16);
        A[g + 8][2 * t + 8 + h] = emu_unpack(o.a[3], h, bf16);
        B[2 * t + h][g] = emu_unpack(o.b[0], h, bf16);
        B[2 * t + 8 + h][g] = emu_unpack(o.b[1], h, bf16);
      }
    }
    int g = emu_lane >> 2, t = emu_lane & 3;
    for (int e = 0; e < 4; ++e) {
      int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
      double sum = c[e];
      for (int k = 0; k < 16; ++k) sum += (double)A[row][k] * (double)B[k][col];
      d[e] = (float)sum;
    }
    return 0;
  });
  for (int e = 0; e < 4; ++e) c[e] = d[e];
}

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lanes 8j .. 8j + 7 give the row addresses
// of matrix j; lane l = 4 g + t receives, of each matrix, row g's elements 2t, 2t + 1 (or with
// .trans, column g's elements 2t, 2t + 1).
static inline void emu_ldmatrix(unsigned* r, const void* p, bool trans) {
  emu_collective(p, [&](auto value_of) {
    int g = emu_lane >> 2, t = emu_lane & 3;
    for (int j = 0; j < 4; ++j) {
      unsigned short e[2];
      for (int h = 0; h < 2; ++h) {
        int row = trans ? 2 * t + h : g, col = trans ? g : 2 * t + h;
        const unsigned short* rowp = static_cast<const unsigned short*>(value_of(8 * j + row));
        e[h] = rowp[col];
      }
      r[j] = (unsigned)e[0] | ((unsigned)e[1] << 16);
    }
    return 0;
  });
}
static inline void ldmatrix_x4(unsigned* r, const void* p) { emu_ldmatrix(r, p, false); }
static inline void ldmatrix_x4_trans(unsigned* r, const void* p) { emu_ldmatrix(r, p, true); }

// cp.async.cg.shared.global 16 bytes with a source size: copied now (the wait is a no-op).
static inline void cp_async_16(void* dst, const void* src, unsigned bytes) {
  std::memset(dst, 0, 16);
  if (bytes) std::memcpy(dst, src, bytes);
}

// Runs `kernel` over the grid, one block at a time.
template <class K>
static void emu_launch(const K& kernel, dim3_t grid, dim3_t block) {
  gridDim = grid;
  blockDim = block;
  unsigned threads = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::memset(emu_dynamic_shared, 0xff, sizeof emu_dynamic_shared);  // no zeros to rely on
        emu_block_barrier = std::make_unique<std::barrier<>>(threads);
        for (auto& named : emu_named_barriers) named.reset();
        emu_warps = std::vector<EmuWarp>((threads + 31) / 32);
        for (unsigned w = 0; w < emu_warps.size(); ++w) {
          emu_warps[w].size = (int)std::min(32u, threads - 32 * w);
          emu_warps[w].bar = std::make_unique<std::barrier<>>(emu_warps[w].size);
        }
        std::vector<std::thread> pool;
        for (unsigned i = 0; i < threads; ++i) {
          pool.emplace_back([=] {
            threadIdx = {i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
            blockIdx = {bx, by, bz};
            emu_lane = (int)(i % 32);
            emu_warp = &emu_warps[i / 32];
            kernel();
            // An exited thread no longer counts at barriers (as on the GPU since sm_70).
            emu_warp->bar->arrive_and_drop();
            emu_block_barrier->arrive_and_drop();
          });
        }
        for (auto& t : pool) t.join();
      }
}
