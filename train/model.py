"""A small Transformer-TTS: characters -> normalised log-mel, r frames per decoder step.

Encoder: character embedding -> conv prenet -> scaled sinusoidal positions -> pre-LN self-attention
blocks. Decoder: teacher-forced previous frame -> bottleneck prenet -> causal self-attention +
cross-attention blocks -> r mel frames and one stop logit per step. Postnet: residual conv stack.
Every shape is static (the schema's max lengths), so the whole thing compiles with XLA.
"""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from keras import layers

from train.config import ModelConfig


def sinusoids(length: int, dim: int) -> np.ndarray:
    pos = np.arange(length)[:, None]
    rate = 1.0 / np.power(10000.0, (2 * (np.arange(dim) // 2)) / dim)
    angles = pos * rate[None, :]
    return np.where(np.arange(dim) % 2 == 0, np.sin(angles), np.cos(angles)).astype(np.float32)


class _Block(layers.Layer):
    """Pre-LN transformer block: self-attention, optional cross-attention, feed-forward."""

    def __init__(self, cfg: ModelConfig, cross: bool, **kw):
        super().__init__(**kw)
        d, dt = cfg.d_model, self.dtype_policy
        key_dim = d // cfg.num_heads
        self.norm1 = layers.LayerNormalization(dtype=dt)
        self.attn = layers.MultiHeadAttention(cfg.num_heads, key_dim, dropout=cfg.dropout, dtype=dt)
        self.cross = cross
        if cross:
            self.norm2 = layers.LayerNormalization(dtype=dt)
            self.xattn = layers.MultiHeadAttention(cfg.num_heads, key_dim, dropout=cfg.dropout, dtype=dt)
        self.norm3 = layers.LayerNormalization(dtype=dt)
        self.ff1 = layers.Dense(cfg.ff_dim, activation="relu", dtype=dt)
        self.ff2 = layers.Dense(d, dtype=dt)
        self.drop = layers.Dropout(cfg.dropout, dtype=dt)

    def call(self, x, self_mask, memory=None, cross_mask=None, causal=False, training=False):
        h = self.norm1(x)
        x = x + self.drop(self.attn(h, h, attention_mask=self_mask, use_causal_mask=causal,
                                    training=training), training=training)
        if self.cross:
            h = self.norm2(x)
            x = x + self.drop(self.xattn(h, memory, attention_mask=cross_mask, training=training),
                              training=training)
        h = self.norm3(x)
        return x + self.drop(self.ff2(self.ff1(h)), training=training)


class TextToMel(keras.Model):
    def __init__(self, cfg: ModelConfig, vocab_size: int, n_mels: int, max_text_len: int,
                 max_mel_frames: int, precision: str = "float32", **kw):
        super().__init__(dtype=precision, **kw)
        dt, d, r = self.dtype_policy, cfg.d_model, cfg.reduction_factor
        self.cfg, self.n_mels, self.r = cfg, n_mels, r
        self.max_text_len, self.steps = max_text_len, max_mel_frames // r
        self.embed = layers.Embedding(vocab_size, d, dtype=dt)
        self.enc_convs = [layers.Conv1D(d, cfg.conv_kernel, padding="same", activation="relu", dtype=dt)
                          for _ in range(cfg.encoder_conv_layers)]
        self.enc_conv_norms = [layers.LayerNormalization(dtype=dt) for _ in range(cfg.encoder_conv_layers)]
        self.enc_proj = layers.Dense(d, dtype=dt)
        self.enc_blocks = [_Block(cfg, cross=False, dtype=dt) for _ in range(cfg.encoder_layers)]
        self.enc_norm = layers.LayerNormalization(dtype=dt)
        self.prenet = [layers.Dense(cfg.prenet_dim, activation="relu", dtype=dt),
                       layers.Dense(cfg.prenet_dim, activation="relu", dtype=dt)]
        self.prenet_drop = layers.Dropout(cfg.prenet_dropout, dtype=dt)
        self.dec_proj = layers.Dense(d, dtype=dt)
        self.dec_blocks = [_Block(cfg, cross=True, dtype=dt) for _ in range(cfg.decoder_layers)]
        self.dec_norm = layers.LayerNormalization(dtype=dt)
        self.drop = layers.Dropout(cfg.dropout, dtype=dt)
        # heads and postnet output stay float32: losses and the stop decision need the precision
        self.mel_head = layers.Dense(r * n_mels, dtype="float32")
        self.stop_head = layers.Dense(1, dtype="float32")
        self.postnet = [layers.Conv1D(cfg.postnet_channels, 5, padding="same", activation="tanh", dtype=dt)
                        for _ in range(cfg.postnet_layers)]
        self.postnet_norms = [layers.LayerNormalization(dtype=dt) for _ in range(cfg.postnet_layers)]
        self.postnet_out = layers.Conv1D(n_mels, 5, padding="same", dtype="float32")
        # learned scale of the fixed position table (Transformer-TTS), one per side
        self.enc_alpha = self.add_weight(shape=(), initializer="ones", name="enc_alpha")
        self.dec_alpha = self.add_weight(shape=(), initializer="ones", name="dec_alpha")
        self.enc_pos = tf.constant(sinusoids(max_text_len, d))
        self.dec_pos = tf.constant(sinusoids(self.steps, d))

    # -- pieces used by training (all at once) and synthesis (decoder step by step) ------------
    def encode(self, text_ids, text_len, training=False):
        mask = tf.sequence_mask(text_len, self.max_text_len)  # [B, L]
        x = self.embed(text_ids)
        for conv, norm in zip(self.enc_convs, self.enc_conv_norms):
            x = self.drop(norm(conv(x)), training=training)
        x = self.enc_proj(x) + tf.cast(self.enc_alpha * self.enc_pos, x.dtype)
        x = self.drop(x, training=training)
        self_mask = mask[:, None, :] & mask[:, :, None]
        for block in self.enc_blocks:
            x = block(x, self_mask, training=training)
        return self.enc_norm(x), mask

    def decode(self, memory, text_mask, prev_frames, training=False):
        """prev_frames [B, G, n_mels] (frame before each step) -> mel [B, G*r, n_mels], stop logits [B, G]."""
        x = prev_frames
        for dense in self.prenet:
            x = self.prenet_drop(dense(x), training=training)
        x = self.dec_proj(x) + tf.cast(self.dec_alpha * self.dec_pos, x.dtype)
        x = self.drop(x, training=training)
        cross_mask = tf.broadcast_to(text_mask[:, None, :], [tf.shape(x)[0], self.steps, self.max_text_len])
        for block in self.dec_blocks:
            x = block(x, None, memory=memory, cross_mask=cross_mask, causal=True, training=training)
        x = self.dec_norm(x)
        mel = tf.reshape(self.mel_head(x), [-1, self.steps * self.r, self.n_mels])
        return mel, tf.squeeze(self.stop_head(x), -1)

    def refine(self, mel, training=False):
        """Postnet: residual correction of the decoder's frames."""
        x = mel
        for conv, norm in zip(self.postnet, self.postnet_norms):
            x = self.drop(norm(conv(x)), training=training)
        return mel + self.postnet_out(x)

    def teacher_inputs(self, target):
        """Normalised target [B, T, M] -> decoder inputs [B, G, M]: the last frame of the previous step."""
        last = target[:, self.r - 1::self.r, :]
        go = tf.zeros_like(last[:, :1, :])
        return tf.concat([go, last[:, :-1, :]], axis=1)

    def call(self, text_ids, text_len, target, training=False):
        memory, text_mask = self.encode(text_ids, text_len, training=training)
        mel, stop = self.decode(memory, text_mask, self.teacher_inputs(target), training=training)
        return mel, self.refine(mel, training=training), stop


def build_model(cfg: ModelConfig, schema, precision: str) -> TextToMel:
    """The model for this schema, with its variables created (so the optimizer can be built)."""
    model = TextToMel(cfg, vocab_size=len(schema.vocabulary), n_mels=schema.n_mels,
                      max_text_len=schema.max_text_len, max_mel_frames=schema.max_mel_frames,
                      precision=precision)
    model(tf.zeros([1, schema.max_text_len], tf.int32), tf.ones([1], tf.int32),
          tf.zeros([1, schema.max_mel_frames, schema.n_mels]))
    return model
