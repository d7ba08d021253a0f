"""The training loop around the compiled step.

`train` builds a `Run` (model, optimizer, compiled steps, input, checkpoints) and then calls small
named pieces once per compiled call: `Run.call` (the step and its timing), `RunState.record`
(metrics, NaN check, throughput), `Scalars.write` (TensorBoard), `Progress.update`, `Run.evaluate`,
`Checkpointer.save` and the `StopFlag`. Python runs once per call of the step (K =
steps_per_execution optimizer steps) and does nothing else.
"""
from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import posixpath
import signal
import socket
import sys
import threading
import time
from typing import Sequence

from melshards.train.tf_quiet import tf  # noqa: I001 (first: keras imports TensorFlow)
import keras
import numpy as np

from melshards.shards_schema import SCHEMA_FILE, Schema
from melshards.shards_schema.shards import first_bad_shard
from melshards.train import buckets as bk
from melshards.train import distribute as dist
from melshards.train import input_pipeline as ip
from melshards.train.checkpoints import CHECKPOINT_DIR, Checkpointer, check_writable, data_settings, resume_checkpoint
from melshards.train.config import TrainConfig
from melshards.train.contract import current_factory
from melshards.train.errors import ModelDirError, RestoreError, TrainError
from melshards.train.metrics import RunState, format_summary
from melshards.train.plugins import build_model
from melshards.train.step import MODEL_INPUTS, make_eval_step, make_optimizer, make_train_step, step_specs
from melshards.train.summaries import TENSORBOARD_DIR, Scalars

__all__ = ["CHECKPOINT_DIR", "CONFIG_FILE", "SUMMARY_FILE", "TENSORBOARD_DIR", "Inputs", "ModelDirError",
           "RestoreError", "StopFlag", "TrainError", "format_summary", "resolve_inputs", "train"]

log = logging.getLogger("melshards.train")

CONFIG_FILE = "train_config.json"
SUMMARY_FILE = "run_summary.json"


@dataclasses.dataclass
class Inputs:
    """Everything checked before any compilation: files, the schema, the validated config."""
    files: list[str]
    val_files: list[str]
    schema: Schema
    schema_path: str  # the file `schema` was read from: the model dir records this one
    cfg: TrainConfig


def resolve_inputs(globs: Sequence[str], val_globs: Sequence[str], schema_path: str | None,
                   cfg: TrainConfig) -> Inputs:
    """Globs, schemas (train and val must agree) and config; raises before anything is traced."""
    files = ip.expand_globs(globs)
    schema, where = ip.check_schemas(files, schema_path)
    val_files = ip.expand_globs(val_globs) if val_globs else []
    if val_files:
        ip.check_schemas(val_files, where)
    bk.files_by_bucket([*files, *val_files], schema)  # every file's length bucket is known
    if val_files:
        by_bucket = bk.files_by_bucket(files, schema)
        ip.check_val_is_not_train(files, val_files,
                                  sum(bk.records_in(fs, schema, schema.buckets[i]) for i, fs in by_bucket.items()))
    return Inputs(files, val_files, schema, where, cfg.validate(schema))


class StopFlag:
    """SIGINT/SIGTERM set a flag; the loop checkpoints at the next step boundary and exits cleanly.

    A second signal ends the process at once, without a checkpoint, even while the main thread
    sits in a long C++ call (the first XLA compile takes tens of seconds). Python runs its signal
    handlers only on the main thread between bytecodes, so they would wait for the call to end; and
    while one signal is pending CPython does not even report the next one to `set_wakeup_fd`. So a
    watcher thread, woken through the wakeup fd by the first signal, acknowledges it at once and
    puts the C-level default action (terminate) back for both signals: the next one ends the
    process in the kernel (exit status 128 + signal number in a shell).
    """

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {}

    def __enter__(self):
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        self._watcher = threading.Thread(target=self._watch, name="melshards-stop-watcher", daemon=True)
        self._watcher.start()
        return self

    def _handle(self, signum, frame):  # main thread, between bytecodes: records the request only
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name

    def _watch(self):
        while True:
            try:
                data = self._reader.recv(64)
            except OSError:
                return
            if not data:  # __exit__ closed the writer
                return
            stops = [signal.Signals(b) for b in data if b in (signal.SIGINT, signal.SIGTERM)]
            if stops:
                _default_action_for(signal.SIGINT, signal.SIGTERM)
                log.warning("%s received: checkpointing at the end of this step, then exiting "
                            "(send it again to stop at once, without a checkpoint)", stops[0].name)
                return

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():  # also replaces the C-level default action
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._previous_fd)
        self._writer.close()
        self._watcher.join()
        self._reader.close()


