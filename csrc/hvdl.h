/*
 * hvdl.h -- hvd_lite's public C API.
 *
 * The shape follows NCCL so that code written against NCCL reads the same here:
 * the same enum numbers for data types (plus three of hvd_lite's own, numbered
 * outside NCCL's range), reduction ops and result codes, the same parameter order
 * for collectives, the same count and in-place rules:
 *
 *   - `count` is a number of elements, not bytes; count 0 is a valid no-op.
 *   - A collective is in-place when sendbuff == recvbuff (AllGather and
 *     ReduceScatter: when the per-rank buffer is this rank's block of the
 *     whole one); buffers that overlap otherwise are rejected with
 *     hvdlInvalidArgument.
 *   - Buffers are host memory, and `stream` must be NULL, unless the build has
 *     CUDA (HVD_LITE_CUDA=1; not yet run on a GPU). Then hvdlAllReduce and
 *     hvdlBroadcast also take CUDA device buffers (both on one device), queued
 *     on `stream` (a cudaStream_t; NULL is the legacy default stream) after
 *     the work already there, as NCCL does; the call returns once the result's
 *     last copy is queued. Every rank's buffers must then be device memory: the
 *     call runs in chunks, whose collectives would not match a host rank's one
 *     (as a mismatched count, this is not detected). A stream with host buffers
 *     is hvdlInvalidArgument, and so are device buffers in the other collectives.
 *   - Every rank of the communicator ends with bitwise-identical results, and
 *     a rerun gives the same bits.
 *
 * A communicator is made from an MPI communicator, which it duplicates: all of
 * hvd_lite's traffic runs on its private copy, never on the caller's.
 *
 * Every function returns an hvdlResult_t. hvdlGetErrorString() names a code;
 * hvdlGetLastError() gives the message of the most recent failure on a
 * communicator (what failed and where). hvdlInvalidArgument is always returned
 * before any data is sent, and leaves the communicator usable. Any other
 * failure during a collective (an MPI error, a peer that went away) marks the
 * communicator broken: later calls return hvdlInvalidUsage until it is destroyed.
 *
 * C99, no framework headers.
 */
#ifndef HVDL_H_
#define HVDL_H_

#include <mpi.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HVDL_MAJOR        0
#define HVDL_MINOR        1
#define HVDL_PATCH        0
#define HVDL_VERSION_CODE (HVDL_MAJOR * 10000 + HVDL_MINOR * 100 + HVDL_PATCH)

/* Result codes: NCCL's numbers. */
typedef enum {
  hvdlSuccess = 0,
  hvdlUnhandledCudaError = 1,
  hvdlSystemError = 2,
  hvdlInternalError = 3,
  hvdlInvalidArgument = 4,
  hvdlInvalidUsage = 5,
  hvdlRemoteError = 6,
  hvdlInProgress = 7,
  hvdlNumResults = 8
} hvdlResult_t;

/* Data types.
 * 0 .. 9 are NCCL's types with NCCL's numbers, and hvdlNumTypes keeps NCCL's
 * meaning: the count of those (a loop over 0 .. hvdlNumTypes-1 visits NCCL's types).
 * hvd_lite's own types, which NCCL lacks but Horovod takes (int16, uint16, bool),
 * are numbered from hvdlExtTypesBegin = 32 to hvdlExtTypesEnd - 1. The gap is
 * room for NCCL's list to grow (NCCL 2.24 added ncclFloat8e4m3 = 10 and
 * ncclFloat8e5m2 = 11) without a number ever naming one type in NCCL and another
 * here; numbers in it (10 .. 31) are not types and are refused as invalid.
 * bool is one byte, moved verbatim; it has no reduction ops (AllReduce, Reduce and
 * ReduceScatter refuse it with hvdlInvalidArgument, as Horovod refuses it). */
typedef enum {
  hvdlInt8 = 0,
  hvdlChar = 0,
  hvdlUint8 = 1,
  hvdlInt32 = 2,
  hvdlInt = 2,
  hvdlUint32 = 3,
  hvdlInt64 = 4,
  hvdlUint64 = 5,
  hvdlFloat16 = 6,
  hvdlHalf = 6,
  hvdlFloat32 = 7,
  hvdlFloat = 7,
  hvdlFloat64 = 8,
  hvdlDouble = 8,
  hvdlBfloat16 = 9,
  hvdlNumTypes = 10,
  /* hvd_lite's types (not NCCL's) */
  hvdlExtTypesBegin = 32,
  hvdlInt16 = 32,
  hvdlUint16 = 33,
  hvdlBool = 34,
  hvdlExtTypesEnd = 35
} hvdlDataType_t;

