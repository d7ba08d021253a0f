"""The model dir: what a training run records there before it starts, and what it refuses.

`MODEL_DIR/{checkpoints/, tensorboard/, schema.json, train_config.json, run_summary.json}`: the
checkpoints are train/checkpoints.py's, the TensorBoard files train/summaries.py's.
"""
from __future__ import annotations

import dataclasses
import json
import posixpath

from melshards.train.tf_quiet import tf

from melshards.shards_schema import SCHEMA_FILE
from melshards.train.checkpoints import check_writable
from melshards.train.config import TrainConfig
from melshards.train.contract import current_factory
from melshards.train.errors import TrainError
from melshards.train.inputs import Inputs

CONFIG_FILE = "train_config.json"
SUMMARY_FILE = "run_summary.json"


def write_json(path: str, data: dict) -> None:
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(json.dumps(data, indent=2) + "\n")


def refuse_other_model(model_dir: str, inputs: Inputs) -> None:
    """A model dir holds one model: refuse to resume it with other shards' schema or another model."""
    from melshards.shards_schema import read_schema

    here = posixpath.join(model_dir, SCHEMA_FILE)
    if tf.io.gfile.exists(here):
        inputs.schema.check_compatible(read_schema(here), here=inputs.schema_path, there=here)
    cfg_path = posixpath.join(model_dir, CONFIG_FILE)
    if tf.io.gfile.exists(cfg_path):
        with tf.io.gfile.GFile(cfg_path) as f:
            saved = json.load(f)["model"]
        now = recorded_model_section(inputs.cfg)
        saved = dict(saved, factory=current_factory(saved.get("factory", now["factory"])))  # since plug-ins exist
        if saved != now:
            diff = sorted(k for k in set(now) | set(saved) if saved.get(k) != now.get(k))
            raise TrainError(f"{model_dir} holds a model trained with other model settings ({', '.join(diff)}); "
                             "use the same config to resume, or a new --model-dir")


def recorded_model_section(cfg: TrainConfig) -> dict:
    """The model section as train_config.json records it: with its factory, so synthesis can rebuild it."""
    return dict(cfg.model, factory=cfg.model_factory)


def prepare_model_dir(model_dir: str, inputs: Inputs) -> None:
    """Refuse another model's dir, check it is writable, then record the schema and config."""
    refuse_other_model(model_dir, inputs)
    check_writable(model_dir)
    tf.io.gfile.copy(inputs.schema_path, posixpath.join(model_dir, SCHEMA_FILE), overwrite=True)
    write_json(posixpath.join(model_dir, CONFIG_FILE),
               dict(dataclasses.asdict(inputs.cfg), model=recorded_model_section(inputs.cfg)))
