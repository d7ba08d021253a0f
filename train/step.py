"""Losses and the compiled train/eval steps: small functions returning metrics.

Both steps are `tf.function(input_signature=..., jit_compile=True)` built from the schema, so they
trace once (under a tf.distribute strategy the compiled part is each replica's forward and backward
pass, see make_train_step). Masks and mel normalisation are computed in-graph from the static shapes.
"""
from __future__ import annotations

from melshards.train.tf_quiet import tf  # noqa: I001 (first: keras imports TensorFlow)
import keras
import numpy as np

from melshards.shards_schema import Schema
from melshards.shards_schema.schema import Bucket
from melshards.shards_schema.records import tensor_specs
from melshards.train.config import OptimConfig
from melshards.train.contract import MODEL_INPUTS

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


def step_specs(schema: Schema | Bucket, batch_size: int, steps_per_execution: int | None = None) -> dict:
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
    """AdamW (with loss scaling for float16), built now: an unbuilt optimizer makes the step trace twice.

    No clipping inside Keras: it would clip each replica's gradient before the all-reduce; the step
    clips the global gradient itself (clip_factor).
    """
    opt = keras.optimizers.AdamW(
        learning_rate=WarmupRsqrt(cfg.learning_rate, cfg.warmup_steps), weight_decay=cfg.weight_decay,
        beta_1=cfg.beta_1, beta_2=cfg.beta_2)
    if precision == "mixed_float16":
        opt = keras.optimizers.LossScaleOptimizer(opt)
    opt.build(model.trainable_variables)
    return opt


def clip_factor(norm, clip_norm: float):
    """The global-norm clip scale (as tf.clip_by_global_norm); NaN for a non-finite norm, so every
    replica sees non-finite gradients alike (the loss-scale optimizer then skips the step)."""
    scale = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm)
    return tf.where(tf.math.is_finite(norm), scale, tf.constant(float("nan")))


def dropout_key(seed: int, step, replica) -> tf.Tensor:
    """The [2] key of one replica's dropout at one step; each Dropout folds in its site number."""
    key = tf.random.experimental.stateless_fold_in(tf.constant([seed, 0], tf.int32), tf.cast(step, tf.int32),
                                                   alg="philox")
    return tf.random.experimental.stateless_fold_in(key, tf.cast(replica, tf.int32), alg="philox")


