"""Shards -> fixed-shape batches, in pure TF ops (no Python on the hot path).

Everything about the records (parse spec, dtypes, static shapes) comes from the schema. Checks
that can fail (globs, schemas beside the shards) run here in Python before anything is traced.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from train.tf_quiet import tf

from shards_schema import Schema
from shards_schema.schema import Bucket
from shards_schema.records import decode_parsed, encode_example, parse_spec
from shards_schema.shards import InputError, check_schemas, expand_globs  # noqa: F401 (the trainer's checks)
from train.config import DataConfig


def padding_record(schema: Schema, shapes: Bucket | None = None) -> bytes:
    """A serialized record with zero lengths: fills a short last validation batch, masked out by length."""
    values, shapes = {}, shapes or schema
    for f in shapes.features:
        if f.dtype == "string":
            values[f.name] = ""
        elif f.name == "mel":
            values[f.name] = np.full(f.shape, schema.mel.pad_value, np.float32)
        elif f.shape:
            values[f.name] = np.zeros(f.shape, f.dtype)
        else:
            values[f.name] = 0
    return encode_example(shapes.features, values)


def _parse_fn(schema: Schema, batch_size: int, names: Sequence[str]):
    """Vectorised parse of a batch of serialized records, keeping the features the step reads."""
    spec = parse_spec(schema)
    for name in names:
        schema.feature(name)  # a schema without it is a SchemaError here, not a KeyError in a trace

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


def train_dataset(files: Sequence[str], schema: Schema, cfg: DataConfig, names: Sequence[str],
                  steps_per_execution: int | None, batch_size: int | None = None, shard: tuple | None = None,
                  seed: int | None = None, shuffle: bool = True, repeat: bool = True) -> tf.data.Dataset:
    """Endless stream of {feature: [K, B, *shape]} for the train step ([B, ...] when K is None).

    batch_size: B (default cfg.batch_size; a replica's share under tf.distribute). shard: (how, n, i)
    keeps the i-th of n parts, by "files" or by "records". seed: overrides cfg.seed for the shuffles.
    shuffle=False reads the files and records in order; repeat=False makes one pass (the public
    `melshards.dataset` offers both; the trainer uses neither).
    """
    files = list(files)
    b = cfg.batch_size if batch_size is None else batch_size
    seed = cfg.seed if seed is None else seed
    how, n, i = shard or (None, 1, 0)
    ds = tf.data.Dataset.from_tensor_slices(files)
    if how == "files":  # before the shuffle: each part is a fixed set of files
        ds, files = ds.shard(n, i), files[i::n]
    ds = (
        # new file order every epoch (reshuffle_each_iteration), reproducible from the seed
        ds.apply(_if(shuffle, lambda d: d.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)))
        # several shards read at once: hides per-file latency (gs://) and mixes shards
        .interleave(tf.data.TFRecordDataset, cycle_length=min(cfg.cycle_length, len(files)),
                    block_length=1, num_parallel_calls=tf.data.AUTOTUNE, deterministic=cfg.deterministic)
    )
    if how == "records":  # every part reads every file and keeps every n-th record
        ds = ds.shard(n, i)
    ds = (
        # records within and across shards are mixed; serialized records keep the buffer small
        ds.apply(_if(shuffle, lambda d: d.shuffle(cfg.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)))
        # endless: the loop counts steps, not epochs
        .apply(_if(repeat, lambda d: d.repeat()))
        # static batch dim for the signature-bound step
        .batch(b, drop_remainder=True)
        # one vectorised parse per batch, decoded to the schema's static shapes
        .map(_parse_fn(schema, b, names), num_parallel_calls=tf.data.AUTOTUNE,
             deterministic=cfg.deterministic)
        .apply(_stack(steps_per_execution))
        # overlap input with the step
        .prefetch(cfg.prefetch)
    )
    return ds.with_options(_options(cfg))


def val_dataset(files: Sequence[str], schema: Schema, cfg: DataConfig,
                names: Sequence[str], shapes: Bucket | None = None) -> tf.data.Dataset:
    """One pass over the validation shards in order, every record once, batches of the train shape.

    The last batch is topped up with zero-length records (masked out by the loss) instead of
    dropped or given a smaller shape that would trace the eval step again. `shapes`: the length
    bucket the files hold (default: the largest); train_dataset takes a Bucket as its schema.
    """
    b = cfg.batch_size
    pad = tf.constant(padding_record(schema, shapes))
    schema = shapes or schema

    def top_up(serialized):
        filler = tf.fill([b - tf.shape(serialized)[0]], pad)
        return tf.ensure_shape(tf.concat([serialized, filler], 0), [b])

    ds = (
        tf.data.TFRecordDataset(list(files), num_parallel_reads=min(cfg.cycle_length, len(files)))
        # keep the remainder: validation sees every record
        .batch(b, drop_remainder=False)
        .map(top_up)
        .map(_parse_fn(schema, b, names), num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(cfg.prefetch)
    )
    return ds.with_options(_options(cfg))


def synthetic_dataset(example: dict[str, tf.Tensor], steps_per_execution: int) -> tf.data.Dataset:
    """One constant batch repeated from memory: the input-free upper bound (as in tf_cnn_benchmarks).

    `example` is one real decoded batch of [B, ...] (so the model sees realistic lengths).
    """
    stacked = {k: tf.stack([v] * steps_per_execution) for k, v in example.items()}
    return tf.data.Dataset.from_tensors(stacked).repeat()


def first_batch(files: Sequence[str], schema: Schema, cfg: DataConfig,
                names: Sequence[str]) -> dict[str, tf.Tensor]:
    """The first `batch_size` records of the shards, decoded (records repeat if there are fewer)."""
    ds = (tf.data.TFRecordDataset(list(files)).repeat()
          .batch(cfg.batch_size, drop_remainder=True).map(_parse_fn(schema, cfg.batch_size, names)))
    return next(iter(ds.take(1)))


def _options(cfg: DataConfig) -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = cfg.deterministic
    options.experimental_optimization.map_parallelization = True
    return options


def python_ops_in(ds: tf.data.Dataset) -> list[str]:
    """Names of py_function / numpy_function ops in the dataset graph and its function library."""
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    graph.ParseFromString(tf.raw_ops.DatasetToGraphV2(
        input_dataset=ds._variant_tensor, external_state_policy=0, strip_device_assignment=True).numpy())
    python = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}
    found = [n.op for n in graph.node if n.op in python]
    for fn in graph.library.function:
        found += [n.op for n in fn.node_def if n.op in python]
    return found

