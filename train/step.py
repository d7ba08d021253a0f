"""Losses and the compiled train/eval steps: small functions returning metrics.

Both steps are `tf.function(input_signature=..., jit_compile=True)` built from the schema, so they
trace once. Masks and mel normalisation are computed in-graph from the static shapes.
"""
from __future__ import annotations

from train.tf_quiet import tf  # noqa: I001 (first: keras imports TensorFlow)
import keras
import numpy as np

from shards_schema import Schema
from shards_schema.records import tensor_specs
from train.config import OptimConfig
from train.contract import MODEL_INPUTS

# Besides the model's own losses (the keys of its losses_from_terms), every step reports these.
STEP_METRICS = ("grad_norm", "learning_rate", "examples", "mel_frames")


class Normaliser:
    """Per-bin standardisation of log-mel with the schema's corpus statistics."""

    def __init__(self, schema: Schema):
        self.mean = tf.constant(np.asarray(schema.mel_mean, np.float32))
        # a constant bin (std 0) must not divide by zero
        self.std = tf.constant(np.maximum(np.asarray(schema.mel_std, np.float32), 1e-3))

    def __call__(self, mel):
        return (mel - self.mean) / self.std

    def invert(self, mel):
        return mel * self.std + self.mean


def step_specs(schema: Schema, batch_size: int, steps_per_execution: int | None = None) -> dict:
    """input_signature: the schema's specs for MODEL_INPUTS, with a leading K dim for the train step."""
    specs = tensor_specs(schema, batch_size, MODEL_INPUTS)
    if steps_per_execution is None:
        return specs
    return {k: tf.TensorSpec([steps_per_execution, *s.shape], s.dtype, name=k) for k, s in specs.items()}


class WarmupRsqrt(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to the peak, then decay with 1/sqrt(step) (Transformer schedule, peak-normalised)."""

    def __init__(self, peak: float, warmup_steps: int):
        self.peak, self.warmup = peak, float(max(warmup_steps, 1))

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        return self.peak * tf.minimum(step / self.warmup, tf.math.rsqrt(step / self.warmup))

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": int(self.warmup)}


def make_optimizer(cfg: OptimConfig, precision: str, model: keras.Model):
    """AdamW (with loss scaling for float16), built now: an unbuilt optimizer makes the step trace twice."""
    opt = keras.optimizers.AdamW(
        learning_rate=WarmupRsqrt(cfg.learning_rate, cfg.warmup_steps), weight_decay=cfg.weight_decay,
        beta_1=cfg.beta_1, beta_2=cfg.beta_2, global_clipnorm=cfg.clip_norm)
    if precision == "mixed_float16":
        opt = keras.optimizers.LossScaleOptimizer(opt)
    opt.build(model.trainable_variables)
    return opt


def make_train_step(model: keras.Model, optimizer, schema: Schema, cfg: OptimConfig, batch_size: int,
                    steps_per_execution: int, seed: int, step: tf.Variable, loss_names: tuple[str, ...]):
    """The compiled step: K optimizer steps per call over a [K, B, ...] stack of batches.

    Returns {metric: mean over the K steps} plus "losses": the K total losses (NaN detection).
    """
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    inner = optimizer.inner_optimizer if scaled else optimizer
    k_steps = steps_per_execution

    def one_step(batch):
        variables = model.trainable_variables
        # dropout masks are a function of (seed, step): a resumed run draws what it would have drawn
        key = tf.stack([tf.constant(seed, tf.int32), tf.cast(step, tf.int32)])
        with tf.GradientTape() as tape:
            terms = model.loss_terms(batch, key, training=True)
            losses = model.losses_from_terms(terms)
            losses = {name: tf.cast(losses[name], tf.float32) for name in loss_names}
            loss = optimizer.scale_loss(losses["loss"]) if scaled else losses["loss"]
        grads = tape.gradient(loss, variables)
        grad_norm = tf.linalg.global_norm(grads)
        if scaled:
            grad_norm = grad_norm / tf.cast(optimizer.dynamic_scale, grad_norm.dtype)
        lr = inner.learning_rate  # value at this step, before apply() increments iterations
        optimizer.apply(grads, variables)
        step.assign_add(1)
        return dict(losses, grad_norm=grad_norm, learning_rate=tf.cast(lr, tf.float32),
                    examples=terms["examples"], mel_frames=terms["mel_frames"])

    metric_names = (*loss_names, *STEP_METRICS)

    @tf.function(input_signature=[step_specs(schema, batch_size, k_steps)], jit_compile=True)
    def train_step(batches):
        if k_steps == 1:  # no loop: XLA fuses and schedules a straight-line step better than a while body
            metrics = one_step({name: batches[name][0] for name in MODEL_INPUTS})
            return dict({name: metrics[name] for name in metric_names}, losses=metrics["loss"][None])
        totals = {name: tf.constant(0.0) for name in metric_names}
        step_losses = tf.TensorArray(tf.float32, size=k_steps)
        for k in tf.range(k_steps):
            metrics = one_step({name: batches[name][k] for name in MODEL_INPUTS})
            totals = {name: totals[name] + metrics[name] for name in metric_names}
            step_losses = step_losses.write(k, metrics["loss"])
        out = {name: totals[name] / k_steps for name in metric_names}
        out["examples"], out["mel_frames"] = totals["examples"], totals["mel_frames"]  # sums, not means
        out["losses"] = step_losses.stack()
        return out

    return train_step


def make_eval_step(model: keras.Model, schema: Schema, batch_size: int):
    """Compiled once like the train step; returns masked sums so the caller adds batches up exactly."""
    @tf.function(input_signature=[step_specs(schema, batch_size)], jit_compile=True)
    def eval_step(batch):
        return model.loss_terms(batch, tf.zeros([2], tf.int32), training=False)

    return eval_step
