/*
 * adasum_reference.h -- the simulation's inputs for hvdlAdasum and their float64 result
 * (adasum_reference.c), which sim/driver.c checks hvdlAllReduce's against.
 */
#ifndef HVDL_SIM_ADASUM_REFERENCE_H_
#define HVDL_SIM_ADASUM_REFERENCE_H_

#include <stddef.h>

#include "hvdl.h"

/* Rank q's element i as stored in type dt (float16, bfloat16, float32 or float64), widened
 * to double: the same on every rank, from q and i alone. */
double adasum_input(int q, size_t i, hvdlDataType_t dt);

/* x[0 .. count-1] = rank q's elements first .. first+count-1, in type dt. */
void adasum_fill(void *x, size_t first, size_t count, int q, hvdlDataType_t dt);

/* Element i of a buffer of type dt, widened to double. */
double adasum_load(const void *x, size_t i, hvdlDataType_t dt);

/* ref[0 .. hi-lo-1] = the float64 Adasum of the n ranks' inputs at the elements lo .. hi-1. The tree's leaves are groups of ranks: rank q belongs to leaf
 * leaf_of[q] (0 .. leaves-1, the leaves in the order of their first ranks), whose vector is
 * its ranks' average (the flat form: leaf_of[q] = q; the hierarchical one: q's host). Collective
 * over comm: every rank calls it, each with its own range, and the dot products are summed
 * with MPI_Allreduce. Returns 0, or 1 out of memory. */
int adasum_reference(MPI_Comm comm, const int *leaf_of, int leaves, int n, size_t lo, size_t hi,
                     hvdlDataType_t dt, double *ref);

#endif /* HVDL_SIM_ADASUM_REFERENCE_H_ */
