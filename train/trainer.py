"""What the training loop drives (`Trainer`): the model, optimizer, compiled steps, input iterators
and checkpoints of one run, and the three things the loop asks of them: one compiled call of the
scheduled bucket (`call`), validation (`evaluate`) and the facts of the run summary (`facts`).

One input pipeline, train step and eval step per length bucket (train/buckets.py), each bound to the
bucket's shapes and batch; the schedule picks the bucket of each call. On one device the steps compile
behind training from the start of the run (`start_warmup`, train/compile.py): a call whose program is
not ready yet waits for it; under a strategy each step compiles at its first call. On one device each
bucket's input pipeline is built at the bucket's first call (`iterator`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import posixpath
import time
from collections.abc import Sequence

import keras
import numpy as np

from melshards.shards_schema import Schema
from melshards.shards_schema.shards import first_bad_shard
from melshards.train import balance, device, distribute, input_pipeline
from melshards.train.buckets import Schedule, TrainerBucket, trainer_buckets
from melshards.train.checkpoints import CHECKPOINT_DIR, Checkpointer, checkpoint_step, data_settings
from melshards.train.compile import EVAL, TRAIN, Program, Warmup, warmup_order
from melshards.train.config import LoopConfig
from melshards.train.errors import TrainError
from melshards.train.inputs import Inputs
from melshards.train.metrics import Timeline
from melshards.train.plugins import check_model, check_variables, make_model, model_inputs, step_loss_names
from melshards.train.programs import StepProgram, named_calls_available, program_key, source_digest
from melshards.train.references import same_clip
from melshards.train.step import make_eval_step, make_optimizer, make_train_step, step_specs
from melshards.train.tf_quiet import reading_xla_cache, tf  # noqa: I001 (first: keras imports TensorFlow)
from melshards.train.xla_cache import cache_dir_in_flags

log = logging.getLogger("melshards.train")


def check_buckets(inputs: Inputs, topo: distribute.Topology) -> list[TrainerBucket]:
    """Every bucket's batch, files and schedule share; a batch that does not fit the records or the
    replicas is a ConfigError. Pure: called before anything is written."""
    cfg = inputs.cfg
    topo.per_replica_batch(cfg.data.batch_size)
    balancing = balance.balancing(inputs.schema, cfg.data.balance, cfg.data.balance_alpha)
    return trainer_buckets(
        inputs.files,
        inputs.val_files,
        inputs.schema,
        cfg.data.batch_size,
        cfg.data.fixed_batch_size,
        cfg.loop.steps_per_execution,
        replicas=topo.replicas,
        kept=balancing.bucket_kept if balancing else None,
    )


def seed_everything(loop: LoopConfig) -> None:
    """Keras, numpy and TF seeds; deterministic ops when loop.op_determinism (exact resume)."""
    keras.utils.set_random_seed(loop.seed)
    if loop.op_determinism:
        tf.config.experimental.enable_op_determinism()


def read_or_name_shard(fetch, files: Sequence[str], schema: Schema):
    """fetch(), with a read or parse failure turned into an error naming the bad shard."""
    try:
        return fetch()
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        bad = first_bad_shard(files, schema)
        where = str(bad) if bad else f"one of {len(files)} shards ({e.message.split('[Op:')[0].strip()})"
        raise TrainError(
            f"corrupt or truncated shard {where}. Re-run `melshards preprocess` for it, or leave it out of the glob"
        ) from e


class Trainer:
    """The model, optimizer, compiled steps (one per bucket used), input iterators and checkpointer."""

    def __init__(
        self,
        inputs: Inputs,
        model_dir: str,
        synthetic: bool,
        topo: distribute.Topology | None = None,
        stopped=lambda: False,
        began: float | None = None,
        timeline: Timeline | None = None,
        checks=lambda: None,
    ):
        """began: the run's start (time.perf_counter()): on one device its steps then compile behind
        training from now on (`start_warmup`); None: each compiles at its first call. timeline: the run's
        start-up phases, to which the checks' and the model's are added (None: a new one). checks(): what
        is refused before the model is built, run once the steps started compiling behind (the model dir
        and its newest checkpoint: `loop.check_checkpoint`); what it raises stops the warm-up."""
        cfg = inputs.cfg
        self.inputs, self.synthetic = inputs, synthetic
        self.k_steps, self.batch_size = cfg.loop.steps_per_execution, cfg.data.batch_size
        self.topo = topo or distribute.Topology("one", None)
        self.per_replica = self.topo.per_replica_batch(self.batch_size)
        self.timeline = timeline or Timeline(time.perf_counter() if began is None else began)
        seed_everything(cfg.loop)
        self.buckets = check_buckets(inputs, self.topo)
        self.balancing = balance.balancing(inputs.schema, cfg.data.balance, cfg.data.balance_alpha)
        self.schedule = Schedule([tb.calls_per_epoch for tb in self.buckets], cfg.data.seed)
        self.next_call = 0  # the schedule position: set from the restored step
        self.called: set[int] = set()  # buckets called so far: a bucket's first call is not steady state
        self.evaluated = False  # whether validation ran (its steps compiled) in this process
        self.stopped = stopped
        self.first_step_wait: float | None = None  # seconds the run's first call waited for its program
        self.state: list = []  # the variables the steps capture, in the order programs name them
        self._bound: dict[str, list] = {}  # each program's captured inputs (`captured`)
        self.choices = device.choices_for(device.step_device(self.topo.strategy), cfg.loop.jit_compile)
        with self.topo.scope():
            self.names = model_inputs(cfg.model_factory)  # MODEL_INPUTS + the features the model asks for
            # a same_clip run's references: cut from each batch's mels in the input pipeline
            self.same_clip = same_clip(self.inputs.schema, self.names)
        # the steps saved by an earlier run load while the model is built (train/compile.py)
        self.warmup: Warmup | None = None if began is None else self.start_warmup(began, model_dir)
        try:
            checks()
            self.timeline.mark("checks")
            self._build_model()
            self._make_steps()
            if self.warmup is not None:
                self.state = self.state_variables()
                steps = {(TRAIN, i): f for i, f in self.train_steps.items()}
                self.warmup.provide({**steps, **{(EVAL, i): f for i, f in self.eval_steps.items()}}, self.state)
        except BaseException:
            self.close_warmup()
            raise
        self.timeline.mark("model")
        self.write_dir = distribute.write_dir(model_dir, self.topo)
        self._make_input()
        self.checkpointer = Checkpointer(
            self.write_dir,
            self.model,
            self.optimizer,
            self.step_var,
            self.saved_iterators,
            data_settings(inputs.files, cfg, synthetic),
            cfg.loop.keep_checkpoints,
            read_dir=model_dir,
            before_save=self.complete_input,
            positions=[f"bucket_{i:02d}" for i in self.train_steps],
        )
        self._log_buckets()

    # -- construction, in order -------------------------------------------------------------------
    def _build_model(self) -> None:
        """The factory's model (its contract checked before anything compiles), the optimizer and the
        step counter: variables mirrored over the replicas (the default scope on one device).

        The contract is checked by calling the model once, eagerly (`plugins.check_model`), unless the first
        program of the warm-up was restored from the persistent cache and fits this model's state
        (`StepProgram.matches`, the test the warm-up applies before it calls a restored program): the run
        that saved it checked the same model (its key covers the factory's source, the model options,
        the precision, the layer choices, schema.json and the versions), so the loss names are read from
        the program's outputs (`plugins.step_loss_names`) and only the checks that call nothing run. A
        program that does not fit is traced by the warm-up, so a run that traces its first step has
        always called the model first; a model its factory left unbuilt (no variables yet) is always
        called. As for the program itself, code the factory imports from another package is not in the key
        (train/programs.py). `contract` says which happened."""
        cfg = self.inputs.cfg
        spec, schema = cfg.model_factory, self.inputs.schema
        with self.topo.scope():
            self.model = make_model(spec, schema, cfg.model_options, cfg.loop.precision, self.choices)
            self.step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            first = self._restored_first_step() if self.model.variables else None
            if first is not None:
                bucket, saved = first
                self.optimizer = make_optimizer(cfg.optim, cfg.loop.precision, self.model)
                if saved.matches(self.state_variables()):
                    check_variables(self.model, spec)
                    self.loss_names = step_loss_names(saved.outputs)
                    self.contract = "checked by the run that saved its program"
                    log.info(
                        "model contract checked by the run that saved the train step of bucket %d: not called "
                        "eagerly; losses %s",
                        bucket,
                        ", ".join(self.loss_names),
                    )
                    return
            self.loss_names = check_model(self.model, spec, schema, self.names)
            # made (again) after the eager call: a model that call built further gets the slots of every variable
            self.optimizer = make_optimizer(cfg.optim, cfg.loop.precision, self.model)
            self.contract = "checked"
            log.info("model contract checked by one eager call; losses %s", ", ".join(self.loss_names))

    def _restored_first_step(self) -> tuple[int, StepProgram] | None:
        """(bucket, StepProgram) when the warm-up's first program is a train step the persistent cache held
        (`Warmup.restored`: waits for its look-up, not its compile); else None."""
        if self.warmup is None or not self.warmup.programs:
            return None
        kind, bucket = next(iter(self.warmup.programs))
        saved = self.warmup.restored(kind, bucket) if kind == TRAIN else None
        return None if saved is None else (bucket, saved)

    def state_variables(self) -> list:
        """The variables the steps capture, in the order programs name them (`StepProgram.matches`)."""
        return [*self.model.variables, *self.optimizer.variables, self.step_var]

    def _make_steps(self) -> None:
        """A train step per bucket the schedule uses, an eval step per bucket with validation shards."""
        cfg = self.inputs.cfg
        # one replica's specs per bucket (each bucket's batch must divide by the replicas too)
        self.specs = {
            tb.index: step_specs(
                tb.bucket, self.topo.per_replica_batch(tb.batch_size), None, self.names, self.same_clip
            )
            for tb in self.buckets
            if tb.calls_per_epoch
        }
        self.train_steps = {
            i: make_train_step(
                self.model,
                self.optimizer,
                self.inputs.schema,
                cfg.optim,
                specs,
                self.k_steps,
                cfg.loop.seed,
                self.step_var,
                self.loss_names,
                strategy=self.topo.strategy,
                jit_compile=cfg.loop.jit_compile,
            )
            for i, specs in self.specs.items()
        }
        self.eval_steps = {
            tb.index: make_eval_step(
                self.model, tb.bucket, tb.batch_size, self.names, cfg.loop.jit_compile, self.same_clip
            )
            for tb in self.buckets
            if tb.val_files
        }

    def start_warmup(self, began: float, model_dir: str) -> Warmup | None:
        """On one device: every train step, then every eval step, compiled on a background thread
        (train/compile.py), the train steps in the order the schedule first calls their buckets from the
        call the newest checkpoint in `model_dir` resumes at. Started before the model is built: a step an
        earlier run saved is restored and loaded meanwhile; one to trace waits for the model
        (`Warmup.provide`). Under a strategy each step compiles at its first call (its step takes
        distributed batches): None."""
        if self.topo.distributed:
            return None
        specs = {
            TRAIN: {
                tb.index: step_specs(tb.bucket, tb.batch_size, self.k_steps, self.names, self.same_clip)
                for tb in self.buckets
                if tb.calls_per_epoch
            },  # one device: the replica's batch is the bucket's
            EVAL: {
                tb.index: step_specs(tb.bucket, tb.batch_size, None, self.names, self.same_clip)
                for tb in self.buckets
                if tb.val_files
            },
        }
        start = checkpoint_step(posixpath.join(model_dir, CHECKPOINT_DIR)) // self.k_steps
        order = warmup_order(self.schedule.bucket, start, list(specs[TRAIN]))
        settings = self.program_settings()
        named = named_calls_available()
        if not named:
            log.warning(
                "TensorFlow %s: the eager context cannot call a function by name; every step is traced, "
                "none is saved or restored",
                tf.__version__,
            )

        def program(kind: str, i: int) -> Program:
            key = program_key(kind, i, specs[kind][i], settings) if named else None
            return Program(kind, i, None, specs[kind][i], key)

        programs = [program(TRAIN, i) for i in order] + [program(EVAL, i) for i in sorted(specs[EVAL])]
        log.info(
            "compiling %d train and %d eval steps (one per length bucket) behind training, in the order %s",
            len(specs[TRAIN]),
            len(specs[EVAL]),
            ", ".join(f"{p.kind} {p.bucket}" for p in programs),
        )
        cache_dir = cache_dir_in_flags(os.environ.get("TF_XLA_FLAGS", ""))
        return Warmup(programs, began, cache_dir, self.stopped).start()

    def program_settings(self) -> dict:
        """What a step's trace depends on besides its kind, bucket and specs (train/programs.py
        `program_key`): the train config less the loop's counts and intervals, schema.json, the layer
        choices, the source (`source_digest`) and XLA_FLAGS (XLA's persistent cache keys an entry by the
        function's name and HLO, not by the flags it was compiled under)."""
        cfg = dataclasses.asdict(self.inputs.cfg)
        for name in ("steps", "checkpoint_every", "keep_checkpoints", "log_every", "val_every", "val_batches"):
            cfg["loop"].pop(name, None)  # when and how long to train: no step depends on them
        return {
            "config": cfg,
            "schema": self.inputs.schema.to_dict(),
            "layers": self.choices.facts(),
            "source": source_digest(self.inputs.cfg.model_factory),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
        }

    def close_warmup(self) -> None:
        """Stop compiling after the program in progress (a program left out compiles at its first call)."""
        if self.warmup is not None:
            self.warmup.close()

    def _make_input(self) -> None:
        """On one device nothing is built here: each bucket's input is built at its first use (`iterator`),
        so the first call waits for its own bucket's pipeline only. Under a strategy every bucket's input
        is built at restore (`start_distributed_input`)."""
        self.datasets: dict = {}
        self.iterators: dict = {}
        self.saved_iterators = tf.Module() if not self.topo.distributed else None
        self.input_seed: int | None = None  # overrides the config's seed (a checkpoint without a position)

    def _log_buckets(self) -> None:
        data = self.inputs.cfg.data
        if data.balance != "none":  # the shares the schedule's calls give, each of k steps of its bucket's batch
            drawn = [tb.calls_per_epoch * tb.batch_size * self.k_steps for tb in self.buckets]
            log.info(
                "%s%s",
                balance.describe(self.inputs.schema, data.balance, data.balance_alpha, drawn),
                " (--synthetic-data: not applied)" if self.synthetic else "",
            )
        for tb in self.buckets:
            log.info(
                "bucket %d: text %d, mel %d frames, batch %d, %d train records (%d calls per schedule "
                "epoch), %d val shards",
                tb.index,
                tb.bucket.max_text_len,
                tb.bucket.max_mel_frames,
                tb.batch_size,
                tb.records,
                tb.calls_per_epoch,
                len(tb.val_files),
            )

    # -- input ----------------------------------------------------------------------------------
    def make_dataset(
        self, tb: TrainerBucket, batch_size: int | None = None, shard: tuple | None = None, seed: int | None = None
    ) -> tf.data.Dataset:
        """One bucket's train input of one replica's batch (the bucket's global batch on one device)."""
        data = tb.data_config(self.inputs.cfg.data)
        if self.synthetic:  # one constant batch of each bucket: every bucket's shape is measured
            if batch_size is not None:
                data = dataclasses.replace(data, batch_size=batch_size)
            first = read_or_name_shard(
                lambda: input_pipeline.first_batch(tb.files, tb.bucket, data, self.names, self.same_clip),
                list(tb.files),
                self.inputs.schema,
            )
            return input_pipeline.synthetic_dataset(first, self.k_steps)
        return input_pipeline.train_dataset(
            tb.files,
            tb.bucket,
            data,
            self.names,
            self.k_steps,
            batch_size=batch_size,
            shard=shard,
            seed=seed,
            balance=self.balancing,
            same_clip=self.same_clip,
        )

    def iterator(self, index: int):
        """The input iterator of bucket `index`. Under a strategy: the one `start_distributed_input` built.
        On one device it is built at its first use and saved in the checkpoint as `iterator/bucket_NN`;
        when the run resumed exactly (the full checkpoint restored, `Checkpointer.pending`), it is restored
        as it is attached (tf.train.Checkpoint restores an object added to a restored object graph), so the
        run continues each bucket's stream where it stopped, whenever that bucket is first called."""
        if index not in self.iterators:
            if self.saved_iterators is None:
                raise TrainError(f"bucket {index}: a distributed input is built at restore, not at its first use")
            tb = next(tb for tb in self.buckets if tb.index == index)
            self.datasets[index] = self.make_dataset(tb, seed=self.input_seed)
            self.iterators[index] = iter(self.datasets[index])
            self.checkpointer.attach(self.saved_iterators, f"bucket_{index:02d}", self.iterators[index])
        return self.iterators[index]

    def complete_input(self) -> None:
        """On one device every bucket's input iterator built (and restored): a checkpoint then saves every
        position. Under a strategy nothing (its inputs are built at restore, their positions not saved)."""
        if self.saved_iterators is None:
            return
        for i in self.train_steps:
            self.iterator(i)

    def start_distributed_input(self, start: int) -> None:
        """Under a strategy: every bucket's distributed input, reshuffled for the step it starts at
        (no saved position)."""
        seed = distribute.resume_seed(self.inputs.cfg.data.seed, start)
        if start:
            log.info(
                "distributed input position is not checkpointable in TensorFlow; reshuffled the input with "
                "seed %d (derived from step %d) instead of replaying its first batches",
                seed,
                start,
            )
        for tb in self.buckets:
            if tb.index not in self.train_steps:
                continue
            specs = {k: tf.TensorSpec([self.k_steps, *s.shape], s.dtype) for k, s in self.specs[tb.index].items()}
            self.datasets[tb.index] = distribute.distributed_dataset(
                self.topo,
                lambda batch_size, shard, tb=tb: self.make_dataset(tb, batch_size, shard, seed),
                list(tb.files),
                tb.batch_size,
                specs,
            )
            self.iterators[tb.index] = iter(self.datasets[tb.index])

    # -- what the loop calls ----------------------------------------------------------------------
    def restore(self) -> tuple[int, list[str]]:
        """(the step to start from, the data-setting changes that gave a fresh iterator)."""
        changes = self.checkpointer.restore()
        start = int(self.step_var.numpy())
        self.next_call = start // self.k_steps
        if self.checkpointer.latest:
            log.info("resumed from %s at step %d", self.checkpointer.latest, start)
        if start % self.k_steps:
            raise TrainError(
                f"the checkpoint is at step {start}, not a multiple of loop.steps_per_execution "
                f"{self.k_steps}; resume with the steps_per_execution it was trained with"
            )
        if self.topo.distributed:
            self.start_distributed_input(start)
        elif start and not self.checkpointer.input_position_saved and not changes:
            # a checkpoint written under a strategy holds no input position: reshuffle, as a strategy does
            seed = distribute.resume_seed(self.inputs.cfg.data.seed, start)
            log.info(
                "%s holds no input position (written under a tf.distribute strategy); reshuffled the input "
                "with seed %d (derived from step %d) instead of replaying its first batches",
                self.checkpointer.latest,
                seed,
                start,
            )
            self.input_seed = seed
        return start, changes

    def captured(self, program) -> list:
        """The program's captured inputs bound to this run's state (made once per program)."""
        if program.name not in self._bound:
            self._bound[program.name] = program.bind(self.state)
        return self._bound[program.name]

    def next_bucket(self) -> int:
        """The index of the bucket the next call trains."""
        return self.buckets[self.schedule.bucket(self.next_call)].index

    def program_ready(self) -> bool:
        """Wait for the program of the next call; False when a stop was asked for meanwhile (no step runs)."""
        if self.warmup is None:
            return True
        return self.warmup.wait_unless_stopped(TRAIN, self.next_bucket())

    def call(self) -> tuple[dict, np.ndarray, float, float]:
        """One compiled call of the scheduled bucket: (mean metrics, the K step losses, input wait s, call s)."""
        tb = self.buckets[self.schedule.bucket(self.next_call)]
        train_step = self.train_steps[tb.index]
        first = tb.index not in self.called
        self.called.add(tb.index)
        warmed = self.warmup is not None and (TRAIN, tb.index) in self.warmup.programs
        if warmed:  # the schedule never changes: a late program is waited for
            self.warmup.wait(TRAIN, tb.index)  # type: ignore[union-attr]
        if self.first_step_wait is None:
            self.first_step_wait = self.warmup.programs[TRAIN, tb.index].waited_s or 0.0 if warmed else 0.0  # type: ignore[union-attr]
        if first and not warmed:
            log.info(
                "first call: tracing and XLA-compiling the train step of bucket %d (tens of seconds on CPU)", tb.index
            )
        t0 = time.perf_counter()
        it = self.iterator(tb.index)  # built (and restored) outside the shard check: its errors are not a shard's
        batch = read_or_name_shard(lambda: next(it), list(tb.files), self.inputs.schema)
        t1 = time.perf_counter()
        # a step compiled at its first call (under a strategy) may load its program from the persistent cache
        program = self.warmup.programs[TRAIN, tb.index].program if warmed else None  # type: ignore[union-attr]
        with reading_xla_cache() if first and not warmed else contextlib.nullcontext():
            out = program(batch, self.captured(program)) if program is not None else train_step(batch)
            losses = out.pop("losses").numpy()  # waits for the call: the per-call sync point
        t2 = time.perf_counter()
        self.next_call += 1
        if first and not warmed:
            log.info(
                "first call (trace + XLA compile + %d steps) of bucket %d: %.1f s", self.k_steps, tb.index, t2 - t0
            )
        out["first_call"] = float(first)
        out["padded_frames"] = float(self.k_steps * tb.batch_size * tb.bucket.max_mel_frames)
        return out, losses, t1 - t0, t2 - t0

    @property
    def validates(self) -> bool:
        """Some bucket has validation shards."""
        return bool(self.eval_steps)

    def evaluate(self) -> dict:
        """Validation losses over every bucket's validation shards, each with its own eval step and
        batch; loop.val_batches (when > 0) caps the batches of each bucket. "examples" counts the
        records seen."""
        sums: dict
        max_batches, sums = self.inputs.cfg.loop.val_batches, {}
        first = not self.evaluated
        self.evaluated = True
        for tb in self.buckets:
            if tb.index not in self.eval_steps:
                continue
            warmed = self.warmup is not None and (EVAL, tb.index) in self.warmup.programs
            if warmed:
                self.warmup.wait(EVAL, tb.index)  # type: ignore[union-attr]
            ds = input_pipeline.val_dataset(
                tb.val_files,
                self.inputs.schema,
                tb.data_config(self.inputs.cfg.data),
                self.names,
                tb.bucket,
                self.same_clip,
            )
            # a step compiled at its first call may load its program from the persistent cache
            program = self.warmup.programs[EVAL, tb.index].program if warmed else None  # type: ignore[union-attr]
            step = self.eval_steps[tb.index] if program is None else lambda b, p=program: p(b, self.captured(p))
            with reading_xla_cache() if first and not warmed else contextlib.nullcontext():
                for batch in ds.take(max_batches) if max_batches else ds:
                    for k, v in step(batch).items():
                        sums[k] = sums.get(k, 0.0) + float(v)
        losses = self.model.losses_from_terms({k: tf.constant(v, tf.float32) for k, v in sums.items()})
        return dict({k: float(v) for k, v in losses.items()}, examples=sums.get("examples", 0.0))

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
                log.error(
                    "THE TRAIN STEP OF BUCKET %d WAS TRACED %d TIMES, NOT ONCE (PER REPLICA DEVICE): every "
                    "trace recompiles with XLA. Signatures traced:\n%s\nThe dataset yields: %s",
                    i,
                    traces,
                    step.grad_fn.pretty_printed_concrete_signatures(),
                    self.datasets[i].element_spec if i in self.datasets else None,
                )
        return out

    def _restored(self, kind: str, bucket: int) -> bool:
        p = self.warmup.programs.get((kind, bucket)) if self.warmup is not None else None
        return p is not None and p.restored and p.program is not None

    def facts(self) -> dict:
        """The run summary's facts about the set-up and the compiled steps."""
        cfg = self.inputs.cfg
        traces = self.traces()
        evals = {i: step.experimental_get_tracing_count() for i, step in self.eval_steps.items()}
        buckets = [
            {
                "index": tb.index,
                "max_text_len": tb.bucket.max_text_len,
                "max_mel_frames": tb.bucket.max_mel_frames,
                "batch_size": tb.batch_size,
                "train_records": tb.records,
                "calls_per_epoch": tb.calls_per_epoch,
                "train_step_traces": traces.get(tb.index, 0),
                "eval_step_traces": evals.get(tb.index, 0),
                # restored from the persistent cache instead of traced (train/programs.py)
                "train_step_restored": int(self._restored(TRAIN, tb.index)),
                "eval_step_restored": int(self._restored(EVAL, tb.index)),
            }
            for tb in self.buckets
        ]
        warmup = self.warmup.facts() if self.warmup is not None else {}
        if warmup:  # behind training: every program's trace and compile (else each bucket's first call)
            warmup["compile_seconds"] = sum(p["trace_s"] + p["compile_s"] for p in warmup["programs"])
        return {
            **warmup,
            "first_step_wait_s": self.first_step_wait,
            "model_factory": cfg.model_factory,
            "contract": self.contract,  # how the model's contract was checked (`_build_model`)
            "synthetic_data": self.synthetic,
            "batch_size": self.batch_size,
            "fixed_batch_size": cfg.data.fixed_batch_size,
            "steps_per_execution": self.k_steps,
            "precision": cfg.loop.precision,
            **self.topo.facts(self.batch_size),
            "layers": self.choices.facts(),
            "step_function_traces": sum(s.experimental_get_tracing_count() for s in self.train_steps.values()),
            "parameters": int(self.model.count_params()),
            "train_step_traces": sum(traces.values()),
            "eval_step_traces": sum(evals.values()),
            "buckets_used": sum(1 for n in traces.values() if n),
            "buckets": buckets,
        }
