"""The trainer's optimizer (train/step.py SummedGradientsAdamW) updates as Keras's AdamW does.

On one device it updates each variable with TensorFlow's fused `ResourceApplyAdam` and builds the
learning rate and Adam's step scalars once per apply (fewer graph ops to trace and lower). The fused
op computes Keras's expressions in Keras's order, except that it forms 1 - beta in float32 where Keras
rounds Python's 1 - beta: with betas whose 1 - beta is exact both ways the variables and slots equal
Keras's bit for bit, and with the default betas they agree to that rounding. Under a tf.distribute
strategy and with amsgrad the update is Keras's own, bit for bit.
"""

from __future__ import annotations

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

from melshards.train.config import OptimConfig
from melshards.train.step import LossScaleOptimizer, SummedGradientsAdamW, WarmupRsqrt, make_optimizer

EXACT_BETAS = (0.875, 0.984375)  # 1 - beta is 1/8 and 1/64: the same in Python and in float32
DEFAULT_BETAS = (0.9, 0.98)  # configs' defaults: float32(1 - 0.9) is 0.1, 1 - float32(0.9) is 0.100000024


def _run(
    optimizer_class, steps: int = 3, betas=DEFAULT_BETAS, jit_compile: bool = True, strategy=None, **kw
) -> list[np.ndarray]:
    """The variables, then the optimizer's (iterations, momentums, velocities), after `steps` applies."""
    rng = np.random.default_rng(0)
    with (strategy or tf.distribute.get_strategy()).scope():
        variables = [tf.Variable(rng.normal(size=shape).astype(np.float32)) for shape in ((3, 4), (4,), ())]
        opt = optimizer_class(
            learning_rate=WarmupRsqrt(3e-3, 2), weight_decay=0.01, beta_1=betas[0], beta_2=betas[1], name="adam_w", **kw
        )
        opt.build(variables)
    grads = [[tf.constant(rng.normal(size=v.shape).astype(np.float32)) for v in variables] for _ in range(steps)]

    def apply(g):
        opt.apply(g, variables)

    if strategy is None:
        step = tf.function(apply, autograph=False, jit_compile=jit_compile)
    else:
        step = tf.function(lambda g: strategy.run(apply, args=(g,)), autograph=False)
    for g in grads:
        step(g)
    return [v.numpy() for v in variables] + [v.numpy() for v in opt.variables]


def _apply_ops(optimizer_class, **kw) -> collections.Counter:
    """The op types of one traced apply() over three variables."""
    variables = [tf.Variable(np.ones(shape, np.float32)) for shape in ((3, 4), (4,), (2,))]
    opt = optimizer_class(learning_rate=WarmupRsqrt(3e-3, 2), weight_decay=0.01, name="adam_w", **kw)
    opt.build(variables)
    apply = tf.function(lambda: opt.apply([tf.ones_like(v) for v in variables], variables), autograph=False)
    return collections.Counter(op.type for op in apply.get_concrete_function().graph.get_operations())


@pytest.mark.parametrize("jit_compile", [True, False], ids=["xla", "tf-kernels"])
def test_the_fused_update_equals_keras_adamw_bit_for_bit_where_one_minus_beta_is_exact(jit_compile):
    ours = _run(SummedGradientsAdamW, betas=EXACT_BETAS, jit_compile=jit_compile)
    theirs = _run(keras.optimizers.AdamW, betas=EXACT_BETAS, jit_compile=jit_compile)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)
    assert ours[0].tobytes() != _run(SummedGradientsAdamW, steps=2, betas=EXACT_BETAS)[0].tobytes()  # steps count


def test_the_fused_update_agrees_with_keras_adamw_to_the_rounding_of_one_minus_beta():
    """Float32's 1 - 0.9 and 1 - 0.98 are 2e-7 and 1e-6 off Keras's rounded constants (relative), so three
    steps agree to a few of those; nothing else differs (the exact-betas test)."""
    for a, b in zip(_run(SummedGradientsAdamW), _run(keras.optimizers.AdamW), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9)


