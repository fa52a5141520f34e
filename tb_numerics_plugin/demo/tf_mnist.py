"""A TensorFlow MLP whose loss goes to -inf and then NaN, dumped with tfdbg2.

The TF take on TF's own ``debug_mnist_v2`` example: a 784-500-10 MLP trained
on synthetic data (fixed seed) whose weights start so large that the softmax
saturates. ``loss`` (a ``tf.function`` whose first argument is ``probs``)
takes ``tf.math.log(probs)``: probabilities that underflowed to 0 give -inf,
and ``labels * -inf`` gives NaN. ``--fix`` clips the probabilities first.

Usage::

    python -m tb_numerics_plugin.demo.tf_mnist --dump_dir /tmp/dump \
        --dump_tensor_debug_mode FULL_HEALTH [--fix] [--steps 3]

The dump is written with TF's own
``tf.debugging.experimental.enable_dump_debug_info`` (unbounded buffer) and
flushed at the end. :func:`run` can be called several times in one process
with different dump roots and modes (the tests use that to pay for one TF
import only); each call builds fresh ``tf.function`` objects so that every
dump holds its own graphs.
"""

import argparse
import sys

MODES = (
    "NO_TENSOR",
    "CURT_HEALTH",
    "CONCISE_HEALTH",
    "FULL_HEALTH",
    "SHAPE",
    "FULL_TENSOR",
)
_BATCH = 100
_HIDDEN = 500
_CLASSES = 10
_FEATURES = 784


def _build(tf, fix):
    """Returns (model, loss, variables) as fresh tf.functions and variables."""
    init = tf.random.stateless_normal
    # A wide initial scale saturates the softmax: most probabilities are 0.0f.
    w1 = tf.Variable(init([_FEATURES, _HIDDEN], seed=[1, 2], stddev=1.0), name="w1")
    b1 = tf.Variable(tf.zeros([_HIDDEN]), name="b1")
    w2 = tf.Variable(init([_HIDDEN, _CLASSES], seed=[3, 4], stddev=1.0), name="w2")
    b2 = tf.Variable(tf.zeros([_CLASSES]), name="b2")

    @tf.function
    def model(x):
        hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
        return tf.nn.softmax(tf.matmul(hidden, w2) + b2)

    @tf.function
    def loss(probs, labels):
        if fix:
            probs = tf.clip_by_value(probs, 1e-6, 1.0)
        log_probs = tf.math.log(probs)  # the bad line: log(0) = -inf
        return -tf.reduce_mean(tf.reduce_sum(labels * log_probs, axis=1))

    return model, loss, [w1, b1, w2, b2]


def _data(tf, steps):
    """Synthetic MNIST-shaped batches from a fixed seed."""
    batches = []
    for step in range(steps):
        x = tf.random.stateless_uniform([_BATCH, _FEATURES], seed=[7, step])
        y = tf.random.stateless_uniform([_BATCH], seed=[8, step], maxval=_CLASSES, dtype=tf.int32)
        batches.append((x, tf.one_hot(y, _CLASSES)))
    return batches


def run(dump_dir, tensor_debug_mode="FULL_HEALTH", fix=False, steps=3, learning_rate=0.05):
    """Trains ``steps`` steps with tfdbg2 dumping into ``dump_dir``.

    Args:
      dump_dir: dump root (created by TF).
      tensor_debug_mode: one of :data:`MODES`.
      fix: clip probabilities before the log (no -inf, no NaN).
      steps: training steps.
      learning_rate: SGD step size.

    Returns:
      list of float: the loss of each step (inf/nan without ``fix``).
    """
    import tensorflow as tf  # heavy: imported only when a demo runs

    batches = _data(tf, steps)
    writer = tf.debugging.experimental.enable_dump_debug_info(
        dump_dir, tensor_debug_mode=tensor_debug_mode, circular_buffer_size=-1
    )
    try:
        model, loss, variables = _build(tf, fix)
        losses = []
        for x, labels in batches:
            with tf.GradientTape() as tape:
                value = loss(model(x), labels)
            grads = tape.gradient(value, variables)
            for var, grad in zip(variables, grads):
                var.assign_sub(learning_rate * grad)
            losses.append(float(value.numpy()))
        writer.FlushNonExecutionFiles()
        writer.FlushExecutionFiles()
    finally:
        tf.debugging.experimental.disable_dump_debug_info()
    return losses


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump_dir", required=True, help="tfdbg2 dump root to write")
    parser.add_argument("--dump_tensor_debug_mode", default="FULL_HEALTH", choices=MODES)
    parser.add_argument("--fix", action="store_true", help="clip probabilities before the log")
    parser.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    args = parser.parse_args(argv)
    losses = run(args.dump_dir, args.dump_tensor_debug_mode, args.fix, args.steps)
    print("losses: %s" % ", ".join("%g" % v for v in losses))
    print("dump written to %s" % args.dump_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
