"""Losses and the compiled train/eval steps: small functions returning metrics.

Both steps are `tf.function(input_signature=..., jit_compile=True)` built from the schema, so they
trace once (under a tf.distribute strategy the compiled part is each replica's forward and backward
pass, see make_train_step). Masks and mel normalisation are computed in-graph from the static shapes.
They trace without autograph (`autograph=False`, as Keras 3's own train function): their Python
control flow depends on settings, never on tensor values, and the K-step loop is a `tf.while_loop`.
A model plug-in's loss methods are traced as written (train/contract.py).
"""

from __future__ import annotations

import keras
import numpy as np

from melshards.shards_schema import Schema
from melshards.shards_schema.records import tensor_specs
from melshards.shards_schema.schema import Bucket
from melshards.train import native_ops
from melshards.train.config import OptimConfig
from melshards.train.contract import MODEL_INPUTS
from melshards.train.references import SameClip
from melshards.train.tf_quiet import tf  # noqa: I001 (first: keras imports TensorFlow)

# Besides the model's own losses (the keys of its losses_from_terms), every step reports these.
STEP_METRICS = ("grad_norm", "learning_rate", "examples", "mel_frames")


class Normaliser:
    """Per-bin standardisation of log-mel with the schema's corpus statistics; `pitch` and `energy`
    standardise those features with the global statistics, or each record's speaker's."""

    def __init__(self, schema: Schema, check_ids: bool = False):
        self.check_ids = check_ids  # speaker ids checked against the table (`checked_speaker_ids`)
        self.n_mels = len(schema.mel_mean)
        self.mean = tf.constant(np.asarray(schema.mel_mean, np.float32))
        # a constant bin (std 0) must not divide by zero
        self.std = tf.constant(np.maximum(np.asarray(schema.mel_std, np.float32), 1e-3))
        self.tables = {
            name: feature_table(schema, name)
            for name in ("pitch", "energy")
            if (schema.feature_stats.get(name) or {}).get("mean") is not None
        }

    def __call__(self, mel):
        return (self._bins(mel, "normalizer(mel)") - self.mean) / self.std

    def invert(self, mel):
        return self._bins(mel, "normalizer.invert(mel)") * self.std + self.mean

    def _bins(self, mel, call: str):
        """`mel` as a tensor, or a ValueError when its static last axis is not the schema's mel bins or its
        dtype is not floating (checked as it is traced: nothing runs per call)."""
        mel = tf.convert_to_tensor(mel)
        if not mel.dtype.is_floating:
            raise ValueError(f"{call}: mel is {mel.dtype.name}; pass log-mel as floats, e.g. tf.cast(mel, tf.float32)")
        bins = mel.shape[-1] if mel.shape.rank else None
        if bins is not None and bins != self.n_mels:
            raise ValueError(
                f"{call}: mel has {bins} bins in its last axis, and this schema's log-mel has {self.n_mels}; "
                f"pass log-mel [..., {self.n_mels}] of the shards the schema describes, or the normalizer of "
                "the run the mel comes from"
            )
        return mel

    def _stats(self, name: str, speaker_id):
        """(mean, std) broadcastable against [B, T]: global, or gathered by speaker_id [B]."""
        if name not in self.tables:
            from melshards.shards_schema.schema import OPTIONAL_FEATURES

            raise ValueError(
                f"the schema has no {name} statistics; re-run `melshards preprocess` with {OPTIONAL_FEATURES[name]}"
            )
        table = self.tables[name]
        if speaker_id is None:
            return table["global"]
        if self.check_ids:
            speaker_id = checked_speaker_ids(speaker_id, int(table["mean"].shape[0]))
        return (tf.gather(table["mean"], speaker_id)[:, None], tf.gather(table["std"], speaker_id)[:, None])

    def pitch(self, pitch, speaker_id=None):
        """f0 [B, T] in Hz -> voiced frames standardised, unvoiced frames and padding (0) stay 0
        (FastPitch's convention: 0 keeps meaning "no pitch"). Per speaker when `speaker_id` [B] is given."""
        mean, std = self._stats("pitch", speaker_id)
        return tf.where(pitch > 0, (pitch - mean) / std, tf.zeros_like(pitch))

    def invert_pitch(self, x, speaker_id=None):
        """Standardised pitch -> Hz everywhere (the caller masks unvoiced frames)."""
        mean, std = self._stats("pitch", speaker_id)
        return x * std + mean

    def energy(self, energy, speaker_id=None):
        """Energy [B, T] -> standardised (padding is not masked: the caller's loss masks by mel_len)."""
        mean, std = self._stats("energy", speaker_id)
        return (energy - mean) / std

    def invert_energy(self, x, speaker_id=None):
        mean, std = self._stats("energy", speaker_id)
        return x * std + mean


