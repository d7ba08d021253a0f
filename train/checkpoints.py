"""Checkpoints of a run: what is saved, how it is restored (checked), and the model dir's health.

A checkpoint holds the model, the optimizer, the step counter, the tf.data iterator position and
the data settings that fix the iterator's shape. The iterator state only restores into an
identical pipeline, so those settings are compared before restoring it: when they differ, the
weights, optimizer and step are restored and the iterator starts fresh (with a warning naming what
changed).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
import re
from collections.abc import Sequence

from melshards.train.config import TrainConfig
from melshards.train.errors import CheckpointError, ModelDirError, RestoreError
from melshards.train.input_pipeline import STATE_LAYOUT
from melshards.train.tf_quiet import tf

log = logging.getLogger("melshards.train")

CHECKPOINT_DIR = "checkpoints"
DATA_KEY = "data_settings/.ATTRIBUTES/VARIABLE_VALUE"
_FUNCTION_NODE = re.compile(r"^\{\{function_node [^}]*\}\}\s*")  # an eager op's wrapper, before its error message
LAYOUT_KEY = "input_state_layout"  # in the data settings: input_pipeline.STATE_LAYOUT of the run that saved them


def check_writable(model_dir: str) -> None:
    """Create model_dir and write a probe file in it and in its checkpoints/ if that exists (the first
    checkpoint creates it), before anything compiles; removes the probes."""
    for d in (model_dir, posixpath.join(model_dir, CHECKPOINT_DIR)):
        if d != model_dir and not tf.io.gfile.exists(d):
            continue
        probe = posixpath.join(d, f".melshards-write-test-{os.getpid()}")
        try:
            tf.io.gfile.makedirs(d)
            with tf.io.gfile.GFile(probe, "w") as f:
                f.write("ok")
            tf.io.gfile.remove(probe)
        except (tf.errors.OpError, OSError) as e:
            reason = e.message if isinstance(e, tf.errors.OpError) else str(e)
            raise ModelDirError(
                f"{d} is not a writable directory ({reason.strip()}); every checkpoint would be lost. "
                "Fix its permissions, or pass another --model-dir"
            ) from e


def remove_partial_writes(checkpoint_dir: str) -> list[str]:
    """Delete the ckpt-N_temp directories of checkpoint writes that were killed; returns them.

    The manager writes into ckpt-N_temp/ and then moves the files to ckpt-N.*: a leftover temp
    dir never holds a usable checkpoint.
    """
    leftovers = sorted(
        p for p in tf.io.gfile.glob(posixpath.join(checkpoint_dir, "ckpt-*_temp")) if tf.io.gfile.isdir(p)
    )
    for path in leftovers:
        tf.io.gfile.rmtree(path)
        log.info("removed %s, left by a checkpoint write that did not finish", path)
    return leftovers


def _files_of(path: str) -> list[str]:
    return tf.io.gfile.glob(path + ".index") + tf.io.gfile.glob(path + ".data-*")


def checkpoint_problem(path: str) -> str | None:
    """What is wrong with the checkpoint `path` (ckpt-N), or None when every saved tensor reads back.

    Reads every tensor once, each checked against the checksum saved with it (a truncated ckpt-N.data-*
    fails only at the tensors past its end, e.g. the object graph written last), so its cost is one read
    of the checkpoint. One tensor at a time: each iterator state is decoded into the memory the one
    before it freed.
    """
    name = posixpath.basename(path)
    if not tf.io.gfile.exists(path + ".index"):
        return f"{name}.index is missing"
    try:
        reader = tf.train.load_checkpoint(path)
        for key, dtype in reader.get_variable_to_dtype_map().items():
            if dtype == tf.variant:  # the iterator state: the reader cannot return it as numpy
                tf.raw_ops.RestoreV2(prefix=path, tensor_names=[key], shape_and_slices=[""], dtypes=[dtype])
            else:
                reader.get_tensor(key)
    except (tf.errors.OpError, IndexError, ValueError, RuntimeError, OSError) as e:
        message = (getattr(e, "message", None) or str(e) or type(e).__name__).strip().splitlines()[0]
        message = _FUNCTION_NODE.sub("", message).split("[Op:")[0].strip()
        # TensorFlow's ways of saying the data file ends too early (the reader's, the op's)
        if isinstance(e, (IndexError, tf.errors.OutOfRangeError)):
            return f"its data file is truncated ({message})"
        return message
    return None


def _listed(checkpoint_dir: str) -> list[str]:
    """The checkpoints the manager's `checkpoint` file lists, oldest first, as paths under
    `checkpoint_dir` (relative when it is: `get_checkpoint_state` joins the file's relative entries
    onto it)."""
    state = tf.train.get_checkpoint_state(checkpoint_dir)
    if state is None:
        return []
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    if state.model_checkpoint_path not in paths:
        paths.append(state.model_checkpoint_path)
    return paths


def checkpoint_step(checkpoint_dir: str) -> int:
    """The step counter saved in the newest checkpoint in `checkpoint_dir` with files, read without checking
    or restoring anything; 0 when there is none or it cannot be read (the restore then says why)."""
    try:
        present = [p for p in _listed(checkpoint_dir) if _files_of(p)]
        if not present:
            return 0
        return int(tf.train.load_checkpoint(present[-1]).get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))
    except Exception:  # noqa: BLE001 (a guess for the warm-up's order only)
        return 0


def resume_checkpoint(checkpoint_dir: str, repair: bool = True) -> str | None:
    """The checkpoint to resume (or synthesize) from: the newest listed one; None when there is none.

    Raises CheckpointError, naming it and how to go on, when it is damaged. A listed checkpoint whose
    files are all gone (deleted by the user, as that message suggests) is skipped for the newest one
    before it; `repair` then drops it from the `checkpoint` file so the CheckpointManager agrees.
    """
    listed = _listed(checkpoint_dir)
    present = [p for p in listed if _files_of(p)]
    if not present:
        return None
    latest = present[-1]
    problem = checkpoint_problem(latest)
    if problem is not None:
        previous = next((p for p in reversed(present[:-1]) if checkpoint_problem(p) is None), None)
        name = posixpath.basename(latest)
        go_on = (
            f"delete {checkpoint_dir}/{name}.* to resume from {posixpath.basename(previous)}, the previous "
            "checkpoint (intact), or pass another --model-dir"
            if previous
            else "no earlier checkpoint is intact: pass another --model-dir to start afresh"
        )
        raise CheckpointError(f"checkpoint {latest} is damaged ({problem}); {go_on}")
    if repair and latest != listed[-1]:
        log.warning(
            "%s: the newest listed checkpoint %s has no files; resuming from %s",
            checkpoint_dir,
            posixpath.basename(listed[-1]),
            posixpath.basename(latest),
        )
        tf.compat.v1.train.update_checkpoint_state(checkpoint_dir, latest, all_model_checkpoint_paths=present)
    return latest


def data_settings(files: Sequence[str], cfg: TrainConfig, synthetic: bool) -> dict:
    """Everything that fixes the shape of the input pipeline, hence of its saved iterator state: the
    settings, and the layout of the state this melshards' pipeline saves (`input_pipeline.STATE_LAYOUT`)."""
    return {
        "files": list(files),
        "synthetic_data": synthetic,
        "steps_per_execution": cfg.loop.steps_per_execution,
        LAYOUT_KEY: STATE_LAYOUT,
        **dataclasses.asdict(cfg.data),
    }


