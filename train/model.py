"""A small Transformer-TTS: characters -> normalised log-mel, r frames per decoder step.

Encoder: character embedding -> conv prenet -> scaled sinusoidal positions -> pre-LN self-attention
blocks, plus the speaker and language embeddings (projected to d_model) on every position of its
output, so the decoder's cross-attention reads who speaks which language. Decoder: teacher-forced previous frame -> bottleneck prenet -> causal self-attention +
cross-attention blocks -> r mel frames and one stop logit per step. Postnet: residual conv stack.
Every shape is static, so the whole thing compiles with XLA. The position tables are sized for the
longest bucket (the schema's max lengths) and sliced to each input's length, so one model runs every
length bucket.

It is a plug-in like any other (train/contract.py): `build` is its factory, `loss_terms`,
`loss_counts`, `losses_from_terms` and `generate` are what the trainer and `melshards synthesize` call.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import layers

from melshards.shards_schema.config import from_dict
from melshards.train import device, native_ops
from melshards.train.config import ModelConfig
from melshards.train.step import Normaliser
from melshards.train.tf_quiet import tf  # noqa: I001 (first: keras imports TensorFlow)


def sinusoids(length: int, dim: int) -> np.ndarray:
    pos = np.arange(length)[:, None]
    rate = 1.0 / np.power(10000.0, (2 * (np.arange(dim) // 2)) / dim)
    angles = pos * rate[None, :]
    return np.where(np.arange(dim) % 2 == 0, np.sin(angles), np.cos(angles)).astype(np.float32)


def attach(owner: layers.Layer, prefix: str, items: list) -> tuple:
    """Each item as its own attribute (prefix_0, prefix_1, ...); returns them as a tuple to iterate.

    Keras 3 on TensorFlow wraps a list attribute in its own TrackedList. Keras sees the layers
    inside (model.variables, the optimizer), but TensorFlow's checkpoint object graph does not: the
    TF backend exposes such lists as children only when exporting a SavedModel. A
    tf.train.Checkpoint of the model then silently misses every variable held in a list. Named
    attributes are ordinary checkpoint dependencies (model/enc_conv_0/...).
    """
    for i, item in enumerate(items):
        setattr(owner, f"{prefix}_{i}", item)
    return tuple(items)


class SiteKeys:
    """A step's dropout key split by site: site n draws with `stateless_fold_in(seed, n)` (philox).

    That fold-in is [hash(seed), n]: its first number depends on `seed` alone, so it is hashed once
    here and each site adds its own number (a model with many dropout sites builds one hash per
    forward pass, not one per site). Keys differ by site, and by step and replica through the hash.
    """

    def __init__(self, seed):
        self.base = tf.random.experimental.stateless_fold_in(seed, 0, alg="philox")  # [hash(seed), 0]
        # threefry's 64-bit key of [h, n] is h | n << 32 (as tf.random builds it): h's half built once
        self._threefry_low = tf.cast(tf.bitcast(self.base[0], tf.uint32), tf.uint64)
        self._counter = tf.zeros([1], tf.uint64)

    def site(self, n: int) -> tf.Tensor:
        return self.base + tf.constant([0, n], tf.int32)

    def uniform(self, shape, n: int, alg: str) -> tf.Tensor:
        """`tf.random.stateless_uniform(shape, self.site(n), alg=alg)` (float32 in [0, 1)); for threefry
        from the key built above (the same numbers, a few graph ops instead of the seed's conversion)."""
        if alg != "threefry":
            return tf.random.stateless_uniform(shape, self.site(n), alg=alg)
        key = tf.reshape(tf.bitwise.bitwise_or(self._threefry_low, tf.constant((n & 0xFFFFFFFF) << 32, tf.uint64)), [1])
        return tf.raw_ops.StatelessRandomUniformV2(
            shape=shape, key=key, counter=self._counter, alg=tf.random.Algorithm.THREEFRY.value, dtype=tf.float32
        )


def masked_scale(x, keep, scale):
    """`where(keep, x / scale, 0)`, with its gradient `where(keep, dy, 0) / scale` written out.

    Those are the numbers TensorFlow's own gradients of `where` and `/` give; those would also build
    the gradients of the zeros branch and of the constant divisor, which the step discards.
    """

    @tf.custom_gradient
    def scaled(x):
        def grad(dy):
            return tf.where(keep, dy, tf.zeros([], dy.dtype)) / scale

        return tf.where(keep, x / scale, tf.zeros([], x.dtype)), grad

    return scaled(x)


class Dropout(layers.Layer):
    """Dropout from a stateless stream keyed by the step's key and the layer's own site number.

    The generator is the device's (train/device.py): threefry on CPU, where XLA runs TF's default
    ("auto_select") far slower; philox on a GPU; the hardware generator on a TPU. `seed` is the [2]
    key of (run seed, step, replica) (train/step.py dropout_key), or its `SiteKeys` built once for
    every site of a forward pass; the site's key, `stateless_fold_in(seed, site)`, gives every site an
    independent stream, and a resumed run draws the same masks. (The fold-in draws with philox: TF's
    threefry kernel outside XLA refuses a [2] key, and the fold-in is two numbers.)
    """

    def __init__(self, rate: float, site: int, rng: str | None = None, **kw):
        super().__init__(**kw)
        self.rate, self.site = rate, site
        self.rng = rng or device.current().dropout_rng

    def call(self, x, seed, training=False):
        if not training or self.rate == 0.0:
            return x
        keys = seed if isinstance(seed, SiteKeys) else SiteKeys(seed)
        keep = keys.uniform(tf.shape(x), self.site, self.rng) >= self.rate
        return masked_scale(x, keep, tf.cast(1.0 - self.rate, x.dtype))


def relu(x):
    """max(x, 0) as `where(x > 0, x, 0)`: Relu's values, and through `where` its gradient (dy where
    x > 0, else 0), without the Relu and ReluGrad ops, which TensorFlow lowers to XLA through its MLIR
    bridge one op at a time, far slower than a select."""
    return tf.where(x > 0, x, tf.zeros_like(x))


class Dense(layers.Dense):
    """keras.layers.Dense (the same variables, names and values) adding its bias with AddV2.

    Keras's TensorFlow backend turns a bias add into BiasAdd, whose gradient (BiasAddGrad) is one of
    the ops TensorFlow lowers to XLA through its MLIR bridge one op at a time; AddV2's gradient is a
    Sum over the same rows.
    """

    def call(self, inputs, training=None):
        x = keras.ops.matmul(inputs, self.kernel)
        if self.bias is not None:
            x = tf.add(x, tf.cast(self.bias, x.dtype))
        return x if self.activation is None else self.activation(x)


def same_conv(x, dense: layers.Dense, kernel: int, impl: str | None = None):
    """'same' 1-D convolution [B, T, C] -> [B, T, F] whose weights are `dense`'s: kernel [kernel * C, F]
    (row i * C + c: shift i, channel c), bias and activation.

    impl (train/device.py; None: the device's): "im2col", shifted copies + one matmul, which XLA on
    CPU runs far faster than the native convolution's gradient (docs/performance.md#train-step);
    "native", tf.nn.conv1d on the same kernel reshaped to [kernel, C, F], which a GPU runs without
    the kernel-size-times activation copy. Both are the same function of the same variables.
    """
    impl = impl or device.current().conv
    channels = x.shape[-1]
    if not dense.built:
        dense.build((None, None, kernel * channels))
    if impl == "native":
        w = tf.reshape(tf.cast(dense.kernel, x.dtype), [kernel, channels, -1])
        y = tf.nn.conv1d(x, w, stride=1, padding="SAME")  # SAME at stride 1: (kernel - 1) // 2 on the left
        if dense.use_bias:
            y = y + tf.cast(dense.bias, y.dtype)
        return dense.activation(y) if dense.activation is not None else y
    left = (kernel - 1) // 2
    padded = tf.pad(x, [[0, 0], [left, kernel - 1 - left], [0, 0]])
    return dense(tf.concat([padded[:, i : i + x.shape[1], :] for i in range(kernel)], axis=-1))


class Conv1D(layers.Layer):
    """'same' 1-D convolution (`same_conv`): im2col on CPU, the native op on a GPU or TPU; the
    variables are one Dense's either way, so checkpoints move between devices."""

    def __init__(self, filters: int, kernel: int, activation=None, impl: str | None = None, **kw):
        super().__init__(**kw)
        self.kernel = kernel
        self.impl = impl or device.current().conv
        self.dense = Dense(filters, activation=activation, dtype=self.dtype_policy)

    def build(self, input_shape):
        self.dense.build((*input_shape[:-1], self.kernel * input_shape[-1]))

    def call(self, x):
        return same_conv(x, self.dense, self.kernel, self.impl)


def project(dense: layers.EinsumDense, x):
    """`dense`'s output for x [B, T, *in] -> [B, T, *out] (its kernel [*in, *out], bias [*out]): one
    rank-2 MatMul of x reshaped to [B * T, in], plus the bias.

    The same products as `dense(x)`; Keras's einsum broadcasts the kernel over the batch instead (a
    BatchMatMulV2), whose gradient builds the broadcast's shapes and a reduction over the batch. The
    kernel's gradient here sums over the B * T rows in one product, not per sequence and then over
    the batch: the same sum, rounded in another order. The bias is added (AddV2), not BiasAdd: the
    gradient of BiasAdd (BiasAddGrad) is one of the ops TensorFlow lowers to XLA through its MLIR
    bridge, op by op, far slower to lower than a Sum.
    """
    steps, inner = x.shape[1], int(np.prod(x.shape[2:]))
    kernel = tf.cast(dense.kernel, x.dtype)
    out = kernel.shape[len(x.shape) - 2 :]
    y = tf.reshape(tf.matmul(tf.reshape(x, [-1, inner]), tf.reshape(kernel, [inner, -1])), [-1, steps, *out])
    return y if dense.bias is None else y + tf.cast(dense.bias, y.dtype)


def attend(mha: layers.MultiHeadAttention, query, value, mask):
    """`mha(query, value, attention_mask=mask)`: Keras's multi-head attention on its variables, as its
    TensorFlow backend computes it (scaled logits in float32, masked to a large negative, softmax),
    with the projections as rank-2 MatMuls (`project`) and the per-head products as batched MatMuls
    of [B, heads, T, H] where Keras uses Einsum: TensorFlow lowers Einsum (like BiasAddGrad) to XLA
    through its MLIR bridge one op at a time, far slower than a MatMul, and each product's gradient
    holds two more. The softmax is `native_ops.softmax`, for the same reason.

    query [B, T, d], value [B, S, d]; mask: bool, broadcastable to [B, heads, T, S] (a causal mask is
    a constant [T, S]).
    """
    if not mha.built:  # as its first call would build it
        mha.build(query.shape, value.shape)
    dtype = mha.compute_dtype
    query, value = tf.cast(query, dtype), tf.cast(value, dtype)
    q = project(mha.query_dense, query)
    k = project(mha.key_dense, value)
    v = project(mha.value_dense, value)
    heads_first = [0, 2, 1, 3]  # [B, T, N, H] <-> [B, N, T, H]
    q, k, v = (tf.transpose(t, heads_first) for t in (q, k, v))
    logits = tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32)  # [B, N, T, S]
    logits = tf.multiply(logits, tf.cast(1.0 / math.sqrt(float(mha.key_dim)), logits.dtype))
    logits = tf.where(mask, logits, tf.constant(3.38953e38 * -0.7, logits.dtype))  # Keras's large negative
    probs = tf.cast(native_ops.softmax(logits), k.dtype)
    return project(mha.output_dense, tf.transpose(tf.matmul(probs, v), heads_first))


