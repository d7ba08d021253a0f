"""Losses and the compiled train/eval steps: small functions returning metrics.

Both steps are `tf.function(input_signature=..., jit_compile=True)` built from the schema, so they
trace once. Masks and mel normalisation are computed in-graph from the static shapes.
"""
from __future__ import annotations

from train.tf_quiet import tf  # noqa: I001 (first: keras imports TensorFlow)
import keras
import numpy as np

from shards_schema import Schema
from shards_schema.schema import Bucket
from shards_schema.records import tensor_specs
from train.config import OptimConfig
from train.model import TextToMel

# What the model reads from a record; the shapes and dtypes come from the schema.
MODEL_INPUTS = ("text_ids", "text_len", "mel", "mel_len")
TRAIN_METRICS = ("loss", "mel_loss", "postnet_loss", "stop_loss", "grad_norm", "learning_rate",
                 "examples", "mel_frames")


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


def step_specs(schema: Schema | Bucket, batch_size: int, steps_per_execution: int | None = None) -> dict:
    """input_signature: the schema's specs for MODEL_INPUTS, with a leading K dim for the train step."""
    specs = tensor_specs(schema, batch_size, MODEL_INPUTS)
    if steps_per_execution is None:
        return specs
    return {k: tf.TensorSpec([steps_per_execution, *s.shape], s.dtype, name=k) for k, s in specs.items()}


def loss_terms(model: TextToMel, norm: Normaliser, batch: dict, seed, training: bool) -> dict:
    """Masked sums and counts, so batches (and padded records) combine exactly."""
    target = norm(batch["mel"])
    mel, refined, stop_logits = model(batch["text_ids"], batch["text_len"], target, seed, training=training)
    frames = target.shape[1]
    frame_mask = tf.cast(tf.sequence_mask(batch["mel_len"], frames), tf.float32)[..., None]  # [B, T, 1]
    groups = stop_logits.shape[1]
    # stop target: 1 at the step holding the last real frame; weighted up to that step only, so the
    # padding (half of all steps here) does not teach "stop now". Length-0 (padding) records weigh 0.
    last_step = (batch["mel_len"] - 1) // model.r
    steps = tf.range(groups)[None, :]
    stop_target = tf.cast(steps == last_step[:, None], tf.float32)
    stop_weight = tf.cast(steps <= last_step[:, None], tf.float32)
    bce = tf.nn.sigmoid_cross_entropy_with_logits(labels=stop_target, logits=stop_logits)
    return {
        "mel_abs": tf.reduce_sum(tf.abs(mel - target) * frame_mask),
        "postnet_abs": tf.reduce_sum(tf.abs(refined - target) * frame_mask),
        "mel_count": tf.reduce_sum(frame_mask) * target.shape[2],
        "stop_bce": tf.reduce_sum(bce * stop_weight),
        "stop_count": tf.reduce_sum(stop_weight),
        "examples": tf.reduce_sum(tf.cast(batch["mel_len"] > 0, tf.float32)),
        "mel_frames": tf.cast(tf.reduce_sum(batch["mel_len"]), tf.float32),
    }


def losses_from_terms(terms: dict, stop_weight: float) -> dict:
    mel = terms["mel_abs"] / tf.maximum(terms["mel_count"], 1.0)
    post = terms["postnet_abs"] / tf.maximum(terms["mel_count"], 1.0)
    stop = terms["stop_bce"] / tf.maximum(terms["stop_count"], 1.0)
    return {"loss": mel + post + stop_weight * stop, "mel_loss": mel, "postnet_loss": post, "stop_loss": stop}


class WarmupRsqrt(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to the peak, then decay with 1/sqrt(step) (Transformer schedule, peak-normalised)."""

    def __init__(self, peak: float, warmup_steps: int):
        self.peak, self.warmup = peak, float(max(warmup_steps, 1))

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        return self.peak * tf.minimum(step / self.warmup, tf.math.rsqrt(step / self.warmup))

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": int(self.warmup)}


def make_optimizer(cfg: OptimConfig, precision: str, model: TextToMel):
    """AdamW (with loss scaling for float16), built now: an unbuilt optimizer makes the step trace twice."""
    opt = keras.optimizers.AdamW(
        learning_rate=WarmupRsqrt(cfg.learning_rate, cfg.warmup_steps), weight_decay=cfg.weight_decay,
        beta_1=cfg.beta_1, beta_2=cfg.beta_2, global_clipnorm=cfg.clip_norm)
    if precision == "mixed_float16":
        opt = keras.optimizers.LossScaleOptimizer(opt)
    opt.build(model.trainable_variables)
    return opt


def make_train_step(model: TextToMel, optimizer, schema: Schema, cfg: OptimConfig, batch_size: int,
                    steps_per_execution: int, seed: int, step: tf.Variable, shapes: Bucket | None = None):
    """The compiled step: K optimizer steps per call over a [K, B, ...] stack of batches.

    `shapes`: the length bucket whose static shapes the signature takes (default: the largest).

    Returns {metric: mean over the K steps} plus "losses": the K total losses (NaN detection).
    """
    norm = Normaliser(schema)
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    inner = optimizer.inner_optimizer if scaled else optimizer
    k_steps = steps_per_execution

    def one_step(batch):
        variables = model.trainable_variables
        # dropout masks are a function of (seed, step): a resumed run draws what it would have drawn
        key = tf.stack([tf.constant(seed, tf.int32), tf.cast(step, tf.int32)])
        with tf.GradientTape() as tape:
            terms = loss_terms(model, norm, batch, key, training=True)
            losses = losses_from_terms(terms, cfg.stop_loss_weight)
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

    @tf.function(input_signature=[step_specs(shapes or schema, batch_size, k_steps)], jit_compile=True)
    def train_step(batches):
        if k_steps == 1:  # no loop: XLA fuses and schedules a straight-line step better than a while body
            metrics = one_step({name: batches[name][0] for name in MODEL_INPUTS})
            return dict({name: metrics[name] for name in TRAIN_METRICS}, losses=metrics["loss"][None])
        totals = {name: tf.constant(0.0) for name in TRAIN_METRICS}
        step_losses = tf.TensorArray(tf.float32, size=k_steps)
        for k in tf.range(k_steps):
            metrics = one_step({name: batches[name][k] for name in MODEL_INPUTS})
            totals = {name: totals[name] + metrics[name] for name in TRAIN_METRICS}
            step_losses = step_losses.write(k, metrics["loss"])
        out = {name: totals[name] / k_steps for name in TRAIN_METRICS}
        out["examples"], out["mel_frames"] = totals["examples"], totals["mel_frames"]  # sums, not means
        out["losses"] = step_losses.stack()
        return out

    return train_step


def make_eval_step(model: TextToMel, schema: Schema, batch_size: int, shapes: Bucket | None = None):
    """Compiled once like the train step; returns masked sums so the caller adds batches up exactly."""
    norm = Normaliser(schema)

    @tf.function(input_signature=[step_specs(shapes or schema, batch_size)], jit_compile=True)
    def eval_step(batch):
        return loss_terms(model, norm, batch, tf.zeros([2], tf.int32), training=False)

    return eval_step
