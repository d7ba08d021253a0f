"""The model dir: what a training run refuses, and what it records there once it starts.

`MODEL_DIR/{checkpoints/, tensorboard/, schema.json, train_config.json, run_summary.json}`: the
checkpoints are train/checkpoints.py's, the TensorBoard files train/summaries.py's. The train_config.json
training writes makes a directory a model dir (`melshards.shards_schema.ownership.holds_model_config`:
the file's name and content, never a folder name such as `checkpoints/`, which other trainers write
too): training writes over nothing in a directory without one, and `preprocess --output` refuses one
with it.

A run checks the dir first (`check_model_dir`: nothing written but a probe file), and records its
settings (`record_settings`: train_config.json, then schema.json) only once its model is built and its
steps compiled, before anything else is written there: a run that fails to start leaves no
settings, and the settings of a dir without a checkpoint (nothing trained) are replaced, not compared.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath

from melshards.shards_schema import REJECTED_FILE, SCHEMA_FILE, SHARD_SUFFIX, STATS_FILE
from melshards.shards_schema.ownership import MODEL_CONFIG_FILE, holds_model_config
from melshards.shards_schema.schema import PUBLISH_JOURNAL
from melshards.shards_schema.shards import dir_of
from melshards.train.checkpoints import CHECKPOINT_DIR, check_writable
from melshards.train.config import TrainConfig
from melshards.train.contract import current_factory
from melshards.train.errors import ModelDirError, TrainError
from melshards.train.inputs import Inputs
from melshards.train.summaries import TENSORBOARD_DIR
from melshards.train.tf_quiet import tf

CONFIG_FILE = MODEL_CONFIG_FILE
SUMMARY_FILE = "run_summary.json"
WRITES = (SCHEMA_FILE, CONFIG_FILE, SUMMARY_FILE, CHECKPOINT_DIR, TENSORBOARD_DIR)  # what training puts in it


def write_json(path: str, data: dict) -> None:
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(json.dumps(data, indent=2) + "\n")


def same_dir(a: str, b: str) -> bool:
    """Two spellings of one directory: local paths resolved (relative, `..`, links); URLs without trailing /."""
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def is_run_file(name: str) -> bool:
    """A file `melshards preprocess` leaves in its output: a shard, stats.json, rejected.jsonl, its journal."""
    return name.rstrip("/").endswith(SHARD_SUFFIX) or name in (STATS_FILE, REJECTED_FILE, PUBLISH_JOURNAL)


def model_dir_problem(model_dir: str, names: list[str], shard_dirs: list[str], ours: bool) -> str | None:
    """Why training must not write into model_dir (holding `names`, base names, directories with a
    trailing /; `ours`: its train_config.json is one melshards train wrote) when it reads shards from
    `shard_dirs`; None when it may. Training never writes among the shards it reads nor into a
    preprocess run, and writes over its own files only in a model dir."""
    if any(same_dir(model_dir, d) for d in shard_dirs):
        return (
            f"--model-dir {model_dir} is the directory of the shards it trains on: training would write "
            "its schema.json, checkpoints and logs among them; pass a new --model-dir"
        )
    run = [n.rstrip("/") for n in names if is_run_file(n)]
    if run:
        return (
            f"--model-dir {model_dir} holds a preprocess run or shards ({', '.join(sorted(run)[:3])}"
            f"{', ...' if len(run) > 3 else ''}): training would write among them; pass a new --model-dir"
        )
    in_the_way = sorted(n.rstrip("/") for n in names if n.rstrip("/") in WRITES)
    if in_the_way and not ours:
        return (
            f"--model-dir {model_dir} holds {', '.join(in_the_way)}, which melshards train did not write (a "
            f"model dir holds the {CONFIG_FILE} melshards train writes): they are left as they are; pass a "
            "new --model-dir, or move them away first"
        )
    return None


def check_model_dir_target(model_dir: str, inputs: Inputs) -> None:
    """ModelDirError (a usage error) when training must not write into model_dir (`model_dir_problem`);
    reads its listing and its train_config.json, so it runs before anything is built."""
    names = tf.io.gfile.listdir(model_dir) if tf.io.gfile.isdir(model_dir) else []
    ours = CONFIG_FILE in {n.rstrip("/") for n in names} and holds_model_config(model_dir)
    problem = model_dir_problem(model_dir, names, [dir_of(f) for f in [*inputs.files, *inputs.val_files]], ours)
    if problem:
        raise ModelDirError(problem)


def record_schema(source: str, model_dir: str) -> None:
    """Copy the schema the shards were read with to the model dir, unless it already holds those bytes
    (also when source is that very file, which a copy would truncate)."""
    here = posixpath.join(model_dir, SCHEMA_FILE)
    with tf.io.gfile.GFile(source, "rb") as f:
        data = f.read()
    if tf.io.gfile.exists(here):
        with tf.io.gfile.GFile(here, "rb") as f:
            if f.read() == data:
                return
    with tf.io.gfile.GFile(here, "wb") as f:
        f.write(data)


def refuse_other_model(model_dir: str, inputs: Inputs) -> None:
    """A model dir holds one model: refuse to resume its checkpoint with other shards' schema or another
    model."""
    from melshards.shards_schema import read_schema

    here = posixpath.join(model_dir, SCHEMA_FILE)
    if tf.io.gfile.exists(here):
        inputs.schema.check_compatible(read_schema(here), here=inputs.schema_path, there=here)
    cfg_path = posixpath.join(model_dir, CONFIG_FILE)
    if tf.io.gfile.exists(cfg_path):
        with tf.io.gfile.GFile(cfg_path) as f:
            saved = json.load(f)["model"]
        now = recorded_model_section(inputs.cfg)
        # a section recorded without a factory takes this run's; a renamed factory compares under its current name
        saved = dict(saved, factory=current_factory(saved.get("factory", now["factory"])))
        if saved != now:
            diff = sorted(k for k in set(now) | set(saved) if saved.get(k) != now.get(k))
            raise TrainError(
                f"{model_dir} holds a model trained with other model settings ({', '.join(diff)}); "
                "use the same config to resume, or a new --model-dir"
            )


def recorded_model_section(cfg: TrainConfig) -> dict:
    """The model section as train_config.json records it: with its factory, so synthesis can rebuild it."""
    return dict(cfg.model, factory=cfg.model_factory)


def check_model_dir(model_dir: str, inputs: Inputs, trained: bool) -> None:
    """Refuse a dir training must not write into, and, when it holds a checkpoint (`trained`), another
    model's dir; check it is writable. Writes nothing but a probe file (train/checkpoints.py)."""
    check_model_dir_target(model_dir, inputs)
    if trained:
        refuse_other_model(model_dir, inputs)
    check_writable(model_dir)


def record_settings(model_dir: str, inputs: Inputs) -> None:
    """Record the config (what makes the dir a model dir: first, before anything else is written there)
    and the schema; called once the run's model is built and its steps compiled."""
    write_json(
        posixpath.join(model_dir, CONFIG_FILE),
        dict(dataclasses.asdict(inputs.cfg), model=recorded_model_section(inputs.cfg)),
    )
    record_schema(inputs.schema_path, model_dir)
