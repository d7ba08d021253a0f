"""The run state: step counters, the latest metrics, throughput bookkeeping and the run summary.

Pure Python over numbers the loop hands in (no TensorFlow), so every figure is unit-tested.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from melshards.train.errors import TrainError

LOSSES = ("loss", "mel_loss", "postnet_loss", "stop_loss")  # the built-in model's; a plug-in names its own
STEP_SCALARS = ("grad_norm", "learning_rate")


@dataclasses.dataclass
class Steady:
    """Sums over the calls after the first (which traces and compiles)."""

    seconds: float = 0.0
    calls: int = 0
    examples: float = 0.0
    mel_frames: float = 0.0
    wait: float = 0.0


@dataclasses.dataclass
class Timeline:
    """Where a run's set-up goes: the end of each start-up phase, in seconds from the start of `train`,
    in the order the phases ran (the run summary's `startup_s` gives each phase's own seconds)."""

    began: float  # time.perf_counter() at the start of `train`
    ends: dict[str, float] = dataclasses.field(default_factory=dict)

    def mark(self, phase: str, now: float | None = None) -> None:
        """`phase` ended now (or at `now`, a time.perf_counter() reading); a phase is marked once."""
        if phase not in self.ends:
            self.ends[phase] = (time.perf_counter() if now is None else now) - self.began

    def phases(self) -> dict[str, float]:
        """Each phase's own seconds: its end less the previous phase's end (the first's: less the start)."""
        out, previous = {}, 0.0
        for phase, end in self.ends.items():
            out[phase] = end - previous
            previous = end
        return out

    def describe(self) -> str:
        return ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds in self.phases().items())