/* Reduction ops.
 * 0 .. 4 are NCCL's ops with NCCL's numbers, and hvdlNumOps keeps NCCL's meaning:
 * the count of those. hvd_lite's own op, Adasum, is numbered from hvdlExtOpsBegin
 * = 32 (NCCL hands out the numbers from 5 up to the ops a program makes with
 * ncclRedOpCreatePreMulSum, which hvd_lite does not have; 5 .. 31 are refused as
 * invalid).
 * Integers wrap (two's complement). Float16 and bfloat16 are computed in float32
 * and rounded to nearest-even after every binary operation. Min/max on floats
 * return the other operand when one is NaN (IEEE fmin/fmax, as NCCL).
 * Avg: integers take the wrapped sum and one truncating division by the number of
 * ranks; floats take the sum and one division by the number of ranks.
 * Adasum (Maleki et al., MLSys 2021; Horovod's op=Adasum): the ranks' vectors are
 * combined pairwise, a and b into
 *     (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b
 * (the sum of orthogonal vectors, the mean of parallel ones; a coefficient is 1
 * where its squared norm is below sqrt(DBL_MIN), so a zero vector is left out),
 * over the whole buffer, level by level of a binary tree over the ranks in rank
 * order: recursive vector halving, with the dot product and squared norms summed in
 * float64 over the ranks that hold the pair, then distance doubling. Any number of
 * ranks (Horovod takes a power of two): with p the largest power of two below n,
 * ranks 0 .. 2(n-p)-1 are first combined in pairs (0,1), (2,3), ...
 * AllReduce only, float16, bfloat16, float32 and float64 only, host memory only;
 * every rank ends with the same bytes. Combined in float64 and rounded once to the
 * type. bool takes no op. */
typedef enum {
  hvdlSum = 0,
  hvdlProd = 1,
  hvdlMax = 2,
  hvdlMin = 3,
  hvdlAvg = 4,
  hvdlNumOps = 5,
  /* hvd_lite's ops (not NCCL's) */
  hvdlExtOpsBegin = 32,
  hvdlAdasum = 32,
  hvdlExtOpsEnd = 33
} hvdlRedOp_t;

/* Opaque communicator. */
typedef struct hvdlComm *hvdlComm_t;

/* A cudaStream_t (no CUDA header here); NULL for host buffers. */
typedef void *hvdlStream_t;

/* Tunables of one communicator. hvdlConfigDefault() fills it from the
 * HVD_LITE_* environment variables (see docs/tuning.md); a field left at 0 means
 * "the default", but for shmStandInBytes (0: off). */
typedef struct {
  size_t segmentBytes;        /* ring pipeline segment size (HVD_LITE_SEGMENT_BYTES) */
  size_t smallAllReduceBytes; /* the latency path's crossover (HVD_LITE_SMALL_ALLREDUCE_BYTES):
                                 without a shared-memory path, AllReduce takes the latency
                                 path at or below this many bytes per rank; the shared-memory
                                 path reduces in the latency path's order at or below it and
                                 in the ring's above. HVDL_SMALL_BYTES_AUTO: chosen by the
                                 number of ranks and hosts */
  int disableShm;             /* 1: no shared-memory path between the ranks of a host
                                 (HVD_LITE_SHM=0) */
  size_t shmBytes;            /* the shared-memory path's chunk: bytes of each of the four
                                 areas a rank has in its host's segment (HVD_LITE_SHM_BYTES) */
  int disableShmCma;          /* 1: the shared-memory path never reads or writes a peer's own
                                 memory (process_vm_readv/writev, "cross-memory attach"), so
                                 it copies every buffer through the segment and leaves large
                                 all-reduces to the ring, all-gathers to the model's choice
                                 (HVD_LITE_SHM_CMA=0) */
  int allReduceAlgorithm;     /* an hvdlAlgorithm_t (HVD_LITE_ALLREDUCE_ALGO); hvdlAlgoAuto:
                                 the selector's choice (csrc/select/select_allreduce.c) */
  int broadcastAlgorithm;     /* an hvdlBroadcastAlgorithm_t (HVD_LITE_BROADCAST_ALGO);
                                 hvdlBcastAuto: the cost model's choice */
  int allGatherAlgorithm;     /* an hvdlAllGatherAlgorithm_t (HVD_LITE_ALLGATHER_ALGO);
                                 hvdlAllGatherAuto: shm where it can run, else the cost
                                 model's choice */
  int reduceScatterAlgorithm; /* an hvdlReduceScatterAlgorithm_t
                                 (HVD_LITE_REDUCESCATTER_ALGO); hvdlReduceScatterAuto: the
                                 cost model's choice */
  size_t shmStandInBytes;     /* the single-copy all-reduce's stand-in: a rank whose buffers
                                 are not hvdlMemAlloc memory, with at least half of their
                                 pages small, copies them through a region of its own that the
                                 peers map, up to this many bytes per rank
                                 (HVD_LITE_SHM_STAND_IN_BYTES); 0 (unlike the fields above,
                                 not the default): never, the kernel's copies */
  int adasumHierarchical;     /* 1: hvdlAdasum averages within each host and combines the
                                 hosts with Adasum (HVD_LITE_ADASUM_HIERARCHICAL=1); 0: every
                                 rank is combined with Adasum */
  int allToAllAlgorithm;      /* an hvdlAllToAllAlgorithm_t (HVD_LITE_ALLTOALL_ALGO);
                                 hvdlAllToAllAuto: the cost model's choice where every block
                                 is the same size, else pairwise */
} hvdlConfig_t;