def settings_diff(saved: dict | None, now: dict) -> list[str]:
    """Human-readable differences, e.g. "batch_size 100 -> 8"; [] when nothing differs."""
    if saved is None:
        return ["the checkpoint records no data settings"]
    diff = []
    saved = {LAYOUT_KEY: 1, **saved}  # written before the layout was recorded
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key), now.get(key)
        if a == b:
            continue
        if key == LAYOUT_KEY:
            diff.append(
                f"input state layout {a} -> {b} (the checkpoint's input position is of another melshards "
                "version's pipeline; resume with that version to keep it)"
            )
        elif key == "files" and isinstance(a, list) and isinstance(b, list):
            added, removed = sorted(set(b) - set(a)), sorted(set(a) - set(b))
            parts = (
                [f"{len(added)} added ({', '.join(added[:3])}{', ...' if len(added) > 3 else ''})"] if added else []
            ) + (
                [f"{len(removed)} removed ({', '.join(removed[:3])}{', ...' if len(removed) > 3 else ''})"]
                if removed
                else []
            )
            diff.append(
                "shard files: "
                + "; ".join(parts or ["same files, other order"])
                + " (pass the same shard globs to keep them)"
            )
        else:
            diff.append(f"{key} {a} -> {b} ({_how_to_keep(key, a)})")
    return diff