def _default_action_for(*signals: signal.Signals) -> None:
    """sigaction(SIG_DFL) from any thread: Python's signal.signal may only be called on the main one."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    for sig in signals:
        libc.signal(int(sig), None)  # None is SIG_DFL (0)


class Progress:
    """A one-line progress bar on a terminal, plain log lines otherwise."""

    def __init__(self, total: int, every: int):
        self.total, self.every = total, every
        self.tty = sys.stderr.isatty()

    def update(self, state: RunState) -> None:
        step, loss = state.step, state.last["loss"]
        steps_per_s, examples_per_s = state.rates["steps_per_second"], state.rates["examples_per_second"]
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


def _write_json(path: str, data: dict) -> None:
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(json.dumps(data, indent=2) + "\n")


def _check_model_dir(model_dir: str, inputs: Inputs) -> None:
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


def evaluate(eval_steps: dict, lanes: Sequence[bk.Lane], inputs: Inputs, max_batches: int, model) -> dict:
    """Validation losses over every bucket's validation shards, each with its own eval step and batch;
    max_batches (when > 0) caps the batches of each bucket. "examples" counts the records seen."""
    sums: dict[str, float] = {}
    for lane in lanes:
        if lane.index not in eval_steps:
            continue
        ds = ip.val_dataset(lane.val_files, inputs.schema, lane_data(inputs.cfg, lane), MODEL_INPUTS, lane.bucket)
        if max_batches:
            ds = ds.take(max_batches)
        for batch in ds:
            for k, v in eval_steps[lane.index](batch).items():
                sums[k] = sums.get(k, 0.0) + float(v)
    losses = model.losses_from_terms({k: tf.constant(v, tf.float32) for k, v in sums.items()})
    return dict({k: float(v) for k, v in losses.items()}, examples=sums.get("examples", 0.0))


def plan_lanes(inputs: Inputs, topo: dist.Topology) -> list[bk.Lane]:
    """Every bucket's batch, files and schedule share; a batch that does not fit the records or the
    replicas is a ConfigError. Pure: called before anything is written."""
    cfg = inputs.cfg
    topo.per_replica_batch(cfg.data.batch_size)
    return bk.plan(inputs.files, inputs.val_files, inputs.schema, cfg.data.batch_size, cfg.data.fixed_batch_size,
                   cfg.loop.steps_per_execution, replicas=topo.replicas)


def lane_data(cfg: TrainConfig, lane: bk.Lane):
    """The data config of one bucket's pipeline: its own (global) batch size."""
    return dataclasses.replace(cfg.data, batch_size=lane.batch_size)


def _read(fetch, files: Sequence[str], schema: Schema):
    """fetch(), with a read or parse failure turned into an error naming the bad shard."""
    try:
        return fetch()
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        bad = first_bad_shard(files, schema)
        where = str(bad) if bad else f"one of {len(files)} shards ({e.message.split('[Op:')[0].strip()})"
        raise TrainError(f"corrupt or truncated shard {where}. Re-run `melshards preprocess` for it, or "
                         "leave it out of the glob") from e


