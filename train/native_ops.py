"""TensorFlow ops that tf2xla lowers through its MLIR bridge, restated, under XLA, with ops it lowers natively.

TensorFlow lowers a function to XLA's HLO op by op (tf2xla): most ops have a native kernel that
builds their HLO directly, but some (tensorflow/compiler/tf2xla/kernels: Abs, Exp, IsFinite, Log1p,
Reciprocal, Rsqrt, Sign, Softmax, Sqrt, Tanh, ... registered as `MlirXlaOpKernel`) are lowered
through the MLIR bridge one op at a time, far slower. A resumed run lowers its step again to look
its program up in the persistent XLA cache (docs/performance.md#compile), so each such op delays
the first step.

Each function here computes the TensorFlow op it names, with the gradient TensorFlow registers for
it. While a function is traced for XLA (`compiling_with_xla`: a `tf.function(jit_compile=True)` or
a function it calls) the value comes from ops with native kernels that give the same bits: XLA's
optimised HLO holds the op's own instructions (softmax, log1p), or the formulation is exact by
construction (absolute, is_finite). So the compiled program computes the same numbers bit for bit
(tests/train/test_native_ops.py compares each with the op it replaces, values and gradients, on
inputs with zeros of both signs, tiny and huge values, inf and NaN). Outside XLA each is the
TensorFlow op itself: TensorFlow's own kernels round some of these formulations differently.

Not here, for want of a native kernel that builds the op's HLO instruction alone and lowers faster:
Rsqrt (FusedBatchNormGradV3 in inference mode folds to it, but lowers slower still), Exp, Sqrt, Tanh.
"""

from __future__ import annotations

import numpy as np

from melshards.train.tf_quiet import tf

# registered as MlirXlaOpKernel in tensorflow/compiler/tf2xla/kernels (TF 2.21), among the ops a TTS step uses
MLIR_LOWERED = frozenset(
    {
        "Abs", "BiasAddGrad", "Einsum", "Exp", "Expm1", "IsFinite", "Log1p", "LogSoftmax", "Reciprocal", "Relu",
        "Relu6", "ReluGrad", "Rsqrt", "Sigmoid", "Sign", "Softmax", "Sqrt", "Tanh",
    }
)  # fmt: skip

# the integer of the same width as each float, and the mask of every bit but the sign's
_MAGNITUDE_BITS = {
    tf.float16: (tf.int16, 0x7FFF),
    tf.bfloat16: (tf.int16, 0x7FFF),
    tf.float32: (tf.int32, 0x7FFFFFFF),
    tf.float64: (tf.int64, 0x7FFFFFFFFFFFFFFF),
}


def compiling_with_xla() -> bool:
    """Whether the graph being traced will be compiled with XLA: inside a `tf.function(jit_compile=True)`
    (TensorFlow traces one inside an XLA control-flow context) or a function traced within one."""
    if tf.executing_eagerly():
        return False
    from tensorflow.python.ops import control_flow_util  # no public way to ask

    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def absolute(x):
    """`tf.abs(x)` (real x), with its gradient `dy * sign(x)`.

    Under XLA: the sign bit cleared (Bitcast, BitwiseAnd), which is what an absolute value is in IEEE
    754, NaN's included; the gradient's sign(x) as XLA defines it (1 or -1, x itself at +0, -0 and
    NaN) from two selects.
    """
    if not compiling_with_xla() or x.dtype not in _MAGNITUDE_BITS:
        return tf.abs(x)
    bits, mask = _MAGNITUDE_BITS[x.dtype]

    @tf.custom_gradient
    def magnitude(x):
        def grad(dy):
            one = tf.ones([], x.dtype)
            return dy * tf.where(x > 0, one, tf.where(x < 0, -one, x))

        return tf.bitcast(tf.bitwise.bitwise_and(tf.bitcast(x, bits), tf.constant(mask, bits)), x.dtype), grad

    return magnitude(x)


def softmax(logits):
    """`tf.nn.softmax(logits)` over the last axis, with its gradient `(dy - sum(dy * y)) * y`.

    Under XLA: the second output of SoftmaxCrossEntropyWithLogits on zero labels, the softmax minus
    the labels; its XLA kernel computes the softmax as the MLIR bridge lowers Softmax (max, subtract,
    exp, sum, divide), and subtracting zero folds away.
    """
    if not compiling_with_xla() or not logits.shape.is_fully_defined():
        return tf.nn.softmax(logits)

    @tf.custom_gradient
    def probabilities(logits):
        rows = tf.reshape(logits, [-1, logits.shape[-1]])
        y = tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=rows, labels=tf.zeros_like(rows))[1]
        y = tf.reshape(y, logits.shape)
        return y, lambda dy: (dy - tf.reduce_sum(dy * y, -1, keepdims=True)) * y

    return probabilities(logits)


def log1p(x):
    """`tf.math.log1p(x)`, with its gradient `dy * (1 / (1 + x))`.

    Under XLA: xlog1py(1, x), whose kernel builds select(1 == 0, 0, 1 * log1p(x)); XLA folds it to
    log1p(x). The gradient's reciprocal is a division (RealDiv), which is how the MLIR bridge lowers
    Reciprocal.
    """
    if not compiling_with_xla():
        return tf.math.log1p(x)

    @tf.custom_gradient
    def log_one_plus(x):
        return tf.math.xlog1py(tf.ones([], x.dtype), x), lambda dy: dy * (1 / (1 + x))

    return log_one_plus(x)


def sigmoid_cross_entropy_with_logits(labels, logits):
    """`tf.nn.sigmoid_cross_entropy_with_logits`, TensorFlow's expression with `log1p` above:
    max(logits, 0) - logits * labels + log1p(exp(-|logits|)). (Its Exp stays: no native kernel
    builds XLA's exp of a tensor alone.)"""
    zeros = tf.zeros_like(logits)
    positive = logits >= zeros
    relu_logits = tf.where(positive, logits, zeros)
    neg_abs_logits = tf.where(positive, -logits, logits)
    return tf.add(relu_logits - logits * labels, log1p(tf.exp(neg_abs_logits)))


def is_finite(x):
    """`tf.math.is_finite(x)`; under XLA, -inf < x < inf (false for NaN, as is every comparison)."""
    if not compiling_with_xla():
        return tf.math.is_finite(x)
    inf = tf.constant(np.inf, x.dtype)
    return tf.logical_and(x > -inf, x < inf)
