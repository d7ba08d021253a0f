"""The job's worker processes: how many a local run starts (`--workers`), and what each one does once
at start (`worker_setup`, from the DoFns' setup)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable

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


def apply_workers(options: PipelineOptions, beam_args: list[str], workers: int | None, rows: int | None = None) -> None:
    """--workers N (default: `default_workers(rows)`) -> the local runner's worker count and mode.

    N > 1 runs N worker processes (multi_processing); 1 runs in this process. Beam's own
    --direct_num_workers / --direct_running_mode, when given, win.
    """
    if not is_local(options):
        if workers is not None:
            raise OptionsError(
                "--workers sets the local runner's processes; for Dataflow use --num_workers / --max_num_workers"
            )
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


# -- watching them --------------------------------------------------------------------------
class WorkerDiedError(RuntimeError):
    """A local worker process died while the job ran: it crashed in native code, or was killed (the
    kernel's out-of-memory killer). The run cannot finish: its bundles are lost."""


class JobStoppedError(RuntimeError):
    """The launcher stopped a watched job (its `stop_when` said why: what the job writes into is gone)."""


# Set from the moment a watched job's worker is found dead.
WORKER_DIED = threading.Event()
# Set from the moment a watched job is found dead, or failed with an error the command tells in one
# line: what the workers print about it from then on (their tracebacks, straight to the stderr they
# inherit) is not for the console, which goes mute (`melshards.commands.ctrl_c`).
QUIET = threading.Event()

# How Beam's local runner reports a worker process that ended, from the thread that started it.
_WORKER_EXIT = re.compile(r"Worker subprocess exited with return code (-?\d+)")


def how_it_ended(code: int) -> str:
    """A worker's return code -> what happened, as words. Workers run under /bin/sh, which reports
    signal N as 128 + N (and a killed shell as -N)."""
    sig = -code if code < 0 else code - 128 if code > 128 else None
    if sig is None:
        return f"exited with status {code} while the job ran"
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    if sig == signal.SIGKILL:
        return (
            f"was killed ({name}) while the job ran, most often by the kernel's out-of-memory killer "
            "(try fewer --workers)"
        )
    if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT):
        return f"crashed ({name}) in native code while the job ran"
    return f"was stopped by {name} while the job ran"


def _stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, ... (ValueError/OSError where unreadable)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    if len(fields) < 2:
        raise ValueError(f"/proc/{pid}/stat is cut short")
    return fields


def descendants(pid: int) -> list[int]:
    """Process ids below pid (Linux /proc; elsewhere none are found and workers end with the launcher)."""
    parents: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for e in entries:
        try:
            ppid = int(_stat_fields(e)[1])
        except (OSError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(e))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill(pids: list[int]) -> None:
    """SIGKILL each (one already gone is no error)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _beam_workers() -> list[int]:
    """This process's local Beam workers (and the shells that started them)."""
    found = []
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"apache_beam.runners.worker.sdk_worker_main" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def kill_and_wait(pids: list[int], timeout: float = 5.0) -> None:
    """SIGKILL each, then wait (bounded) until none is left running: none writes after we return."""
    kill(pids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_running(pid) for pid in pids):
        time.sleep(0.02)


def _running(pid: int) -> bool:
    try:
        return _stat_fields(pid)[0] != "Z"
    except (OSError, ValueError):
        return False


def _from_beam(tb) -> bool:
    """The traceback runs through Beam's or gRPC's code."""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if f"{os.sep}apache_beam{os.sep}" in name or f"{os.sep}grpc{os.sep}" in name:
            return True
        tb = tb.tb_next
    return False


class _Watch:
    """Routes Beam's reports of ended workers (uncaught in its worker threads) to the watch under way;
    anything else goes to the hook it found."""

    current: _Watch | None = None
    previous = None
    _inside = threading.local()

    def __init__(self):
        self.done = threading.Event()  # the job ended, or a worker died
        self.codes: list[int] = []

    @classmethod
    def hook(cls, args) -> None:
        m = _WORKER_EXIT.search(str(args.exc_value)) if isinstance(args.exc_value, RuntimeError) else None
        if m is None and QUIET.is_set() and _from_beam(args.exc_traceback):
            return  # the runner's threads finding their channels to a dead (or killed) worker broken
        if m is None:
            if getattr(cls._inside, "yes", False):  # a hook installed over this one called it back
                threading.__excepthook__(args)
                return
            cls._inside.yes = True
            try:
                cls.previous(args)  # type: ignore[misc]  # `install` sets it before this hook is in place
            finally:
                cls._inside.yes = False
        elif cls.current is not None:
            cls.current.codes.append(int(m.group(1)))
            WORKER_DIED.set()
            QUIET.set()
            cls.current.done.set()
        # else: a worker killed after its run had ended (by this module or a Ctrl-C); nothing to say

    @classmethod
    def install(cls) -> None:
        """Over whatever hook is there now (one installed later, e.g. pytest's, may have replaced it)."""
        if threading.excepthook is not cls.hook:
            cls.previous, threading.excepthook = threading.excepthook, cls.hook