def _how_to_keep(key: str, saved) -> str:
    if key == "batch_size":
        return f"pass --batch-size {saved} to keep it"
    if key == "synthetic_data":
        return "pass --synthetic-data to keep it" if saved else "drop --synthetic-data to keep it"
    if key == "steps_per_execution":
        return f"set loop.steps_per_execution: {saved} to keep it"
    return f"set data.{key}: {json.dumps(saved)} to keep it"


def saved_data_settings(path: str) -> dict | None:
    reader = tf.train.load_checkpoint(path)
    if not reader.has_tensor(DATA_KEY):
        return None
    return json.loads(reader.get_tensor(DATA_KEY))


def saved_positions(path: str) -> list[str]:
    """The names of the input iterators a checkpoint holds (`bucket_NN`), sorted; none when it was written
    under a strategy (runs on one device save them; strategies cannot)."""
    keys = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    return sorted({k.split("/")[1] for k in keys if k.startswith("iterator/") and k.count("/") >= 2})


def untracked_variables(root, model) -> list[str]:
    """Paths of the model's variables that a checkpoint of `root` would not save or restore."""
    reachable = {id(obj) for obj in tf.train.TrackableView(root).descendants()}
    return [v.path for v in model.variables if id(v) not in reachable and id(getattr(v, "value", v)) not in reachable]


def restore_checked(ckpt: tf.train.Checkpoint, path: str, model):
    """ckpt.restore(path), failing if any model variable is left with its initial value; returns the
    restore's status (objects attached to `ckpt`'s graph later are restored as they are attached).

    Two checks: every model variable must be in the checkpoint's object graph (so restore can
    reach it), and every object in that graph must have been matched by a saved value. Whether every
    saved value was used (an exact resume) is the status's `assert_consumed`, once every object is
    attached (`Checkpointer.save`).
    """
    missing = untracked_variables(ckpt, model)
    if missing:
        raise RestoreError(
            f"{len(missing)} of {len(model.variables)} model variables are not in the "
            f"checkpoint object graph (e.g. {', '.join(missing[:3])}); they would keep "
            "their random initial values"
        )
    status = ckpt.restore(path)
    try:
        status.assert_existing_objects_matched()
    except AssertionError as e:
        raise RestoreError(
            f"{path} does not restore this model: {str(e).splitlines()[0]} Train it with "
            "this version of melshards, or use another --model-dir"
        ) from e
    return status


def restore_model(model, path: str) -> None:
    """The model's weights (only) from a training checkpoint; every variable must be restored. `path`
    comes from `resume_checkpoint`, which has read it whole (a damaged one is a CheckpointError there)."""
    restore_checked(tf.train.Checkpoint(model=model), path, model).expect_partial()