class Run:
    """What the loop drives: the model, optimizer, compiled steps, input iterators and checkpoints.

    One input pipeline, train step and eval step per length bucket (train/buckets.py), each bound to
    the bucket's shapes and batch; the schedule picks the bucket of each call. Built before anything
    compiles (each step compiles at its first call).
    """

    def __init__(self, inputs: Inputs, model_dir: str, synthetic: bool, topo: dist.Topology | None = None):
        cfg, schema = inputs.cfg, inputs.schema
        lp, self.k_steps, self.batch_size = cfg.loop, cfg.loop.steps_per_execution, cfg.data.batch_size
        self.inputs, self.synthetic = inputs, synthetic
        self.topo = topo = topo or dist.Topology("one", None)
        self.per_replica = topo.per_replica_batch(self.batch_size)
        keras.utils.set_random_seed(lp.seed)
        if lp.op_determinism:
            tf.config.experimental.enable_op_determinism()
        with topo.scope():  # variables mirrored over the replicas (the default scope on one device)
            # the factory and the contract checks: before anything compiles
            self.model, self.loss_names = build_model(cfg.model_factory, schema, cfg.model_options, lp.precision)
            self.optimizer = make_optimizer(cfg.optim, lp.precision, self.model)
            self.step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.lanes = plan_lanes(inputs, topo)
        used = [lane for lane in self.lanes if lane.calls_per_epoch]
        self.schedule = bk.Schedule([lane.calls_per_epoch for lane in self.lanes], cfg.data.seed)
        self.next_call = 0  # the schedule position: set from the restored step
        # one replica's specs per bucket (each bucket's batch must divide by the replicas too)
        self.specs = {lane.index: step_specs(lane.bucket, topo.per_replica_batch(lane.batch_size)) for lane in used}
        self.train_steps = {lane.index: make_train_step(self.model, self.optimizer, schema, cfg.optim,
                                                        self.specs[lane.index], self.k_steps, lp.seed, self.step_var,
                                                        self.loss_names, strategy=topo.strategy) for lane in used}
        self.eval_steps = {lane.index: make_eval_step(self.model, schema, lane.batch_size, lane.bucket)
                           for lane in self.lanes if lane.val_files}
        self.write_dir = dist.write_dir(model_dir, topo)
        self.datasets: dict = {}
        self.iterators: dict = {}
        self.saved_iterators = None  # distributed iterators are not trackable: built at restore, position not saved
        if not topo.distributed:
            # every bucket's iterator position is saved (the schedule position is the step counter)
            self.saved_iterators = tf.Module()
            self.start_local_input(seed=None)
        self.checkpointer = Checkpointer(self.write_dir, self.model, self.optimizer, self.step_var,
                                         self.saved_iterators,
                                         data_settings(inputs.files, cfg, synthetic), lp.keep_checkpoints,
                                         read_dir=model_dir)
        for lane in self.lanes:
            log.info("bucket %d: text %d, mel %d frames, batch %d, %d train records (%d calls per schedule "
                     "epoch), %d val shards", lane.index, lane.bucket.max_text_len, lane.bucket.max_mel_frames,
                     lane.batch_size, lane.records, lane.calls_per_epoch, len(lane.val_files))

    def make_dataset(self, lane: bk.Lane, batch_size: int | None = None, shard: tuple | None = None,
                     seed: int | None = None) -> tf.data.Dataset:
        """One bucket's train input of one replica's batch (the bucket's global batch on one device)."""
        data = lane_data(self.inputs.cfg, lane)
        if self.synthetic:  # one constant batch of each bucket: every bucket's shape is measured
            if batch_size is not None:
                data = dataclasses.replace(data, batch_size=batch_size)
            first = _read(lambda: ip.first_batch(lane.files, lane.bucket, data, MODEL_INPUTS), list(lane.files),
                          self.inputs.schema)
            return ip.synthetic_dataset(first, self.k_steps)
        return ip.train_dataset(lane.files, lane.bucket, data, MODEL_INPUTS, self.k_steps, batch_size=batch_size,
                                shard=shard, seed=seed)

    def start_local_input(self, seed: int | None) -> None:
        """On one device: every bucket's input iterator, in the checkpoint's `iterator/bucket_NN`."""
        self.datasets = {lane.index: self.make_dataset(lane, seed=seed) for lane in self.lanes
                         if lane.index in self.train_steps}
        self.iterators = {i: iter(ds) for i, ds in self.datasets.items()}
        for i, it in self.iterators.items():
            setattr(self.saved_iterators, f"bucket_{i:02d}", it)

    def start_input(self, start: int) -> None:
        """Under a strategy: every bucket's distributed input, reshuffled for the step it starts at
        (no saved position)."""
        seed = dist.resume_seed(self.inputs.cfg.data.seed, start)
        if start:
            log.info("distributed input position is not checkpointable in TensorFlow; reshuffled the input with "
                     "seed %d (derived from step %d) instead of replaying its first batches", seed, start)
        for lane in self.lanes:
            if lane.index not in self.train_steps:
                continue
            specs = {k: tf.TensorSpec([self.k_steps, *s.shape], s.dtype) for k, s in self.specs[lane.index].items()}
            self.datasets[lane.index] = dist.distributed_dataset(
                self.topo, lambda batch_size, shard, lane=lane: self.make_dataset(lane, batch_size, shard, seed),
                list(lane.files), lane.batch_size, specs)
            self.iterators[lane.index] = iter(self.datasets[lane.index])

    @property
    def eval_step(self):
        """Truthy when the run validates (some bucket has validation shards)."""
        return self.eval_steps or None

    def restore(self) -> tuple[int, list[str]]:
        """(the step to start from, the data-setting changes that gave a fresh iterator)."""
        changes = self.checkpointer.restore()
        start = int(self.step_var.numpy())
        self.next_call = start // self.k_steps
        if self.checkpointer.latest:
            log.info("resumed from %s at step %d", self.checkpointer.latest, start)
        if start % self.k_steps:
            raise TrainError(f"the checkpoint is at step {start}, not a multiple of loop.steps_per_execution "
                             f"{self.k_steps}; resume with the steps_per_execution it was trained with")
        if self.topo.distributed:
            self.start_input(start)
        elif start and not self.checkpointer.input_position_saved and not changes:
            # a checkpoint written under a strategy holds no input position: reshuffle, as a strategy does
            seed = dist.resume_seed(self.inputs.cfg.data.seed, start)
            log.info("%s holds no input position (written under a tf.distribute strategy); reshuffled the input "
                     "with seed %d (derived from step %d) instead of replaying its first batches",
                     self.checkpointer.latest, seed, start)
            self.start_local_input(seed)
        return start, changes

    def call(self) -> tuple[dict, np.ndarray, float, float]:
        """One compiled call of the scheduled bucket: (mean metrics, the K step losses, input wait s, call s)."""
        lane = self.lanes[self.schedule.bucket(self.next_call)]
        train_step = self.train_steps[lane.index]
        first = train_step.experimental_get_tracing_count() == 0
        if first:
            log.info("first call: tracing and XLA-compiling the train step of bucket %d (tens of seconds on CPU)",
                     lane.index)
        t0 = time.perf_counter()
        batch = _read(lambda: next(self.iterators[lane.index]), list(lane.files), self.inputs.schema)
        t1 = time.perf_counter()
        out = train_step(batch)
        losses = out.pop("losses").numpy()  # waits for the call: the per-call sync point
        t2 = time.perf_counter()
        self.next_call += 1
        if first:
            log.info("first call (trace + XLA compile + %d steps) of bucket %d: %.1f s", self.k_steps, lane.index,
                     t2 - t0)
        out["compiled"] = float(first)
        out["padded_frames"] = float(self.k_steps * lane.batch_size * lane.bucket.max_mel_frames)
        return out, losses, t1 - t0, t2 - t0

    def evaluate(self) -> dict:
        lp = self.inputs.cfg.loop
        return evaluate(self.eval_steps, self.lanes, self.inputs, lp.val_batches, self.model)

    def traces(self) -> dict[int, int]:
        """Traces per bucket of the XLA-compiled function: the whole step on one device, a replica's
        pass under a strategy (0: the bucket's step never ran).

        Under MirroredStrategy that function is traced once per local replica device (each trace
        captures that device's copies of the variables), so the expected count is the local replicas.
        """
        out = {}
        for i, step in self.train_steps.items():
            out[i] = traces = step.grad_fn.experimental_get_tracing_count()
            if traces > self.topo.local_replicas:
                log.error("THE TRAIN STEP OF BUCKET %d WAS TRACED %d TIMES, NOT ONCE (PER REPLICA DEVICE): every "
                          "trace recompiles with XLA. Signatures traced:\n%s\nThe dataset yields: %s", i, traces,
                          step.grad_fn.pretty_printed_concrete_signatures(), self.datasets[i].element_spec)
        return out

    def facts(self) -> dict:
        lp = self.inputs.cfg.loop
        traces = self.traces()
        evals = {i: step.experimental_get_tracing_count() for i, step in self.eval_steps.items()}
        buckets = [{"index": lane.index, "max_text_len": lane.bucket.max_text_len,
                    "max_mel_frames": lane.bucket.max_mel_frames, "batch_size": lane.batch_size,
                    "train_records": lane.records, "calls_per_epoch": lane.calls_per_epoch,
                    "train_step_traces": traces.get(lane.index, 0), "eval_step_traces": evals.get(lane.index, 0)}
                   for lane in self.lanes]
        return {"model_factory": self.inputs.cfg.model_factory, "synthetic_data": self.synthetic,
                "batch_size": self.batch_size, "fixed_batch_size": self.inputs.cfg.data.fixed_batch_size,
                "steps_per_execution": self.k_steps, "precision": lp.precision,
                **self.topo.facts(self.batch_size),
                "step_function_traces": sum(s.experimental_get_tracing_count() for s in self.train_steps.values()),
                "parameters": int(self.model.count_params()), "train_step_traces": sum(traces.values()),
                "eval_step_traces": sum(evals.values()),
                "buckets_used": sum(1 for n in traces.values() if n), "buckets": buckets}


