"""A custom training loop under hvd_lite's MultiWorkerMirroredStrategy: strategy.run + strategy.reduce.

    mpirun -np 2 python examples/tf_custom_loop.py

The tf.distribute custom-loop pattern unchanged but for the strategy's line: the per-example
loss is averaged over the *global* batch with tf.nn.compute_average_loss, the replicas' losses
are summed with strategy.reduce, and the optimizer all-reduces the gradients in one fused call.
"""

import argparse

import _tf_setup
import keras
import tensorflow as tf

import hvd_lite.tensorflow as hvd


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--global-batch", type=int, default=64)
    args = p.parse_args()
    _tf_setup.threads()
    keras.utils.set_random_seed(42)

    strategy = hvd.MultiWorkerMirroredStrategy()  # was: tf.distribute.MultiWorkerMirroredStrategy()
    x_train, x_test, y_train, y_test = _tf_setup.digits()
    dataset = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(x_train), seed=1)
        .batch(args.global_batch)
    )
    dist_dataset = strategy.experimental_distribute_dataset(dataset)

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Flatten(),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        optimizer = keras.optimizers.Adam(0.005)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(inputs):
        def step_fn(x, y):
            with tf.GradientTape() as tape:
                per_example = loss_fn(y, model(x, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        per_replica = strategy.run(step_fn, args=inputs)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    for epoch in range(args.epochs):
        total, steps = 0.0, 0
        for batch in dist_dataset:
            total += float(train_step(batch))
            steps += 1
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1:3d}/{args.epochs}  loss {total / steps:.4f}")

    _tf_setup.report(hvd, model, x_test, y_test)


if __name__ == "__main__":
    main()