class Checkpointer:
    """Saves and restores a run: model, optimizer, step, iterator and the data settings beside it."""

    def __init__(
        self,
        model_dir: str,
        model,
        optimizer,
        step: tf.Variable,
        iterator,
        data: dict,
        keep: int,
        read_dir: str | None = None,
        before_save=lambda: None,
        positions: Sequence[str] = (),
    ):
        """iterator None: the input position is not saved (distributed iterators are not trackable); else a
        tf.Module whose attributes are the iterators, which may be attached after `restore` (`attached`).
        read_dir: the model dir to resume from when it is not the one written (a non-chief worker).
        before_save(): called before each save (the trainer attaches every iterator it has not built yet).
        positions: the names of the iterators the run attaches (`bucket_NN`): an exact resume needs the
        checkpoint to hold exactly these."""
        self.model, self.data, self.has_iterator = model, data, iterator is not None
        self.before_save, self.positions = before_save, sorted(positions)
        self.pending = None  # the restore of the full checkpoint while iterators are still to be attached
        self.input_position_saved = True  # whether the restored checkpoint held the input position
        self.data_var = tf.Variable(json.dumps(data, sort_keys=True), trainable=False, dtype=tf.string)
        self.weights = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
        saved = {"iterator": iterator} if iterator is not None else {}
        self.full = tf.train.Checkpoint(
            model=model, optimizer=optimizer, step=step, data_settings=self.data_var, **saved
        )
        self.dir = posixpath.join(model_dir, CHECKPOINT_DIR)
        self.read_dir = posixpath.join(read_dir, CHECKPOINT_DIR) if read_dir else self.dir
        self.manager = tf.train.CheckpointManager(self.full, self.dir, max_to_keep=keep)

    @property
    def latest(self) -> str | None:
        return self.manager.latest_checkpoint

    def restore(self) -> list[str]:
        """Restore the newest checkpoint, if any; returns the data-setting differences (fresh iterator)."""
        remove_partial_writes(self.dir)
        latest = self.latest if self.read_dir == self.dir else tf.train.latest_checkpoint(self.read_dir)
        if latest is None:
            return []
        diff = settings_diff(saved_data_settings(latest), self.data)
        saved = saved_positions(latest)
        self.input_position_saved = bool(saved)
        if not diff and self.has_iterator and self.input_position_saved:
            if self.positions and saved != self.positions:  # every bucket's position, no other: refused now
                raise RestoreError(
                    f"{latest} holds the input positions of {', '.join(saved) or 'no bucket'}, this run's buckets "
                    f"are {', '.join(self.positions)}: the shards' buckets changed since it was written. Resume "
                    "with the shards it was trained on, or use another --model-dir"
                )
            # iterators attached later are restored as they are attached (`attached`); every saved
            # value must be used by the first save (an exact resume)
            self.pending = restore_checked(self.full, latest, self.model).expect_partial()
            return []
        if not diff and self.has_iterator:  # written under a strategy: no input position to restore
            restore_checked(self.weights, latest, self.model).expect_partial()
            return []
        if not self.has_iterator:  # the input restarts anyway; a position saved by a one-device run is unused
            restore_checked(self.weights, latest, self.model).expect_partial()
            return []
        restore_checked(self.weights, latest, self.model).expect_partial()
        log.warning(
            "the input differs from the run that wrote %s (%s): restored the weights, optimizer "
            "and step, and started the input pipeline afresh. To resume exactly where it "
            "stopped, pass the same shards and settings",
            latest,
            "; ".join(diff),
        )
        return diff

    def attach(self, saved: tf.Module, name: str, iterator) -> None:
        """Attach `iterator` to the saved iterators `saved` as `name`. After a restore of the full checkpoint
        this restores its position, which must be there and restore into this pipeline (RestoreError)."""
        try:
            setattr(saved, name, iterator)
        except tf.errors.OpError as e:  # tf.data refuses a state saved by another chain
            raise RestoreError(
                f"{self.latest} holds an input position for {name} that this input pipeline cannot restore "
                f"({e.message.strip().splitlines()[0].split('. ')[0]}): it was saved by another melshards or "
                "TensorFlow version. Resume with the version that wrote it, or use another --model-dir"
            ) from e
        if self.pending is None:
            return
        try:
            self.pending.assert_existing_objects_matched()
        except AssertionError as e:
            raise RestoreError(
                f"{self.latest} holds no input position for {name}. Resume with the shards and data settings "
                "it was trained with, or use another --model-dir"
            ) from e

    def save(self, step: int) -> str:
        self.before_save()
        if self.pending is not None:  # every value the restored checkpoint held is in use: an exact resume
            try:
                self.pending.assert_consumed()
            except AssertionError as e:
                what = str(e).splitlines()[0].split(": attributes")[0]
                raise RestoreError(
                    f"{self.latest} holds values this run did not restore ({what}); the model or its input "
                    "changed since it was written. Resume with the melshards version, shards and settings it "
                    "was trained with, or use another --model-dir"
                ) from e
            self.pending = None
        return self.manager.save(checkpoint_number=step)
