"""same_clip references (schema.json `reference.source: same_clip`): a random slice of each record's own
log-mel, cut in-graph at read time, in pure TF ops with a static shape: the one implementation behind
`melshards.dataset(features=("reference_mel", ...))` and the trainer's batches for models that declare
`reference_mel` (train/input_pipeline.py; `SameClip` says how, `same_clip` whether).

The slice of record b of batch number `step` starts at floor(u * (room + 1)), room = max(mel_len -
frames, 0), u = `tf.random.stateless_uniform` keyed by (seed, step): the same seed and step give the same
slices in any process, and a resumed iterator (its batch counter is part of its state) cuts what an
uninterrupted one would. A clip shorter than `frames` is taken whole and padded with the mel's pad value
(`reference_len` says how much is real). other_clip runs store their references in the records instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from melshards.shards_schema import Schema
from melshards.train.tf_quiet import tf

REFERENCE_FEATURES = ("reference_mel", "reference_len")  # what a same_clip slice adds to a batch


def same_clip_reference(mel, mel_len, frames: int, seed, pad_value: float) -> dict:
    """mel [B, F, n_mels], mel_len [B], seed int [2] (a stateless seed) -> {"reference_mel" [B, frames,
    n_mels], "reference_len" int32 [B], "reference_start" int32 [B]}."""
    b = mel.shape[0] if mel.shape[0] is not None else tf.shape(mel)[0]
    room = tf.maximum(mel_len - frames, 0)
    u = tf.random.stateless_uniform([b], seed=seed, dtype=tf.float32)
    start = tf.minimum(tf.cast(tf.floor(u * tf.cast(room + 1, tf.float32)), tf.int32), room)
    last = (mel.shape[1] if mel.shape[1] is not None else tf.shape(mel)[1]) - 1
    # [B, frames]; a frame past the mel reads its last one, and is masked below (past mel_len <= F): no
    # padded copy of the whole mel: the same values, without copying every frame of the batch
    # (docs/performance.md#references-in-the-batch)
    idx = tf.minimum(start[:, None] + tf.range(frames)[None, :], last)
    taken = tf.gather(mel, idx, batch_dims=1)
    length = tf.clip_by_value(mel_len - start, 0, frames)
    valid = tf.sequence_mask(length, frames)[:, :, None]
    return {
        "reference_mel": tf.where(valid, taken, tf.cast(pad_value, mel.dtype)),
        "reference_len": length,
        "reference_start": start,
    }


def with_same_clip_references(
    ds: tf.data.Dataset, frames: int, seed: int, pad_value: float, keep: tuple[str, ...]
) -> tf.data.Dataset:
    """Batches holding mel and mel_len -> the same batches with a same_clip reference added, the k-th batch
    cut with the stateless seed (seed, k); only the features `keep` (and the reference's) are left."""

    @tf.autograph.experimental.do_not_convert  # no tensor-dependent Python control flow: nothing to convert
    def add(k, batch):
        key = tf.stack([tf.constant(seed, tf.int64), k])
        out = dict(batch, **same_clip_reference(batch["mel"], batch["mel_len"], frames, key, pad_value))
        return {n: v for n, v in out.items() if n in keep or n in REFERENCE_FEATURES}

    # the counter is part of the iterator's state: a checkpointed iterator resumes on the same slices
    # sequential: it runs in the thread of the prefetch after it, which holds the only batches cut ahead
    return tf.data.Dataset.zip(tf.data.Dataset.counter(), ds).map(add)


@dataclasses.dataclass(frozen=True)
class SameClip:
    """How a same_clip run's references are cut for a batch that asks for them: `frames` [frames, n_mels],
    padded with the mel's `pad_value` (from the schema, `same_clip`)."""

    frames: int
    n_mels: int
    pad_value: float

    def stored(self, names: Sequence[str]) -> tuple[str, ...]:
        """The features of `names` read from the records: not the reference's, and mel and mel_len (what
        it is cut from) whether asked for or not."""
        kept = tuple(n for n in names if n not in REFERENCE_FEATURES)
        return kept + tuple(n for n in ("mel", "mel_len") if n not in kept)

    def specs(self, batch_size: int) -> dict:
        """tf.TensorSpec of reference_mel [B, frames, n_mels] float32 and reference_len [B] int32."""
        return {
            "reference_mel": tf.TensorSpec([batch_size, self.frames, self.n_mels], tf.float32, name="reference_mel"),
            "reference_len": tf.TensorSpec([batch_size], tf.int32, name="reference_len"),
        }

    def add(self, ds: tf.data.Dataset, seed: int, names: Sequence[str]) -> tf.data.Dataset:
        """Batches of `stored(names)` -> batches of `names` (`with_same_clip_references`)."""
        return with_same_clip_references(ds, self.frames, seed, self.pad_value, tuple(names))


def same_clip(schema: Schema, names: Sequence[str]) -> SameClip | None:
    """A SameClip when the run's references are cut at read time (`reference.source: same_clip`) and
    `names` asks for reference_mel; None otherwise (stored other_clip references are read as they are)."""
    if not schema.references_cut_at_read_time or "reference_mel" not in names:
        return None
    return SameClip(schema.reference_frames, schema.n_mels, schema.mel.pad_value)
