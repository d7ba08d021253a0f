"""A small non-autoregressive text-to-mel model: a plug-in for `melshards train` (train/contract.py).

    melshards train 'out/demo/shards/train-*.tfrecord' --model examples.fastspeech_lite:build \
        --model-dir out/demo/fs --config configs/train_tiny_fastspeech.yaml

FastSpeech-like, with the simplest duration rule: a uniform alignment. Every character of an
utterance gets the same share of its frames (frame t reads character floor(t * text_len / mel_len)),
so no aligner or duration targets are needed; the model learns the utterance's length in frames
from the text (log-length regression) and uses it at synthesis. A speaker and a language embedding
(tables sized by schema.json's speakers and languages) are added to the encoder output, so the
length and the frames depend on who speaks which language. Encoder and decoder are stacks of
'same' convolutions over the characters and over the expanded frames; every shape is static.
With `dropout` above 0, each encoder and decoder layer's output goes through the trainer's stateless
dropout (`melshards.train.model.Dropout`) keyed by the `seed` the trainer hands `loss_terms`, (loop.seed,
step): a resumed run draws the masks an uninterrupted one draws.
Only the public API (`melshards.normalizer`), the trainer's layers and Keras are used.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import tensorflow as tf

import melshards
from melshards.shards_schema.config import ConfigError, from_dict
from melshards.train.model import Dropout, same_conv


@dataclasses.dataclass(frozen=True)
class Options:
    """The `model:` section of the config (unknown keys are errors)."""

    d_model: int = 64
    encoder_layers: int = 2
    decoder_layers: int = 2
    kernel: int = 3
    length_loss_weight: float = 0.1
    dropout: float = 0.0  # rate on each encoder and decoder layer's output while training


def conv(x, dense: keras.layers.Dense, kernel: int):
    """'same' 1-D convolution with `dense`'s weights: the trainer's (im2col on CPU, native on a GPU)."""
    return same_conv(x, dense, kernel)


def uniform_alignment(text_len, mel_len, frames: int):
    """[B] lengths -> [B, frames] character index of each frame; every character gets an equal share."""
    t = tf.range(frames, dtype=tf.float32)[None, :]
    share = tf.cast(tf.maximum(text_len, 1), tf.float32)[:, None] / tf.cast(tf.maximum(mel_len, 1), tf.float32)[:, None]
    return tf.minimum(tf.cast(tf.floor(t * share), tf.int32), tf.maximum(text_len, 1)[:, None] - 1)


class FastSpeechLite(keras.Model):
    def __init__(self, opts: Options, schema, **kw):
        super().__init__(**kw)
        d = opts.d_model
        self.opts, self.n_mels = opts, schema.n_mels
        self.max_frames = schema.max_mel_frames  # the longest bucket's: synthesis makes this many frames
        self.norm = melshards.normalizer(schema)
        self.embed = keras.layers.Embedding(len(schema.vocabulary), d)
        self.speaker_embed = keras.layers.Embedding(len(schema.speakers), d)  # rows: the records' speaker_id
        self.language_embed = keras.layers.Embedding(len(schema.languages), d)  # rows: their language_id
        # named attributes, not lists: a tf.train.Checkpoint sees every variable (see train/model.py attach)
        for i in range(opts.encoder_layers):
            setattr(self, f"enc_{i}", keras.layers.Dense(d, activation="relu"))
            setattr(self, f"enc_drop_{i}", Dropout(opts.dropout, i))  # one site (own mask stream) per layer
        for i in range(opts.decoder_layers):
            setattr(self, f"dec_{i}", keras.layers.Dense(d, activation="relu"))
            setattr(self, f"dec_drop_{i}", Dropout(opts.dropout, 100 + i))
        self.enc_norm = keras.layers.LayerNormalization()
        self.length_head = keras.layers.Dense(1, dtype="float32")
        self.frame_pos = keras.layers.Dense(d)  # relative position of a frame inside its character
        self.mel_head = keras.layers.Dense(schema.n_mels, dtype="float32")

    def condition(self, speaker, language_id):
        """[B, d]: who speaks (`speaker`: the records' speaker_id) which language; a subclass may
        condition on something else (examples/embedding_tts.py: a speaker embedding)."""
        return self.speaker_embed(speaker) + self.language_embed(language_id)

    def speaker_input(self, batch):
        """What `condition` reads as the speaker from a training batch."""
        return batch["speaker_id"]

    def encode(self, text_ids, text_len, speaker_id, language_id, seed=None, training=False):
        """seed: the int32 [2] dropout key `loss_terms` is handed; read only while training."""
        mask = tf.sequence_mask(text_len, text_ids.shape[1], dtype=tf.float32)[..., None]  # this batch's width
        x = self.embed(text_ids)
        for i in range(self.opts.encoder_layers):
            y = conv(x, getattr(self, f"enc_{i}"), self.opts.kernel)
            x = x + getattr(self, f"enc_drop_{i}")(y, seed, training=training) * tf.cast(mask, x.dtype)
        # who speaks which language, on every character: [B, d] broadcast over the text
        x = self.enc_norm(x) + self.condition(speaker_id, language_id)[:, None, :]
        pooled = tf.reduce_sum(tf.cast(x, tf.float32) * mask, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1.0)
        log_frames = tf.squeeze(self.length_head(pooled), -1)  # predicted log(mel_len)
        return x, log_frames

    def decode(self, memory, text_len, mel_len, frames: int, seed=None, training=False):
        """[B, frames, n_mels] normalised log-mel: `frames` is the bucket's (training) or the longest (synthesis)."""
        idx = uniform_alignment(text_len, mel_len, frames)  # [B, T]
        x = tf.gather(memory, idx, batch_dims=1)  # the length regulator: [B, T, d]
        t = tf.range(frames, dtype=tf.float32)[None, :]
        where = (
            t
            * tf.cast(tf.maximum(text_len, 1), tf.float32)[:, None]
            / tf.cast(tf.maximum(mel_len, 1), tf.float32)[:, None]
        )
        x = x + self.frame_pos(
            tf.stack([where - tf.floor(where), tf.broadcast_to(t / self.max_frames, tf.shape(where))], -1)
        )
        for i in range(self.opts.decoder_layers):
            x = x + getattr(self, f"dec_drop_{i}")(
                conv(x, getattr(self, f"dec_{i}"), self.opts.kernel), seed, training=training
            )
        return self.mel_head(x)  # normalised log-mel [B, T, n_mels]

    def call(
        self, text_ids, text_len, speaker_id, language_id, mel_len, frames: int | None = None, seed=None, training=False
    ):
        """Normalised log-mel [B, frames, n_mels] (default frames: the schema's longest) and log(frames) predicted."""
        memory, log_frames = self.encode(text_ids, text_len, speaker_id, language_id, seed, training)
        return self.decode(memory, text_len, mel_len, frames or self.max_frames, seed, training), log_frames

    # -- the contract ---------------------------------------------------------------------------
    # a batch's shapes are its length bucket's (train/contract.py): widths come from its tensors, never the schema
    def loss_counts(self, batch):
        frame_mask = tf.sequence_mask(batch["mel_len"], batch["mel"].shape[1], dtype=tf.float32)
        return {
            "mel_count": tf.reduce_sum(frame_mask) * self.n_mels,
            "examples": tf.reduce_sum(tf.cast(batch["mel_len"] > 0, tf.float32)),
        }

    def loss_terms(self, batch, seed, training):
        target = self.norm(batch["mel"])
        mel, log_frames = self(
            batch["text_ids"],
            batch["text_len"],
            self.speaker_input(batch),
            batch["language_id"],
            batch["mel_len"],
            frames=batch["mel"].shape[1],
            seed=seed,
            training=training,
        )
        frame_mask = tf.sequence_mask(batch["mel_len"], batch["mel"].shape[1], dtype=tf.float32)[..., None]
        real = tf.cast(batch["mel_len"] > 0, tf.float32)
        length_err = log_frames - tf.math.log(tf.maximum(tf.cast(batch["mel_len"], tf.float32), 1.0))
        return {
            "mel_abs": tf.reduce_sum(tf.abs(mel - target) * frame_mask),
            "mel_count": tf.reduce_sum(frame_mask) * self.n_mels,
            "length_sq": tf.reduce_sum(tf.square(length_err) * real),
            "examples": tf.reduce_sum(real),
            "mel_frames": tf.cast(tf.reduce_sum(batch["mel_len"]), tf.float32),
        }

    def losses_from_terms(self, terms):
        mel = terms["mel_abs"] / tf.maximum(terms["mel_count"], 1.0)
        length = terms["length_sq"] / tf.maximum(terms["examples"], 1.0)
        return {"loss": mel + self.opts.length_loss_weight * length, "mel_loss": mel, "length_loss": length}

    def generate(self, text_ids, text_len, speaker_id, language_id):
        memory, log_frames = self.encode(text_ids, text_len, speaker_id, language_id)
        n = tf.clip_by_value(tf.cast(tf.round(tf.exp(log_frames)), tf.int32), 1, self.max_frames)
        mel = self.decode(memory, text_len, n, self.max_frames)
        return {"mel": self.norm.invert(mel), "mel_len": n}


def validate(schema, options: dict) -> None:
    opts = from_dict(Options, options, where="model")
    for key in ("d_model", "kernel"):
        if getattr(opts, key) < 1:
            raise ConfigError(f"model.{key} is {getattr(opts, key)}; it must be at least 1")
    if not 0.0 <= opts.dropout < 1.0:
        raise ConfigError(f"model.dropout is {opts.dropout}; it must be at least 0 and below 1")


def build(schema, options: dict) -> FastSpeechLite:
    """The factory: `--model examples.fastspeech_lite:build`."""
    return built(FastSpeechLite, schema, options)


def built(model_class, schema, options: dict):
    """`model_class` (FastSpeechLite or a subclass taking the same arguments) for `schema` with the
    model `options`, checked, and called once on a zero batch so its weights exist."""
    validate(schema, options)
    model = model_class(from_dict(Options, options, where="model"), schema)
    zeros = np.zeros([1], np.int32)
    model(
        tf.zeros([1, schema.max_text_len], tf.int32),
        tf.constant(zeros + 1),
        tf.constant(zeros),
        tf.constant(zeros),
        tf.constant(zeros + 1),
    )  # build
    return model


build.validate = validate
