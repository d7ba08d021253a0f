"""The training loop around the compiled step: checkpoints, signals, TensorBoard, validation, summary.

Python runs once per call of the step (K = steps_per_execution optimizer steps); it fetches the K
losses (NaN check), times the call and the wait for input, and writes logs. Nothing else.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import posixpath
import signal
import sys
import time
from typing import Sequence

import keras
import numpy as np
import tensorflow as tf

from shards_schema import SCHEMA_FILE, Schema
from shards_schema.shards import first_bad_shard
from train import input_pipeline as ip
from train.config import TrainConfig
from train.model import build_model
from train.step import (MODEL_INPUTS, losses_from_terms, make_eval_step, make_optimizer, make_train_step)

log = logging.getLogger("melshards.train")

CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
CONFIG_FILE = "train_config.json"
SUMMARY_FILE = "run_summary.json"


class TrainError(RuntimeError):
    """Training stopped on bad data or a diverged loss; the message says where and what to do."""


@dataclasses.dataclass
class Inputs:
    """Everything checked before any compilation: files, the schema, the validated config."""
    files: list[str]
    val_files: list[str]
    schema: Schema
    schema_path: str
    cfg: TrainConfig


def resolve_inputs(globs: Sequence[str], val_globs: Sequence[str], schema_path: str | None,
                   cfg: TrainConfig) -> Inputs:
    """Globs, schemas (train and val must agree) and config; raises before anything is traced."""
    files = ip.expand_globs(globs)
    schema, where = ip.check_schemas(files, schema_path)
    val_files = ip.expand_globs(val_globs) if val_globs else []
    if val_files:
        ip.check_schemas(val_files, where)
    return Inputs(files, val_files, schema, where, cfg.validate(schema))


class StopFlag:
    """SIGINT/SIGTERM set a flag; the loop checkpoints at the next step boundary and exits cleanly."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signal_name is not None:  # second signal: the user really wants out now
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        log.warning("%s received: checkpointing at the end of this step, then exiting "
                    "(send it again to stop without a checkpoint)", self.signal_name)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Progress:
    """A one-line progress bar on a terminal, plain log lines otherwise."""

    def __init__(self, total: int, every: int):
        self.total, self.every = total, every
        self.tty = sys.stderr.isatty()

    def update(self, step: int, loss: float, steps_per_s: float, examples_per_s: float) -> None:
        if self.tty:
            width = 30
            done = int(width * step / self.total)
            sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] step {step}/{self.total} "
                             f"loss {loss:.4f} {steps_per_s:.2f} steps/s {examples_per_s:.1f} ex/s ")
            sys.stderr.flush()
        elif step % self.every == 0 or step == self.total:
            log.info("step %d/%d loss %.4f %.2f steps/s %.1f examples/s", step, self.total, loss,
                     steps_per_s, examples_per_s)

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


def _scalars_metadata():
    """Metadata of TensorBoard's scalars plugin (version 0: empty content), built from TF's own protos.

    tf.summary.scalar lives in the tensorboard package, which TensorFlow does not install; writing
    the same record with core tf.summary.write keeps logging working without it.
    """
    from tensorflow.core.framework import summary_pb2

    return summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


def _scalar(name: str, value: float, step: int, metadata) -> None:
    tf.summary.write(name, tf.constant(value, tf.float32), step=step, metadata=metadata)


def _write_json(path: str, data: dict) -> None:
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(json.dumps(data, indent=2) + "\n")


def _check_model_dir(model_dir: str, inputs: Inputs) -> None:
    """A model dir holds one model: refuse to resume it with other shards' schema or another model."""
    from shards_schema import read_schema

    here = posixpath.join(model_dir, SCHEMA_FILE)
    if tf.io.gfile.exists(here):
        inputs.schema.check_compatible(read_schema(here), here=inputs.schema_path, there=here)
    cfg_path = posixpath.join(model_dir, CONFIG_FILE)
    if tf.io.gfile.exists(cfg_path):
        with tf.io.gfile.GFile(cfg_path) as f:
            saved = json.load(f)["model"]
        now = dataclasses.asdict(inputs.cfg.model)
        if saved != now:
            diff = sorted(k for k in now if saved.get(k) != now[k])
            raise TrainError(f"{model_dir} holds a model trained with other model settings ({', '.join(diff)}); "
                             "use the same config to resume, or a new --model-dir")


def evaluate(eval_step, files: Sequence[str], inputs: Inputs, max_batches: int) -> dict:
    ds = ip.val_dataset(files, inputs.schema, inputs.cfg.data, MODEL_INPUTS)
    if max_batches:
        ds = ds.take(max_batches)
    sums: dict[str, float] = {}
    for batch in ds:
        for k, v in eval_step(batch).items():
            sums[k] = sums.get(k, 0.0) + float(v)
    losses = losses_from_terms({k: tf.constant(v) for k, v in sums.items()}, inputs.cfg.optim.stop_loss_weight)
    return {k: float(v) for k, v in losses.items()}


