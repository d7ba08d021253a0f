"""The built-in model's graph (train/model.py): its layers compute what Keras's and TensorFlow's own
ops do, with fewer graph nodes in the step's gradient."""

from __future__ import annotations

import numpy as np

from melshards.train.model import Dropout, SiteKeys
from melshards.train.tf_quiet import tf  # noqa: I001


def _count(graph, op_type: str) -> int:
    return sum(op.type == op_type for op in graph.get_operations())


def _value_and_gradients(f, sources, dy):
    """f's value and the gradients of <f, dy> with respect to sources, in one traced function."""

    @tf.function(autograph=False)
    def run():
        with tf.GradientTape() as tape:
            tape.watch([s for s in sources if isinstance(s, tf.Tensor)])
            y = f()
        return y, tape.gradient(y, sources, output_gradients=dy)

    return run


def test_dropouts_gradient_is_tensorflows_own_without_the_constant_divisors_gradient():
    x, dy = tf.random.stateless_normal([4, 16, 8], [1, 2]), tf.random.stateless_normal([4, 16, 8], [3, 4])
    seed, layer = tf.constant([7, 3], tf.int32), Dropout(0.3, site=5, rng="philox")
    keep = SiteKeys(seed).uniform(tf.shape(x), 5, "philox") >= 0.3
    ours = _value_and_gradients(lambda: layer(x, seed, training=True), [x], dy)
    theirs = _value_and_gradients(lambda: tf.where(keep, x / tf.cast(0.7, x.dtype), tf.zeros_like(x)), [x], dy)
    (y, [dx]), (want_y, [want_dx]) = ours(), theirs()
    np.testing.assert_array_equal(y.numpy(), want_y.numpy())
    np.testing.assert_array_equal(dx.numpy(), want_dx.numpy())
    # x / scale forward and dy / scale backward; no gradient for the divisor (two more divisions)
    assert _count(ours.get_concrete_function().graph, "RealDiv") == 2
