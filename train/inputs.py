"""What a training run is given, checked before anything is traced or written: the shard files, the
schema they share, the validation files (never training data) and the validated config.

(The tf.data pipelines that read those files are train/input_pipeline.py.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from melshards.shards_schema import Schema
from melshards.shards_schema.shards import InputError, dir_of, listed_split
from melshards.train import input_pipeline
from melshards.train.buckets import files_by_bucket, records_in
from melshards.train.config import TrainConfig


@dataclasses.dataclass
class Inputs:
    """Everything checked before any compilation: files, the schema, the validated config."""

    files: list[str]
    val_files: list[str]
    schema: Schema
    schema_path: str  # the file `schema` was read from: the model dir records this one
    cfg: TrainConfig


def check_no_validation_shards(globs: Sequence[str], files: Sequence[str], schema: Schema) -> None:
    """Refuse training globs that match validation shards (`DIR/*.tfrecord`): each file's split as
    schema.json lists it, else as its name's prefix says."""
    val = [f for f in files if listed_split(schema, f)[0] == "val"]
    if val:
        d = dir_of(val[0])
        raise InputError(
            f"{' '.join(globs)!r} matches {len(val)} validation shard(s) (e.g. {val[0]}), which would "
            f"be trained on; pass '{d}/train-*.tfrecord' and --val '{d}/val-*.tfrecord'"
        )


def resolve_inputs(globs: Sequence[str], val_globs: Sequence[str], schema_path: str | None, cfg: TrainConfig) -> Inputs:
    """Globs, schemas (train and val must agree) and config; raises before anything is traced."""
    files = input_pipeline.expand_globs(globs)
    schema, where = input_pipeline.check_schemas(files, schema_path)
    check_no_validation_shards(globs, files, schema)
    val_files = input_pipeline.expand_globs(val_globs) if val_globs else []
    if val_files:
        input_pipeline.check_schemas(val_files, where)
    files_by_bucket([*files, *val_files], schema)  # every file's length bucket is known
    if val_files:
        by_bucket = files_by_bucket(files, schema)
        train_records = sum(records_in(fs, schema, schema.buckets[i]) for i, fs in by_bucket.items())
        input_pipeline.check_val_is_not_train(files, val_files, train_records)
    return Inputs(files, val_files, schema, where, cfg.validate(schema))