def run_watching_workers(
    run: Callable[[], None],
    grace: float = 2.0,
    told_in_one_line: Callable[[BaseException], bool] = lambda e: False,
    stop_when: Callable[[], str | None] = lambda: None,
) -> None:
    """run() (a local multi-process job, to its end) in a thread while this one watches its workers.

    Beam's local runner can wait for ever for a worker process that died (measured: a SIGSEGV in
    one of two workers hung the job with no message); the thread that started the worker reports
    its end as an uncaught RuntimeError, which this takes. Then the job's other workers are killed,
    so none writes any more, and WorkerDiedError is raised here; the runner's thread, if still
    waiting, is left behind (a daemon). A job that fails is given `grace` seconds for a death to be
    reported (the runner sometimes notices the broken channel first): the death is the cause. A
    failure that `told_in_one_line` accepts sets QUIET at once, in the job's thread: a worker's
    traceback printed a moment before is then still held by the console relay, and dropped.
    `stop_when()`, asked at every tick of the watch (twice a second), returns why the job must stop
    (what it writes into was removed): then QUIET is set, the workers are killed, so none writes any
    more, and JobStoppedError is raised with that reason.
    """
    _Watch.install()
    WORKER_DIED.clear()
    QUIET.clear()
    watch = _Watch.current = _Watch()
    failure: list[BaseException] = []

    def target():
        try:
            run()
        except BaseException as e:
            failure.append(e)
            if told_in_one_line(e):
                QUIET.set()
        finally:
            watch.done.set()

    threading.Thread(target=target, name="melshards-job", daemon=True).start()
    try:
        while not watch.done.wait(0.5):  # a timed wait: Ctrl-C's handler runs at once
            why = stop_when()
            if why:
                QUIET.set()
                kill_and_wait(_beam_workers())
                raise JobStoppedError(why)
        if failure:
            WORKER_DIED.wait(grace)
        if watch.codes:
            kill_and_wait(_beam_workers())
            raise WorkerDiedError(f"a worker process {how_it_ended(watch.codes[0])}") from (
                failure[0] if failure else None
            )
        if failure:
            raise failure[0]
    finally:
        _Watch.current = None


# -- what they log -----------------------------------------------------------------------------
# Where Beam's local runner logs a failed bundle's error with its traceback (15 lines and more each):
# in a worker process, relayed as `Worker: ...` by the local job service; in this process (one worker,
# in_memory) by the DoFn runner itself.
WORKER_LOG = "apache_beam.runners.portability.local_job_service"
BUNDLE_LOG = "apache_beam.runners.common"


class HeldLogs(logging.Filter):
    """Holds the records of some loggers while installed; `release` hands them on, `drop` forgets them."""

    def __init__(self, names: tuple[str, ...]):
        super().__init__()
        self.loggers = [logging.getLogger(n) for n in names]
        self.records: list[logging.LogRecord] = []
        self.dropped = False
        for logger in self.loggers:
            logger.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False

    def drop(self) -> None:
        """The command says what went wrong in one line: what was logged about it is not shown."""
        self.dropped = True
        self.records.clear()

    def release(self) -> None:
        for logger in self.loggers:
            logger.removeFilter(self)
        held, self.records = ([] if self.dropped else self.records), []
        for record in held:
            logging.getLogger(record.name).handle(record)


@contextlib.contextmanager
def worker_logs_held():
    """For the length of a job, the errors its bundles log (with their tracebacks) wait here: when
    the job ends they reach the console, unless the command called `drop()` on the object yielded,
    because it tells the failure in one line (a full disk, a worker that died, a removed staging dir)."""
    held = HeldLogs((WORKER_LOG, BUNDLE_LOG))
    try:
        yield held
    finally:
        held.release()


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