def checked_speaker_ids(speaker_id, n: int):
    """speaker_id, in 0..n-1 or an error naming the range: a ValueError when eager, an assertion in a
    graph (XLA compiles assertions to nothing)."""
    ids = tf.convert_to_tensor(speaker_id)
    what = f"(schema.json has {n} speakers); pass ids of schema.speakers"
    if tf.executing_eagerly():
        values = np.asarray(ids.numpy())
        bad = values[(values < 0) | (values >= n)]
        if bad.size:
            raise ValueError(f"speaker_id {int(bad.flat[0])} is outside 0..{n - 1} {what}")
        return ids
    message = f"speaker_id outside 0..{n - 1} {what}"
    with tf.control_dependencies(
        [
            tf.debugging.assert_non_negative(ids, message=message),
            tf.debugging.assert_less(ids, tf.cast(n, ids.dtype), message=message),
        ]
    ):
        return tf.identity(ids)


def feature_table(schema: Schema, name: str) -> dict:
    """The global mean and std of a feature, and per speaker id (the global ones for a speaker
    without statistics), as float32 constants; std at least 1e-3."""
    g = schema.feature_stats[name]

    def of(stats: dict) -> tuple[float, float]:
        own = stats.get(name) or {}
        if own.get("mean") is None:
            return float(g["mean"]), float(g["std"])
        return float(own["mean"]), float(own["std"])

    pairs = [of(s.stats) for s in schema.speakers]
    return {
        "global": (tf.constant(float(g["mean"])), tf.constant(max(float(g["std"]), 1e-3))),
        "mean": tf.constant([m for m, _ in pairs], tf.float32),
        "std": tf.constant([max(sd, 1e-3) for _, sd in pairs], tf.float32),
    }


def step_specs(
    bucket: Bucket,
    batch_size: int,
    steps_per_execution: int | None = None,
    names: tuple[str, ...] = MODEL_INPUTS,
    same_clip: SameClip | None = None,
) -> dict:
    """input_signature: one length bucket's specs for the model's inputs (MODEL_INPUTS and the features
    it asks for, `plugins.model_inputs`), with a leading K dim for the train step (a one-shape run's
    bucket is `schema.largest`); same_clip: a same_clip run's references, cut at read time
    ([frames, n_mels] from the schema, the same in every bucket)."""
    specs = tensor_specs(bucket, batch_size, names)
    if same_clip is not None:
        specs.update(same_clip.specs(batch_size))
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
    clips the global gradient itself (clip_factor). No all-reduce inside Keras either: the step sums
    the gradients over the replicas once, for their norm, and applies that sum (SummedGradientsAdamW).
    """
    if not hasattr(keras.optimizers.AdamW, "_all_reduce_sum_gradients"):  # pragma: no cover
        # a Keras that reduces elsewhere would sum already-summed gradients: replicas x the step
        raise RuntimeError(
            f"keras {keras.__version__}: AdamW has no _all_reduce_sum_gradients to override; "
            "train/step.py's SummedGradientsAdamW needs updating for this Keras"
        )
    opt = SummedGradientsAdamW(
        learning_rate=WarmupRsqrt(cfg.learning_rate, cfg.warmup_steps),
        weight_decay=cfg.weight_decay,
        beta_1=cfg.beta_1,
        beta_2=cfg.beta_2,
        name="adam_w",
    )  # AdamW's own name: the same variable names
    if precision == "mixed_float16":
        opt = LossScaleOptimizer(opt)
    opt.build(model.trainable_variables)
    return opt


class LossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """keras.optimizers.LossScaleOptimizer (the same name, variables and decisions) checking the
    gradients with `native_ops.is_finite`: Keras's check is one IsFinite per gradient, each lowered to
    XLA through tf2xla's MLIR bridge one op at a time (train/native_ops.py)."""

    def check_finite(self, grads):
        """Keras's check: whether every element of every gradient is finite."""
        finite = [tf.reduce_all(native_ops.is_finite(g)) for g in grads if g is not None]
        return tf.reduce_all(tf.convert_to_tensor(finite))


