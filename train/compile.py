"""Each bucket's steps compiled behind training: the first step runs as soon as its own bucket's program is ready.

`Warmup` compiles a run's programs one after another on a background thread, in a fixed order
(`warmup_order`): the train step of each bucket in the order the schedule first calls it,
counted from the run's first call (a resumed run: from its checkpoint's), then the eval steps. It starts
before the model is built: a program an earlier run saved is restored and compiled meanwhile, one to
trace waits for the traced functions and the state (`Warmup.provide`). A second thread restores or
traces the next program while one compiles (XLA compiles one program at a time, even from two threads;
a trace is Python), once the first program, the one the first step waits for, is ready. The loop
asks `Warmup.wait` before a program's first call; a program that is late makes that call wait for it,
the schedule never changes, so a resumed run trains on exactly the batches an uninterrupted one would.

Each program is a StepProgram (train/programs.py: the traced step under names derived from its key,
or, with the persistent cache on, the one a previous run saved, restored without tracing) and compiles
by one call on a batch of padding records with a scratch copy of the variables it captures (zeros of
the same shapes and dtypes, on the same devices). XLA keys a compiled program by the function and the
shapes and dtypes of its arguments, not by which variables they are, so the training call that follows
finds it compiled; the warm-up never writes the weights, optimizer slots or step counter the loop is
training, so it can run while the loop trains. The scratch copy (one, shared by every program) lives
until the last program is ready. A step that cannot be a StepProgram (it captures a resource that is
no state variable) compiles through the traced function's flat call (`ConcreteFunction._call_flat`,
the private entry that takes the captured inputs as arguments); where a TensorFlow lacks it
(`flat_call_available`), such a step compiles at its first call instead (logged), and
tests/train/test_compile.py fails.

The persistent cache that keeps compiled steps across runs is train/xla_cache.py; a program it holds
is loaded, not compiled (`Program.from_cache`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from melshards.train.programs import Scratch, StepProgram, from_trace, program_path, restore, variable_spec
from melshards.train.tf_quiet import reading_xla_cache, tf

log = logging.getLogger("melshards.train")

TRAIN, EVAL = "train", "eval"


def zeros(specs: dict) -> dict:
    """A batch of padding records (every length 0) of the specs' shapes."""
    return {k: tf.zeros(s.shape, s.dtype) for k, s in specs.items()}


def warmup_order(schedule: Callable[[int], int], first_call: int, buckets: Sequence[int]) -> list[int]:
    """`buckets` in the order the schedule first calls them from call `first_call` on (a bucket it never
    reaches within a few epochs' worth of calls comes last, in index order)."""
    order: list[int] = []
    left = set(buckets)
    call, limit = first_call, first_call + 100_000
    while left and call < limit:
        b = schedule(call)
        if b in left:
            order.append(b)
            left.discard(b)
        call += 1
    return order + sorted(left)


def flat_call_available() -> bool:
    """Whether this TensorFlow's traced functions take their captured inputs as arguments
    (`ConcreteFunction._call_flat(tensor_inputs, captured_inputs)`), which the warm-up compiles through."""
    from tensorflow.python.eager.polymorphic_function.concrete_function import ConcreteFunction

    call = getattr(ConcreteFunction, "_call_flat", None)
    if call is None:
        return False
    import inspect

    return list(inspect.signature(call).parameters)[1:3] == ["tensor_inputs", "captured_inputs"]


@dataclasses.dataclass
class Program:
    """One step to compile: its kind (train or eval), bucket, traced function and the specs it is called
    with; what the warm-up measured (trace and compile seconds, when it was ready since the run began,
    whether the persistent cache held it) and its error, if it failed."""

    kind: str
    bucket: int
    step: object  # the traced function (tf.function); None until `Warmup.provide`
    specs: dict
    key: str | None = None  # its StepProgram's key (train/programs.py); None: called as traced
    program: StepProgram | None = None  # what the loop calls, once ready (None: the traced function)
    restored: bool = False  # the program came from a saved StepProgram: not traced
    trace_s: float = 0.0
    compile_s: float = 0.0
    ready_s: float | None = None
    from_cache: bool | None = None
    error: BaseException | None = None
    prepared: tuple | None = None  # (StepProgram or None, traced function or None, saved file or None)
    found: StepProgram | None = None  # what its look-up in the persistent cache restored (set with `looked_up`)
    waited_s: float | None = None  # how long the loop waited for it at its first call
    called_s: float | None = None  # when the loop first called it, in seconds since the run began
    ready: threading.Event = dataclasses.field(default_factory=threading.Event, repr=False)
    made: threading.Event = dataclasses.field(default_factory=threading.Event, repr=False)  # `prepared` is set
    looked_up: threading.Event = dataclasses.field(default_factory=threading.Event, repr=False)  # `found` is set

    def facts(self) -> dict:
        return {
            "kind": self.kind,
            "bucket": self.bucket,
            "restored": self.restored,
            "trace_s": round(self.trace_s, 3),
            "compile_s": round(self.compile_s, 3),
            "ready_s": None if self.ready_s is None else round(self.ready_s, 3),
            "from_cache": self.from_cache,
            "waited_s": None if self.waited_s is None else round(self.waited_s, 3),
            "called_s": None if self.called_s is None else round(self.called_s, 3),
        }


