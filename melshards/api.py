"""The public Python API: the shards as static-shaped tf.data datasets, their schema, and the mel
normalisation. Re-exported as `melshards.dataset`, `melshards.bucket_datasets`,
`melshards.audio_segments`, `melshards.read_schema` and `melshards.normalizer` (docs/api.md).

The datasets are the trainer's own chain (`melshards.train.input_pipeline.train_dataset`: interleaved shard
reads, record shuffle, one vectorised parse per batch, pure TF ops), after the trainer's checks
(`melshards.shards_schema.shards`: globs, finished runs, one compatible schema for every directory).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from melshards.shards_schema import Schema, SchemaError, read_schema
from melshards.shards_schema.shards import InputError, check_shard, check_sizes, expand_globs, listed_split, schemas_for

if TYPE_CHECKING:  # importing melshards must not import TensorFlow
    import tensorflow as tf

    from melshards.train.balance import Balancing
    from melshards.train.step import Normaliser

# The features a text-to-mel model reads (the trainer's MODEL_INPUTS): speaker_id and language_id index
# schema.speakers and schema.languages. `features=` may ask for any of the schema's (id, speaker,
# language, text are strings: fine for tf.data, not inside an XLA-compiled function).
DEFAULT_FEATURES = ("text_ids", "text_len", "speaker_id", "language_id", "mel", "mel_len")

log = logging.getLogger("melshards")

# read_schema is melshards.shards_schema.read_schema, public here
__all__ = ["audio_segments", "bucket_datasets", "dataset", "normalizer", "read_schema"]


def normalizer(schema: Schema) -> Normaliser:
    """In-graph per-bin standardisation of log-mel with the corpus statistics of `schema`.

    `norm(mel)` -> (mel - mean) / std, `norm.invert(x)` -> x * std + mean; TF ops, usable inside
    `tf.function(jit_compile=True)`. The same object the built-in model trains with.
    `norm.pitch(pitch, speaker_id=None)` and `norm.energy(energy, speaker_id=None)` standardise those
    features (shards with features.pitch / features.energy) with the global statistics, or each
    record's speaker's when `speaker_id` [B] is given; voiced pitch only (0 stays 0).
    `norm.invert_pitch` / `norm.invert_energy` undo them. A `speaker_id` outside the schema's speakers
    is a ValueError naming the range (eager), or an InvalidArgumentError saying it (in a tf.function).
    """
    from melshards.train.step import Normaliser

    if not isinstance(schema, Schema):
        raise TypeError(
            f"normalizer(schema): schema is {schema!r} ({type(schema).__name__}), not a Schema; "
            "pass melshards.read_schema(RUN_DIR)"
        )
    return Normaliser(schema, check_ids=True)


def _check_int(name: str, value, minimum: int | None) -> None:
    """An int argument (numpy ints too, not bool) of at least `minimum`; else an error naming it."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} is {value!r} ({type(value).__name__}); pass an int, e.g. {name}=4")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} is {value}; it must be at least {minimum}")


def _check_unlisted(path: str, schema: Schema) -> int:
    """Records of a shard that schema.json does not list (copied in or renamed), after `melshards inspect`'s
    check of every record against the bucket its name gives: a shard of another run fails here, named,
    rather than as an unnamed DecodeRaw error while the dataset is read."""
    result, _ = check_shard(path, schema)
    if result.problems:
        bucket = schema.bucket_of_file(path)
        raise InputError(
            f"{result.problems[0]} (schema.json does not list this file, so its records were checked "
            f"against bucket {bucket.index}, which its name gives); leave it out of the glob, or "  # type: ignore[union-attr]  # the caller found its bucket
            "re-run `melshards preprocess` to write it into the run"
        )
    return result.records


@dataclasses.dataclass(frozen=True)
class _Files:
    schema: Schema
    by_bucket: dict[int, list[str]]  # bucket index -> its files
    records: dict[int, int]  # bucket index -> records schema.json lists for those files


def _paths(patterns) -> list[str]:
    """Shard globs as strings: one str or os.PathLike, or a sequence of them; else a TypeError naming it."""
    import os
    from collections.abc import Mapping

    if isinstance(patterns, Mapping):
        raise TypeError(
            f"patterns is a {type(patterns).__name__}; pass shard globs as a str, a "
            "pathlib.Path or a list of them, e.g. ['DIR/train-*.tfrecord']"
        )
    given = [patterns] if isinstance(patterns, (str, os.PathLike)) else patterns
    try:
        given = list(given)
    except TypeError:
        given = [patterns]
    bad = [p for p in given if not isinstance(p, (str, os.PathLike))]
    if bad:
        raise TypeError(
            f"patterns holds {bad[0]!r} ({type(bad[0]).__name__}); pass shard globs as str or "
            "pathlib.Path, e.g. 'DIR/train-*.tfrecord'"
        )
    return [os.fspath(p) for p in given]