def prepare_model_dir(model_dir: str, inputs: Inputs) -> None:
    """Refuse another model's dir, check it is writable, then record the schema and config."""
    _check_model_dir(model_dir, inputs)
    check_writable(model_dir)
    tf.io.gfile.copy(inputs.schema_path, posixpath.join(model_dir, SCHEMA_FILE), overwrite=True)
    _write_json(posixpath.join(model_dir, CONFIG_FILE),
                dict(dataclasses.asdict(inputs.cfg), model=recorded_model_section(inputs.cfg)))


def train(inputs: Inputs, model_dir: str, synthetic: bool = False, topo: dist.Topology | None = None) -> dict:
    """Train to cfg.loop.steps (resuming from model_dir); returns the run summary (also written).

    topo: the tf.distribute set-up (melshards.train.distribute.make_topology); None: one device. A non-chief
    worker writes its checkpoints and summary to a temp dir, removed at the end.
    """
    lp = inputs.cfg.loop
    topo = topo or dist.Topology("one", None)
    with StopFlag() as stop:  # from the start: a Ctrl-C during set-up stops before the first call
        plan_lanes(inputs, topo)  # batch vs replicas and records: a ConfigError before anything is written
        # a damaged newest checkpoint: a CheckpointError before anything is written or built
        resume_checkpoint(posixpath.join(model_dir, CHECKPOINT_DIR), repair=topo.chief)
        if topo.chief:  # the others would race the chief's writes; the chief's refusal stops them all
            prepare_model_dir(model_dir, inputs)
        run = Run(inputs, model_dir, synthetic, topo)
        out_dir = run.write_dir
        if not topo.chief:
            check_writable(out_dir)
        start, changes = run.restore()
        preemption = (dist.Preemption(topo, run.checkpointer.full, run.checkpointer.read_dir, run.checkpointer.save)
                      if topo.name == "multiworker" else None)
        state = RunState(start=start, target=lp.steps, steps_per_call=run.k_steps, data_changes=changes,
                         loss_names=run.loss_names)
        log.info("model %d parameters, batch %d (%d per replica, %d replicas on %d workers, strategy %s), "
                 "%d steps per call, precision %s, %s data, steps %d -> %d", run.model.count_params(),
                 run.batch_size, run.per_replica, topo.replicas, topo.workers, topo.name, run.k_steps,
                 lp.precision, "synthetic" if synthetic else "shard", start, lp.steps)
        scalars, progress = Scalars(out_dir), Progress(lp.steps, lp.log_every)
        try:
            while state.running and not stop.signal_name:
                state.record(*run.call(), last_checkpoint=run.checkpointer.latest)
                if preemption is not None:
                    preemption.check(state.step)
                if state.due(lp.log_every):
                    scalars.write("train", state.step, state.train_scalars())
                progress.update(state)
                if run.eval_step is not None and state.due(lp.val_every):
                    state.val_losses = run.evaluate()
                    log_validation(state)
                    scalars.write("val", state.step, state.val_losses)
                if state.due(lp.checkpoint_every):
                    run.checkpointer.save(state.step)
                    state.saved_at = state.step
            state.stopped_by = stop.signal_name or "steps"
        except dist.Preempted:
            log.warning("preempted (SIGTERM on a worker): all workers checkpointed at step %d", state.step)
            state.stopped_by, state.saved_at = "SIGTERM", state.step
        progress.close()
        finish(run, state, scalars, model_dir)
    summary = state.summary(**run.facts())
    log.info("weights digest %s", weights_digest(run.model))
    _write_json(posixpath.join(out_dir, SUMMARY_FILE), summary)
    dist.remove_write_dir(out_dir, model_dir)
    return summary


def weights_digest(model) -> str:
    """A short hash of every weight: equal on all workers of a synchronous run."""
    import hashlib

    h = hashlib.sha256()
    for v in model.variables:
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()[:16]


def log_validation(state: RunState) -> None:
    v = state.val_losses
    parts = ", ".join(f"{k} {v[k]:.4f}" for k in v if k != "loss")
    log.info("step %d validation loss %.4f (%s)", state.step, v["loss"], parts)


def finish(run: Run, state: RunState, scalars: Scalars, model_dir: str) -> None:
    """The final checkpoint (unless the last call just wrote one) and the TensorBoard files."""
    if state.step != state.saved_at:
        run.checkpointer.save(state.step)
        state.saved_at = state.step
    if state.step > state.start:
        log.info("checkpoint %s", run.checkpointer.latest)
    scalars.close()
