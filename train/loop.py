"""The training loop: `train` checks what it can before writing anything, builds a `Trainer`
(train/trainer.py) and then calls small named pieces once per compiled call: `Trainer.call` (the
step and its timing), `RunState.record` (metrics, NaN check, throughput), `Scalars.write`
(TensorBoard), `Progress.update`, `Trainer.evaluate`, `Checkpointer.save` and the `StopFlag`
(train/signals.py). Python runs once per call of the step (K = steps_per_execution optimizer steps)
and does nothing else.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import time

import numpy as np

from melshards.train import distribute
from melshards.train.checkpoints import CHECKPOINT_DIR, check_writable, resume_checkpoint
from melshards.train.errors import ModelDirError, RestoreError, TrainError
from melshards.train.inputs import Inputs, resolve_inputs
from melshards.train.metrics import RunState, Timeline, format_summary
from melshards.train.model_dir import (
    CONFIG_FILE,
    SUMMARY_FILE,
    check_model_dir,
    check_model_dir_target,
    record_settings,
    write_json,
)
from melshards.train.progress import Progress, log_validation
from melshards.train.signals import StopFlag
from melshards.train.summaries import TENSORBOARD_DIR, Scalars
from melshards.train.trainer import Trainer, check_buckets

__all__ = [
    "CHECKPOINT_DIR",
    "CONFIG_FILE",
    "SUMMARY_FILE",
    "TENSORBOARD_DIR",
    "Inputs",
    "ModelDirError",
    "RestoreError",
    "TrainError",
    "format_summary",
    "resolve_inputs",
    "train",
]

log = logging.getLogger("melshards.train")


def train(inputs: Inputs, model_dir: str, synthetic: bool = False, topo: distribute.Topology | None = None) -> dict:
    """Train to cfg.loop.steps (resuming from model_dir); returns the run summary (also written).

    topo: the tf.distribute set-up (melshards.train.distribute.make_topology); None: one device. A non-chief
    worker writes its checkpoints and summary to a temp dir, removed at the end.
    """
    topo = topo or distribute.Topology("one", None)
    began = time.perf_counter()
    with StopFlag() as stop:  # from the start: a Ctrl-C during set-up stops before the first call
        timeline = Timeline(began)
        check_target(inputs, model_dir, topo)
        trainer = Trainer(
            inputs,
            model_dir,
            synthetic,
            topo,
            stopped=lambda: stop.signal_name is not None,
            began=began,
            timeline=timeline,
            checks=lambda: check_checkpoint(inputs, model_dir, topo),
        )
        try:
            if topo.chief:  # the model is built (its steps compiling behind): the run starts, its dir is marked
                record_settings(model_dir, inputs)
            timeline.mark("settings")
            state = start(trainer, began)
            scalars = Scalars(trainer.write_dir)
            run_calls(trainer, state, stop, scalars)
        finally:  # no compile left running when the run ends, however it ends
            trainer.close_warmup()
        finish(trainer, state, scalars)
    return write_summary(trainer, state, model_dir)


def check_target(inputs: Inputs, model_dir: str, topo: distribute.Topology) -> None:
    """What can be refused before anything is built or read from the model dir: the batch against the
    replicas and records (a ConfigError), then, on the chief, a dir of someone else's files (refused
    before its checkpoint file is read or repaired)."""
    check_buckets(inputs, topo)
    if topo.chief:
        check_model_dir_target(model_dir, inputs)


def check_checkpoint(inputs: Inputs, model_dir: str, topo: distribute.Topology) -> None:
    """The newest checkpoint read whole (a damaged one: a CheckpointError) and the model dir checked
    against it (on the chief). Run by the Trainer once its steps started compiling behind (their programs
    come from the persistent cache, not the model dir) and before the model is built: nothing is written
    in a directory that is not one melshards train may write into, and nothing but a probe file before
    the run starts (`record_settings`)."""
    latest = resume_checkpoint(posixpath.join(model_dir, CHECKPOINT_DIR), repair=topo.chief)
    if topo.chief:  # the others would race the chief's writes; the chief's refusal stops them all
        check_model_dir(model_dir, inputs, trained=latest is not None)


def start(trainer: Trainer, began: float) -> RunState:
    """Restore the newest checkpoint (if any) and log the set-up: the state the first call starts from."""
    if not trainer.topo.chief:
        check_writable(trainer.write_dir)
    start_step, changes = trainer.restore()
    trainer.timeline.mark("restore")
    if trainer.synthetic:  # each bucket's input reads its first batch: a bad shard stops the run before it trains
        trainer.complete_input()
    else:  # the first call's input (the others' at their first calls)
        trainer.iterator(trainer.next_bucket())
    trainer.timeline.mark("input")
    lp, topo = trainer.inputs.cfg.loop, trainer.topo
    log.info(
        "model %d parameters, batch %d (%d per replica, %d replicas on %d workers, strategy %s), "
        "%d steps per call, precision %s, %s data, steps %d -> %d",
        trainer.model.count_params(),
        trainer.batch_size,
        trainer.per_replica,
        topo.replicas,
        topo.workers,
        topo.name,
        trainer.k_steps,
        lp.precision,
        "synthetic" if trainer.synthetic else "shard",
        start_step,
        lp.steps,
    )
    return RunState(
        start=start_step,
        target=lp.steps,
        steps_per_call=trainer.k_steps,
        data_changes=changes,
        loss_names=trainer.loss_names,
        compiled=trainer.warmup is not None,
        began=began,
        startup=trainer.timeline,
    )


def run_calls(trainer: Trainer, state: RunState, stop: StopFlag, scalars: Scalars) -> None:
    """Compiled calls until the target step, a signal or (multiworker) a preemption; sets stopped_by."""
    lp, ckpt = trainer.inputs.cfg.loop, trainer.checkpointer
    preemption = (
        distribute.Preemption(trainer.topo, ckpt.full, ckpt.read_dir, ckpt.save)
        if trainer.topo.name == "multiworker"
        else None
    )
    progress = Progress(lp.steps, lp.log_every)
    try:
        while state.running and not stop.signal_name:
            if not trainer.program_ready():  # a signal came while the call's program was compiling
                break
            trainer.timeline.mark("program wait")
            state.record(*trainer.call(), last_checkpoint=ckpt.latest)
            if state.time_to_first_step is None:
                state.time_to_first_step = time.perf_counter() - state.began
                trainer.timeline.mark("first call", state.began + state.time_to_first_step)
                log.info(
                    "first call done %.1f s after the start (it waited %.1f s for its program); start-up: %s",
                    state.time_to_first_step,
                    trainer.first_step_wait or 0.0,
                    trainer.timeline.describe(),
                )
            if preemption is not None:
                preemption.check(state.step)
            if state.due(lp.log_every):
                scalars.write("train", state.step, state.train_scalars())
            progress.update(state)
            if trainer.validates and state.due(lp.val_every):
                state.val_losses = trainer.evaluate()
                log_validation(state)
                scalars.write("val", state.step, state.val_losses)
            if state.due(lp.checkpoint_every):
                ckpt.save(state.step)
                state.saved_at = state.step
        state.stopped_by = stop.signal_name or "steps"
    except distribute.Preempted:
        log.warning("preempted (SIGTERM on a worker): all workers checkpointed at step %d", state.step)
        state.stopped_by, state.saved_at = "SIGTERM", state.step
    progress.close()


def finish(trainer: Trainer, state: RunState, scalars: Scalars) -> None:
    """The final checkpoint (unless the last call just wrote one) and the TensorBoard files."""
    if state.step != state.saved_at:
        trainer.checkpointer.save(state.step)
        state.saved_at = state.step
    if state.step > state.start:
        log.info("checkpoint %s", trainer.checkpointer.latest)
    scalars.close()


def write_summary(trainer: Trainer, state: RunState, model_dir: str) -> dict:
    """run_summary.json (in this worker's write dir, removed unless it is the model dir) and the weights
    digest every worker logs."""
    summary = state.summary(**trainer.facts())
    log.info("weights digest %s", weights_digest(trainer.model))
    write_json(posixpath.join(trainer.write_dir, SUMMARY_FILE), summary)
    distribute.remove_write_dir(trainer.write_dir, model_dir)
    return summary


def weights_digest(model) -> str:
    """A short hash of every weight: equal on all workers of a synchronous run."""
    h = hashlib.sha256()
    for v in model.variables:
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()[:16]