def _features(features) -> tuple[str, ...]:
    """`features` as a tuple of names: one str is one feature; else a TypeError or ValueError saying what
    to pass (the schema's check names an unknown one)."""
    from collections.abc import Mapping

    example = f"e.g. features=('mel', 'mel_len'), or leave it out for {DEFAULT_FEATURES}"
    if isinstance(features, str):
        return (features,)
    if isinstance(features, Mapping) or not hasattr(features, "__iter__"):
        raise TypeError(f"features is {features!r} ({type(features).__name__}); pass record field names, {example}")
    names = tuple(features)
    if not names:
        raise ValueError(f"features is empty, so the records would give nothing; pass the fields to keep, {example}")
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"features holds {bad[0]!r} ({type(bad[0]).__name__}); pass record field names, {example}")
    return names


def _resolve(patterns, split: str | None, schema_path) -> _Files:
    import os

    files = expand_globs(_paths(patterns))
    schema_path = None if schema_path is None else os.fspath(schema_path)
    by_file, problems = schemas_for(files, schema_path)
    if problems:
        raise SchemaError(problems[0].what)
    check_sizes(by_file)  # a shard cut short, even at a record boundary: before anything is read
    schema = by_file[files[0]]
    if split is not None:  # each file by its own directory's schema.json (their contracts agree)
        files = [f for f in files if listed_split(by_file[f], f)[0] == split]
        if not files:
            raise InputError(
                f"{' '.join(_paths(patterns))!r} matches no {split!r} shard; splits are named by the file prefix, "
                f"e.g. DIR/{split}-*.tfrecord"
            )
    by_bucket: dict[int, list[str]] = {}
    records: dict[int, int] = {}
    for f in files:
        own = by_file[f]
        bucket = own.bucket_of_file(f)
        if bucket is None:
            raise InputError(
                f"{f}: schema.json does not list it and its name gives no bucket "
                "(split-bNN-SSSSS-of-CCCCC.tfrecord), so its shapes are unknown"
            )
        by_bucket.setdefault(bucket.index, []).append(f)
        listed = listed_split(own, f)[1]
        records[bucket.index] = records.get(bucket.index, 0) + (
            listed if listed is not None else _check_unlisted(f, own)
        )
    return _Files(schema, by_bucket, records)


def _bucket_dataset(
    files: list[str],
    shapes,
    batch_size: int,
    shuffle: bool,
    repeat: bool,
    seed: int,
    features: Sequence[str],
    shuffle_buffer: int,
    cycle_length: int,
    deterministic: bool,
    balance,
    schema=None,
) -> tf.data.Dataset:
    from melshards.train.config import DataConfig
    from melshards.train.input_pipeline import train_dataset
    from melshards.train.references import same_clip

    cfg = DataConfig(
        batch_size=batch_size,
        shuffle_buffer=shuffle_buffer,
        cycle_length=cycle_length,
        seed=seed,
        deterministic=deterministic,
    )
    names = _features(features)
    # a same_clip run's references: cut from each record's own mel in-graph (melshards.train.references), as
    # the trainer cuts them, seeded by (seed, batch number)
    cut = None if schema is None else same_clip(schema, names)
    return train_dataset(
        files, shapes, cfg, names, None, shuffle=shuffle, repeat=repeat, balance=balance, same_clip=cut
    )


def _check_balance(balance: str, balance_alpha: float) -> None:
    """A `balance` of the trainer's choices and an alpha in [0, 1]; else a ValueError naming the argument."""
    import numbers

    from melshards.train.config import BALANCES

    if balance not in BALANCES:
        raise ValueError(f"balance is {balance!r}; pass one of {', '.join(BALANCES)}")
    if isinstance(balance_alpha, bool) or not isinstance(balance_alpha, numbers.Real) or not 0 <= balance_alpha <= 1:
        raise ValueError(
            f"balance_alpha is {balance_alpha!r}; pass a number from 0 (every group equally often) "
            "to 1 (the corpus as it is)"
        )