def _read(fetch, files: Sequence[str], schema: Schema):
    """fetch(), with a read or parse failure turned into an error naming the bad shard."""
    try:
        return fetch()
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        bad = first_bad_shard(files, schema)
        where = str(bad) if bad else f"one of {len(files)} shards ({e.message.split('[Op:')[0].strip()})"
        raise TrainError(f"corrupt or truncated shard {where}. Re-run `melshards preprocess` for it, or "
                         "leave it out of the glob") from e


def train(inputs: Inputs, model_dir: str, synthetic: bool = False) -> dict:
    """Train to cfg.loop.steps (resuming from model_dir); returns the run summary (also written)."""
    cfg, schema = inputs.cfg, inputs.schema
    lp, k_steps, batch_size = cfg.loop, cfg.loop.steps_per_execution, cfg.data.batch_size
    _check_model_dir(model_dir, inputs)
    tf.io.gfile.makedirs(model_dir)
    tf.io.gfile.copy(inputs.schema_path, posixpath.join(model_dir, SCHEMA_FILE), overwrite=True)
    _write_json(posixpath.join(model_dir, CONFIG_FILE), dataclasses.asdict(cfg))

    keras.utils.set_random_seed(lp.seed)
    if lp.op_determinism:
        tf.config.experimental.enable_op_determinism()

    model = build_model(cfg.model, schema, lp.precision)
    optimizer = make_optimizer(cfg.optim, lp.precision, model)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    train_step = make_train_step(model, optimizer, schema, cfg.optim, batch_size, k_steps, lp.seed, step_var)
    eval_step = make_eval_step(model, schema, batch_size) if inputs.val_files else None

    if synthetic:
        first = _read(lambda: ip.first_batch(inputs.files, schema, cfg.data, MODEL_INPUTS), inputs.files, schema)
        dataset = ip.synthetic_dataset(first, k_steps)
    else:
        dataset = ip.train_dataset(inputs.files, schema, cfg.data, MODEL_INPUTS, k_steps)
    iterator = iter(dataset)

    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var, iterator=iterator)
    manager = tf.train.CheckpointManager(ckpt, posixpath.join(model_dir, CHECKPOINT_DIR),
                                         max_to_keep=lp.keep_checkpoints)
    if manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        log.info("resumed from %s at step %d", manager.latest_checkpoint, int(step_var))
    start = int(step_var.numpy())
    if start % k_steps:
        raise TrainError(f"the checkpoint is at step {start}, not a multiple of loop.steps_per_execution "
                         f"{k_steps}; resume with the steps_per_execution it was trained with")
    log.info("model %d parameters, batch %d, %d steps per call, precision %s, %s data, steps %d -> %d",
             model.count_params(), batch_size, k_steps, lp.precision, "synthetic" if synthetic else "shard",
             start, lp.steps)

    writers = {name: tf.summary.create_file_writer(posixpath.join(model_dir, TENSORBOARD_DIR, name))
               for name in ("train", "val")}
    scalars = _scalars_metadata()
    progress = Progress(lp.steps, lp.log_every)
    step, saved_at, first_loss, last, val_losses = start, start, None, {}, {}
    compile_s, steady = None, {"seconds": 0.0, "calls": 0, "examples": 0.0, "mel_frames": 0.0, "wait": 0.0}
    stopped_by = "steps"
    with StopFlag() as stop:
        while step < lp.steps:
            t0 = time.perf_counter()
            batch = _read(lambda: next(iterator), inputs.files, schema)
            t1 = time.perf_counter()
            out = train_step(batch)
            losses = out["losses"].numpy()  # waits for the call: the per-call sync point
            t2 = time.perf_counter()
            bad = np.flatnonzero(~np.isfinite(losses))
            if bad.size:
                raise TrainError(
                    f"loss became {losses[bad[0]]} at step {step + bad[0] + 1}; stopped instead of training "
                    f"on. The last checkpoint ({manager.latest_checkpoint or 'none'}) is intact: lower "
                    "optim.learning_rate or check the shards' statistics (`melshards stats`)")
            step += k_steps
            last = {k: float(v) for k, v in out.items() if k != "losses"}
            if first_loss is None:
                first_loss = float(losses[0])
            if compile_s is None:
                compile_s = t2 - t0
                log.info("first call (trace + XLA compile + %d step%s): %.1f s", k_steps, "s" * (k_steps > 1),
                         compile_s)
            else:
                steady["seconds"] += t2 - t0
                steady["calls"] += 1
                steady["examples"] += last["examples"]
                steady["mel_frames"] += last["mel_frames"]
                steady["wait"] += t1 - t0
            call_s = t2 - t0
            rates = {"steps_per_second": k_steps / call_s, "examples_per_second": last["examples"] / call_s,
                     "mel_frames_per_second": last["mel_frames"] / call_s, "input_wait_seconds": t1 - t0}
            if step % lp.log_every == 0:
                with writers["train"].as_default():
                    for name in ("loss", "mel_loss", "postnet_loss", "stop_loss", "grad_norm", "learning_rate"):
                        _scalar(name, last[name], step, scalars)
                    for name, value in rates.items():
                        _scalar(name, value, step, scalars)
            progress.update(step, last["loss"], rates["steps_per_second"], rates["examples_per_second"])
            if eval_step is not None and step % lp.val_every == 0:
                val_losses = evaluate(eval_step, inputs.val_files, inputs, lp.val_batches)
                log.info("step %d validation loss %.4f (mel %.4f, postnet %.4f, stop %.4f)", step,
                         val_losses["loss"], val_losses["mel_loss"], val_losses["postnet_loss"],
                         val_losses["stop_loss"])
                with writers["val"].as_default():
                    for name, value in val_losses.items():
                        _scalar(name, value, step, scalars)
            if step % lp.checkpoint_every == 0:
                manager.save(checkpoint_number=step)
                saved_at = step
            if stop.signal_name:
                stopped_by = stop.signal_name
                break
    progress.close()
    if step != saved_at:
        manager.save(checkpoint_number=step)
    if step > start:
        log.info("checkpoint %s", manager.latest_checkpoint)
    for w in writers.values():
        w.flush()

    traces = train_step.experimental_get_tracing_count()
    if traces > 1:
        log.error("THE TRAIN STEP WAS TRACED %d TIMES, NOT ONCE: every trace recompiles with XLA. "
                  "Signatures traced:\n%s\nThe dataset yields: %s", traces,
                  train_step.pretty_printed_concrete_signatures(), dataset.element_spec)
    steady_s = steady["seconds"]
    summary = {
        "steps_run": step - start,
        "start_step": start,
        "final_step": step,
        "target_steps": lp.steps,
        "stopped_by": stopped_by,
        "synthetic_data": synthetic,
        "batch_size": batch_size,
        "steps_per_execution": k_steps,
        "precision": lp.precision,
        "parameters": int(model.count_params()),
        "first_loss": first_loss,
        "final_losses": {"train": {k: last[k] for k in ("loss", "mel_loss", "postnet_loss", "stop_loss")}
                         if last else {}, "val": val_losses},
        "train_step_traces": traces,
        "eval_step_traces": eval_step.experimental_get_tracing_count() if eval_step else 0,
        "compile_seconds": compile_s,
        "steady_state": {
            "calls": steady["calls"],
            "steps_per_second": steady["calls"] * k_steps / steady_s if steady_s else None,
            "examples_per_second": steady["examples"] / steady_s if steady_s else None,
            "mel_frames_per_second": steady["mel_frames"] / steady_s if steady_s else None,
            "input_wait_fraction": steady["wait"] / steady_s if steady_s else None,
        },
    }
    _write_json(posixpath.join(model_dir, SUMMARY_FILE), summary)
    return summary


