"""Does an allreduce queued on a fresh non-blocking stream see an input filled on the default
stream? (a) filled on the default stream while it is busy; (b) filled on the call's stream."""

import sys

import cupy
import numpy as np

import hvd_lite as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
spin = cupy.RawKernel(
    r'extern "C" __global__ void spin(long long c){long long t=clock64(); while(clock64()-t<c){}}', "spin"
)
want = np.full(1 << 16, n * (n + 1) / 2, np.float32)
for form in ("default-stream input", "input on the call's stream"):
    wrong = 0
    for i in range(int(sys.argv[1])):
        spin((1,), (1,), (np.int64(2_000_000),))  # about 1 ms of the default stream
        s = cupy.cuda.Stream(non_blocking=True)
        if form.startswith("default"):
            x = cupy.full(1 << 16, r + 1.0, cupy.float32)
            with s:
                h = hvd.allreduce_async(x, op=hvd.Sum, name=f"race.{form}.{i}")
        else:
            with s:
                x = cupy.full(1 << 16, r + 1.0, cupy.float32)
                h = hvd.allreduce_async(x, op=hvd.Sum, name=f"race.{form}.{i}")
        del s
        out = hvd.synchronize(h)
        cupy.cuda.runtime.deviceSynchronize()
        wrong += int(not np.array_equal(cupy.asnumpy(out), want))
    total = hvd.allreduce(np.array([wrong]), op=hvd.Sum)[0]
    if r == 0:
        print(f"{form}: {total} wrong results of {int(sys.argv[1]) * n} ({n} ranks)", flush=True)
