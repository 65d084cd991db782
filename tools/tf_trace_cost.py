"""How long a tf.function that calls hvd_lite's collectives takes to trace the first time.

    python tools/tf_trace_cost.py [--runs 5]

Each run is a fresh 1-rank process (so nothing is cached) that traces and runs one step: the
collectives (allreduce Sum and Average, allgather, broadcast, alltoall, reducescatter), or a
custom-loop step (a DistributedGradientTape's gradient and the optimizer's update, as Horovod's
TF2 examples write it). Each step is traced once with AutoGraph on (tf.function's default, what
users get) and once with `autograph=False` (the same trace with no code converted: the baseline),
in turn; the tool prints the medians and their ratio. What on costs over off is AutoGraph
converting code: the step's own, and before hvd_lite's entry points were marked
(mpi_ops.graph_safe), all of hvd_lite's code they reach (docs/tensorflow.md, "Tracing").
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
import keras
import tensorflow as tf
import hvd_lite.tensorflow as hvd
hvd.init()
x = tf.constant([[1.0, 2.0]])
tf.function(lambda v: tf.reduce_sum(v * 2))(x)  # TF's own first-trace costs, outside the timing

def collectives(x):
    return (hvd.allreduce(x, op=hvd.Sum), hvd.allreduce(x), hvd.allgather(x), hvd.broadcast(x, 0),
            hvd.alltoall(x), hvd.reducescatter(x))

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4), keras.layers.Dense(1)])
opt = keras.optimizers.SGD(0.1)

def tape_step(x):  # Horovod's TF2 custom loop: a DistributedGradientTape, then the update
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(x) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss

step = collectives if sys.argv[1] == "collectives" else tape_step
t0 = time.perf_counter()
tf.function(step, autograph=sys.argv[2] == "on")(x)
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def one(script: str, step: str, mode: str) -> float:
    out = subprocess.run([sys.executable, script, step, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="fresh processes per mode (default 5)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # a file, not `python -c`: AutoGraph converts only functions whose source it can read
        script = os.path.join(tmp, "trace_step.py")
        with open(script, "w") as f:
            f.write(CHILD)
        for step in ("collectives", "tape"):
            times = {"on": [], "off": []}
            for _ in range(args.runs):
                for mode in ("on", "off"):
                    times[mode].append(one(script, step, mode))
            on, off = statistics.median(times["on"]), statistics.median(times["off"])
            print(
                f"{step}: first trace, median of {args.runs} fresh processes: AutoGraph on "
                f"{on * 1e3:.1f} ms, off {off * 1e3:.1f} ms, on/off {on / off:.2f}"
            )
            print("  on:  " + " ".join(f"{t * 1e3:.1f}" for t in times["on"]))
            print("  off: " + " ".join(f"{t * 1e3:.1f}" for t in times["off"]))


if __name__ == "__main__":
    main()