def make_train_step(model: keras.Model, optimizer, schema: Schema, cfg: OptimConfig, specs: dict,
                    steps_per_execution: int, seed: int, step: tf.Variable, loss_names: tuple[str, ...],
                    strategy=None):
    """The step: K optimizer steps per call over a [K, B, ...] stack of batches.

    specs: one replica's {name: TensorSpec [B, ...]} (step_specs); one step is built per shape.
    strategy None (one device): the whole call, optimizer included, is one XLA-compiled function
    bound to the specs. Under a tf.distribute strategy only each replica's forward and backward pass
    is compiled (bound to the same specs), and the all-reduces and optimizer.apply run around it
    (train/distribute.py says why). The loss is the global masked mean: each replica divides its
    masked sums by the counts summed over all replicas, so the summed gradient is the gradient of
    the global mean. Returns {metric: mean over the K steps} plus "losses": the K total losses.
    The function's `grad_fn` is the compiled per-replica function (its traces are counted).
    """
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    inner = optimizer.inner_optimizer if scaled else optimizer
    k_steps = steps_per_execution
    names = list(specs)

    def allsum(ctx, values):  # the default strategy's replica context needs no all-reduce
        return values if strategy is None else ctx.all_reduce(tf.distribute.ReduceOp.SUM, values)

    def grads(batch, key, counts):
        variables = model.trainable_variables
        with tf.GradientTape() as tape:
            terms = model.loss_terms(batch, key, training=True)
            # each replica's sums over the counts of all replicas: the summed gradients are those of
            # the global masked mean (losses_from_terms is linear in the sums, train/contract.py)
            loss = tf.cast(model.losses_from_terms(dict(terms, **counts))["loss"], tf.float32)
            loss = optimizer.scale_loss(loss) if scaled else loss
        return tape.gradient(loss, variables), terms

    count_keys = tuple(model.loss_counts({k: tf.zeros(s.shape, s.dtype) for k, s in specs.items()}))
    if strategy is not None:
        grads = tf.function(grads, jit_compile=True, input_signature=[
            specs, tf.TensorSpec([2], tf.int32), {k: tf.TensorSpec([], tf.float32) for k in count_keys}])

    def replica_step(batches, k):
        ctx = tf.distribute.get_replica_context()
        batch = {name: batches[name][k] for name in names}
        # dropout masks are a function of (seed, step, replica, site): a resumed run draws what it would have drawn
        key = dropout_key(seed, step, ctx.replica_id_in_sync_group)
        counts = allsum(ctx, {k: tf.cast(v, tf.float32) for k, v in model.loss_counts(batch).items()})
        local, terms = grads(batch, key, counts)
        total = allsum(ctx, local)
        grad_norm = tf.linalg.global_norm(total)
        if scaled:
            grad_norm = grad_norm / tf.cast(optimizer.dynamic_scale, grad_norm.dtype)
        clip = clip_factor(grad_norm, cfg.clip_norm)
        lr = inner.learning_rate  # value at this step, before apply() increments iterations
        optimizer.apply([g * tf.cast(clip, g.dtype) for g in local], model.trainable_variables)
        terms = allsum(ctx, terms)
        losses = model.losses_from_terms(terms)
        return dict({name: tf.cast(losses[name], tf.float32) for name in loss_names}, grad_norm=grad_norm,
                    learning_rate=tf.cast(lr, tf.float32), examples=terms["examples"],
                    mel_frames=terms["mel_frames"])

    def one_step(batches, k):
        if strategy is None:
            metrics = replica_step(batches, k)
        else:  # every replica returns the same all-reduced values
            metrics = strategy.experimental_local_results(strategy.run(replica_step, args=(batches, k)))[0]
        step.assign_add(1)
        return metrics

    metric_names = (*loss_names, *STEP_METRICS)

    def train_step(batches):
        if k_steps == 1:  # no loop: XLA fuses and schedules a straight-line step better than a while body
            metrics = one_step(batches, 0)
            return dict({name: metrics[name] for name in metric_names}, losses=metrics["loss"][None])
        totals = {name: tf.constant(0.0) for name in metric_names}
        step_losses = tf.TensorArray(tf.float32, size=k_steps)
        for k in tf.range(k_steps):
            metrics = one_step(batches, k)
            totals = {name: totals[name] + metrics[name] for name in metric_names}
            step_losses = step_losses.write(k, metrics["loss"])
        out = {name: totals[name] / k_steps for name in metric_names}
        out["examples"], out["mel_frames"] = totals["examples"], totals["mel_frames"]  # sums, not means
        out["losses"] = step_losses.stack()
        return out

    if strategy is None:
        stacked = {k: tf.TensorSpec([k_steps, *s.shape], s.dtype, name=k) for k, s in specs.items()}
        train_step = tf.function(train_step, input_signature=[stacked], jit_compile=True)
        train_step.grad_fn = train_step
    else:  # traced once per distributed element spec; the compiled part is grad_fn
        train_step = tf.function(train_step)
        train_step.grad_fn = grads
    return train_step


def make_eval_step(model: keras.Model, schema: Schema, batch_size: int, shapes: Bucket | None = None):
    """Compiled once like the train step; returns masked sums so the caller adds batches up exactly.

    `shapes`: the length bucket whose static shapes the signature takes (default: the largest)."""
    @tf.function(input_signature=[step_specs(shapes or schema, batch_size)], jit_compile=True)
    def eval_step(batch):
        return model.loss_terms(batch, tf.zeros([2], tf.int32), training=False)

    return eval_step
