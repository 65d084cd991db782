"""Interleaved timing of the ring all-reduce (C API, in place, float32 sum) under pipe variants.
Variants set HVDL_X_* env vars (read by the experimental pipe.c at each call)."""
import os, sys, time, json
import numpy as np
from mpi4py import MPI
os.environ["HVD_LITE_SHM"] = "0"
os.environ["HVD_LITE_SEGMENT_BYTES"] = os.environ.get("SEGB", "16384")
from hvd_lite import basics, ops as hops
import hvd_lite as hvd
world = MPI.COMM_WORLD
comm = basics._core.Comm()
nbytes = int(float(os.environ.get("MB", "64")) * 2**20)
rounds = int(os.environ.get("ROUNDS", "10")); iters = int(os.environ.get("ITERS", "4"))
variants = [dict(kv.split("=") for kv in v.split(",")) for v in sys.argv[1:]]
mbs = [float(v.pop("MB", os.environ.get("MB", "64"))) for v in variants]
x = (np.arange(int(max(mbs) * 2**20) // 4) % 7).astype(np.float32)
bufs = [x[: int(mb * 2**20) // 4].view(np.uint8) for mb in mbs]
code = hops.HVDL_DTYPES[x.dtype]; cop = hops.HVDL_OPS[hvd.Sum]
def setv(i):
    global rb
    rb = bufs[i]
    v = variants[i]
    for k in ("HVDL_X_MAXSEG", "HVDL_X_SWIN", "HVDL_X_RWIN"):
        os.environ.pop(k, None)
    for k, val in v.items():
        os.environ["HVDL_X_" + k] = val
for i in range(len(variants)):  # warm
    setv(i)
    for _ in range(2): comm.allreduce(rb, rb, code, cop)
times = {i: [] for i in range(len(variants))}
for r in range(rounds):
    order = list(range(len(variants)))
    if r % 2: order.reverse()
    for i in order:
        setv(i); world.Barrier()
        t = time.perf_counter()
        for _ in range(iters): comm.allreduce(rb, rb, code, cop)
        t = (time.perf_counter() - t) / iters
        t = world.allreduce(t, op=MPI.MAX)
        times[i].append(t * 1e3)
if world.rank == 0:
    print(f"{nbytes/2**20:.0f} MiB, np={world.size}, {rounds} rounds x {iters} calls, ms per call")
    for i, v in enumerate(variants):
        a = np.array(times[i])
        q1, med, q3 = np.percentile(a, [25, 50, 75])
        print(f"MB={mbs[i]:g} {','.join(f'{k}={val}' for k,val in v.items()):32s} median {med:7.2f}  IQR {q1:6.2f}-{q3:6.2f}  min {a.min():6.2f} max {a.max():6.2f}")
    out = os.environ.get("OUTJSON")
    if out: json.dump({"variants": [dict(v, MB=str(mb)) for v, mb in zip(variants, mbs)], "times": times}, open(out, "w"))