@dataclasses.dataclass
class RunState:
    start: int
    target: int
    steps_per_call: int
    step: int = -1
    saved_at: int = -1
    first_loss: float | None = None
    last: dict = dataclasses.field(default_factory=dict)
    rates: dict = dataclasses.field(default_factory=dict)
    val_losses: dict = dataclasses.field(default_factory=dict)
    compile_seconds: float | None = None  # each bucket's first call, unless the steps compiled behind training
    compiled: bool = False  # the steps compiled behind training (the run summary's facts give their seconds)
    first_call_seconds: float | None = None  # each bucket's first call (warm-up): out of the steady state
    time_to_first_step: float | None = None  # from the start of `train` to the end of its first call
    began: float = 0.0  # time.perf_counter() at the start of `train`
    startup: Timeline | None = None  # the set-up's phases up to the end of the first call
    steady: Steady = dataclasses.field(default_factory=Steady)
    stopped_by: str = "steps"
    data_changes: list = dataclasses.field(default_factory=list)
    loss_names: tuple = LOSSES  # the keys of the model's losses_from_terms, "loss" first
    valid_frames: float = 0.0  # mel frames over every step run, valid and as padded (length buckets)
    padded_frames: float = 0.0

    def __post_init__(self):
        if self.step < 0:
            self.step = self.start
        if self.saved_at < 0:
            self.saved_at = self.start

    @property
    def running(self) -> bool:
        return self.step < self.target

    def record(
        self, metrics: dict, losses: np.ndarray, wait_s: float, call_s: float, last_checkpoint: str | None
    ) -> None:
        """One compiled call's results: K per-step losses (checked), mean metrics, the timings.

        metrics may carry "first_call" (1: the bucket's first call, which warms up, and traces and compiles
        its step unless `compiled` says that was done behind training; default: the run's first call) and
        "padded_frames" (the frames the call ran, padding included: the padding fraction).
        """
        bad = np.flatnonzero(~np.isfinite(losses))
        if bad.size:
            raise TrainError(
                f"loss became {losses[bad[0]]} at step {self.step + bad[0] + 1}; stopped instead of training "
                f"on. The last checkpoint ({last_checkpoint or 'none'}) is intact: lower "
                "optim.learning_rate or check the shards' statistics (`melshards stats`)"
            )
        self.step += self.steps_per_call
        self.last = {k: float(v) for k, v in metrics.items()}
        if self.first_loss is None:
            self.first_loss = float(losses[0])
        self.valid_frames += self.last["mel_frames"]
        self.padded_frames += self.last.get("padded_frames", 0.0)
        if self.last.get("first_call", self.first_call_seconds is None):
            self.first_call_seconds = (self.first_call_seconds or 0.0) + call_s
            if not self.compiled:
                self.compile_seconds = self.first_call_seconds
        else:
            s = self.steady
            s.seconds += call_s
            s.calls += 1
            s.examples += self.last["examples"]
            s.mel_frames += self.last["mel_frames"]
            s.wait += wait_s
        self.rates = {
            "steps_per_second": self.steps_per_call / call_s,
            "examples_per_second": self.last["examples"] / call_s,
            "mel_frames_per_second": self.last["mel_frames"] / call_s,
            "input_wait_seconds": wait_s,
        }

    def train_scalars(self) -> dict:
        return {**{k: self.last[k] for k in (*self.loss_names, *STEP_SCALARS)}, **self.rates}

    def due(self, every: int) -> bool:
        """True on the calls that end on a multiple of `every` (a multiple of steps_per_call)."""
        return self.step % every == 0

    def summary(self, **facts) -> dict:
        """run_summary.json: the counters, losses and steady-state rates, plus the caller's facts (their
        "compile_seconds", when given, is the compile behind training)."""
        s, secs = self.steady, self.steady.seconds
        compile_seconds = facts.pop("compile_seconds", self.compile_seconds)
        return {
            "steps_run": self.step - self.start,
            "start_step": self.start,
            "final_step": self.step,
            "target_steps": self.target,
            "stopped_by": self.stopped_by,
            **facts,
            "data_changed": self.data_changes,
            "first_loss": self.first_loss,
            "final_losses": {
                "train": {k: self.last[k] for k in self.loss_names} if self.last else {},
                "val": self.val_losses,
            },
            "compile_seconds": compile_seconds,
            "first_call_seconds": self.first_call_seconds,
            "time_to_first_step": self.time_to_first_step,
            "startup_s": self.startup.phases() if self.startup is not None else {},
            "padding_fraction": 1.0 - self.valid_frames / self.padded_frames if self.padded_frames else None,
            "steady_state": {
                "calls": s.calls,
                "steps_per_second": s.calls * self.steps_per_call / secs if secs else None,
                "examples_per_second": s.examples / secs if secs else None,
                "mel_frames_per_second": s.mel_frames / secs if secs else None,
                "input_wait_fraction": s.wait / secs if secs else None,
            },
        }


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
        *(
            [
                f"strategy           {summary['strategy']}: {summary['replicas']} replicas on {summary['workers']} "
                f"workers, {summary['per_replica_batch_size']} examples per replica"
            ]
            if "strategy" in summary
            else []
        ),
        f"train step traces  {summary['train_step_traces']}{_per_bucket(summary)}",
        f"compile            {num(summary['compile_seconds'], '.1f')} s ({_compiled(summary)}); first step after "
        f"{num(summary.get('time_to_first_step'), '.1f')} s, of which {num(summary.get('first_step_wait_s'), '.1f')} s "
        "waiting for its program",
        f"padding            {num(_percent(summary.get('padding_fraction')), '.1f')}% of the mel frames run",
        f"steady state       {num(s['steps_per_second'], '.2f')} steps/s, {num(s['examples_per_second'], '.1f')} "
        f"examples/s, {num(s['mel_frames_per_second'], '.0f')} mel frames/s, input wait "
        f"{num(None if s['input_wait_fraction'] is None else 100 * s['input_wait_fraction'], '.1f')}%",
    ]
    if summary.get("data_changed"):
        lines.append("input changed      fresh iterator: " + "; ".join(summary["data_changed"]))
    if t:
        parts = ", ".join(f"{k.removesuffix('_loss')} {v:.4f}" for k, v in t.items() if k != "loss")
        lines.append(
            f"loss               {num(summary['first_loss'], '.4f')} (first step) -> {t['loss']:.4f}"
            + (f" ({parts})" if parts else "")
        )
    if summary["final_losses"]["val"]:
        lines.append(f"validation loss    {summary['final_losses']['val']['loss']:.4f}")
    return "\n".join(lines)


def _per_bucket(summary: dict) -> str:
    """ " (bucket frames x batch: traces, ...)" when the run has length buckets."""
    buckets = summary.get("buckets") or []
    if not buckets:
        return ""
    return (
        " ("
        + ", ".join(f"{b['max_mel_frames']} frames x {b['batch_size']}: {b['train_step_traces']}" for b in buckets)
        + ")"
    )


def _compiled(summary: dict) -> str:
    """How the steps were compiled: behind training (how many programs, how many from the persistent
    cache), else at each one's first call."""
    if "programs" not in summary:
        return "first call of each step: trace + XLA compile"
    return (
        f"{len(summary['programs'])} programs behind training, {summary['programs_from_cache']} of them "
        "from the persistent cache"
    )


def _percent(fraction: float | None) -> float | None:
    return None if fraction is None else 100 * fraction