def bucket_datasets(
    patterns: str | Sequence[str],
    batch_size: int,
    *,
    split: str | None = None,
    shuffle: bool = True,
    repeat: bool = True,
    seed: int = 0,
    features: Sequence[str] = DEFAULT_FEATURES,
    shuffle_buffer: int = 64,
    cycle_length: int = 4,
    deterministic: bool = True,
    schema_path: str | None = None,
    balance: str = "none",
    balance_alpha: float = 0.0,
) -> dict[int, tf.data.Dataset]:
    """One dataset per length bucket: {bucket index: dataset of {feature: [batch_size, *bucket shape]}}.

    Every element of one bucket's dataset has the same static shapes (`element_spec` is fully
    defined), so a `tf.function` over it traces once. Arguments as for `dataset`.
    """
    return _datasets(
        patterns,
        batch_size,
        split,
        shuffle,
        repeat,
        seed,
        features,
        shuffle_buffer,
        cycle_length,
        deterministic,
        schema_path,
        balance,
        balance_alpha,
    )[2]


def _datasets(
    patterns,
    batch_size,
    split,
    shuffle,
    repeat,
    seed,
    features,
    shuffle_buffer,
    cycle_length,
    deterministic,
    schema_path,
    balance,
    balance_alpha,
    only: int | None = None,
) -> tuple[_Files, Balancing | None, dict[int, tf.data.Dataset]]:
    for name, value, minimum in (
        ("batch_size", batch_size, 1),
        ("seed", seed, None),
        ("shuffle_buffer", shuffle_buffer, 1),
        ("cycle_length", cycle_length, 1),
    ):
        _check_int(name, value, minimum)
    _check_balance(balance, balance_alpha)
    _features(features)
    from melshards.train.balance import balancing

    found = _resolve(patterns, split, schema_path)
    _check_batch(found, batch_size, only)
    balanced = balancing(found.schema, balance, float(balance_alpha))
    return (
        found,
        balanced,
        {
            i: _bucket_dataset(
                files,
                found.schema.buckets[i],
                batch_size,
                shuffle,
                repeat,
                seed,
                features,
                shuffle_buffer,
                cycle_length,
                deterministic,
                balanced,
                found.schema,
            )
            for i, files in sorted(found.by_bucket.items())
            if only is None or i == only
        },
    )


def _check_batch(found: _Files, batch_size: int, only: int | None) -> None:
    """The trainer's refusal (`melshards.train.buckets.check_batch_fits`) of a batch larger than the records
    of a bucket read (`only`, else every bucket the patterns hold): shuffled and repeated, its batches
    would hold records twice; read once, it would give no batch at all."""
    from melshards.train.buckets import check_batch_fits

    if only is not None and only not in found.records:
        return  # `dataset` names the buckets the patterns hold
    records = [found.records.get(b.index, 0) if only in (None, b.index) else 0 for b in found.schema.buckets]
    check_batch_fits(records, batch_size, name="batch_size", setting="batch_size={}", what="records")


