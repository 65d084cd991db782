/*
 * api.h -- what the C API layer (comm.c, collectives.c) gives the layers above
 * it besides the public hvdl.h.
 */
#ifndef HVDL_API_API_H_
#define HVDL_API_API_H_

#include "base/base.h"

/* comm.c: replaces the communicator's MPI communicator with a duplicate of
 * `from` (collective over it), after a failed collective left messages and
 * requests behind on the old one. */
hvdlResult_t hvdl_comm_renew(hvdlComm_t comm, MPI_Comm from);

#endif /* HVDL_API_API_H_ */