class SummedGradientsAdamW(keras.optimizers.AdamW):
    """AdamW whose apply() takes gradients already summed over the replicas, and updates each variable
    with TensorFlow's fused Adam op.

    Keras 3's TensorFlow optimizer all-reduces the gradients inside apply()
    (`_all_reduce_sum_gradients`) and has no switch to turn that off (Keras 2's
    `experimental_aggregate_gradients=False` and `skip_gradients_aggregation` are gone). The step
    needs the summed gradient before apply (its norm clips it), so it all-reduces once itself and
    this optimizer does not reduce again. Its variables are AdamW's (make_optimizer gives it AdamW's
    name too), so checkpoints are unchanged. On one device the reduction is the identity either way.

    On one device (no tf.distribute strategy) and without amsgrad, apply() builds the learning rate and
    Adam's step scalars once, decays each variable with one shared weight-decay constant, and updates
    each variable, its momentum and velocity with one `ResourceApplyAdam` op (XLA has a kernel for it):
    a few graph ops per variable where Keras builds some twenty, so the step traces and lowers faster.
    Under a strategy, and with amsgrad, which the fused op does not cover, the update is Keras's own.
    """

    _step_scalars: dict | None = None  # while apply() traces on the fused path: its per-step scalars

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return list(grads_and_vars)

    def _backend_apply_gradients(self, grads, trainable_variables):
        """Keras's apply, on the fused path (`fused`) with the learning rate and Adam's step scalars
        built once per apply (Keras calls the schedule in every variable's weight decay and recomputes
        the bias corrections in every variable's update_step). The same values: `iterations` is read
        before apply() increments it either way."""
        if not self.fused:
            return super()._backend_apply_gradients(grads, trainable_variables)
        self._step_scalars = {}
        try:
            return super()._backend_apply_gradients(grads, trainable_variables)
        finally:
            self._step_scalars = None

    @property
    def fused(self) -> bool:
        """Whether apply() updates with the fused op: on one device (a strategy's variables update per
        replica device, Keras's path) and without amsgrad (the fused op has no v_hat)."""
        return not tf.distribute.has_strategy() and not self.amsgrad

    def _scalar(self, name: str, dtype, build):
        """The step scalar `name` in `dtype`, built once per apply."""
        scalars, key = self._step_scalars, (name, dtype)
        assert scalars is not None  # only on the fused path, inside apply()
        if key not in scalars:
            scalars[key] = build()
        return scalars[key]

    def _get_current_learning_rate(self):
        if self._step_scalars is None:
            return super()._get_current_learning_rate()
        return self._scalar("learning_rate", None, super()._get_current_learning_rate)

    def _apply_weight_decay(self, variables):
        """Keras's decoupled decay, `variable - variable * wd * lr` in Keras's order, with `wd` and `lr`
        one cast per dtype instead of one per variable."""
        if self._step_scalars is None or self.weight_decay is None:
            return super()._apply_weight_decay(variables)
        for variable in variables:
            if self._use_weight_decay(variable):
                variable = variable.value if isinstance(variable, keras.Variable) else variable
                wd, lr = self._scalar(
                    "decay",
                    variable.dtype,
                    lambda dtype=variable.dtype: (
                        tf.cast(self.weight_decay, dtype),
                        tf.cast(self.learning_rate, dtype),
                    ),
                )
                variable.assign_sub(variable * wd * lr)

    def update_step(self, gradient, variable, learning_rate):
        """keras.optimizers.Adam.update_step (amsgrad off) as one `ResourceApplyAdam`. Its XLA kernel
        computes Keras's expressions in Keras's order: alpha = lr * sqrt(1 - b2^t) / (1 - b1^t),
        m += (g - m) * (1 - b1), v += (g^2 - v) * (1 - b2), var -= m * alpha / (sqrt(v) + eps). One
        difference: it forms 1 - b1 and 1 - b2 in the variable's dtype, where Keras rounds Python's
        1 - beta to it (float32: 0.1 and 0.100000024 for beta 0.9), so the two agree to rounding, and
        bit for bit where 1 - beta is exact in both (tests/train/test_optimizer.py)."""
        if self._step_scalars is None:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype

        def powers():
            local_step = keras.ops.cast(self.iterations + 1, dtype)
            return (
                keras.ops.power(keras.ops.cast(self.beta_1, dtype), local_step),
                keras.ops.power(keras.ops.cast(self.beta_2, dtype), local_step),
            )

        beta_1_power, beta_2_power = self._scalar("beta_powers", dtype, powers)
        lr, beta_1, beta_2, epsilon = self._scalar(
            "hyper",
            dtype,
            lambda: tuple(tf.cast(x, dtype) for x in (learning_rate, self.beta_1, self.beta_2, self.epsilon)),
        )
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=m.handle,
            v=v.handle,
            beta1_power=beta_1_power,
            beta2_power=beta_2_power,
            lr=lr,
            beta1=beta_1,
            beta2=beta_2,
            epsilon=epsilon,
            grad=tf.cast(tf.convert_to_tensor(gradient), dtype),  # dense, as Keras's arithmetic makes it
        )


