"""train/native_ops.py: under XLA each function gives the TensorFlow op's values and gradients bit for bit,
from ops tf2xla lowers natively; outside XLA it is the TensorFlow op."""

from __future__ import annotations

import numpy as np
import pytest

from melshards.train import native_ops
from melshards.train.tf_quiet import tf  # noqa: I001

F32 = np.finfo(np.float32)
EDGES = [0.0, -0.0, 1.0, -1.0, F32.tiny, -F32.tiny, 1e-45, -1e-45, F32.max, -F32.max, np.inf, -np.inf, np.nan, -np.nan]


def _values(*extra, n: int = 400, seed: int = 0) -> np.ndarray:
    """Normal, tiny and huge values of both signs, and `extra`."""
    rng = np.random.default_rng(seed)
    x = np.concatenate(
        [
            rng.standard_normal(n),
            rng.standard_normal(n) * 1e4,
            rng.standard_normal(n) * 1e-4,
            np.exp(rng.uniform(-85, 85, n)) * rng.choice([-1, 1], n),
            extra,
        ]
    )
    return x.astype(np.float32)


def assert_same_bits(got, want):
    """Equal bit for bit: the sign of zero and NaN's bits count."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype
    if got.dtype.kind == "f":
        got, want = got.view(f"i{got.itemsize}"), want.view(f"i{want.itemsize}")
    np.testing.assert_array_equal(got, want)


def _compiled(f, *args, dy=None, watch=(0,)):
    """f(*args) and the gradients of <f, dy> with respect to args[i] for i in watch, compiled with XLA;
    and the op types of the traced graph."""

    @tf.function(jit_compile=True, autograph=False)
    def run(*args):
        with tf.GradientTape() as tape:
            for i in watch:
                tape.watch(args[i])
            y = f(*args)
        if dy is None:
            return y, []
        return y, tape.gradient(y, [args[i] for i in watch], output_gradients=dy)

    args = [tf.constant(a) for a in args]
    y, grads = run(*args)
    ops = {op.type for op in run.get_concrete_function(*args).graph.get_operations()}
    return y.numpy(), [g.numpy() for g in grads], ops


def _check(ours, theirs, *args, dy=None, watch=(0,), gone=()):
    y, grads, ops = _compiled(ours, *args, dy=dy, watch=watch)
    want_y, want_grads, want_ops = _compiled(theirs, *args, dy=dy, watch=watch)
    assert_same_bits(y, want_y)
    for g, want in zip(grads, want_grads, strict=True):
        assert_same_bits(g, want)
    assert set(gone) <= want_ops  # the TensorFlow op (and its gradient's) are what this replaces
    assert not set(gone) & ops


def test_absolute_is_tf_abs_with_its_gradient_under_xla():
    x = _values(*EDGES)
    dy = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    _check(native_ops.absolute, tf.abs, x, dy=dy, gone=("Abs", "Sign"))


def test_absolute_of_half_precision_is_tf_abs_under_xla():
    with np.errstate(over="ignore"):  # huge values: +-inf in half precision
        x = _values(*EDGES).astype(np.float16)
    _check(native_ops.absolute, tf.abs, x, dy=np.ones_like(x), gone=("Abs", "Sign"))


def test_softmax_is_tf_softmax_with_its_gradient_under_xla():
    rng = np.random.default_rng(0)
    for scale in (1.0, 30.0, 1e4):
        logits = (rng.standard_normal([3, 2, 5, 7]) * scale).astype(np.float32)
        masked = rng.uniform(size=logits.shape) < 0.3
        masked[0, 0, 0] = True  # a row with every key masked: uniform
        logits = np.where(masked, np.float32(3.38953e38 * -0.7), logits)  # attend's large negative
        logits[1, 1, 1, :2] = 0.0
        dy = rng.standard_normal(logits.shape).astype(np.float32)
        _check(native_ops.softmax, lambda t: tf.nn.softmax(t, axis=-1), logits, dy=dy, gone=("Softmax",))


def test_log1p_is_tf_log1p_with_its_gradient_under_xla():
    x = _values(0.0, -0.0, -1.0, -0.5, -1e-8, 1e-45, F32.max, np.inf, np.nan, -2.0)
    x = np.where(x < -1, np.float32(-0.999), x)
    x[-1] = -2.0  # below -1: NaN
    dy = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    _check(native_ops.log1p, tf.math.log1p, x, dy=dy, gone=("Log1p", "Reciprocal"))


def test_sigmoid_cross_entropy_is_tensorflows_with_its_gradient_under_xla():
    logits = _values(0.0, -0.0, 88.0, -88.0, 104.0, -104.0, F32.max, -F32.max)
    labels = np.random.default_rng(1).choice(np.float32([0.0, 1.0, 0.5]), logits.shape)
    dy = np.random.default_rng(2).standard_normal(logits.shape).astype(np.float32)
    _check(
        lambda z, t: native_ops.sigmoid_cross_entropy_with_logits(labels=t, logits=z),
        lambda z, t: tf.nn.sigmoid_cross_entropy_with_logits(labels=t, logits=z),
        logits,
        labels,
        dy=dy,
        gone=("Log1p", "Reciprocal"),
    )


def test_is_finite_is_tf_is_finite_under_xla():
    _check(native_ops.is_finite, tf.math.is_finite, _values(*EDGES), gone=("IsFinite",))


@pytest.mark.parametrize(
    "ours, theirs, op, x",
    [
        (native_ops.absolute, tf.abs, "Abs", _values(*EDGES)),
        (native_ops.softmax, tf.nn.softmax, "Softmax", _values().reshape(-1, 8)),
        (native_ops.log1p, tf.math.log1p, "Log1p", np.abs(_values(np.inf, np.nan))),
        (native_ops.is_finite, tf.math.is_finite, "IsFinite", _values(*EDGES)),
    ],
)
def test_outside_xla_each_is_the_tensorflow_op(ours, theirs, op, x):
    x = tf.constant(x)
    assert_same_bits(ours(x).numpy(), theirs(x).numpy())  # eagerly
    graph = tf.function(ours, autograph=False).get_concrete_function(x).graph  # traced without XLA
    assert op in {o.type for o in graph.get_operations()}
