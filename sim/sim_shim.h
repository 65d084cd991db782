/*
 * sim_shim.h -- included first into every file of the SimGrid build
 * (sim/simulate.py: smpicc -include sim/sim_shim.h). Two calls of the core mean
 * something else in a simulation:
 *
 *   sched_yield   the data-phase waits yield the core between polls (wait.c); in
 *                 SMPI the real time a yield takes on the host running the
 *                 simulation would be charged as simulated computation when
 *                 computation is simulated. Simulated ranks have nothing to
 *                 yield to: it does nothing.
 *   posix_memalign the scratch allocator (memory.c); SMPI intercepts malloc, so
 *                 that large buffers can be shared between simulated ranks
 *                 (--cfg=smpi/auto-shared-malloc-thresh, for the runs whose
 *                 results are not checked); through malloc, scratch is too.
 *                 Alignment drops to malloc's, which the kernels accept.
 */
#ifndef HVDL_SIM_SHIM_H_
#define HVDL_SIM_SHIM_H_

#include <sched.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <mm_malloc.h> /* declares posix_memalign again (reduce.c's intrinsics include it) */
#endif

#define sched_yield()                0
#define posix_memalign(pp, align, n) ((*(pp) = malloc(n)) != NULL ? 0 : 12 /* ENOMEM */)

#endif /* HVDL_SIM_SHIM_H_ */