class TransformerBlock(layers.Layer):
    """Pre-LN transformer block: self-attention, optional cross-attention, feed-forward."""

    def __init__(self, cfg: ModelConfig, cross: bool, first_site: int, **kw):
        super().__init__(**kw)
        d, dt = cfg.d_model, self.dtype_policy
        key_dim = d // cfg.num_heads
        self.norm1 = layers.LayerNormalization(dtype=dt)
        self.attn = layers.MultiHeadAttention(cfg.num_heads, key_dim, dtype=dt)
        self.cross = cross
        if cross:
            self.norm2 = layers.LayerNormalization(dtype=dt)
            self.xattn = layers.MultiHeadAttention(cfg.num_heads, key_dim, dtype=dt)
        self.norm3 = layers.LayerNormalization(dtype=dt)
        self.ff1 = Dense(cfg.ff_dim, activation=relu, dtype=dt)
        self.ff2 = Dense(d, dtype=dt)
        # one dropout site per residual branch: each draws its own mask
        self.drops = attach(self, "drop", [Dropout(cfg.dropout, first_site + i, dtype=dt) for i in range(3)])

    def build(self, input_shape):
        """The sublayers' variables, in the order `call` first uses them; input_shape [B, T, d_model]
        (memory, which the cross-attention reads, has d_model channels too)."""
        self.norm1.build(input_shape)
        self.attn.build(input_shape, input_shape)
        if self.cross:
            self.norm2.build(input_shape)
            self.xattn.build(input_shape, input_shape)
        self.norm3.build(input_shape)
        self.ff1.build(input_shape)
        self.ff2.build((*input_shape[:-1], self.ff1.units))

    def call(self, x, self_mask, seed, memory=None, cross_mask=None, training=False):
        """self_mask and cross_mask: bool, broadcastable to [B, heads, T, T] and [B, heads, T, S] (`attend`)."""
        h = self.norm1(x)
        x = x + self.drops[0](attend(self.attn, h, h, self_mask), seed=seed, training=training)
        if self.cross:
            h = self.norm2(x)
            x = x + self.drops[1](attend(self.xattn, h, memory, cross_mask), seed=seed, training=training)
        h = self.norm3(x)
        return x + self.drops[2](self.ff2(self.ff1(h)), seed=seed, training=training)