#define HVDL_SMALL_BYTES_AUTO ((size_t)-1)

/* All-reduce algorithms (docs/algorithms.md). A forced one runs at every size. */
typedef enum {
  hvdlAlgoAuto = 0,
  hvdlAlgoRing = 1,              /* "ring": pipelined ring, reduce-scatter + all-gather */
  hvdlAlgoRecursiveDoubling = 2, /* "rd": log2(n) whole-buffer exchanges */
  hvdlAlgoRabenseifner = 3,      /* "rab": recursive halving + recursive doubling */
  hvdlAlgoHierarchical = 4,      /* "hier": within hosts through shared memory, across
                                      hosts, within hosts */
  hvdlAlgoLatency = 5,           /* "small": the latency path, all-gather + ordered reduce */
  hvdlAlgoShm = 6,               /* "shm": through shared memory, ranks on one host */
  hvdlAlgoHierP2p = 7,           /* "hier_p2p": within hosts, across hosts, within hosts,
                                      over point-to-point messages */
  hvdlAlgoTree = 8,              /* "tree": a binomial-tree reduce to rank 0, then its
                                      binomial broadcast */
  hvdlNumAlgos = 9
} hvdlAlgorithm_t;

/* Broadcast algorithms (docs/algorithms.md). A forced one runs at every size. */
typedef enum {
  hvdlBcastAuto = 0,
  hvdlBcastChain = 1,   /* "chain": pipelined chain from the root */
  hvdlBcastTree = 2,    /* "tree": binomial tree, the whole buffer per edge */
  hvdlBcastScatter = 3, /* "scatter": binomial scatter of n blocks + ring all-gather */
  hvdlBcastShm = 4,     /* "shm": ranks all on one host, each reads the root's buffer
                            (process_vm_readv) */
  hvdlBcastHierP2p = 5, /* "hier_p2p": k-nomial trees among one rank a host and within each
                            host, over point-to-point messages (hosts of the same size) */
  hvdlNumBcastAlgos = 6
} hvdlBroadcastAlgorithm_t;

/* All-gather algorithms (docs/algorithms.md). A forced one runs at every size. */
typedef enum {
  hvdlAllGatherAuto = 0,
  hvdlAllGatherRing = 1,    /* "ring": pipelined ring */
  hvdlAllGatherRd = 2,      /* "rd": recursive doubling, nearest partner first */
  hvdlAllGatherRdFar = 3,   /* "rd_far": recursive doubling, farthest partner first */
  hvdlAllGatherShm = 4,     /* "shm": ranks all on one host, each writes its block into
                              every other's result (process_vm_writev) */
  hvdlAllGatherHierP2p = 5, /* "hier_p2p": within hosts, across hosts, within hosts, over
                               point-to-point messages (hosts of the same size) */
  hvdlNumAllGatherAlgos = 6
} hvdlAllGatherAlgorithm_t;

