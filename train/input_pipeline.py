"""Shards -> fixed-shape batches, in pure TF ops (no Python on the hot path).

Everything about the records (parse spec, dtypes, static shapes) comes from the schema. Checks
that can fail (globs, schemas beside the shards) run here in Python before anything is traced.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import numpy as np

from melshards.shards_schema import Schema
from melshards.shards_schema.records import decode_parsed, encode_example, parse_spec
from melshards.shards_schema.schema import Bucket
from melshards.shards_schema.shards import InputError, check_schemas, dir_of, expand_globs  # noqa: F401 (the trainer's checks)
from melshards.train.balance import Balancing, sampler
from melshards.train.config import DataConfig
from melshards.train.references import SameClip
from melshards.train.tf_quiet import tf

log = logging.getLogger("melshards.train")


# Training records whose ids are compared with --val's when the two come from different directories:
# about 2 GB of LJSpeech-sized records, one read of the id feature each. Above it the check is skipped
# (with a warning): validation shards from another preprocessing run are then the user's to vouch for.
ID_CHECK_MAX_RECORDS = 20_000


def _same_path(path: str) -> str:
    return path if "://" in path else os.path.realpath(path)


def record_ids(files: Sequence[str]) -> set[bytes]:
    """The `id` feature of every record in `files` (the other features are not decoded)."""
    spec = {"id": tf.io.FixedLenFeature([], tf.string)}
    ds = (
        tf.data.TFRecordDataset(list(files), num_parallel_reads=min(8, len(files)))
        .batch(1024)
        .map(lambda s: tf.io.parse_example(s, spec)["id"])
    )
    return {x for batch in ds.as_numpy_iterator() for x in batch.tolist()}


def check_val_is_not_train(files: Sequence[str], val_files: Sequence[str], train_records: int | None = None) -> None:
    """Refuse --val shards that are training shards, or hold records with the training records' ids.

    The same file in both: refused from the paths alone. Shards in the same directory: one
    preprocessing run, which puts each clip in one split, so nothing is read. Otherwise the `id`
    feature of the records is compared (a read of both sets) when the training set holds at most
    ID_CHECK_MAX_RECORDS records (`train_records`, from schema.json; None: read).
    """
    train = {_same_path(f): f for f in files}
    both = [f for f in val_files if _same_path(f) in train]
    if both:
        raise InputError(
            f"--val matches {len(both)} of the training shards (e.g. {both[0]}); validating on the "
            "training data measures nothing. Pass the validation shards, e.g. 'DIR/val-*.tfrecord'"
        )
    train_dirs = {dir_of(p) for p in train}
    other = [f for f in val_files if dir_of(_same_path(f)) not in train_dirs]
    if not other:
        return
    if train_records is not None and train_records > ID_CHECK_MAX_RECORDS:
        log.warning(
            "--val shards from another directory than the training shards: their record ids were not "
            "compared with the %d training records (more than the %d compared before training); make "
            "sure they hold other clips",
            train_records,
            ID_CHECK_MAX_RECORDS,
        )
        return
    common = record_ids(other) & record_ids(list(files))
    if common:
        example = sorted(common)[0].decode("utf-8", "replace")
        where = other[0] if len(other) == 1 else f"{len(other)} files such as {other[0]}"
        raise InputError(
            f"--val shards hold {len(common)} records with the ids of training records (e.g. "
            f"{example!r}, in {where})"
            "; validating on the training data measures nothing. Pass validation shards of other "
            "clips, e.g. the val-*.tfrecord of the same preprocessing run"
        )


def padding_record(schema: Schema, bucket: Bucket | None = None) -> bytes:
    """A serialized record with zero lengths in the bucket's shapes (None: a one-bucket schema's, i.e.
    `schema.largest`): fills a short last validation batch, masked out by length."""
    values: dict[str, object] = {}
    bucket = bucket or schema.largest
    for f in bucket.features:
        if f.dtype == "string":
            values[f.name] = ""
        elif f.name == "mel":
            values[f.name] = np.full(f.shape, schema.mel.pad_value, np.float32)
        elif f.shape:
            values[f.name] = np.zeros(f.shape, f.dtype)
        else:
            values[f.name] = 0
    return encode_example(bucket.features, values)


def _parse_fn(schema: Schema | Bucket, batch_size: int, names: Sequence[str]):
    """Vectorised parse of a batch of serialized records, keeping the features the step reads."""
    for name in names:
        schema.feature(name)  # a schema without it is a SchemaError here, not a KeyError in a trace
    spec = parse_spec(schema, names)  # the others' bytes are not copied out of the records

    @tf.autograph.experimental.do_not_convert  # no tensor-dependent Python control flow: nothing to convert
    def parse(serialized):
        decoded = decode_parsed(schema, tf.io.parse_example(serialized, spec), batch_size)
        return {name: decoded[name] for name in names}

    return parse


def _stack(steps_per_execution: int | None):
    """[B, ...] batches -> [K, B, ...]: one compiled call consumes K steps' worth (None: no stacking)."""

    def stack(ds: tf.data.Dataset) -> tf.data.Dataset:
        return ds if steps_per_execution is None else ds.batch(steps_per_execution, drop_remainder=True)

    return stack


