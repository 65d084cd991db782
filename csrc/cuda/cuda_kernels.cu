/*
 * cuda_kernels.cu -- the reduction kernels on device memory: every type but
 * bool x Sum, Prod, Max, Min (Avg reduces with Sum), Avg's division and the
 * prescale/postscale factors' scaling, with the
 * rules of reduce.c, so that a sum computed here has the bits the host's has (but for a
 * NaN's sign and payload: the device's arithmetic makes the canonical NaN where the host
 * keeps an operand's; the tests compare NaNs by position):
 *
 *   - Integers add and multiply in the unsigned type of the same width (they wrap).
 *   - float16 and bfloat16 are widened to float32, combined, and rounded back to
 *     nearest-even after every operation, by float16.h's conversions, the host's
 *     own lines (not cuda_fp16.h's, so that the two cannot drift apart).
 *   - Float min/max return the other operand when one is NaN (IEEE fmin/fmax);
 *     float16/bfloat16 keep the chosen input's bits.
 *   - Built without --use_fast_math: float32 division is correctly rounded, and
 *     no FMA can form (each kernel does one operation per element).
 *
 * Compiled by nvcc only when setup.py builds CUDA; cuda.c is the one caller.
 * One grid-stride loop per (type, op); a launch covers n elements with at most
 * 4096 blocks of 256 threads.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "kernels/float16.h"

namespace {

enum { SUM = 0, PROD = 1, MAX = 2, MIN = 3 };

template <int OP, typename T, typename U>
__device__ __forceinline__ T int_op(T x, T y) {
  if (OP == SUM) return (T)((U)x + (U)y);
  if (OP == PROD) return (T)((U)x * (U)y);
  if (OP == MAX) return x > y ? x : y;
  return x < y ? x : y;
}

template <int OP, typename T>
__device__ __forceinline__ T flt_op(T x, T y) {
  if (OP == SUM) return x + y;
  if (OP == PROD) return x * y;
  if (OP == MAX) return (x > y || y != y) ? x : y;
  return (x < y || y != y) ? x : y;
}

template <int OP, bool BF16>
__device__ __forceinline__ uint16_t h16_op(uint16_t xb, uint16_t yb) {
  float x = BF16 ? bf16_to_float(xb) : half_to_float(xb);
  float y = BF16 ? bf16_to_float(yb) : half_to_float(yb);
  if (OP == MAX) return (x > y || y != y) ? xb : yb;
  if (OP == MIN) return (x < y || y != y) ? xb : yb;
  float r = OP == SUM ? __fadd_rn(x, y) : __fmul_rn(x, y);
  return BF16 ? float_to_bf16(r) : float_to_half(r);
}

#define GRID_LOOP                                                       \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; \
       i += (size_t)gridDim.x * blockDim.x)

template <int OP, typename T, typename U>
__global__ void reduce_int(T *d, const T *a, const T *b, size_t n) {
  GRID_LOOP d[i] = int_op<OP, T, U>(a[i], b[i]);
}

template <int OP, typename T>
__global__ void reduce_flt(T *d, const T *a, const T *b, size_t n) {
  GRID_LOOP d[i] = flt_op<OP, T>(a[i], b[i]);
}

template <int OP, bool BF16>
__global__ void reduce_h16(uint16_t *d, const uint16_t *a, const uint16_t *b, size_t n) {
  GRID_LOOP d[i] = h16_op<OP, BF16>(a[i], b[i]);
}

template <typename T, typename S>
__global__ void divide_int(T *p, size_t n, uint64_t divisor) {
  GRID_LOOP p[i] = (T)((S)p[i] / (S)divisor);
}

__global__ void divide_f32(float *p, size_t n, float divisor) {
  GRID_LOOP p[i] = __fdiv_rn(p[i], divisor);
}

__global__ void divide_f64(double *p, size_t n, double divisor) {
  GRID_LOOP p[i] = __ddiv_rn(p[i], divisor);
}

template <bool BF16>
__global__ void divide_h16(uint16_t *p, size_t n, float divisor) {
  GRID_LOOP {
    float v = BF16 ? bf16_to_float(p[i]) : half_to_float(p[i]);
    float r = __fdiv_rn(v, divisor);
    p[i] = BF16 ? float_to_bf16(r) : float_to_half(r);
  }
}

/* Integers scaled as reduce.c's INT_SCALE_KERNEL: the product in float64, truncated
 * toward zero; outside [LO, HI) clamped, NaN 0. */
