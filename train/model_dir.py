"""The model dir: what a training run records there before it starts, and what it refuses.

`MODEL_DIR/{checkpoints/, tensorboard/, schema.json, train_config.json, run_summary.json}`: the
checkpoints are train/checkpoints.py's, the TensorBoard files train/summaries.py's. `train_config.json`
or `checkpoints/` make a directory a model dir (`melshards.shards_schema.ownership.MODEL_DIR_MARKS`):
training writes over nothing in a directory without them, and `preprocess --output` refuses one with them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath

from melshards.shards_schema import REJECTED_FILE, SCHEMA_FILE, SHARD_SUFFIX, STATS_FILE
from melshards.shards_schema.ownership import MODEL_CONFIG_FILE, model_dir_marks
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


def model_dir_problem(model_dir: str, names: list[str], shard_dirs: list[str]) -> str | None:
    """Why training must not write into model_dir (holding `names`, base names, directories with a
    trailing /) when it reads shards from `shard_dirs`; None when it may. Training never writes among
    the shards it reads nor into a preprocess run, and writes over its own files only in a model dir."""
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
    if in_the_way and not model_dir_marks(names):
        return (
            f"--model-dir {model_dir} holds {', '.join(in_the_way)}, which melshards train did not write (a "
            f"model dir holds {CONFIG_FILE} or {CHECKPOINT_DIR}/): they are left as they are; pass a new "
            "--model-dir, or move them away first"
        )
    return None


def check_model_dir_target(model_dir: str, inputs: Inputs) -> None:
    """ModelDirError (a usage error) when training must not write into model_dir (`model_dir_problem`);
    reads only its listing, so it runs before anything is built."""
    names = tf.io.gfile.listdir(model_dir) if tf.io.gfile.isdir(model_dir) else []
    problem = model_dir_problem(model_dir, names, [dir_of(f) for f in [*inputs.files, *inputs.val_files]])
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
            raise TrainError(
                f"{model_dir} holds a model trained with other model settings ({', '.join(diff)}); "
                "use the same config to resume, or a new --model-dir"
            )


def recorded_model_section(cfg: TrainConfig) -> dict:
    """The model section as train_config.json records it: with its factory, so synthesis can rebuild it."""
    return dict(cfg.model, factory=cfg.model_factory)


def prepare_model_dir(model_dir: str, inputs: Inputs) -> None:
    """Refuse a dir training must not write into and another model's dir, check it is writable, then
    record the config (what makes it a model dir) and the schema."""
    check_model_dir_target(model_dir, inputs)
    refuse_other_model(model_dir, inputs)
    check_writable(model_dir)
    write_json(
        posixpath.join(model_dir, CONFIG_FILE),
        dict(dataclasses.asdict(inputs.cfg), model=recorded_model_section(inputs.cfg)),
    )
    record_schema(inputs.schema_path, model_dir)