def _if(flag: bool, transform):
    return transform if flag else (lambda ds: ds)


# The layout of the iterator state train_dataset saves: a checkpoint's input position restores only into the
# chain that wrote it. A checkpoint records it with its data settings (train/checkpoints.py data_settings), so
# one of another layout resumes its weights with a fresh input instead of failing to restore. Raise it with
# every change to the chain (its stages, their order, what they buffer); checkpoints without it are layout 1.
STATE_LAYOUT = 2


def train_dataset(
    files: Sequence[str],
    schema: Schema | Bucket,
    cfg: DataConfig,
    names: Sequence[str],
    steps_per_execution: int | None,
    batch_size: int | None = None,
    shard: tuple | None = None,
    seed: int | None = None,
    shuffle: bool = True,
    repeat: bool = True,
    balance: Balancing | None = None,
    same_clip: SameClip | None = None,
) -> tf.data.Dataset:
    """Endless stream of {feature: [K, B, *shape]} for the train step ([B, ...] when K is None).

    batch_size: B (default cfg.batch_size; a replica's share under tf.distribute). shard: (how, n, i)
    keeps the i-th of n parts, by "files" or by "records". seed: overrides cfg.seed for the shuffles
    and the balancing draws. shuffle=False reads the files and records in order; repeat=False makes
    one pass (the public `melshards.dataset` offers both; the trainer uses neither). balance: keep
    records by speaker or language (melshards.train.balance.balancing of the schema; None keeps all).
    same_clip: cut the references of a same_clip run from each batch's mels after the parse
    (`melshards.train.references.same_clip`; the k-th batch with the seed (seed, k), resumable).
    """
    files = list(files)
    b = cfg.batch_size if batch_size is None else batch_size
    seed = cfg.seed if seed is None else seed
    how, n, i = shard or (None, 1, 0)
    ds = tf.data.Dataset.from_tensor_slices(files)
    if how == "files":  # before the shuffle: each part is a fixed set of files
        ds, files = ds.shard(n, i), files[i::n]

    @tf.autograph.experimental.do_not_convert
    def read(path):
        records = tf.data.TFRecordDataset(path)
        # every part reads every file and keeps every n-th record of each file: sharded before the
        # interleave, so the parts are disjoint and complete whatever order it yields (deterministic: false)
        return records.shard(n, i) if how == "records" else records

    ds = (
        # new file order every epoch (reshuffle_each_iteration), reproducible from the seed
        ds.apply(_if(shuffle, lambda d: d.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)))
        # several shards read at once: hides per-file latency (gs://) and mixes shards
        .interleave(
            read,
            cycle_length=min(cfg.cycle_length, len(files)),
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=cfg.deterministic,
        )
    )
    ds = (
        # records within and across shards are mixed; serialized records keep the buffer small
        ds.apply(_if(shuffle, lambda d: d.shuffle(cfg.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)))
        # endless: the loop counts steps, not epochs
        .apply(_if(repeat, lambda d: d.repeat()))
        # temperature sampling of speakers or languages; after the repeat, where an epoch that keeps
        # no record of a small bucket cannot end the stream (repeat() stops at an empty epoch)
        .apply(_if(balance is not None, lambda d: d.apply(sampler(balance, seed, cfg.deterministic))))  # type: ignore[arg-type]  # applied only when balance is not None
        # static batch dim for the signature-bound step
        .batch(b, drop_remainder=True)
        # one vectorised parse per batch, decoded to the schema's static shapes. Sequential, so it runs
        # in prefetch's thread, ahead of the step: the parsed batches a checkpoint saves are prefetch's
        # buffer alone (a parallel map keeps each of its calls' results in the iterator state as well)
        .map(_parse_fn(schema, b, _stored(names, same_clip)))
        # same_clip references: a seeded slice of each record's own mel, per batch (before the stacking)
        .apply(_if(same_clip is not None, lambda d: same_clip.add(d, seed, names)))  # type: ignore[union-attr]  # applied only when same_clip is not None
        .apply(_stack(steps_per_execution))
        # overlap input with the step: data.prefetch calls' worth parsed ahead, in one background thread
        .prefetch(cfg.prefetch)
    )
    return ds.with_options(_options(cfg))


