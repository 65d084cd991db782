"""Synthetic training throughput with the API lines of Horovod's two TensorFlow 2 benchmarks, under
Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1) or Keras 3.

    TF_USE_LEGACY_KERAS=1 mpirun -np 2 python examples/tf_keras_synthetic_benchmark.py --mode fit
    mpirun -np 2 python examples/tf_keras_synthetic_benchmark.py --mode tape

--mode tape is a custom loop as horovod's tensorflow2_synthetic_benchmark.py writes it: a
tf.function step with DistributedGradientTape and `opt.apply_gradients`, the model's and the
optimizer's variables broadcast after the first step. --mode fit is model.fit as
tensorflow2_keras_synthetic_benchmark.py writes it: DistributedOptimizer with a compression,
BroadcastGlobalVariablesCallback and MetricAverageCallback, a tf.keras.callbacks.Callback of its own
timing each epoch. Both use `tf.keras` and `tf.optimizers`, which name tf_keras under
TF_USE_LEGACY_KERAS=1 and Keras 3 otherwise; the two spellings Keras 3 refuses are marked below.
Prints the images per second, and whether every rank ended with the same weights.
"""

import argparse
import os
import timeit

import _tf_setup
import numpy as np
import tensorflow as tf

KERAS2 = os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true")


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["tape", "fit"], default="fit")
    p.add_argument("--model", default="cnn", help="'cnn' (small) or a tf.keras.applications name")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=3)
    p.add_argument("--fp16-allreduce", action="store_true")
    return p.parse_args()


def make_model(name, size):
    """A small CNN, or a tf.keras.applications model without weights (1000 classes)."""
    if name != "cnn":
        return getattr(tf.keras.applications, name)(weights=None, input_shape=(size, size, 3))
    return tf.keras.Sequential(
        [
            tf.keras.Input((size, size, 3)),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(2),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(1000, activation="softmax"),
        ]
    )


def tape_mode(hvd, args, model, data, target):
    opt = tf.optimizers.SGD(0.01)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    @tf.function
    def step(first_batch):
        with tf.GradientTape() as tape:
            probs = model(data, training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(target, probs))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            # Keras 2: opt.variables() (a method; Keras 3 refuses the call: there it is a list)
            hvd.broadcast_variables(opt.variables() if KERAS2 else opt.variables, root_rank=0)

    step(True)
    return [
        args.batch_size
        * args.num_batches_per_iter
        / timeit.timeit(lambda: step(False), number=args.num_batches_per_iter)
        for _ in range(args.num_iters)
    ]


def fit_mode(hvd, args, model, data, target):
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    opt = hvd.DistributedOptimizer(tf.optimizers.SGD(0.01), compression=compression)
    # Keras 2 takes experimental_run_tf_function=False (Horovod's scripts pass it); Keras 3 refuses it
    extra = {"experimental_run_tf_function": False} if KERAS2 else {}
    model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, **extra)
    rates = []

    class Timing(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = timeit.default_timer()

        def on_epoch_end(self, epoch, logs=None):
            rates.append(args.batch_size * args.num_batches_per_iter / (timeit.default_timer() - self.start))

    dataset = tf.data.Dataset.from_tensor_slices((data, target)).cache().repeat().batch(args.batch_size)
    model.fit(
        dataset,
        steps_per_epoch=args.num_batches_per_iter,
        epochs=args.num_iters + 1,  # the first epoch warms up
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.MetricAverageCallback(),
            Timing(),
        ],
        verbose=0,
    )
    return rates[1:]


def main():
    args = parse()
    _tf_setup.threads()
    if args.mode == "tape":
        import hvd_lite.tensorflow as hvd
    else:
        import hvd_lite.tensorflow.keras as hvd
    hvd.init()
    tf.random.set_seed(hvd.rank())  # different on purpose: the broadcasts make them agree
    model = make_model(args.model, args.image_size)
    data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
    target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=999, dtype=tf.int64)
    rates = (tape_mode if args.mode == "tape" else fit_mode)(hvd, args, model, data, target)
    flat = np.concatenate([np.ravel(w) for w in model.get_weights()])
    same = all(np.array_equal(flat, w) for w in hvd.allgather_object(flat))
    if hvd.rank() == 0:
        keras = "Keras 2 (tf_keras)" if tf.keras.__name__.startswith("tf_keras") else "Keras 3"
        print(f"{keras}, {args.mode}, model {args.model}, {hvd.size()} ranks")
        print(f"img/sec per rank: {np.mean(rates):.1f} +-{1.96 * np.std(rates):.1f}")
        print(f"weights identical on all {hvd.size()} ranks: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