def format_summary(summary: dict) -> str:
    """The run summary as a few aligned lines for the terminal."""
    def num(v, fmt):
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    s, t = summary["steady_state"], summary["final_losses"]["train"]
    lines = [
        f"steps run          {summary['steps_run']} ({summary['start_step']} -> {summary['final_step']}"
        f" of {summary['target_steps']}, stopped by {summary['stopped_by']})",
        f"data               {'synthetic (one constant batch)' if summary['synthetic_data'] else 'shards'}, "
        f"batch {summary['batch_size']}, {summary['steps_per_execution']} steps per call, {summary['precision']}",
        f"train step traces  {summary['train_step_traces']}",
        f"first call         {num(summary['compile_seconds'], '.1f')} s (trace + XLA compile)",
        f"steady state       {num(s['steps_per_second'], '.2f')} steps/s, {num(s['examples_per_second'], '.1f')} "
        f"examples/s, {num(s['mel_frames_per_second'], '.0f')} mel frames/s, input wait "
        f"{num(None if s['input_wait_fraction'] is None else 100 * s['input_wait_fraction'], '.1f')}%",
    ]
    if t:
        lines.append(f"loss               {num(summary['first_loss'], '.4f')} (first step) -> {t['loss']:.4f} "
                     f"(mel {t['mel_loss']:.4f}, postnet {t['postnet_loss']:.4f}, stop {t['stop_loss']:.4f})")
    if summary["final_losses"]["val"]:
        lines.append(f"validation loss    {summary['final_losses']['val']['loss']:.4f}")
    return "\n".join(lines)