class Warmup:
    """Traces and compiles `programs` in their order on two background threads (module doc).

    began: time.perf_counter() at the start of the run (`ready_s` counts from it); cache_dir: the
    persistent XLA cache (None: off), whose new entries tell a compiled program from a loaded one;
    stopped(): true ends the warm-up before its next program (a program left out compiles at its first
    call). `wait` returns at once for a program the warm-up does not hold."""

    def __init__(
        self,
        programs: Sequence[Program],
        began: float,
        cache_dir: str | None = None,
        stopped: Callable[[], bool] = lambda: False,
        state: Sequence | None = None,
    ):
        self.programs = {(p.kind, p.bucket): p for p in programs}
        self.began, self.cache_dir, self.stopped = began, cache_dir, stopped
        self.state: list = []
        self._provided = threading.Event()  # the traced functions and the state are there (`provide`)
        self._closing = False
        self._scratch = Scratch()  # the scratch copy: by state index, or ("traced", id(variable))
        if state is not None:
            self.provide({}, state)
        self._thread = threading.Thread(target=self._run, name="melshards-warmup", daemon=True)

    def start(self) -> Warmup:
        self._thread.start()
        return self

    def provide(self, steps: dict, state: Sequence) -> None:
        """The traced functions ({(kind, bucket): tf.function}, for the programs made without one) and the
        state variables, once the model is built: a program restored before them waits for them to be
        checked against, one that is not restored to be traced."""
        for key, step in steps.items():
            if key in self.programs and self.programs[key].step is None:
                self.programs[key].step = step
        self.state = list(state)
        self._provided.set()

    def _await(self, event: threading.Event) -> bool:
        """Wait for `event` (`provide`'s, or a program's); False when the warm-up is closed or stopped meanwhile."""
        while not event.wait(0.1):
            if self._closing or self.stopped():
                return False
        return True

    def _prepare_all(self) -> None:
        """Restore or trace each program in order (the tracing thread): the compile thread compiles the one
        before meanwhile (XLA compiles one program at a time; a trace is Python), except the first, which
        the first step waits for."""
        programs = list(self.programs.values())
        try:
            for k, p in enumerate(programs):
                # one program ahead of the compiles; none while the first, the first step's, compiles
                if k and not self._await(programs[max(k - 2, 0)].ready):
                    return
                if self._closing or self.stopped():
                    break
                try:
                    p.prepared = self._prepare(p)
                except BaseException as e:  # noqa: BLE001 (handed to the thread that waits for it)
                    p.error = e
                finally:
                    p.made.set()
        finally:
            for p in self.programs.values():
                p.looked_up.set()
                p.made.set()

    def _run(self) -> None:
        tracer = threading.Thread(target=self._prepare_all, name="melshards-trace", daemon=True)
        tracer.start()
        try:
            with reading_xla_cache():  # each compile may load its program from the persistent cache
                for p in self.programs.values():
                    if not self._await(p.made) or self._closing or self.stopped():
                        break
                    try:
                        if p.error is None and p.prepared is not None:
                            self._compile(p)
                    except BaseException as e:  # noqa: BLE001 (handed to the thread that waits for it)
                        p.error = e
                    finally:
                        p.ready.set()
        finally:
            self._closing = True
            tracer.join()
            self._scratch.free()  # the scratch copy's memory back once the last program is ready
            for p in self.programs.values():  # left out: compiles at its first call
                p.ready.set()

    def _prepare(self, p: Program) -> tuple | None:
        """(its StepProgram, or None; the traced function, when traced; the file it is saved in): restored
        from the persistent cache, else traced (and saved); None when the warm-up closed meanwhile."""
        t0 = time.perf_counter()
        path = program_path(self.cache_dir, p.key) if self.cache_dir and p.key else None
        program = restore(path) if path else None
        p.restored = program is not None
        p.found = program
        p.looked_up.set()
        concrete = None
        if program is None:
            if not self._await(self._provided):
                return None
            concrete = p.step.get_concrete_function()  # type: ignore[attr-defined]  # bound to its input_signature
            program = from_trace(concrete, p.kind, p.bucket, p.key, self.state) if p.key else None
            if program is not None and path:
                try:
                    program.save(path)
                except OSError as e:  # the next run traces it again
                    log.warning("could not save the %s step of bucket %d in %s: %s", p.kind, p.bucket, path, e)
        p.trace_s = time.perf_counter() - t0
        return program, concrete, path

    def _compile(self, p: Program) -> None:
        program, concrete, path = p.prepared  # type: ignore[misc]
        t1 = time.perf_counter()
        if program is None and not flat_call_available():
            log.warning(
                "TensorFlow %s: no ConcreteFunction._call_flat; the %s step of bucket %d compiles at its first call",
                tf.__version__,
                p.kind,
                p.bucket,
            )
            return
        before = self._cached()
        batch = zeros(p.specs)
        if program is not None:
            out = program(batch, program.scratch(self._scratch))
        else:  # called as traced: its captured variables swapped for the scratch copy
            assert concrete is not None  # traced above: no program without a trace but a restored one
            state = {id(v.handle): i for i, v in enumerate(self.state)}
            captures = [self._scratch_for(c, concrete, state) for c in concrete.captured_inputs]
            out = concrete._call_flat(tf.nest.flatten(batch, expand_composites=True), captures)
        tf.nest.map_structure(lambda t: t.numpy(), out)  # waits for it
        p.compile_s = time.perf_counter() - t1
        p.from_cache = None if before is None else self._cached() == before
        if p.restored:  # restored before the model was built: it must capture this model's state
            if not self._await(self._provided):
                return
            if not program.matches(self.state):
                log.warning(
                    "the %s step of bucket %d saved in %s does not fit this model's variables; tracing it instead",
                    p.kind,
                    p.bucket,
                    path,
                )
                p.key = None  # traced and called as traced, not saved over the file
                p.prepared = self._prepare(p)
                if p.prepared is not None:
                    self._compile(p)
                return
        p.program = program
        p.ready_s = time.perf_counter() - self.began
        log.info(
            "%s the %s step of bucket %d behind training: %s %.1f s, %s %.1f s (ready %.1f s after the start)",
            "restored" if p.restored else "compiled",
            p.kind,
            p.bucket,
            "restore" if p.restored else "trace",
            p.trace_s,
            "loaded from the persistent cache" if p.from_cache else "XLA compile",
            p.compile_s,
            p.ready_s,
        )

    def _scratch_for(self, capture, concrete, state: dict):
        """The scratch variable standing for a captured variable (a state variable's, by its index in
        `state`, {id(handle): index}, as a StepProgram's; else one of the function's own variables:
        the optimizer's slots, which its fused update reads by handle, are not among those), or the
        capture itself when it is no variable (a constant)."""
        if capture.dtype != tf.resource:
            return capture
        if id(capture) in state:
            return self._scratch.handle(state[id(capture)], *variable_spec(self.state[state[id(capture)]]))
        owner = next((v for v in concrete.variables if v.handle is capture), None)
        if owner is None:
            raise RuntimeError(f"{concrete.name}: a captured resource that is no variable; cannot warm it up")
        return self._scratch.handle(("traced", id(owner)), owner.shape, owner.dtype)

    def _cached(self) -> frozenset[str] | None:
        if self.cache_dir is None:
            return None
        try:
            return frozenset(n for n in os.listdir(self.cache_dir) if n.startswith("xla_compile_cache__"))
        except OSError:
            return None

    def restored(self, kind: str, bucket: int) -> StepProgram | None:
        """The StepProgram the persistent cache held for the program, once its look-up is done (it needs no
        model: the first program's is done soon after `start`, a later one's after the programs before it);
        None when the cache held none or the warm-up closed or stopped first. Whether it fits the model
        is `StepProgram.matches`: one that does not is traced instead."""
        p = self.programs.get((kind, bucket))
        if p is None:
            return None
        return p.found if self._await(p.looked_up) else None

    def wait(self, kind: str, bucket: int) -> float:
        """Block until the program is ready (or the warm-up left it out); the seconds waited. A program
        whose warm-up failed raises its error here. The first wait for each program is kept (`waited_s`)."""
        waited = self._wait(kind, bucket, lambda: False)
        assert waited is not None  # never stopped
        return waited

    def wait_unless_stopped(self, kind: str, bucket: int) -> bool:
        """`wait`, or False as soon as `stopped()` turns true while the program is not ready."""
        return self._wait(kind, bucket, self.stopped) is not None

    def _wait(self, kind: str, bucket: int, stop: Callable[[], bool]) -> float | None:
        """The seconds waited for the program (0.0 for one the warm-up does not hold); None when `stop()`
        turned true first (nothing recorded)."""
        p = self.programs.get((kind, bucket))
        if p is None:
            return 0.0
        t0 = time.perf_counter()
        if not p.ready.is_set():
            log.info("waiting for the %s step of bucket %d: compiling behind training", kind, bucket)
            while not p.ready.wait(0.1):  # short waits: the main thread keeps taking signals
                if stop():
                    return None
        waited = time.perf_counter() - t0
        if p.waited_s is None:
            p.waited_s = waited
        if p.called_s is None:
            p.called_s = time.perf_counter() - self.began
        if p.error is not None:
            raise p.error
        return waited

    def close(self) -> None:
        """Stop before the next program and wait for the one compiling (and the one tracing) now."""
        self._closing = True
        if self._thread.is_alive():
            self._thread.join()

    def facts(self) -> dict:
        """The run summary's figures: every program in warm-up order (with the loop's first wait for it),
        how many the persistent cache held and how many were compiled."""
        programs = [p.facts() for p in self.programs.values()]
        return {
            "programs": programs,
            "programs_from_cache": sum(1 for p in programs if p["from_cache"]),
            "programs_compiled": sum(1 for p in programs if p["ready_s"] is not None and not p["from_cache"]),
            "programs_restored": sum(1 for p in programs if p["restored"]),
        }