template <typename T>
__global__ void scale_int(T *d, const T *s, size_t n, double f, double lo, double hi, T tmin,
                          T tmax) {
  GRID_LOOP {
    const double x = __dmul_rn(f, (double)s[i]);
    d[i] = x >= hi ? tmax : x >= lo ? (T)x : x != x ? (T)0 : tmin;
  }
}

__global__ void scale_f32(float *d, const float *s, size_t n, float f) {
  GRID_LOOP d[i] = __fmul_rn(s[i], f);
}

__global__ void scale_f64(double *d, const double *s, size_t n, double f) {
  GRID_LOOP d[i] = __dmul_rn(s[i], f);
}

template <bool BF16>
__global__ void scale_h16(uint16_t *d, const uint16_t *s, size_t n, float f) {
  GRID_LOOP {
    float v = BF16 ? bf16_to_float(s[i]) : half_to_float(s[i]);
    float r = __fmul_rn(v, f);
    d[i] = BF16 ? float_to_bf16(r) : float_to_half(r);
  }
}

unsigned blocks_for(size_t n) {
  size_t b = (n + 255) / 256;
  return (unsigned)(b > 4096 ? 4096 : (b ? b : 1));
}

template <int OP>
cudaError_t launch_reduce(void *d, const void *a, const void *b, size_t n, int dt, cudaStream_t s) {
  const unsigned g = blocks_for(n);
#define INT_CASE(num, T, U) \
  case num: reduce_int<OP, T, U><<<g, 256, 0, s>>>((T *)d, (const T *)a, (const T *)b, n); break;
  switch (dt) {
    INT_CASE(0, int8_t, uint32_t)
    INT_CASE(1, uint8_t, uint32_t)
    INT_CASE(2, int32_t, uint32_t)
    INT_CASE(3, uint32_t, uint32_t)
    INT_CASE(4, int64_t, uint64_t)
    INT_CASE(5, uint64_t, uint64_t)
    INT_CASE(32, int16_t, uint32_t)
    INT_CASE(33, uint16_t, uint32_t)
    case 6:
      reduce_h16<OP, false>
          <<<g, 256, 0, s>>>((uint16_t *)d, (const uint16_t *)a, (const uint16_t *)b, n);
      break;
    case 9:
      reduce_h16<OP, true>
          <<<g, 256, 0, s>>>((uint16_t *)d, (const uint16_t *)a, (const uint16_t *)b, n);
      break;
    case 7:
      reduce_flt<OP, float><<<g, 256, 0, s>>>((float *)d, (const float *)a, (const float *)b, n);
      break;
    case 8:
      reduce_flt<OP, double>
          <<<g, 256, 0, s>>>((double *)d, (const double *)a, (const double *)b, n);
      break;
    default: return cudaErrorInvalidValue;
  }
#undef INT_CASE
  return cudaGetLastError();
}

} // namespace

/* dst = a op b on device memory, on `stream`; op is 0..3 (Avg's sum is Sum). dt is an
 * hvdlDataType_t other than bool. Returns the launch's cudaError_t. */
extern "C" int hvdl_cuda_kernel_reduce(void *dst, const void *a, const void *b, size_t n, int dt,
                                       int op, void *stream) {
  if (n == 0) return cudaSuccess;
  cudaStream_t s = (cudaStream_t)stream;
  switch (op) {
    case SUM: return launch_reduce<SUM>(dst, a, b, n, dt, s);
    case PROD: return launch_reduce<PROD>(dst, a, b, n, dt, s);
    case MAX: return launch_reduce<MAX>(dst, a, b, n, dt, s);
    case MIN: return launch_reduce<MIN>(dst, a, b, n, dt, s);
    default: return cudaErrorInvalidValue;
  }
}

