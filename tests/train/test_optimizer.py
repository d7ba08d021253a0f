"""The trainer's optimizer (train/step.py SummedGradientsAdamW) updates exactly as Keras's AdamW does.

It builds the learning rate and Adam's step scalars once per apply instead of once per variable
(fewer graph ops to trace); the variables and slots after a few steps must equal Keras's, bit for bit.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from melshards.train.step import SummedGradientsAdamW, WarmupRsqrt


def _run(optimizer_class, steps: int = 3) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(0)
    variables = [tf.Variable(rng.normal(size=shape).astype(np.float32)) for shape in ((3, 4), (4,), ())]
    grads = [[tf.constant(rng.normal(size=v.shape).astype(np.float32)) for v in variables] for _ in range(steps)]
    opt = optimizer_class(learning_rate=WarmupRsqrt(3e-3, 2), weight_decay=0.01, beta_1=0.9, beta_2=0.98, name="adam_w")
    opt.build(variables)

    @tf.function(autograph=False)
    def apply(g):
        opt.apply(g, variables)

    for g in grads:
        apply(g)
    return [v.numpy() for v in variables], [v.numpy() for v in opt.variables]


def test_summed_gradients_adamw_updates_bit_for_bit_as_keras_adamw():
    ours, ours_slots = _run(SummedGradientsAdamW)
    keras_vars, keras_slots = _run(keras.optimizers.AdamW)
    for a, b in zip(ours + ours_slots, keras_vars + keras_slots, strict=True):
        np.testing.assert_array_equal(a, b)
    assert ours[0].tobytes() != _run(SummedGradientsAdamW, steps=2)[0][0].tobytes()  # the steps changed it


class _CountedSchedule(WarmupRsqrt):
    calls = 0

    def __call__(self, step):
        type(self).calls += 1
        return super().__call__(step)


def test_the_learning_rate_is_built_once_per_apply_not_once_per_variable():
    """The op saving rests on Keras's private hooks (`_backend_apply_gradients`, `_get_current_learning_rate`,
    `update_step`): a Keras that stops calling them through these names fails here, not silently slower."""

    def schedule_calls(optimizer_class) -> int:
        variables = [tf.Variable(np.ones(shape, np.float32)) for shape in ((3, 4), (4,), (2,))]
        opt = optimizer_class(learning_rate=_CountedSchedule(3e-3, 2), weight_decay=0.01, name="adam_w")
        opt.build(variables)
        _CountedSchedule.calls = 0
        tf.function(lambda: opt.apply([tf.ones_like(v) for v in variables], variables), autograph=False)()
        return _CountedSchedule.calls

    assert schedule_calls(SummedGradientsAdamW) == 1
    assert schedule_calls(keras.optimizers.AdamW) > 3  # Keras's own: once more per variable
