"""A zero-shot text-to-mel plug-in: `examples.fastspeech_lite` conditioned on a reference clip's log-mel
through a small reference encoder (train/contract.py; docs/api.md, References).

    melshards preprocess ... --config configs/references.yaml     # reference: source: other_clip or same_clip
    melshards train 'out/refs/train-*.tfrecord' --model examples.reference_tts:build --model-dir out/refs-model
    melshards synthesize "Hello." --model-dir out/refs-model --reference voice.wav -o hello.wav

The factory declares `features = ("reference_mel",)`: each batch then holds `reference_mel` [B, frames,
n_mels] and `reference_len` [B] (stored by an other_clip run, or cut from the record's own mel by the
trainer on a same_clip run). The reference encoder is two 'same' convolutions over the normalised
reference frames, mean-pooled over its valid frames into one [B, d] voice vector added to every
character of the encoder output, in place of a speaker table: a voice the model never saw in training
is one reference away. Every shape is static.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from examples.fastspeech_lite import FastSpeechLite, Options, conv, validate
from melshards.shards_schema.config import from_dict


class ReferenceTTS(FastSpeechLite):
    def __init__(self, opts: Options, schema, **kw):
        super().__init__(opts, schema, **kw)
        self.ref_frames, self.pad_value = schema.reference_frames, schema.mel.pad_value
        self.ref_in = keras.layers.Dense(opts.d_model, activation="relu")
        self.ref_conv_0 = keras.layers.Dense(opts.d_model, activation="relu")
        self.ref_conv_1 = keras.layers.Dense(opts.d_model, activation="relu")
        self.ref_out = keras.layers.Dense(opts.d_model)

    def voice(self, reference_mel, reference_len):
        """[B, frames, n_mels] log-mel, [B] valid frames -> [B, d]: the reference encoder."""
        mask = tf.sequence_mask(reference_len, self.ref_frames, dtype=tf.float32)[..., None]
        x = self.ref_in(self.norm(reference_mel))
        x = x + conv(x, self.ref_conv_0, self.opts.kernel) * tf.cast(mask, x.dtype)
        x = x + conv(x, self.ref_conv_1, self.opts.kernel) * tf.cast(mask, x.dtype)
        pooled = tf.reduce_sum(tf.cast(x, tf.float32) * mask, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1.0)
        return self.ref_out(pooled)

    def encode_with(self, text_ids, text_len, language_id, reference_mel, reference_len, seed=None, training=False):
        speaker = tf.zeros_like(text_len)  # the voice comes from the reference, not the speaker table
        memory, _ = self.encode(text_ids, text_len, speaker, language_id, seed, training)
        memory = memory + tf.cast(self.voice(reference_mel, reference_len), memory.dtype)[:, None, :]
        mask = tf.sequence_mask(text_len, text_ids.shape[1], dtype=tf.float32)[..., None]
        pooled = tf.reduce_sum(tf.cast(memory, tf.float32) * mask, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1.0)
        return memory, tf.squeeze(self.length_head(pooled), -1)

    def loss_terms(self, batch, seed, training):
        memory, log_frames = self.encode_with(
            batch["text_ids"],
            batch["text_len"],
            batch["language_id"],
            batch["reference_mel"],
            batch["reference_len"],
            seed,
            training,
        )
        frames = batch["mel"].shape[1]  # the bucket's
        mel = self.decode(memory, batch["text_len"], batch["mel_len"], frames, seed, training)
        frame_mask = tf.sequence_mask(batch["mel_len"], frames, dtype=tf.float32)[..., None]
        real = tf.cast(batch["mel_len"] > 0, tf.float32)
        length_err = log_frames - tf.math.log(tf.maximum(tf.cast(batch["mel_len"], tf.float32), 1.0))
        return {
            "mel_abs": tf.reduce_sum(tf.abs(mel - self.norm(batch["mel"])) * frame_mask),
            "mel_count": tf.reduce_sum(frame_mask) * self.n_mels,
            "length_sq": tf.reduce_sum(tf.square(length_err) * real),
            "examples": tf.reduce_sum(real),
            "mel_frames": tf.cast(tf.reduce_sum(batch["mel_len"]), tf.float32),
        }

    def generate(self, text_ids, text_len, speaker_id, language_id, reference_mel=None, reference_len=None):
        """As FastSpeechLite's, in the voice of `reference_mel` [B, frames, n_mels] (log-mel of the run's
        settings, `reference_len` valid frames); without one, the voice of silence."""
        if reference_mel is None:
            reference_mel = tf.fill([tf.shape(text_ids)[0], self.ref_frames, self.n_mels], self.pad_value)
            reference_len = tf.zeros_like(text_len)
        memory, log_frames = self.encode_with(text_ids, text_len, language_id, reference_mel, reference_len)
        n = tf.clip_by_value(tf.cast(tf.round(tf.exp(log_frames)), tf.int32), 1, self.max_frames)
        return {"mel": self.norm.invert(self.decode(memory, text_len, n, self.max_frames)), "mel_len": n}


def build(schema, options: dict) -> ReferenceTTS:
    """The factory: `--model examples.reference_tts:build`."""
    validate(schema, options)
    model = ReferenceTTS(from_dict(Options, options, where="model"), schema)
    ones = tf.constant(np.ones([1], np.int32))
    frames = model.ref_frames
    model.encode_with(
        tf.zeros([1, schema.max_text_len], tf.int32), ones, ones * 0, tf.zeros([1, frames, schema.n_mels]), ones
    )
    model(tf.zeros([1, schema.max_text_len], tf.int32), ones, ones * 0, ones * 0, ones)  # build (keras: `built`)
    return model


build.validate = validate
build.features = ("reference_mel",)  # reference_mel and reference_len in every batch