def test_each_variable_updates_with_one_fused_adam_op():
    ours, theirs = _apply_ops(SummedGradientsAdamW), _apply_ops(keras.optimizers.AdamW)
    assert ours["ResourceApplyAdam"] == 3 and theirs["ResourceApplyAdam"] == 0
    # the momentum and velocity updates are inside the fused op, where Keras adds to each
    assert ours["AssignAddVariableOp"] == 0 and theirs["AssignAddVariableOp"] == 2 * 3
    assert sum(ours.values()) < sum(theirs.values()) / 2


def test_amsgrad_and_a_strategy_update_with_keras_s_own_ops_bit_for_bit():
    """The fused op has no amsgrad maximum, and a strategy's variables update per replica device: both keep
    Keras's update_step, so they equal Keras's AdamW at the default betas exactly."""
    assert _apply_ops(SummedGradientsAdamW, amsgrad=True)["ResourceApplyAdam"] == 0
    for a, b in zip(_run(SummedGradientsAdamW, amsgrad=True), _run(keras.optimizers.AdamW, amsgrad=True), strict=True):
        np.testing.assert_array_equal(a, b)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    for a, b in zip(
        _run(SummedGradientsAdamW, strategy=strategy), _run(keras.optimizers.AdamW, strategy=strategy), strict=True
    ):
        np.testing.assert_array_equal(a, b)


class _CountedSchedule(WarmupRsqrt):
    calls = 0

    def __call__(self, step):
        type(self).calls += 1
        return super().__call__(step)


def test_the_learning_rate_is_built_once_per_apply_not_once_per_variable():
    """The op saving rests on Keras's private hooks (`_backend_apply_gradients`, `_get_current_learning_rate`,
    `_apply_weight_decay`, `update_step`): a Keras that stops calling them through these names fails here or
    in the tests above, not silently slower."""

    def schedule_calls(optimizer_class) -> int:
        variables = [tf.Variable(np.ones(shape, np.float32)) for shape in ((3, 4), (4,), (2,))]
        opt = optimizer_class(learning_rate=_CountedSchedule(3e-3, 2), weight_decay=0.01, name="adam_w")
        opt.build(variables)
        _CountedSchedule.calls = 0
        tf.function(lambda: opt.apply([tf.ones_like(v) for v in variables], variables), autograph=False)()
        return _CountedSchedule.calls

    assert schedule_calls(SummedGradientsAdamW) == 1
    assert schedule_calls(keras.optimizers.AdamW) > 3  # Keras's own: once more per variable


def test_loss_scale_optimizer_checks_finiteness_as_keras_does_without_is_finite_under_xla():
    """The same decision as Keras's LossScaleOptimizer on finite, inf and NaN gradients (so the same
    skipped steps and scale), the same name, and no IsFinite op in the compiled check."""
    variables = [tf.Variable(np.ones(shape, np.float32)) for shape in ((3, 4), (4,))]
    ours = LossScaleOptimizer(keras.optimizers.SGD(0.1))
    keras_own = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    assert ours.name.startswith("loss_scale_optimizer") and keras_own.name.startswith("loss_scale_optimizer")
    checks = [tf.function(opt.check_finite, autograph=False, jit_compile=True) for opt in (ours, keras_own)]
    for bad in (None, np.inf, -np.inf, np.nan):
        grads = [tf.ones_like(v) for v in variables]
        if bad is not None:
            grads[1] = tf.tensor_scatter_nd_update(grads[1], [[2]], [bad])
        assert bool(checks[0](grads)) == bool(checks[1](grads)) == (bad is None)
    graph = checks[0].get_concrete_function([tf.ones_like(v) for v in variables]).graph
    assert "IsFinite" not in {op.type for op in graph.get_operations()}
    assert isinstance(
        make_optimizer(OptimConfig(), "mixed_float16", keras.Sequential([keras.layers.Dense(2)])), LossScaleOptimizer
    )