def dataset(
    patterns: str | Sequence[str],
    batch_size: int,
    *,
    split: str | None = None,
    shuffle: bool = True,
    repeat: bool = True,
    seed: int = 0,
    bucket: int | None = None,
    features: Sequence[str] = DEFAULT_FEATURES,
    shuffle_buffer: int = 64,
    cycle_length: int = 4,
    deterministic: bool = True,
    schema_path: str | None = None,
    balance: str = "none",
    balance_alpha: float = 0.0,
) -> tf.data.Dataset:
    """The shards as a `tf.data.Dataset` of dict batches {feature: tensor}, as the trainer reads them.

    patterns: shard globs (str or os.PathLike, or a sequence of them), local or gs:// (e.g.
      "shards/train-*.tfrecord"); split: keep only the
      "train" or "val" shards among them. The directories' schema.json must agree, and each run must
      be finished (else SchemaError / InputError, before anything is read). A shard schema.json does
      not list is read once and checked against its bucket's shapes (InputError naming it).
    batch_size: records per batch; the last partial batch is dropped, so the batch dimension is
      static too. Padding frames hold log(log_floor); `mel_len` / `text_len` say what is real. A
      batch_size larger than the records of a bucket read is refused, as the trainer refuses it
      (BatchError, a ValueError naming the counts and the largest batch that fits): a batch never
      holds a record twice.
    shuffle: shuffle the file order and records (a `shuffle_buffer` of serialized records), from
      `seed`; False reads in a fixed order. repeat: endless (use `steps_per_epoch` with
      `model.fit`); False makes one pass.
    bucket: only this length bucket (its static shapes). With None and one bucket, the shapes are
      static; with several, batches of every bucket are interleaved (drawn in proportion to their
      records, or with `balance` to the records each keeps, from `seed`) and the element_spec leaves the padded lengths undefined: each batch
      still has one bucket's static shapes, and a jit-compiled function compiles once per bucket
      shape (docs/api.md). `bucket_datasets` gives one dataset per bucket.
    features: the record fields to keep (schema.features names; one str is one field); log-mel is not normalised (see
      `normalizer`). By default those a text-to-mel model reads, speaker_id and language_id included.
    balance: "speaker" or "language" draws each group's records in proportion to its clips **
      balance_alpha (0 every group equally often, 1 the corpus as it is), as `data.balance` does in
      the trainer (docs/train.md); "none" keeps every record.
    """
    import tensorflow as tf

    found, balanced, per_bucket = _datasets(
        patterns,
        batch_size,
        split,
        shuffle,
        repeat,
        seed,
        features,
        shuffle_buffer,
        cycle_length,
        deterministic,
        schema_path,
        balance,
        balance_alpha,
        bucket,
    )
    if bucket is not None:
        if bucket not in per_bucket:
            raise InputError(f"bucket {bucket}: {patterns!r} holds shards of bucket(s) {sorted(found.by_bucket)} only")
        return per_bucket[bucket]
    from melshards.train.balance import bucket_weights, describe

    # each bucket in proportion to the records it gives the stream: with `balance`, what its filter keeps
    drawn = bucket_weights({i: found.records[i] for i in per_bucket}, balanced)
    if balance != "none":  # the shares the buckets as drawn give
        log.info(
            "%s",
            describe(
                found.schema, balance, float(balance_alpha), [drawn.get(b.index, 0.0) for b in found.schema.buckets]
            ),
        )
    if len(per_bucket) == 1:
        return next(iter(per_bucket.values()))
    weights = [drawn[i] for i in per_bucket]
    total = sum(weights)
    return tf.data.Dataset.sample_from_datasets(
        list(per_bucket.values()), weights=[w / total for w in weights], seed=seed, stop_on_empty_dataset=False
    )


def audio_segments(
    patterns: str | Sequence[str],
    segment_frames: int,
    batch_size: int,
    *,
    split: str | None = None,
    seed: int = 0,
    shuffle: bool = True,
    repeat: bool = True,
    shuffle_buffer: int = 64,
    cycle_length: int = 4,
    deterministic: bool = True,
    schema_path: str | None = None,
) -> tf.data.Dataset:
    """Random fixed-length (audio, mel) segments of the shards, for vocoder training (docs/api.md,
    Vocoder segments). The shards must hold audio (`features.audio: true` in the preprocess config).

    Each record gives one segment of `segment_frames` mel frames, its start drawn uniformly over the
    record's valid frames; its audio is the `segment_frames * hop_length` samples those frames are
    centred on. Batches: {"mel" [B, S, n_mels] (not normalised), "audio" float32 [B, S * hop] in
    [-1, 1], "mask" bool [B, S] (False past the end of a record shorter than the segment, which is
    padded), "start" int32 [B], "speaker_id" int32 [B], and "pitch", "energy" [B, S] where the shards
    hold them}. Every shape is static, whatever the buckets.

    seed: the record order and the crops; the same seed gives the same segments, and the draws are
    part of the iterator's state: `tf.train.Checkpoint(iterator=it)` resumes exactly where it was.
    repeat=False makes one pass (up to batch_size - 1 records of each bucket are dropped).
    Other arguments as for `dataset` (a batch_size larger than a bucket's records is refused).
    """
    from melshards.train.config import DataConfig
    from melshards.train.segments import segment_dataset

    for name, value, minimum in (
        ("segment_frames", segment_frames, 1),
        ("batch_size", batch_size, 1),
        ("seed", seed, None),
        ("shuffle_buffer", shuffle_buffer, 1),
        ("cycle_length", cycle_length, 1),
    ):
        _check_int(name, value, minimum)
    found = _resolve(patterns, split, schema_path)
    _check_batch(found, batch_size, None)
    cfg = DataConfig(
        batch_size=batch_size,
        shuffle_buffer=shuffle_buffer,
        cycle_length=cycle_length,
        seed=seed,
        deterministic=deterministic,
    )
    return segment_dataset(
        found.by_bucket, found.records, found.schema, segment_frames, batch_size, cfg, shuffle, repeat
    )
