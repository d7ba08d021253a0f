"""Every bucket's step compiled before the first call, and compiled programs kept across runs.

`compile_steps` traces each bucket's train and eval step, then runs each once on a batch of padding
records so XLA compiles it now rather than when the schedule first reaches the bucket; the train
step's warm-up call changes the weights, the optimizer and the step counter, so their values are
copied to host memory before and put back after. The traces run first and in a fixed order, before any checkpoint
is restored or input built, from a uid counter moved to a round number (`align_function_names`): a
fresh run and a resumed one then trace the same functions under the same names, and the persistent
cache (train/xla_cache.py), whose keys hold those names, finds them.

Serial, not threaded: two threads calling two XLA-compiled functions compile one after the other in
TF 2.21 on CPU, so threads would gain nothing (docs/performance.md#compile).

The persistent cache that keeps compiled steps across runs is train/xla_cache.py.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from melshards.train.tf_quiet import reading_xla_cache, tf

log = logging.getLogger("melshards.train")


def align_function_names(multiple: int = 100_000) -> bool:
    """Move TensorFlow's uid counter, which numbers every traced function (`__inference_train_step_<uid>`),
    up to the next multiple of `multiple`.

    Whatever ran before (a checkpoint check reads its tensors eagerly: 4 uids per iterator state)
    shifts the numbers, and with them the persistent cache's keys; from a round number a resumed run
    traces under the names its first run used. TensorFlow has no public way to read or set the
    counter: this uses the private `tensorflow.python.framework.ops.uid`. Where a TensorFlow no longer
    has it, or it no longer counts up, it logs a warning and returns False, the names left as
    they are (the persistent cache then misses; nothing else changes); tests/train/test_compile.py
    fails on such a TensorFlow. True when the counter was moved. At most `multiple` calls of the counter.
    """
    try:
        from tensorflow.python.framework.ops import uid

        first = uid()
        if not isinstance(first, int) or uid() <= first:
            raise TypeError(f"ops.uid() gave {first!r}, then not a larger number")
    except (ImportError, TypeError) as e:
        log.warning(
            "TensorFlow %s: cannot align the traced functions' names (%s); the persistent XLA cache "
            "will miss on resumed runs (train/compile.py align_function_names)",
            tf.__version__,
            e,
        )
        return False
    target = (first // multiple + 1) * multiple
    while uid() < target - 1:
        pass
    return True


def _host_copy(variable: tf.Variable) -> np.ndarray:
    """The variable's value in host memory, owned by numpy (never a view of a TensorFlow buffer): the
    device holds no second copy of the weights and optimizer slots while the warm-up steps run."""
    value = variable.numpy()
    return value if value.flags.owndata else value.copy()


def zeros(specs: dict) -> dict:
    """A batch of padding records (every length 0) of the specs' shapes."""
    return {k: tf.zeros(s.shape, s.dtype) for k, s in specs.items()}


def compile_steps(
    train_steps: dict,
    train_specs: dict,
    eval_steps: dict,
    eval_specs: dict,
    state: list[tf.Variable],
    stopped=lambda: False,
) -> dict[int, dict]:
    """Trace every step (bucket order), then compile each by one call on padding records of the specs it
    is called with (the train step's with their leading K), the `state` variables put back after.
    The `state` is kept in host memory meanwhile (`_host_copy`): a device copy would double the
    weights' and optimizer slots' device memory during the warm-up steps.
    Returns {bucket: {"trace_s", "compile_s"}} (train and eval together). `stopped()` true (a first
    Ctrl-C) ends it before the next compile; a step left out compiles at its first call, if any."""
    report: dict[int, dict] = {}
    buckets = sorted(set(train_steps) | set(eval_steps))
    align_function_names()
    for steps in (train_steps, eval_steps):
        for i in buckets:
            if i in steps:
                t0 = time.perf_counter()
                steps[i].get_concrete_function()  # bound to its input_signature
                entry = report.setdefault(i, {"trace_s": 0.0, "compile_s": 0.0})
                entry["trace_s"] += time.perf_counter() - t0
    saved = [_host_copy(v) for v in state]
    try:
        with reading_xla_cache():  # each compile may load its program from the persistent cache
            for kind, steps, specs in (("train", train_steps, train_specs), ("eval", eval_steps, eval_specs)):
                for i in buckets:
                    if i in steps and not stopped():
                        t0 = time.perf_counter()
                        tf.nest.map_structure(lambda t: t.numpy(), steps[i](zeros(specs[i])))  # waits for it
                        seconds = time.perf_counter() - t0
                        report[i]["compile_s"] += seconds
                        log.info("compiled the %s step of bucket %d: %.1f s", kind, i, seconds)
    finally:
        for v, value in zip(state, saved):
            v.assign(value)
    return report
