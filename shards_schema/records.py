"""Record codec derived from the schema: encode + frame (writer) and parse spec + decode (readers).

Storage: mel as raw little-endian float16 bytes parsed with `tf.io.decode_raw`, text ids as raw int16,
no compression: the layout that parses fastest, at half the bytes of float32
(docs/performance.md#record-encoding).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import google_crc32c
import numpy as np

from melshards.shards_schema.schema import Bucket, Feature, Schema, SchemaError

# The readers take a Bucket (its own static shapes) or a Schema (its largest bucket: the one shape
# of a one-bucket run); both carry `features`.
Shapes = Schema | Bucket

RAW_DTYPES: dict[str, np.dtype] = {
    "raw_float16": np.dtype("<f2"),
    "raw_int16": np.dtype("<i2"),
    "raw_float32": np.dtype("<f4"),  # extractor outputs declared float32 / int32 (`shards_schema.extracted`)
    "raw_int32": np.dtype("<i4"),
}


# -- writing, without TensorFlow ---------------------------------------------------------------
# The Beam job must not import TensorFlow (seconds in every worker process: docs/performance.md#preprocess-start-up)
# just to build tf.train.Example bytes. The wire format of the three messages involved is small and frozen:
#   Example{features=1: Features}  Features{feature=1: map<string, Feature>}
#   Feature{bytes_list=1 | int64_list=3}  BytesList{value=1: repeated bytes}
#   Int64List{value=1: repeated int64, packed}
# Map entries are written in the order of protobuf's deterministic serialisation (upb, its default
# backend: bytewise, a key before its own prefix), so the tests can compare bytes with
# tf.train.Example.SerializeToString(deterministic=True). Readers do not depend on the order.


_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:  # most keys, lengths and ids
        return _ONE_BYTE[n]
    n &= (1 << 64) - 1  # int64 on the wire: negatives as their 64-bit two's complement
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _tag(number, len(payload)) + payload


@functools.lru_cache(maxsize=4096)  # a run's records repeat their fields' lengths (one shape per bucket)
def _tag(number: int, length: int) -> bytes:
    """A length-delimited field's key and length, before its payload."""
    return _varint(number << 3 | 2) + _varint(length)


def _feature_payload(f: Feature, v: Any) -> tuple[int, bytes | memoryview]:
    """(the Feature's field: 1 bytes_list, 3 int64_list; the one value's bytes inside the list).
    An array's bytes are a view of it, not a copy: the Example is joined once (`encode_example`)."""
    if f.storage == "bytes":
        return 1, v.encode("utf-8") if isinstance(v, str) else bytes(v)
    if f.storage == "int64":
        return 3, _varint(int(v))
    if f.storage in RAW_DTYPES:
        arr = np.asarray(v)
        if arr.shape != f.shape:
            raise SchemaError(f"feature {f.name} has shape {arr.shape}, schema says {f.shape}")
        return 1, memoryview(np.ascontiguousarray(arr.astype(RAW_DTYPES[f.storage], copy=False))).cast("B")  # type: ignore[arg-type]  # numpy declares an array's __buffer__ for Python >= 3.12 only
    raise SchemaError(f"feature {f.name}: unknown storage {f.storage!r}")


def _map_key_order(name: str) -> bytes:
    # 0xFF never occurs in UTF-8, so "mel_len" sorts before "mel" as in upb's map sorter
    return name.encode("utf-8") + b"\xff"


def encode_example(features: Sequence[Feature], values: Mapping[str, Any]) -> bytes:
    """Serialize one clip (already padded to the features' shapes) as tf.train.Example bytes.

    Every message's length is known from its parts, so the keys and lengths are written in front of
    the values and the whole is joined once: a mel's bytes are copied once, not once per nesting level."""
    missing = [f.name for f in features if f.name not in values]
    if missing:
        raise SchemaError(f"record is missing features {missing}")
    parts: list = []
    total = 0
    for f in sorted(features, key=lambda f: _map_key_order(f.name)):
        kind, value = _feature_payload(f, values[f.name])
        value_list = _tag(1, len(value))  # a BytesList / Int64List of the one value
        feature = _tag(kind, len(value_list) + len(value))
        feature_len = len(feature) + len(value_list) + len(value)
        key = _field(1, f.name.encode("utf-8"))
        feature_tag = _tag(2, feature_len)
        entry_len = len(key) + len(feature_tag) + feature_len
        entry = _tag(1, entry_len)  # one entry of Features' map
        parts += [entry, key, feature_tag, feature, value_list, value]
        total += len(entry) + entry_len
    return b"".join([_tag(1, total)] + parts)


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One TFRecord: length, masked CRC32C of the length, data, masked CRC32C of the data.

    A TFRecord file is these frames back to back, so files can be concatenated into shards.
    """
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked_crc(length)) + data + struct.pack("<I", _masked_crc(data))


# -- reading (TensorFlow, imported by the functions that need it) -------------------------------
def parse_spec(schema: Shapes, names: Sequence[str] | None = None) -> dict[str, Any]:
    """`tf.io.parse_example` spec: every feature is a fixed-length scalar entry (the same for every
    bucket: shapes live inside the raw bytes, `decode_parsed` applies them). `names`: only these
    features (the parser then copies no other's bytes: a model without audio does not pay for it)."""
    import tensorflow as tf

    spec = {}
    for f in schema.features:
        if names is not None and f.name not in names:
            continue
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
    raw_dtype = tf.as_dtype(RAW_DTYPES[f.storage].name)
    out = tf.io.decode_raw(column, raw_dtype, little_endian=True)
    out = tf.reshape(out, lead + list(f.shape))
    return tf.cast(out, tf.as_dtype(f.dtype))


def decode_parsed(schema: Shapes, parsed: Mapping[str, Any], batch_size: int | None) -> dict[str, Any]:
    """Turn `parse_example` output into tensors of the schema's static shapes (pure TF ops); the
    features `parsed` holds (`parse_spec`'s names)."""
    return {f.name: _decode(f, parsed[f.name], batch_size) for f in schema.features if f.name in parsed}


def tensor_specs(schema: Shapes, batch_size: int, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """tf.TensorSpec per feature with the batch dim fixed: the trainer's input_signature."""
    import tensorflow as tf

    return {
        f.name: tf.TensorSpec([batch_size, *f.shape], tf.as_dtype(f.dtype), name=f.name)
        for f in schema.features
        if names is None or f.name in names
    }