def clip_factor(norm, clip_norm: float):
    """The global-norm clip scale (as tf.clip_by_global_norm); NaN for a non-finite norm, so every
    replica sees non-finite gradients alike (the loss-scale optimizer then skips the step)."""
    scale = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm)
    return tf.where(native_ops.is_finite(norm), scale, tf.constant(float("nan")))


def dropout_key(seed: int, step, replica) -> tf.Tensor:
    """The [2] key of one replica's dropout at one step; each Dropout folds in its site number."""
    key = tf.random.experimental.stateless_fold_in(
        tf.constant([seed, 0], tf.int32), tf.cast(step, tf.int32), alg="philox"
    )
    return tf.random.experimental.stateless_fold_in(key, tf.cast(replica, tf.int32), alg="philox")


class ReplicaStep:
    """One optimizer step on one replica's batch: forward and backward, the gradients summed over the
    replicas (once), their global norm and clip, optimizer.apply; returns the step's metrics.

    The loss is the global masked mean: each replica divides its masked sums by the counts summed
    over all replicas, so the summed gradient is the gradient of the global mean (losses_from_terms
    is linear in the sums, train/contract.py). On one device (no strategy) every sum is the identity.
    `grads` is the forward and backward pass: XLA-compiled on its own, bound to one replica's specs,
    under a strategy (train/distribute.py says why); inlined in the caller's XLA call on one device.
    """

    def __init__(
        self,
        model: keras.Model,
        optimizer,
        cfg: OptimConfig,
        specs: dict,
        seed: int,
        step: tf.Variable,
        loss_names: tuple[str, ...],
        distributed: bool,
        jit_compile: bool = True,
    ):
        self.model, self.optimizer, self.clip_norm, self.seed, self.step = model, optimizer, cfg.clip_norm, seed, step
        self.loss_names, self.names, self.distributed = loss_names, list(specs), distributed
        self.scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        self.grads = self._grads
        if distributed:
            count_keys = tuple(model.loss_counts({k: tf.zeros(s.shape, s.dtype) for k, s in specs.items()}))
            self.grads = tf.function(
                self._grads,
                jit_compile=jit_compile,
                autograph=False,
                input_signature=[
                    specs,
                    tf.TensorSpec([2], tf.int32),
                    {k: tf.TensorSpec([], tf.float32) for k in count_keys},
                ],
            )

    def _sum(self, ctx, values):
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, values) if self.distributed else values

    def _grads(self, batch, key, counts):
        with tf.GradientTape() as tape:
            terms = self.model.loss_terms(batch, key, training=True)
            # each replica's sums over the counts of all replicas: the summed gradients are the global mean's
            loss = tf.cast(self.model.losses_from_terms(dict(terms, **counts))["loss"], tf.float32)
            loss = self.optimizer.scale_loss(loss) if self.scaled else loss
        return tape.gradient(loss, self.model.trainable_variables), terms

    def __call__(self, batches, k):
        """Step k of a [K, B, ...] stack of this replica's batches."""
        ctx = tf.distribute.get_replica_context()
        batch = {name: batches[name][k] for name in self.names}
        # dropout masks are a function of (seed, step, replica, site): a resumed run draws what it would have drawn
        key = dropout_key(self.seed, self.step, ctx.replica_id_in_sync_group)
        counts = self._sum(ctx, {n: tf.cast(v, tf.float32) for n, v in self.model.loss_counts(batch).items()})
        local, terms = self.grads(batch, key, counts)
        grads = self._sum(ctx, local)  # the one all-reduce of the gradients: the optimizer does not reduce again
        grad_norm = tf.linalg.global_norm(grads)
        if self.scaled:
            grad_norm = grad_norm / tf.cast(self.optimizer.dynamic_scale, grad_norm.dtype)
        clip = clip_factor(grad_norm, self.clip_norm)
        inner = self.optimizer.inner_optimizer if self.scaled else self.optimizer
        lr = inner.learning_rate  # value at this step, before apply() increments iterations
        self.optimizer.apply([g * tf.cast(clip, g.dtype) for g in grads], self.model.trainable_variables)
        terms = self._sum(ctx, terms)
        losses = self.model.losses_from_terms(terms)
        return dict(
            {name: tf.cast(losses[name], tf.float32) for name in self.loss_names},
            grad_norm=grad_norm,
            learning_rate=tf.cast(lr, tf.float32),
            examples=terms["examples"],
            mel_frames=terms["mel_frames"],
        )