class Conditioning(layers.Layer):
    """Speaker and language embeddings -> one [B, d_model] vector added to the encoder output.

    Tables of `speakers` and `languages` rows (schema.json's, indexed by the records' ids), of
    cfg.speaker_dim and cfg.language_dim (0: that one is off); the two are concatenated and projected
    to d_model, without bias (the encoder's last layer norm has one).
    """

    def __init__(self, cfg: ModelConfig, speakers: int, languages: int, **kw):
        super().__init__(**kw)
        dt = self.dtype_policy
        self.speaker = layers.Embedding(speakers, cfg.speaker_dim, dtype=dt) if cfg.speaker_dim else None
        self.language = layers.Embedding(languages, cfg.language_dim, dtype=dt) if cfg.language_dim else None
        self.proj = Dense(cfg.d_model, use_bias=False, dtype=dt)

    def build(self, input_shape):
        """The tables and the projection, in the order `call` first uses them; input_shape: the ids' [B]."""
        tables = [t for t in (self.speaker, self.language) if t is not None]
        for table in tables:
            table.build(input_shape)
        self.proj.build((*input_shape, sum(t.output_dim for t in tables)))

    def call(self, speaker_id, language_id):
        parts = [
            table(ids) for table, ids in ((self.speaker, speaker_id), (self.language, language_id)) if table is not None
        ]
        return self.proj(tf.concat(parts, axis=-1))


