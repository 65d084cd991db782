/*
 * kernels.h -- the kernels layer's contract (reduce.c, adasum.c): element-wise reduction kernels
 * for every data type but bool x 5 ops, Avg's division, the scale factors'
 * multiplication, and Adasum's dot products and combination.
 */
#ifndef HVDL_KERNELS_KERNELS_H
#define HVDL_KERNELS_KERNELS_H

#include "hvdl.h"

#include <stddef.h>
#include <stdint.h>

/* dst[i] = a[i] op b[i] for i < n, with `a` as the left operand.
 * dst may be the same pointer as a or b (not a partial overlap).
 * hvdlAvg reduces with Sum; the division is hvdl_divide's job. dt is not bool
 * (callers refuse reductions of bool). */
void hvdl_reduce(void *dst, const void *a, const void *b, size_t n, hvdlDataType_t dt,
                 hvdlRedOp_t op);

/* buf[i] = buf[i] / divisor: a truncating division for integers (of the
 * two's-complement value), a correctly rounded one for floats (float16 and
 * bfloat16 divide in float32 and round to nearest-even). dt is not bool. */
void hvdl_divide(void *buf, size_t n, hvdlDataType_t dt, uint64_t divisor);

/* dst[i] = src[i] * factor; a plain copy when factor is 1. dst may be src.
 * Floats: float16 and bfloat16 in float32, rounded to nearest-even; float32 with
 * a float32 factor. Integers as Horovod scales them: the product in float64,
 * truncated toward zero; a product outside the type's range is clamped to it and
 * NaN gives 0. bool is copied (no reduction takes it, so nothing scales it). */
void hvdl_scale(void *dst, const void *src, size_t n, hvdlDataType_t dt, double factor);

/* Adasum's kernels (adasum.c), for float16, bfloat16, float32 and float64 only.
 * hvdl_dots adds a.b, |a|^2 and |b|^2 over n elements, in float64, to out[0], out[1],
 * out[2] (the same bits on every call with the same input). hvdl_scaled_add:
 * dst[i] = acoeff * a[i] + bcoeff * b[i], in float64, rounded once to dt (float16 and
 * bfloat16 through float32); dst may be a or b. */
void hvdl_dots(const void *a, const void *b, size_t n, hvdlDataType_t dt, double out[3]);
void hvdl_scaled_add(void *dst, const void *a, double acoeff, const void *b, double bcoeff,
                     size_t n, hvdlDataType_t dt);

#endif /* HVDL_KERNELS_KERNELS_H */