/* buf = buf / divisor on device memory (Avg's division, reduce.c's hvdl_divide). */
extern "C" int hvdl_cuda_kernel_divide(void *buf, size_t n, int dt, uint64_t divisor,
                                       void *stream) {
  if (n == 0) return cudaSuccess;
  cudaStream_t s = (cudaStream_t)stream;
  const unsigned g = blocks_for(n);
  switch (dt) {
    case 0: divide_int<int8_t, int64_t><<<g, 256, 0, s>>>((int8_t *)buf, n, divisor); break;
    case 1: divide_int<uint8_t, uint64_t><<<g, 256, 0, s>>>((uint8_t *)buf, n, divisor); break;
    case 2: divide_int<int32_t, int64_t><<<g, 256, 0, s>>>((int32_t *)buf, n, divisor); break;
    case 3: divide_int<uint32_t, uint64_t><<<g, 256, 0, s>>>((uint32_t *)buf, n, divisor); break;
    case 4: divide_int<int64_t, int64_t><<<g, 256, 0, s>>>((int64_t *)buf, n, divisor); break;
    case 5: divide_int<uint64_t, uint64_t><<<g, 256, 0, s>>>((uint64_t *)buf, n, divisor); break;
    case 32: divide_int<int16_t, int64_t><<<g, 256, 0, s>>>((int16_t *)buf, n, divisor); break;
    case 33: divide_int<uint16_t, uint64_t><<<g, 256, 0, s>>>((uint16_t *)buf, n, divisor); break;
    case 6: divide_h16<false><<<g, 256, 0, s>>>((uint16_t *)buf, n, (float)divisor); break;
    case 9: divide_h16<true><<<g, 256, 0, s>>>((uint16_t *)buf, n, (float)divisor); break;
    case 7: divide_f32<<<g, 256, 0, s>>>((float *)buf, n, (float)divisor); break;
    case 8: divide_f64<<<g, 256, 0, s>>>((double *)buf, n, (double)divisor); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

/* dst = src * factor on device memory (reduce.c's hvdl_scale): dt an hvdlDataType_t other
 * than bool. */
extern "C" int hvdl_cuda_kernel_scale(void *dst, const void *src, size_t n, int dt, double factor,
                                      void *stream) {
  if (n == 0) return cudaSuccess;
  cudaStream_t s = (cudaStream_t)stream;
  const unsigned g = blocks_for(n);
  const float ff = (float)factor;
#define SCALE_INT(num, T, LO, HI, TMIN, TMAX)                                                  \
  case num:                                                                                    \
    scale_int<T>                                                                               \
        <<<g, 256, 0, s>>>((T *)dst, (const T *)src, n, factor, LO, HI, (T)(TMIN), (T)(TMAX)); \
    break;
  switch (dt) {
    SCALE_INT(0, int8_t, -128.0, 128.0, INT8_MIN, INT8_MAX)
    SCALE_INT(1, uint8_t, 0.0, 256.0, 0, UINT8_MAX)
    SCALE_INT(2, int32_t, -2147483648.0, 2147483648.0, INT32_MIN, INT32_MAX)
    SCALE_INT(3, uint32_t, 0.0, 4294967296.0, 0, UINT32_MAX)
    SCALE_INT(4, int64_t, -9223372036854775808.0, 9223372036854775808.0, INT64_MIN, INT64_MAX)
    SCALE_INT(5, uint64_t, 0.0, 18446744073709551616.0, 0, UINT64_MAX)
    SCALE_INT(32, int16_t, -32768.0, 32768.0, INT16_MIN, INT16_MAX)
    SCALE_INT(33, uint16_t, 0.0, 65536.0, 0, UINT16_MAX)
    case 6:
      scale_h16<false><<<g, 256, 0, s>>>((uint16_t *)dst, (const uint16_t *)src, n, ff);
      break;
    case 9: scale_h16<true><<<g, 256, 0, s>>>((uint16_t *)dst, (const uint16_t *)src, n, ff); break;
    case 7: scale_f32<<<g, 256, 0, s>>>((float *)dst, (const float *)src, n, ff); break;
    case 8: scale_f64<<<g, 256, 0, s>>>((double *)dst, (const double *)src, n, factor); break;
    default: return cudaErrorInvalidValue;
  }
#undef SCALE_INT
  return cudaGetLastError();
}