class TextToMel(keras.Model):
    def __init__(
        self,
        cfg: ModelConfig,
        vocab_size: int,
        n_mels: int,
        max_text_len: int,
        max_mel_frames: int,
        speakers: int,
        languages: int,
        precision: str = "float32",
        norm: Normaliser | None = None,
        **kw,
    ):
        super().__init__(dtype=precision, **kw)
        dt, d, r = self.dtype_policy, cfg.d_model, cfg.reduction_factor
        self.cfg, self.n_mels, self.r = cfg, n_mels, r
        self.norm = norm
        self.max_text_len, self.steps = max_text_len, max_mel_frames // r
        self.embed = layers.Embedding(vocab_size, d, dtype=dt)
        self.enc_convs = attach(
            self,
            "enc_conv",
            [Conv1D(d, cfg.conv_kernel, activation=relu, dtype=dt) for _ in range(cfg.encoder_conv_layers)],
        )
        self.enc_conv_norms = attach(
            self, "enc_conv_norm", [layers.LayerNormalization(dtype=dt) for _ in range(cfg.encoder_conv_layers)]
        )
        self.enc_proj = Dense(d, dtype=dt)
        self.enc_blocks = attach(
            self, "enc_block", [TransformerBlock(cfg, False, 10 + 3 * i, dtype=dt) for i in range(cfg.encoder_layers)]
        )
        self.enc_norm = layers.LayerNormalization(dtype=dt)
        self.conditioning = (
            Conditioning(cfg, speakers, languages, dtype=dt) if cfg.speaker_dim or cfg.language_dim else None
        )
        self.prenet = attach(
            self,
            "prenet",
            [
                Dense(cfg.prenet_dim, activation=relu, dtype=dt),
                Dense(cfg.prenet_dim, activation=relu, dtype=dt),
            ],
        )
        self.prenet_drops = attach(
            self, "prenet_drop", [Dropout(cfg.prenet_dropout, 1, dtype=dt), Dropout(cfg.prenet_dropout, 2, dtype=dt)]
        )
        self.dec_proj = Dense(d, dtype=dt)
        self.dec_blocks = attach(
            self,
            "dec_block",
            [
                TransformerBlock(cfg, True, 10 + 3 * (cfg.encoder_layers + i), dtype=dt)
                for i in range(cfg.decoder_layers)
            ],
        )
        self.dec_norm = layers.LayerNormalization(dtype=dt)
        # one site per dropout layer: 3 encoder positions, 4 decoder positions, 100+ encoder convs, 200+ postnet
        self.enc_drop, self.dec_drop = (Dropout(cfg.dropout, i, dtype=dt) for i in (3, 4))
        self.enc_conv_drops = attach(
            self, "enc_conv_drop", [Dropout(cfg.dropout, 100 + i, dtype=dt) for i in range(cfg.encoder_conv_layers)]
        )
        self.post_drops = attach(
            self, "post_drop", [Dropout(cfg.dropout, 200 + i, dtype=dt) for i in range(cfg.postnet_layers)]
        )
        # heads and postnet output stay float32: losses and the stop decision need the precision
        self.mel_head = Dense(r * n_mels, dtype="float32")
        self.stop_head = Dense(1, dtype="float32")
        self.postnet = attach(
            self,
            "postnet",
            [
                Conv1D(cfg.postnet_channels, cfg.conv_kernel, activation="tanh", dtype=dt)
                for _ in range(cfg.postnet_layers)
            ],
        )
        self.postnet_norms = attach(
            self, "postnet_norm", [layers.LayerNormalization(dtype=dt) for _ in range(cfg.postnet_layers)]
        )
        self.postnet_out = Conv1D(n_mels, cfg.conv_kernel, dtype="float32")
        # learned scale of the fixed position table (Transformer-TTS), one per side
        self.enc_alpha = self.add_weight(shape=(), initializer="ones", name="enc_alpha")
        self.dec_alpha = self.add_weight(shape=(), initializer="ones", name="dec_alpha")
        self.enc_pos = tf.constant(sinusoids(max_text_len, d))
        self.dec_pos = tf.constant(sinusoids(self.steps, d))

    def build(self, input_shape):
        """Every variable, from the config alone (none depends on a length), without running the network.

        The sublayers build in the order `call` first uses them: that order draws the initial values
        of the layers that make their own sublayers while they build (MultiHeadAttention), so a model
        built here starts from the values the first call would give it, under the same seed.
        input_shape: text_ids' [B, L].
        """
        d, n_mels = self.cfg.d_model, self.n_mels
        batch = input_shape[0]
        self.embed.build(input_shape)
        for conv, norm in zip(self.enc_convs, self.enc_conv_norms):
            conv.build((batch, None, d))
            norm.build((batch, None, d))
        self.enc_proj.build((batch, None, d))
        for block in self.enc_blocks:
            block.build((batch, None, d))
        self.enc_norm.build((batch, None, d))
        if self.conditioning is not None:
            self.conditioning.build((batch,))
        x = (batch, None, n_mels)
        for dense in self.prenet:
            dense.build(x)
            x = (batch, None, dense.units)
        self.dec_proj.build(x)
        for block in self.dec_blocks:
            block.build((batch, None, d))
        self.dec_norm.build((batch, None, d))
        self.mel_head.build((batch, None, d))
        self.stop_head.build((batch, None, d))
        x = (batch, None, n_mels)
        for conv, norm in zip(self.postnet, self.postnet_norms):
            conv.build(x)
            x = (batch, None, conv.dense.units)
            norm.build(x)
        self.postnet_out.build(x)

    # -- pieces used by training (all at once) and synthesis (decoder step by step) ------------
    def encode(self, text_ids, text_len, speaker_id, language_id, seed, training=False):
        """-> memory [B, L, d] (with the speaker and language on every position) and the text mask [B, L]."""
        length = text_ids.shape[1]  # the bucket's text length (<= max_text_len: tables are sliced)
        mask = tf.sequence_mask(text_len, length)  # [B, L]
        x = self.embed(text_ids)
        for conv, norm, drop in zip(self.enc_convs, self.enc_conv_norms, self.enc_conv_drops):
            x = drop(norm(conv(x)), seed=seed, training=training)
        x = self.enc_proj(x) + tf.cast(self.enc_alpha * self.enc_pos[:length], x.dtype)
        x = self.enc_drop(x, seed=seed, training=training)
        self_mask = (mask[:, None, :] & mask[:, :, None])[:, None]  # [B, 1, L, L]
        for block in self.enc_blocks:
            x = block(x, self_mask, seed=seed, training=training)
        x = self.enc_norm(x)
        if self.conditioning is not None:
            x = x + self.conditioning(speaker_id, language_id)[:, None, :]
        return x, mask

    def decode(self, memory, text_mask, prev_frames, seed, training=False):
        """prev_frames [B, G, n_mels] (frame before each step) -> mel [B, G*r, n_mels], stop logits [B, G]."""
        x, steps = prev_frames, prev_frames.shape[1]  # the bucket's number of decoder steps
        for dense, drop in zip(self.prenet, self.prenet_drops):
            x = drop(dense(x), seed=seed, training=training)
        x = self.dec_proj(x) + tf.cast(self.dec_alpha * self.dec_pos[:steps], x.dtype)
        x = self.dec_drop(x, seed=seed, training=training)
        causal = tf.constant(np.tril(np.ones((steps, steps), bool)))  # [G, G]: step t sees steps <= t
        cross_mask = text_mask[:, None, None, :]  # [B, 1, 1, L]
        for block in self.dec_blocks:
            x = block(x, causal, seed=seed, memory=memory, cross_mask=cross_mask, training=training)
        x = self.dec_norm(x)
        mel = tf.reshape(self.mel_head(x), [-1, steps * self.r, self.n_mels])
        return mel, tf.squeeze(self.stop_head(x), -1)

    def refine(self, mel, seed, training=False):
        """Postnet: residual correction of the decoder's frames."""
        x = mel
        for conv, norm, drop in zip(self.postnet, self.postnet_norms, self.post_drops):
            x = drop(norm(conv(x)), seed=seed, training=training)
        return mel + self.postnet_out(x)

    def teacher_inputs(self, target):
        """Normalised target [B, T, M] -> decoder inputs [B, G, M]: the last frame of the previous step."""
        last = target[:, self.r - 1 :: self.r, :]
        go = tf.zeros_like(last[:, :1, :])
        return tf.concat([go, last[:, :-1, :]], axis=1)

    def call(self, text_ids, text_len, speaker_id, language_id, target, seed, training=False):
        """Teacher-forced pass. seed: int32 [2] dropout key of (run seed, step, replica) while training."""
        seed = SiteKeys(seed) if training else seed  # every dropout site's key from one hash of the seed
        memory, text_mask = self.encode(text_ids, text_len, speaker_id, language_id, seed, training=training)
        mel, stop = self.decode(memory, text_mask, self.teacher_inputs(target), seed, training=training)
        return mel, self.refine(mel, seed, training=training), stop

    # -- the plug-in contract (train/contract.py) ---------------------------------------------
    def loss_masks(self, mel_len, frames: int) -> tuple:
        """Frame mask [B, T, 1], stop target and stop weight [B, G]: functions of the lengths only."""
        frame_mask = tf.cast(tf.sequence_mask(mel_len, frames), tf.float32)[..., None]
        # stop target: 1 at the step holding the last real frame; weighted up to that step only, so the
        # padding steps do not teach "stop now". Length-0 (padding) records weigh 0.
        last_step = (mel_len - 1) // self.r
        steps = tf.range(frames // self.r)[None, :]
        return (
            frame_mask,
            tf.cast(steps == last_step[:, None], tf.float32),
            tf.cast(steps <= last_step[:, None], tf.float32),
        )

    def loss_counts(self, batch: dict) -> dict:
        frame_mask, _, stop_weight = self.loss_masks(batch["mel_len"], batch["mel"].shape[1])
        return {
            "mel_count": tf.reduce_sum(frame_mask) * batch["mel"].shape[2],
            "stop_count": tf.reduce_sum(stop_weight),
        }

    def loss_terms(self, batch: dict, seed, training: bool) -> dict:
        """Masked sums and counts, so batches (and padded records) combine exactly."""
        target = self.norm(batch["mel"])  # type: ignore[misc]  # build_model gives every model the schema's normaliser
        mel, refined, stop_logits = self(
            batch["text_ids"],
            batch["text_len"],
            batch["speaker_id"],
            batch["language_id"],
            target,
            seed,
            training=training,
        )
        frame_mask, stop_target, stop_weight = self.loss_masks(batch["mel_len"], target.shape[1])
        bce = native_ops.sigmoid_cross_entropy_with_logits(labels=stop_target, logits=stop_logits)
        return dict(
            self.loss_counts(batch),
            mel_abs=tf.reduce_sum(native_ops.absolute(mel - target) * frame_mask),
            postnet_abs=tf.reduce_sum(native_ops.absolute(refined - target) * frame_mask),
            stop_bce=tf.reduce_sum(bce * stop_weight),
            examples=tf.reduce_sum(tf.cast(batch["mel_len"] > 0, tf.float32)),
            mel_frames=tf.cast(tf.reduce_sum(batch["mel_len"]), tf.float32),
        )

    def losses_from_terms(self, terms: dict) -> dict:
        mel = terms["mel_abs"] / tf.maximum(terms["mel_count"], 1.0)
        post = terms["postnet_abs"] / tf.maximum(terms["mel_count"], 1.0)
        stop = terms["stop_bce"] / tf.maximum(terms["stop_count"], 1.0)
        return {
            "loss": mel + post + self.cfg.stop_loss_weight * stop,
            "mel_loss": mel,
            "postnet_loss": post,
            "stop_loss": stop,
        }

    def generate(self, text_ids, text_len, speaker_id, language_id) -> dict:
        """Greedy autoregression over a static buffer of its own past frames (a causal decoder
        ignores the unfilled tail); the stop token decides afterwards how many frames are speech."""
        seed = tf.zeros([2], tf.int32)  # unused: no dropout at inference
        steps, r = self.steps, self.r
        memory, mask = self.encode(text_ids, text_len, speaker_id, language_id, seed)
        buf = tf.zeros([1, steps, self.n_mels])  # decoder input at each step: the frame before it
        for i in tf.range(steps - 1):
            mel, _ = self.decode(memory, mask, buf, seed)
            frame = tf.gather(mel, i * r + r - 1, axis=1)  # last frame of step i feeds step i + 1
            buf = buf + tf.one_hot(i + 1, steps)[None, :, None] * frame[:, None, :]
        mel, stop = self.decode(memory, mask, buf, seed)
        refined = self.refine(mel, seed)
        stopped = tf.sigmoid(stop[0]) > 0.5
        n = tf.where(tf.reduce_any(stopped), tf.argmax(tf.cast(stopped, tf.int32), output_type=tf.int32) + 1, steps)
        return {"mel": self.norm.invert(refined), "mel_len": tf.reshape(n * r, [1])}  # type: ignore[union-attr]  # build_model gives every model the schema's normaliser


def _options(options: dict) -> ModelConfig:
    return from_dict(ModelConfig, dict(options), where="model options", prefix="model.")


def validate(schema, options: dict) -> None:
    """The built-in model's config checks: unknown keys, sizes, shapes (run before anything is built)."""
    _options(options).validate(schema)


def build(schema, options: dict) -> TextToMel:
    """The built-in model's factory (train/contract.py), in the Keras global dtype policy."""
    cfg = _options(options).validate(schema)
    return build_text_to_mel(cfg, schema, keras.config.dtype_policy().name)


build.validate = validate  # type: ignore[attr-defined]  # the factory's optional checks (train/contract.py)


def build_text_to_mel(cfg: ModelConfig | dict, schema, precision: str) -> TextToMel:
    """The built-in TextToMel for this schema, with its variables created by `TextToMel.build` (so the
    optimizer can be built), not yet run; the trainer builds the configured factory's model and checks it
    (its first run, unless the run's first step is restored: `Trainer._build_model`)."""
    if isinstance(cfg, dict):
        cfg = _options({k: v for k, v in cfg.items() if k != "factory"})
    # a shorter bucket may hold longer texts than the longest one: the text table covers them all
    model = TextToMel(
        cfg,
        vocab_size=len(schema.vocabulary),
        n_mels=schema.n_mels,
        max_text_len=max(b.max_text_len for b in schema.buckets),
        max_mel_frames=schema.max_mel_frames,
        speakers=len(schema.speakers),
        languages=len(schema.languages),
        precision=precision,
        norm=Normaliser(schema),
    )
    model.build((None, None))
    return model
