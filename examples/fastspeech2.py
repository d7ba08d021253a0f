"""A small FastSpeech 2-style model: a plug-in for `melshards train` (train/contract.py) that trains on
phone durations, pitch and energy.

    melshards preprocess --input data/ljspeech_tiny --output out/fs2/shards --config CONFIG \
        --alignments ALIGNMENTS_DIR        # CONFIG with features: {pitch: true, energy: true}
    melshards train 'out/fs2/shards/train-*.tfrecord' --model-dir out/fs2/model \
        --config configs/train_fastspeech2.yaml

The factory declares `build.features = ("durations", "pitch", "energy")`: the trainer adds those to
every batch, and stops before building anything on shards that lack one, naming the preprocess
setting that adds it. The model (Ren et al. 2021, shrunk):

- a phone encoder ('same' convolutions) plus speaker and language embeddings;
- the variance adaptor: a duration predictor (log(1 + frames) per phone, MSE over the phones), the
  length regulator (`regulate`: frame j reads the phone whose cumulative durations span j), and
  frame-level pitch and energy predictors (MSE on the values `melshards.normalizer` standardises
  with each speaker's statistics; pitch over voiced frames only), whose targets (while training) or
  predictions (at synthesis) are embedded and added to the frames;
- a convolutional decoder to the normalised log-mel (L1 over valid frames).

Every shape comes from the batch, so each length bucket traces once. Only the public API
(`melshards.normalizer`) and Keras are used.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import tensorflow as tf

import melshards
from examples.fastspeech_lite import conv  # the trainer's 'same' convolution (train/model.py same_conv)
from melshards.shards_schema.config import ConfigError, from_dict


@dataclasses.dataclass(frozen=True)
class Options:
    """The `model:` section of the config (unknown keys are errors)."""

    d_model: int = 64
    encoder_layers: int = 2
    decoder_layers: int = 2
    predictor_layers: int = 2
    kernel: int = 3
    duration_loss_weight: float = 0.1
    pitch_loss_weight: float = 0.1
    energy_loss_weight: float = 0.1


def regulate(durations, frames: int):
    """Durations [B, L] (frames per phone) -> [B, frames] index of the phone each frame reads: the
    number of phones whose cumulative end is at or before the frame (phones of 0 frames are skipped).
    Frames past the durations' sum read index L (the caller masks them)."""
    ends = tf.cumsum(tf.cast(durations, tf.int32), axis=1)  # [B, L]
    j = tf.range(frames, dtype=tf.int32)[None, :, None]  # [1, T, 1]
    return tf.reduce_sum(tf.cast(ends[:, None, :] <= j, tf.int32), axis=-1)  # [B, T]


def gather_frames(phones, index):
    """[B, L, d] phone features, [B, T] indices (L = past the end) -> [B, T, d], zeros past the end."""
    padded = tf.pad(phones, [[0, 0], [0, 1], [0, 0]])
    return tf.gather(padded, index, batch_dims=1)