def make_train_step(
    model: keras.Model,
    optimizer,
    schema: Schema,
    cfg: OptimConfig,
    specs: dict,
    steps_per_execution: int,
    seed: int,
    step: tf.Variable,
    loss_names: tuple[str, ...],
    strategy=None,
    jit_compile: bool = True,
):
    """The step: K optimizer steps per call over a [K, B, ...] stack of batches.

    specs: one replica's {name: TensorSpec [B, ...]} (step_specs); one step is built per shape.
    strategy None (one device): the whole call, optimizer included, is one XLA-compiled function
    bound to the specs (one_device_step). Under a tf.distribute strategy only each replica's forward
    and backward pass is compiled, bound to the same specs (distributed_step). Returns {metric: mean
    over the K steps} plus "losses": the K total losses. The function's `grad_fn` is the compiled
    function whose traces are counted. (`schema` is unused: kept for the callers' signature.)
    """
    replica = ReplicaStep(
        model, optimizer, cfg, specs, seed, step, loss_names, distributed=strategy is not None, jit_compile=jit_compile
    )
    if strategy is None:
        return one_device_step(replica, specs, steps_per_execution, jit_compile)
    return distributed_step(replica, strategy, steps_per_execution)


def one_device_step(replica: ReplicaStep, specs: dict, steps_per_execution: int, jit_compile: bool = True):
    """The whole call, K steps and the optimizer, as one XLA-compiled function bound to [K, *specs]
    (jit_compile False, loop.jit_compile: the same function run by TensorFlow's own kernels)."""
    stacked = {k: tf.TensorSpec([steps_per_execution, *s.shape], s.dtype, name=k) for k, s in specs.items()}

    @tf.function(input_signature=[stacked], jit_compile=jit_compile, autograph=False)
    def train_step(batches):
        return k_steps(replica, replica, batches, steps_per_execution)

    train_step.grad_fn = train_step
    return train_step


def distributed_step(replica: ReplicaStep, strategy, steps_per_execution: int):
    """strategy.run of the replica step in an ordinary tf.function (traced once per distributed element
    spec); its compiled part, each replica's forward and backward pass, is grad_fn."""

    def on_every_replica(batches, k):  # every replica returns the same all-reduced values
        return strategy.experimental_local_results(strategy.run(replica, args=(batches, k)))[0]

    @tf.function(autograph=False)
    def train_step(batches):
        return k_steps(replica, on_every_replica, batches, steps_per_execution)

    train_step.grad_fn = replica.grads
    return train_step


def k_steps(replica: ReplicaStep, run, batches, steps_per_execution: int) -> dict:
    """run(batches, k) for k < K, counting each step: {metric: mean over the K steps} (examples and
    frames: sums) and "losses", the K total losses."""
    metric_names = (*replica.loss_names, *STEP_METRICS)

    def one_step(k):
        metrics = run(batches, k)
        replica.step.assign_add(1)
        return metrics

    if steps_per_execution == 1:  # no loop: XLA fuses and schedules a straight-line step better than a while body
        metrics = one_step(0)
        return dict({name: metrics[name] for name in metric_names}, losses=metrics["loss"][None])

    def body(k, totals, step_losses):
        metrics = one_step(k)
        totals = {name: totals[name] + metrics[name] for name in metric_names}
        return k + 1, totals, step_losses.write(k, metrics["loss"])

    start = (
        tf.constant(0),
        {name: tf.constant(0.0) for name in metric_names},
        tf.TensorArray(tf.float32, size=steps_per_execution),
    )
    _, totals, step_losses = tf.while_loop(
        lambda k, totals, step_losses: k < steps_per_execution, body, start, maximum_iterations=steps_per_execution
    )
    out = {name: totals[name] / steps_per_execution for name in metric_names}
    out["examples"], out["mel_frames"] = totals["examples"], totals["mel_frames"]  # sums, not means
    out["losses"] = step_losses.stack()
    return out


def make_eval_step(
    model: keras.Model,
    bucket: Bucket,
    batch_size: int,
    names: tuple[str, ...] = MODEL_INPUTS,
    jit_compile: bool = True,
    same_clip: SameClip | None = None,
):
    """Compiled once like the train step, bound to the bucket's shapes; returns masked sums so the
    caller adds batches up exactly."""

    @tf.function(
        input_signature=[step_specs(bucket, batch_size, None, names, same_clip)],
        jit_compile=jit_compile,
        autograph=False,
    )
    def eval_step(batch):
        return model.loss_terms(batch, tf.zeros([2], tf.int32), training=False)

    return eval_step
