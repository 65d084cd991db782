/*
 * adasum_reference.c -- hvdlAdasum's inputs in the simulation, and their result in float64
 * from the formula, over the tree of csrc/algorithms/allreduce_adasum.c's header (the same
 * as tests/helpers.py's adasum_tree):
 *
 *     adasum(a, b) = (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b
 *
 * a coefficient being 1 where its squared norm is below sqrt(DBL_MIN). With k leaves, p the
 * largest power of two <= k and rem = k - p, the tree has stages 0 .. log2(p):
 *
 *   stage 0   the fold: v[j] = adasum(leaf 2j, leaf 2j+1) for j < rem, leaf j+rem above
 *   stage s   v[j] = adasum(v[2j], v[2j+1]) for j < p >> s
 *
 * and v[0] is the result. A stage's coefficients depend on its inputs' whole vectors, so the
 * reference is computed stage by stage: each rank evaluates the tree, with the coefficients
 * known so far, on its own range of the elements, adds the stage's dot products and squared
 * norms there, and MPI_Allreduce sums them over the ranks; then the last pass gives the
 * result on the range. Every pass regenerates the inputs from (rank, index) rather than
 * holding the n vectors: (stages + 1) x n x range evaluations, and one vector of the range.
 *
 * The inputs: rank q's element i is (1 + (q % 4) / 2) (c(i) + 3/4 u(q, i)), c and u uniform
 * in [-1, 1) from a hash, so the ranks' vectors are correlated (their coefficients are far
 * from 1) and of different norms; rank 5's vector is zero, which Adasum leaves out.
 */
#include "adasum_reference.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/float16.h"

/* splitmix64's finalizer. */
static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [-1, 1), from the hash of key. */
static double uniform(uint64_t key) { return (double)(mix(key) >> 11) * 0x1p-52 - 1.0; }

/* v as stored in type dt, widened. */
static double rounded(double v, hvdlDataType_t dt) {
  switch (dt) {
    case hvdlFloat16: return half_to_float(float_to_half((float)v));
    case hvdlBfloat16: return bf16_to_float(float_to_bf16((float)v));
    case hvdlFloat32: return (float)v;
    default: return v;
  }
}

double adasum_input(int q, size_t i, hvdlDataType_t dt) {
  if (q == 5) return 0.0;
  const double common = uniform(0x5eed000000000000ull ^ (uint64_t)i);
  const double own = uniform(((uint64_t)(q + 1) << 40) ^ (uint64_t)i);
  return rounded((1.0 + 0.5 * (q % 4)) * (common + 0.75 * own), dt);
}

void adasum_fill(void *x, size_t first, size_t count, int q, hvdlDataType_t dt) {
  for (size_t i = 0; i < count; i++) {
    const double v = adasum_input(q, first + i, dt);
    switch (dt) {
      case hvdlFloat16: ((uint16_t *)x)[i] = float_to_half((float)v); break;
      case hvdlBfloat16: ((uint16_t *)x)[i] = float_to_bf16((float)v); break;
      case hvdlFloat32: ((float *)x)[i] = (float)v; break;
      default: ((double *)x)[i] = v; break;
    }
  }
}

double adasum_load(const void *x, size_t i, hvdlDataType_t dt) {
  switch (dt) {
    case hvdlFloat16: return half_to_float(((const uint16_t *)x)[i]);
    case hvdlBfloat16: return bf16_to_float(((const uint16_t *)x)[i]);
    case hvdlFloat32: return ((const float *)x)[i];
    default: return ((const double *)x)[i];
  }
}

/* The tree over k leaves: its stages, and each pair's two coefficients. */
struct tree {
  int k, p, rem, stages;
  int first[64]; /* stage s's first pair in coef */
  double *coef;  /* 2 per pair: the fold's rem pairs, then p/2, p/4, ..., 1 */
};

/* Stage s's pairs; its output is v[0 .. width-1], pairs below `pairs`, inputs passed above. */
static int stage_pairs(const struct tree *t, int s) { return s == 0 ? t->rem : t->p >> s; }
static int stage_width(const struct tree *t, int s) { return s == 0 ? t->p : t->p >> s; }

