"""The contract between `preprocess` (writer) and `train` (reader): schema.json and its record codec."""

from melshards.shards_schema.schema import (
    REJECTED_FILE,
    SCHEMA_FILE,
    SCHEMA_VERSION,
    SHARD_SUFFIX,
    SPLITS,
    STATS_FILE,
    AudioParams,
    Bucket,
    Feature,
    Language,
    MelParams,
    Schema,
    SchemaError,
    Speaker,
    parse_shard_name,
    read_schema,
    shard_name,
)
from melshards.shards_schema.vocab import Vocabulary

__all__ = [
    "REJECTED_FILE",
    "SCHEMA_FILE",
    "SCHEMA_VERSION",
    "SHARD_SUFFIX",
    "SPLITS",
    "STATS_FILE",
    "AudioParams",
    "Bucket",
    "Feature",
    "Language",
    "MelParams",
    "Schema",
    "SchemaError",
    "Speaker",
    "Vocabulary",
    "parse_shard_name",
    "read_schema",
    "shard_name",
]
