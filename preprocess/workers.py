"""The job's worker processes: how many a local run starts (`--workers`), and what each one does once
at start (`worker_setup`, from the DoFns' setup)."""
from __future__ import annotations

import atexit
import functools
import gc
import os

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

from melshards.preprocess.options import OptionsError, is_local

ROWS_PER_WORKER = 1000


def all_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_workers(rows: int | None) -> int:
    """Every core, but one worker per ROWS_PER_WORKER rows at most.

    A worker process costs ~2 s to start and stop (Beam's harness, librosa's import), paid back
    by about 1,000 clips of work shared (measured on 2 cores: 56 clips 3.3 s with one worker,
    5.2 s with two; 1,000 clips 8.8 s and 9.5 s). rows None (a remote corpus not counted): every core.
    """
    cores = all_cores()
    return cores if rows is None else max(1, min(cores, -(-rows // ROWS_PER_WORKER)))


def apply_workers(options: PipelineOptions, beam_args: list[str], workers: int | None,
                  rows: int | None = None) -> None:
    """--workers N (default: `default_workers(rows)`) -> the local runner's worker count and mode.

    N > 1 runs N worker processes (multi_processing); 1 runs in this process. Beam's own
    --direct_num_workers / --direct_running_mode, when given, win.
    """
    if not is_local(options):
        if workers is not None:
            raise OptionsError("--workers sets the local runner's processes; for Dataflow use --num_workers "
                               "/ --max_num_workers")
        return
    given = {a.split("=")[0] for a in beam_args if a.startswith("--direct_")}
    direct = options.view_as(DirectOptions)
    if workers is not None and workers < 1:
        raise OptionsError(f"--workers must be at least 1, got {workers}")
    n = workers or default_workers(rows)
    if "--direct_num_workers" not in given:
        direct.direct_num_workers = n
    if "--direct_running_mode" not in given:
        direct.direct_running_mode = "multi_processing" if direct.direct_num_workers > 1 else "in_memory"


# -- in each worker ----------------------------------------------------------------------------
@functools.cache  # once per process
def _freeze_heap_at_exit() -> None:
    atexit.register(gc.freeze)


def _one_blas_thread() -> None:
    """Runners start one worker process per core; BLAS threads per worker then oversubscribe the
    cores and spin (measured: 52.3 -> 41.6 CPU s for 500 clips on 2 workers with 1 thread each)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)


def worker_setup() -> None:
    """In each worker (DoFn.setup): one BLAS thread, and no walk of the heap at exit.

    A worker's interpreter spends ~0.45 s at exit in its last garbage collections over librosa,
    numba and Beam (measured), and the local runner stops its workers one after the other. The
    hook runs only when the process ends, so a long-lived (Dataflow) worker is unaffected.
    """
    _one_blas_thread()
    _freeze_heap_at_exit()
