/*
 * adasum.c -- Adasum's two kernels (kernels.h): the dot product and squared norms of a
 * pair of vectors, and their combination with two coefficients.
 *
 * The sums are float64 whatever the type (float16 and bfloat16 are widened exactly), in
 * DOT_LANES interleaved partial sums that the compiler keeps in vector registers, added
 * together in lane order at the end: the same bits on every call with the same input,
 * whatever the buffer's alignment (elements are read with memcpy). The combination is
 * computed in float64 and rounded once to the type (float16 and bfloat16 from float64
 * through float32: two roundings, the second to nearest-even).
 */
#include <string.h>

#include "base/base.h"
#include "kernels/float16.h"
#include "kernels/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define KERNEL __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KERNEL
#endif

#define DOT_LANES 8

static inline double load_f16(const char *p) {
  uint16_t h;
  memcpy(&h, p, sizeof h);
  return (double)half_to_float(h);
}
static inline double load_bf16(const char *p) {
  uint16_t h;
  memcpy(&h, p, sizeof h);
  return (double)bf16_to_float(h);
}
static inline double load_f32(const char *p) {
  float f;
  memcpy(&f, p, sizeof f);
  return (double)f;
}
static inline double load_f64(const char *p) {
  double d;
  memcpy(&d, p, sizeof d);
  return d;
}
static inline void store_f16(char *p, double v) {
  const uint16_t h = float_to_half((float)v);
  memcpy(p, &h, sizeof h);
}
static inline void store_bf16(char *p, double v) {
  const uint16_t h = float_to_bf16((float)v);
  memcpy(p, &h, sizeof h);
}
static inline void store_f32(char *p, double v) {
  const float f = (float)v;
  memcpy(p, &f, sizeof f);
}
static inline void store_f64(char *p, double v) { memcpy(p, &v, sizeof v); }

#define DOTS_KERNEL(name, LOAD, ES)                                                \
  KERNEL static void name(const char *a, const char *b, size_t n, double out[3]) { \
    double ab[DOT_LANES] = {0}, aa[DOT_LANES] = {0}, bb[DOT_LANES] = {0};          \
    size_t i = 0;                                                                  \
    for (; i + DOT_LANES <= n; i += DOT_LANES)                                     \
      for (int k = 0; k < DOT_LANES; k++) {                                        \
        const double x = LOAD(a + (i + k) * ES), y = LOAD(b + (i + k) * ES);       \
        ab[k] += x * y;                                                            \
        aa[k] += x * x;                                                            \
        bb[k] += y * y;                                                            \
      }                                                                            \
    for (int k = 0; i < n; i++, k++) {                                             \
      const double x = LOAD(a + i * ES), y = LOAD(b + i * ES);                     \
      ab[k] += x * y;                                                              \
      aa[k] += x * x;                                                              \
      bb[k] += y * y;                                                              \
    }                                                                              \
    for (int k = 0; k < DOT_LANES; k++) {                                          \
      out[0] += ab[k];                                                             \
      out[1] += aa[k];                                                             \
      out[2] += bb[k];                                                             \
    }                                                                              \
  }

DOTS_KERNEL(dots_f16, load_f16, 2)
DOTS_KERNEL(dots_bf16, load_bf16, 2)
DOTS_KERNEL(dots_f32, load_f32, 4)
DOTS_KERNEL(dots_f64, load_f64, 8)

#define SCALED_ADD_KERNEL(name, LOAD, STORE, ES)                                         \
  KERNEL static void name(char *dst, const char *a, double ca, const char *b, double cb, \
                          size_t n) {                                                    \
    _Pragma("GCC ivdep") for (size_t i = 0; i < n; i++) {                                \
      STORE(dst + i * ES, ca * LOAD(a + i * ES) + cb * LOAD(b + i * ES));                \
    }                                                                                    \
  }

SCALED_ADD_KERNEL(scaled_add_f16, load_f16, store_f16, 2)
SCALED_ADD_KERNEL(scaled_add_bf16, load_bf16, store_bf16, 2)
SCALED_ADD_KERNEL(scaled_add_f32, load_f32, store_f32, 4)
SCALED_ADD_KERNEL(scaled_add_f64, load_f64, store_f64, 8)

void hvdl_dots(const void *a, const void *b, size_t n, hvdlDataType_t dt, double out[3]) {
  switch (dt) {
    case hvdlFloat16: dots_f16(a, b, n, out); break;
    case hvdlBfloat16: dots_bf16(a, b, n, out); break;
    case hvdlFloat32: dots_f32(a, b, n, out); break;
    case hvdlFloat64: dots_f64(a, b, n, out); break;
    default: break; /* callers refuse other types */
  }
}

void hvdl_scaled_add(void *dst, const void *a, double acoeff, const void *b, double bcoeff,
                     size_t n, hvdlDataType_t dt) {
  switch (dt) {
    case hvdlFloat16: scaled_add_f16(dst, a, acoeff, b, bcoeff, n); break;
    case hvdlBfloat16: scaled_add_bf16(dst, a, acoeff, b, bcoeff, n); break;
    case hvdlFloat32: scaled_add_f32(dst, a, acoeff, b, bcoeff, n); break;
    case hvdlFloat64: scaled_add_f64(dst, a, acoeff, b, bcoeff, n); break;
    default: break; /* callers refuse other types */
  }
}
