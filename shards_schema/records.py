"""Record codec derived from the schema: encode (writer) and parse spec + decode (readers).

Storage choices were measured (docs/performance.md, benchmarks/record_encoding.py): mel as raw
little-endian float16 bytes parsed with `tf.io.decode_raw`, text ids as raw int16, no compression.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from shards_schema.schema import Feature, Schema, SchemaError

RAW_DTYPES = {"raw_float16": np.dtype("<f2"), "raw_int16": np.dtype("<i2")}


def encode_example(features: Sequence[Feature], values: Mapping[str, Any]) -> bytes:
    """Serialize one clip (already padded to the features' shapes) as a tf.train.Example."""
    from tensorflow.core.example import example_pb2, feature_pb2

    missing = [f.name for f in features if f.name not in values]
    if missing:
        raise SchemaError(f"record is missing features {missing}")
    feats = {}
    for f in features:
        v = values[f.name]
        if f.storage == "bytes":
            raw = v.encode("utf-8") if isinstance(v, str) else bytes(v)
            feats[f.name] = feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[raw]))
        elif f.storage == "int64":
            feats[f.name] = feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[int(v)]))
        elif f.storage in RAW_DTYPES:
            arr = np.asarray(v)
            if arr.shape != f.shape:
                raise SchemaError(f"feature {f.name} has shape {arr.shape}, schema says {f.shape}")
            raw = arr.astype(RAW_DTYPES[f.storage]).tobytes()
            feats[f.name] = feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[raw]))
        else:
            raise SchemaError(f"feature {f.name}: unknown storage {f.storage!r}")
    return example_pb2.Example(features=feature_pb2.Features(feature=feats)).SerializeToString()


def parse_spec(schema: Schema) -> dict[str, Any]:
    """`tf.io.parse_example` spec: every feature is a fixed-length scalar entry."""
    import tensorflow as tf

    spec = {}
    for f in schema.features:
        dtype = tf.int64 if f.storage == "int64" else tf.string
        spec[f.name] = tf.io.FixedLenFeature([], dtype)
    return spec


def _decode(f: Feature, column, batch_size: int | None):
    import tensorflow as tf

    lead = [] if batch_size is None else [batch_size]
    if f.storage == "bytes":
        return column
    if f.storage == "int64":
        return tf.cast(column, tf.int32)
    raw_dtype = tf.float16 if f.storage == "raw_float16" else tf.int16
    out = tf.io.decode_raw(column, raw_dtype, little_endian=True)
    out = tf.reshape(out, lead + list(f.shape))
    return tf.cast(out, tf.as_dtype(f.dtype))


def decode_parsed(schema: Schema, parsed: Mapping[str, Any], batch_size: int | None) -> dict[str, Any]:
    """Turn `parse_example` output into tensors of the schema's static shapes (pure TF ops)."""
    return {f.name: _decode(f, parsed[f.name], batch_size) for f in schema.features}


def tensor_specs(schema: Schema, batch_size: int, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """tf.TensorSpec per feature with the batch dim fixed: the trainer's input_signature."""
    import tensorflow as tf

    return {f.name: tf.TensorSpec([batch_size, *f.shape], tf.as_dtype(f.dtype), name=f.name)
            for f in schema.features if names is None or f.name in names}