def _stored(names: Sequence[str], same_clip: SameClip | None) -> tuple[str, ...]:
    """The features parsed from the records for a batch of `names`."""
    return tuple(names) if same_clip is None else same_clip.stored(names)


def val_dataset(
    files: Sequence[str],
    schema: Schema,
    cfg: DataConfig,
    names: Sequence[str],
    bucket: Bucket | None = None,
    same_clip: SameClip | None = None,
) -> tf.data.Dataset:
    """One pass over the validation shards in order, every record once, batches of the train shape.

    The last batch is topped up with zero-length records (masked out by the loss) instead of
    dropped or given a smaller shape that would trace the eval step again. `bucket`: the length
    bucket the files hold (None: a one-bucket schema's, `schema.largest`); train_dataset takes a
    Bucket as its schema. same_clip: as for train_dataset (every pass cuts the same slices, seed cfg.seed).
    """
    b = cfg.batch_size
    bucket = bucket or schema.largest
    pad = tf.constant(padding_record(schema, bucket))

    @tf.autograph.experimental.do_not_convert
    def top_up(serialized):
        filler = tf.fill([b - tf.shape(serialized)[0]], pad)
        return tf.ensure_shape(tf.concat([serialized, filler], 0), [b])

    ds = (
        tf.data.TFRecordDataset(list(files), num_parallel_reads=min(cfg.cycle_length, len(files)))
        # keep the remainder: validation sees every record
        .batch(b, drop_remainder=False)
        .map(top_up)
        .map(_parse_fn(bucket, b, _stored(names, same_clip)), num_parallel_calls=tf.data.AUTOTUNE)
        .apply(_if(same_clip is not None, lambda d: same_clip.add(d, cfg.seed, names)))  # type: ignore[union-attr]  # applied only when same_clip is not None
        .prefetch(cfg.prefetch)
    )
    return ds.with_options(_options(cfg))


def synthetic_dataset(example: dict[str, tf.Tensor], steps_per_execution: int) -> tf.data.Dataset:
    """One constant batch repeated from memory: the input-free upper bound (as in tf_cnn_benchmarks).

    `example` is one real decoded batch of [B, ...] (so the model sees realistic lengths).
    """
    stacked = {k: tf.stack([v] * steps_per_execution) for k, v in example.items()}
    return tf.data.Dataset.from_tensors(stacked).repeat()


def first_batch(
    files: Sequence[str],
    schema: Schema | Bucket,
    cfg: DataConfig,
    names: Sequence[str],
    same_clip: SameClip | None = None,
) -> dict[str, tf.Tensor]:
    """The first `batch_size` records of the shards, decoded (records repeat if there are fewer);
    same_clip: with the references train_dataset would cut."""
    ds = (
        tf.data.TFRecordDataset(list(files))
        .repeat()
        .batch(cfg.batch_size, drop_remainder=True)
        .map(_parse_fn(schema, cfg.batch_size, _stored(names, same_clip)))
        .apply(_if(same_clip is not None, lambda d: same_clip.add(d, cfg.seed, names)))  # type: ignore[union-attr]  # applied only when same_clip is not None
    )
    return next(iter(ds.take(1)))


def _options(cfg: DataConfig) -> tf.data.Options:
    """Deterministic as configured; a map without num_parallel_calls stays sequential and a batch after a
    map stays a batch (TensorFlow would rewrite them into parallel calls, whose pending results the
    iterator state holds: parsed float32 batches beside prefetch's, in every checkpoint)."""
    options = tf.data.Options()
    options.deterministic = cfg.deterministic
    options.experimental_optimization.map_parallelization = False
    options.experimental_optimization.map_and_batch_fusion = False
    return options


def python_ops_in(ds: tf.data.Dataset) -> list[str]:
    """Names of py_function / numpy_function ops in the dataset graph and its function library."""
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    graph.ParseFromString(
        tf.raw_ops.DatasetToGraphV2(
            input_dataset=ds._variant_tensor, external_state_policy=0, strip_device_assignment=True
        ).numpy()
    )
    python = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}
    found = [n.op for n in graph.node if n.op in python]
    for fn in graph.library.function:
        found += [n.op for n in fn.node_def if n.op in python]
    return found
