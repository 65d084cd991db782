/*
 * float16.h -- float16 and bfloat16 to and from float32, rounding to nearest-even,
 * in integer bit operations and selects (no branches, no tables, no F16C): the
 * host's kernels (reduce.c) vectorize them, and the device's (cuda_kernels.cu)
 * compile the same lines, so both round alike. C and CUDA C++.
 */
#ifndef HVDL_FLOAT16_H_
#define HVDL_FLOAT16_H_

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define HVDL_F16_FN static __host__ __device__ __forceinline__
#else
#define HVDL_F16_FN static inline
#endif

HVDL_F16_FN uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

HVDL_F16_FN float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

HVDL_F16_FN float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t mag = h & 0x7fffu;
  /* Normal and subnormal halves: put the 15 magnitude bits where a float keeps
   * them and scale by 2^(127-15); the product is exact. */
  uint32_t scaled = f32_bits(f32_from_bits(mag << 13) * 0x1p112f);
  /* Inf and NaN: all-ones exponent, payload kept. */
  uint32_t special = (mag << 13) | 0x7f800000u;
  return f32_from_bits((mag >= 0x7c00u ? special : scaled) | sign);
}

HVDL_F16_FN uint16_t float_to_half(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  /* |f| >= 65536, Inf or NaN. */
  uint32_t big = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  /* |f| < 2^-14: the half is subnormal (or zero). Adding 0.5 aligns the value so
   * that float32 rounding (nearest-even) rounds at the half's last subnormal bit. */
  uint32_t tiny = f32_bits(f32_from_bits(x) + 0.5f) - 0x3f000000u;
  /* Normal: rebias the exponent, then round to nearest-even at bit 13. */
  uint32_t normal = (x - (112u << 23) + 0xfffu + ((x >> 13) & 1u)) >> 13;
  uint32_t o = x >= 0x47800000u ? big : (x < 0x38800000u ? tiny : normal);
  return (uint16_t)(o | sign);
}

HVDL_F16_FN float bf16_to_float(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

HVDL_F16_FN uint16_t float_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (x >> 16) | 0x0040u;
  return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

#endif /* HVDL_FLOAT16_H_ */