/* Reduce-scatter algorithms (docs/algorithms.md). A forced one runs at every size. */
typedef enum {
  hvdlReduceScatterAuto = 0,
  hvdlReduceScatterRing = 1,    /* "ring": pipelined ring */
  hvdlReduceScatterHalving = 2, /* "halving": recursive halving, neighbours first */
  hvdlReduceScatterShm = 3,     /* "shm": ranks all on one host, each reads its block from
                                    every other's sendbuff (process_vm_readv) */
  hvdlReduceScatterHierP2p = 4, /* "hier_p2p": within hosts, across hosts, within hosts, over
                                    point-to-point messages (hosts of the same size) */
  hvdlNumReduceScatterAlgos = 5
} hvdlReduceScatterAlgorithm_t;

/* All-to-all algorithms (docs/algorithms.md). A forced one runs at every size; Bruck's,
 * hier_p2p and hier_pairs run where every block is the same size (hvdlAllToAll always; the
 * engine's alltoall where every rank's splits are all equal), pairwise elsewhere. */
typedef enum {
  hvdlAllToAllAuto = 0,
  hvdlAllToAllPairwise = 1,  /* "pairwise": every pair's block at once, n-1 messages each way */
  hvdlAllToAllBruck = 2,     /* "bruck": Bruck's, ceil(log2 n) steps of about n/2 blocks */
  hvdlAllToAllHierP2p = 3,   /* "hier_p2p": within hosts, then across in lanes, L+H-2 messages
                                each way (hosts of the same size) */
  hvdlAllToAllHierPairs = 4, /* "hier_pairs": within hosts, one message per pair of hosts, within
                                hosts (hosts of the same size) */
  hvdlNumAllToAllAlgos = 5
} hvdlAllToAllAlgorithm_t;

/* Library version as HVDL_VERSION_CODE. */
hvdlResult_t hvdlGetVersion(int *version);

/* Fills *config from the environment. */
hvdlResult_t hvdlConfigDefault(hvdlConfig_t *config);

/* Makes a communicator over the ranks of mpiComm (collective over mpiComm).
 * MPI must be initialised. The MPI communicator is duplicated. config may be NULL.
 * Ranks that share a host also map a shared-memory segment (4 x shmBytes each),
 * unless config->disableShm. A forced allReduceAlgorithm that this layout cannot
 * run (shm across hosts or without a segment, hier on one host, hier_p2p on one
 * host or on hosts of different sizes), and a forced allGatherAlgorithm shm that
 * it cannot (ranks not all on one host, or unable to write into each other's
 * memory), is hvdlInvalidArgument on every rank, with the reason. */
hvdlResult_t hvdlCommInitMpi(hvdlComm_t *comm, MPI_Comm mpiComm, const hvdlConfig_t *config);

/* Frees a communicator (collective: every rank must call it). */
hvdlResult_t hvdlCommDestroy(hvdlComm_t comm);

/* Frees a communicator without talking to the other ranks; use after a failure. */
hvdlResult_t hvdlCommAbort(hvdlComm_t comm);

/* hvdlCommShrink's flags (NCCL's ncclCommShrink numbers). */
#define HVDL_SHRINK_DEFAULT 0x00 /* no failure: the listed ranks leave */
#define HVDL_SHRINK_ABORT   0x01 /* after a failure: dead ranks are dropped (ULFM) */

/* Makes *newcomm of comm's ranks without the excludeRanksCount ranks of
 * excludeRanksList (comm's rank numbers), keeping their order: a rank's new number
 * is its place among those left, so rank 0 is the lowest one left. config NULL
 * takes comm's; comm stays usable with HVDL_SHRINK_DEFAULT, and after
 * HVDL_SHRINK_ABORT may only be aborted (hvdlCommAbort).
 * - HVDL_SHRINK_DEFAULT (no failure): collective over the ranks left only, as in
 *   NCCL: an excluded rank does not call it.
 * - HVDL_SHRINK_ABORT (after a failure, under an MPI with ULFM: Open MPI's
 *   mpirun --with-ft ulfm): comm is revoked, so every collective pending on it fails
 *   on every rank, and the ranks the MPI reports dead are dropped whether listed or
 *   not (MPIX_Comm_shrink). Unlike NCCL, every living rank of comm calls it (MPI's
 *   shrink is collective over them): a living listed rank gets *newcomm NULL.
 * Wrong arguments (a rank out of range or repeated, the caller's own rank with
 * HVDL_SHRINK_DEFAULT, every rank excluded, another flag) are hvdlInvalidArgument
 * before anything is sent; HVDL_SHRINK_ABORT without ULFM is hvdlInvalidUsage. */