static double coefficient(double dot, double normsq) {
  return normsq >= sqrt(DBL_MIN) ? 1.0 - dot / normsq * 0.5 : 1.0;
}

/* v[0 .. k-1]: the leaves at element i (their ranks' averages). */
static void leaves_at(const int *leaf_of, int n, size_t i, hvdlDataType_t dt, const int *members,
                      int k, double *v) {
  for (int j = 0; j < k; j++) v[j] = 0.0;
  for (int q = 0; q < n; q++) v[leaf_of[q]] += adasum_input(q, i, dt);
  for (int j = 0; j < k; j++)
    if (members[j] > 1) v[j] /= members[j];
}

/* Applies stages 0 .. upto-1 to v in place (their coefficients known); then, with sums, adds
 * stage upto's a.b, |a|^2, |b|^2 per pair to sums[3j ..]. */
static void evaluate(const struct tree *t, double *v, int upto, double *sums) {
  for (int s = 0; s < upto; s++) {
    const int pairs = stage_pairs(t, s), width = stage_width(t, s);
    const double *c = t->coef + 2 * t->first[s];
    for (int j = 0; j < width; j++) /* reads v[2j], v[2j+1] or v[j+pairs], never below j */
      v[j] = j < pairs ? c[2 * j] * v[2 * j] + c[2 * j + 1] * v[2 * j + 1] : v[j + pairs];
  }
  if (!sums) return;
  for (int j = 0; j < stage_pairs(t, upto); j++) {
    const double a = v[2 * j], b = v[2 * j + 1];
    sums[3 * j] += a * b;
    sums[3 * j + 1] += a * a;
    sums[3 * j + 2] += b * b;
  }
}

int adasum_reference(MPI_Comm comm, const int *leaf_of, int leaves, int n, size_t lo, size_t hi,
                     hvdlDataType_t dt, double *ref) {
  struct tree t = {.k = leaves, .p = 1};
  while (2 * t.p <= leaves) t.p *= 2, t.stages++;
  t.rem = leaves - t.p;
  t.stages++; /* the fold, then log2(p) levels */
  int pairs = 0;
  for (int s = 0; s < t.stages; s++) t.first[s] = pairs, pairs += stage_pairs(&t, s);
  t.coef = malloc((2 * (size_t)pairs + 1) * sizeof(double));
  double *sums = malloc((3 * (size_t)(leaves / 2 + 1)) * sizeof(double));
  double *v = malloc((size_t)leaves * sizeof(double));
  int *members = calloc((size_t)leaves, sizeof(int));
  if (!t.coef || !sums || !v || !members) {
    free(t.coef), free(sums), free(v), free(members);
    return 1;
  }
  for (int q = 0; q < n; q++) members[leaf_of[q]]++;
  for (int s = 0; s < t.stages; s++) {
    const int np = stage_pairs(&t, s);
    if (np == 0) continue; /* no fold: the same on every rank */
    memset(sums, 0, 3 * (size_t)np * sizeof(double));
    for (size_t i = lo; i < hi; i++) {
      leaves_at(leaf_of, n, i, dt, members, leaves, v);
      evaluate(&t, v, s, sums);
    }
    MPI_Allreduce(MPI_IN_PLACE, sums, 3 * np, MPI_DOUBLE, MPI_SUM, comm);
    double *c = t.coef + 2 * t.first[s];
    for (int j = 0; j < np; j++) {
      c[2 * j] = coefficient(sums[3 * j], sums[3 * j + 1]);
      c[2 * j + 1] = coefficient(sums[3 * j], sums[3 * j + 2]);
    }
  }
  for (size_t i = lo; i < hi; i++) {
    leaves_at(leaf_of, n, i, dt, members, leaves, v);
    evaluate(&t, v, t.stages, NULL);
    ref[i - lo] = v[0];
  }
  free(t.coef), free(sums), free(v), free(members);
  return 0;
}