class FastSpeech2(keras.Model):
    def __init__(self, opts: Options, schema, **kw):
        super().__init__(**kw)
        d = opts.d_model
        self.opts, self.n_mels = opts, schema.n_mels
        self.norm = melshards.normalizer(schema)
        self.embed = keras.layers.Embedding(len(schema.vocabulary), d)
        self.speaker_embed = keras.layers.Embedding(len(schema.speakers), d)
        self.language_embed = keras.layers.Embedding(len(schema.languages), d)
        # named attributes, not lists: a tf.train.Checkpoint sees every variable (see train/model.py attach)
        for name, n in (
            ("enc", opts.encoder_layers),
            ("dec", opts.decoder_layers),
            ("dur", opts.predictor_layers),
            ("f0", opts.predictor_layers),
            ("en", opts.predictor_layers),
        ):
            for i in range(n):
                setattr(self, f"{name}_{i}", keras.layers.Dense(d, activation="relu"))
        self.enc_norm = keras.layers.LayerNormalization()
        self.dur_head = keras.layers.Dense(1, dtype="float32")
        self.f0_head = keras.layers.Dense(1, dtype="float32")
        self.en_head = keras.layers.Dense(1, dtype="float32")
        self.f0_embed = keras.layers.Dense(d)
        self.en_embed = keras.layers.Dense(d)
        self.mel_head = keras.layers.Dense(schema.n_mels, dtype="float32")

    def _stack(self, x, name: str, layers: int, mask):
        for i in range(layers):
            x = x + conv(x, getattr(self, f"{name}_{i}"), self.opts.kernel) * tf.cast(mask, x.dtype)
        return x

    def encode(self, text_ids, text_len, speaker_id, language_id):
        """Phones -> ([B, L, d] features, [B, L] predicted log(1 + frames))."""
        mask = tf.sequence_mask(text_len, text_ids.shape[1])[..., None]
        x = self._stack(self.embed(text_ids), "enc", self.opts.encoder_layers, mask)
        x = self.enc_norm(x) + (self.speaker_embed(speaker_id) + self.language_embed(language_id))[:, None, :]
        log_dur = tf.squeeze(self.dur_head(self._stack(x, "dur", self.opts.predictor_layers, mask)), -1)
        return x, log_dur

    def variance(self, frames, frame_mask):
        """Frame features -> predicted (normalised) pitch and energy [B, T]."""
        f0 = tf.squeeze(self.f0_head(self._stack(frames, "f0", self.opts.predictor_layers, frame_mask)), -1)
        en = tf.squeeze(self.en_head(self._stack(frames, "en", self.opts.predictor_layers, frame_mask)), -1)
        return f0, en

    def decode(self, frames, pitch, energy, frame_mask):
        """Frames + the pitch and energy they are given (normalised) -> normalised log-mel [B, T, n_mels]."""
        x = frames + self.f0_embed(pitch[..., None]) + self.en_embed(energy[..., None])
        return self.mel_head(self._stack(x, "dec", self.opts.decoder_layers, frame_mask))

    def call(self, batch, training=False):
        memory, log_dur = self.encode(batch["text_ids"], batch["text_len"], batch["speaker_id"], batch["language_id"])
        frames_n = batch["mel"].shape[1]
        frame_mask = tf.sequence_mask(batch["mel_len"], frames_n)[..., None]
        frames = gather_frames(memory, regulate(batch["durations"], frames_n))
        f0, en = self.variance(frames, frame_mask)
        target_f0 = self.norm.pitch(batch["pitch"], batch["speaker_id"])
        target_en = self.norm.energy(batch["energy"], batch["speaker_id"])
        mel = self.decode(frames, target_f0, target_en, frame_mask)  # teacher forcing: the true variance
        return mel, log_dur, f0, en, target_f0, target_en

    # -- the contract ---------------------------------------------------------------------------
    def loss_counts(self, batch):
        frames_n = batch["mel"].shape[1]
        valid = tf.sequence_mask(batch["mel_len"], frames_n, dtype=tf.float32)
        return {
            "mel_count": tf.reduce_sum(valid) * self.n_mels,
            "frame_count": tf.reduce_sum(valid),
            "voiced_count": tf.reduce_sum(valid * tf.cast(batch["pitch"] > 0, tf.float32)),
            "phone_count": tf.reduce_sum(
                tf.sequence_mask(batch["text_len"], batch["text_ids"].shape[1], dtype=tf.float32)
            ),
            "examples": tf.reduce_sum(tf.cast(batch["mel_len"] > 0, tf.float32)),
        }

    def loss_terms(self, batch, seed, training):
        mel, log_dur, f0, en, target_f0, target_en = self(batch, training=training)
        counts = self.loss_counts(batch)
        frames_n = batch["mel"].shape[1]
        valid = tf.sequence_mask(batch["mel_len"], frames_n, dtype=tf.float32)
        voiced = valid * tf.cast(batch["pitch"] > 0, tf.float32)
        phones = tf.sequence_mask(batch["text_len"], batch["text_ids"].shape[1], dtype=tf.float32)
        dur_target = tf.math.log1p(tf.cast(batch["durations"], tf.float32))
        return dict(
            counts,
            mel_abs=tf.reduce_sum(tf.abs(mel - self.norm(batch["mel"])) * valid[..., None]),
            duration_sq=tf.reduce_sum(tf.square(log_dur - dur_target) * phones),
            pitch_sq=tf.reduce_sum(tf.square(f0 - target_f0) * voiced),
            energy_sq=tf.reduce_sum(tf.square(en - target_en) * valid),
            mel_frames=tf.cast(tf.reduce_sum(batch["mel_len"]), tf.float32),
        )

    def losses_from_terms(self, terms):
        def mean(total, count):
            return terms[total] / tf.maximum(terms[count], 1.0)

        o = self.opts
        losses = {
            "mel_loss": mean("mel_abs", "mel_count"),
            "duration_loss": mean("duration_sq", "phone_count"),
            "pitch_loss": mean("pitch_sq", "voiced_count"),
            "energy_loss": mean("energy_sq", "frame_count"),
        }
        losses["loss"] = (
            losses["mel_loss"]
            + o.duration_loss_weight * losses["duration_loss"]
            + o.pitch_loss_weight * losses["pitch_loss"]
            + o.energy_loss_weight * losses["energy_loss"]
        )
        return losses

    def generate(self, text_ids, text_len, speaker_id, language_id, frames_n: int | None = None):
        """Predicted durations (rounded, at least 0) drive the length regulator over the static
        `frames_n` frames (default: the largest bucket's); predicted pitch and energy drive the decoder."""
        frames_n = frames_n or self.max_frames
        memory, log_dur = self.encode(text_ids, text_len, speaker_id, language_id)
        phones = tf.sequence_mask(text_len, text_ids.shape[1], dtype=tf.int32)
        durations = tf.maximum(tf.cast(tf.round(tf.math.expm1(log_dur)), tf.int32), 0) * phones
        mel_len = tf.minimum(tf.reduce_sum(durations, axis=1), frames_n)
        frame_mask = tf.sequence_mask(mel_len, frames_n)[..., None]
        frames = gather_frames(memory, regulate(durations, frames_n))
        f0, en = self.variance(frames, frame_mask)
        mel = self.decode(frames, f0, en, frame_mask)
        return {"mel": self.norm.invert(mel), "mel_len": mel_len}


def validate(schema, options: dict) -> None:
    opts = from_dict(Options, options, where="model")
    for key in ("d_model", "kernel"):
        if getattr(opts, key) < 1:
            raise ConfigError(f"model.{key} is {getattr(opts, key)}; it must be at least 1")


def build(schema, options: dict) -> FastSpeech2:
    """The factory: `--model examples.fastspeech2:build`."""
    validate(schema, options)
    model = FastSpeech2(from_dict(Options, options, where="model"), schema)
    model.max_frames = schema.max_mel_frames
    one = np.ones([1], np.int32)
    frames = 8
    model(
        {
            "text_ids": tf.zeros([1, 4], tf.int32),
            "text_len": tf.constant(one),
            "speaker_id": tf.constant(0 * one),
            "language_id": tf.constant(0 * one),
            "mel": tf.zeros([1, frames, schema.n_mels]),
            "mel_len": tf.constant(one),
            "durations": tf.constant([[1, 0, 0, 0]]),
            "pitch": tf.zeros([1, frames]),
            "energy": tf.zeros([1, frames]),
        }
    )  # build every variable
    return model


build.validate = validate
build.features = ("durations", "pitch", "energy")  # the trainer adds these to the batch (train/contract.py)