hvdlResult_t hvdlCommShrink(hvdlComm_t comm, const int *excludeRanksList, int excludeRanksCount,
                            hvdlComm_t *newcomm, const hvdlConfig_t *config, int shrinkFlags);

/* The number of ranks in the communicator. */
hvdlResult_t hvdlCommCount(const hvdlComm_t comm, int *count);

/* This process's rank in the communicator (0 .. count - 1). */
hvdlResult_t hvdlCommUserRank(const hvdlComm_t comm, int *rank);

/* Returns a static string naming the result code. */
const char *hvdlGetErrorString(hvdlResult_t result);

/* The message of the most recent failure on comm ("" if none); with comm NULL,
 * the most recent failure of this thread outside any communicator. */
const char *hvdlGetLastError(hvdlComm_t comm);

/* Reduces count elements of sendbuff across all ranks with op; every rank
 * receives the result in recvbuff. */
hvdlResult_t hvdlAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           hvdlDataType_t datatype, hvdlRedOp_t op, hvdlComm_t comm,
                           hvdlStream_t stream);

/* Copies count elements from the root's sendbuff into every rank's recvbuff.
 * Only the root reads sendbuff (others may pass NULL); in-place when
 * sendbuff == recvbuff on the root. root must be in 0 .. ranks-1. */
hvdlResult_t hvdlBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           hvdlDataType_t datatype, int root, hvdlComm_t comm, hvdlStream_t stream);

/* Reduces count elements of sendbuff across all ranks with op into the root's
 * recvbuff; recvbuff is used on the root only (others may pass NULL). The root
 * gets the same bits hvdlAllReduce would give. */
hvdlResult_t hvdlReduce(const void *sendbuff, void *recvbuff, size_t count, hvdlDataType_t datatype,
                        hvdlRedOp_t op, int root, hvdlComm_t comm, hvdlStream_t stream);

/* Gathers sendcount elements from every rank into every rank's recvbuff, which
 * holds ranks * sendcount elements in rank order. In-place when
 * sendbuff == recvbuff + rank * sendcount (in elements). */
hvdlResult_t hvdlAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           hvdlDataType_t datatype, hvdlComm_t comm, hvdlStream_t stream);

/* Reduces ranks * recvcount elements of sendbuff across all ranks with op;
 * rank r receives block r (elements r * recvcount .. (r+1) * recvcount - 1) in
 * recvbuff. In-place when recvbuff == sendbuff + rank * recvcount (in elements).
 * The reduction order is fixed (deterministic); Avg divides by the number of ranks. */
hvdlResult_t hvdlReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               hvdlDataType_t datatype, hvdlRedOp_t op, hvdlComm_t comm,
                               hvdlStream_t stream);

/* Sends count elements to every rank: block q (elements q*count .. (q+1)*count-1)
 * of sendbuff goes to rank q, and block q of recvbuff comes from rank q. Both hold
 * ranks * count elements. In-place when sendbuff == recvbuff; any other overlap is
 * invalid. The algorithm: HVD_LITE_ALLTOALL_ALGO (config.allToAllAlgorithm). */
hvdlResult_t hvdlAllToAll(const void *sendbuff, void *recvbuff, size_t count,
                          hvdlDataType_t datatype, hvdlComm_t comm, hvdlStream_t stream);

/* Host memory that the ranks of one host reach directly (NCCL's ncclMemAlloc): *ptr
 * gets size bytes (size > 0), page-aligned and zeroed. Not collective. A collective
 * whose buffers lie inside such memory on the ranks of one host takes the same
 * algorithm and gives the same bits; its single-copy forms (the shared-memory
 * all-reduce above 32 KiB, the single-copy all-gather) then read and write the
 * peers' buffers with plain loads and stores instead of process_vm_readv/writev.
 * Any other buffer works with every call as before. */
hvdlResult_t hvdlMemAlloc(void **ptr, size_t size);

/* Frees memory from hvdlMemAlloc (NULL: nothing); any other pointer is
 * hvdlInvalidArgument. Not while a collective uses it. */
hvdlResult_t hvdlMemFree(void *ptr);

#ifdef __cplusplus
}
#endif

#endif /* HVDL_H_ */
