"""The contract between `preprocess` (writer) and `train` (reader): schema.json and its record codec."""
from shards_schema.schema import (
    REJECTED_FILE, SCHEMA_FILE, SCHEMA_VERSION, SPLITS, STATS_FILE, AudioParams, Feature, MelParams,
    Schema, SchemaError, read_schema)
from shards_schema.vocab import Vocabulary

__all__ = [
    "REJECTED_FILE", "SCHEMA_FILE", "SCHEMA_VERSION", "SPLITS", "STATS_FILE", "AudioParams", "Feature",
    "MelParams", "Schema", "SchemaError", "Vocabulary", "read_schema",
]
