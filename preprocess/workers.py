"""The job's processes: the job process the command runs the Beam job in (`run_in_job_process`), how
many worker processes a local run starts (`--workers`), and what each one does once at start
(`worker_setup`, from the DoFns' setup)."""

from __future__ import annotations

import atexit
import ctypes
import functools
import gc
import logging
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import IO

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

from melshards.preprocess.options import OptionsError, is_local

ROWS_PER_WORKER = 1000


def all_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_workers(rows: int | None) -> int:
    """Every core, but one worker per ROWS_PER_WORKER rows at most.

    A worker process has a fixed cost to start and stop (Beam's harness, librosa's import), which
    only enough clips of shared work pay back (docs/performance.md#preprocess-throughput). rows None
    (a remote corpus not counted): every core.
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


# -- the job process --------------------------------------------------------------------------
class WorkerDiedError(RuntimeError):
    """A local worker process died while the job ran: it crashed in native code, was killed (the
    kernel's out-of-memory killer), or exited with an error of its own (`code` > 0: its traceback is
    in the job's log). The run cannot finish: its bundles are lost."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code

    @property
    def by_signal(self) -> bool:
        """Ended by a signal (or a shell's 128 + N): nothing the process printed explains it."""
        return self.code is None or self.code < 0 or self.code > 128


class JobStoppedError(RuntimeError):
    """The command stopped the job process (its `stop_when` said why: what the job writes into is gone)."""


# What the command stops on (its handlers: `melshards.commands.ctrl_c`); held back while the job process forks.
_STOPPING = {signal.SIGINT, signal.SIGTERM}
# prctl(2) options: the signal this process gets when its parent ends; orphaned descendants are
# re-parented to this process, which can then reap them.
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def how_it_ended(code: int) -> str:
    """A process's end as words: -N for signal N (waitpid's view), or an exit status (a shell reports
    signal N in a command it ran as 128 + N)."""
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


def _prctl(option: int, value: int) -> None:
    """prctl(2) on Linux; elsewhere a no-op."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _set_subreaper(on: bool) -> None:
    """Linux: this process adopts its orphaned descendants (so it can wait for each)."""
    _prctl(_PR_SET_CHILD_SUBREAPER, int(on))


def _portable(e: BaseException) -> list[bytes]:
    """e and its causes, each pickled on its own (an exception's pickle keeps no cause); one that does
    not pickle becomes a RuntimeError with its type and text."""
    chain, seen = [], set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        e = cause
        seen.add(id(e))
        try:
            data = pickle.dumps(e)
            pickle.loads(data)
        except Exception:
            data = pickle.dumps(RuntimeError(f"{type(e).__qualname__}: {e}"))
        chain.append(data)
        cause = e.__cause__ or e.__context__
    return chain


def _rebuilt(chain: list[bytes]) -> BaseException:
    errors = [pickle.loads(data) for data in chain]
    for error, cause in zip(errors, errors[1:]):
        error.__cause__ = cause
    return errors[0]


def _in_job_process(
    job: Callable[[], None], parent: int, log: IO[bytes], result: IO[bytes], watch_children: bool, grace: float
):
    """The forked job process: its own process group, no stdin, stdout, stderr and logging into `log`,
    job() run, how it ended written to `result` (pickled: ("ok",), ("failed", chain) or ("died",
    code)). Never returns: it ends with os._exit, as a forked child must (the command's own clean-up
    is not its)."""
    code = 1
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the command killed (kill -9): this process goes too
        if os.getppid() != parent:  # it was, before that took effect
            return
        os.setpgid(0, 0)
        for s in _STOPPING:
            signal.signal(s, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPPING)
        signal.set_wakeup_fd(-1)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # a background group must not read the terminal
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        stream = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        sys.stdout = sys.stderr = stream
        root = logging.getLogger()
        formatter = next((h.formatter for h in root.handlers if h.formatter), None)
        for handler in list(root.handlers):
            root.removeHandler(handler)
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        root.addHandler(handler)
        ended = threading.Lock()  # held by whichever writes the result: the job's end or a worker's death
        died = threading.Event()
        if watch_children and hasattr(signal, "sigwaitinfo"):  # not on macOS: no watch there
            # Blocked in every thread (the threads the job starts inherit the mask), SIGCHLD waits for
            # the watcher, whose siginfo tells which child ended and how, whoever reaps it.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})

            def watch() -> None:
                while True:
                    info = signal.sigwaitinfo({signal.SIGCHLD})
                    if info.si_code not in (os.CLD_EXITED, os.CLD_KILLED, os.CLD_DUMPED):
                        continue  # stopped or continued (kill -STOP, a debugger or py-spy attaching): alive
                    if info.si_code == os.CLD_EXITED and info.si_status == 0:
                        continue  # a worker the runner stopped at the job's end
                    how = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
                    died.set()
                    with ended:
                        pickle.dump(("died", how), result)
                        result.flush()
                        os.killpg(0, signal.SIGKILL)  # this process and every worker

            threading.Thread(target=watch, name="melshards-children", daemon=True).start()
        try:
            job()
            outcome: tuple = ("ok",)
            code = 0
        except BaseException as e:
            traceback.print_exc()
            if watch_children:  # the runner may notice a dead worker's channel first: the death is the cause
                died.wait(grace)
            if not isinstance(e, Exception):  # SystemExit, KeyboardInterrupt: said, not re-raised as they are
                e = RuntimeError(f"the job ended with {type(e).__name__}: {e}")
            outcome = ("failed", _portable(e))
        sys.stdout.flush()
        with ended:
            pickle.dump(outcome, result)
            result.flush()
    finally:
        os._exit(code)


def run_in_job_process(
    job: Callable[[], None],
    log: IO[bytes],
    watch_children: bool = False,
    stop_when: Callable[[], str | None] = lambda: None,
    grace: float = 2.0,
) -> None:
    """job() in a forked child process, the leader of a process group of its own, to its end.

    The child's stdout and stderr, its logging, and the stdout and stderr of every process it starts
    (Beam's local workers) go into `log` (a file: the caller shows it, or not); signals sent to the
    command's process group (Ctrl-C, `timeout`) do not reach them. job()'s error is raised here (its
    causes kept); with `watch_children`, a child of the job process (a local worker: Beam starts them
    as children of the process that runs the pipeline) that ends by a signal or with a non-zero status
    while the job runs ends the job process and every worker, and WorkerDiedError says how it ended
    (Beam's local runner alone can wait for such a worker for ever). `stop_when()`, asked every tenth
    of a second, returns why the job must stop (what it writes into was removed): then JobStoppedError.
    However this returns or raises (a KeyboardInterrupt from the command's signal handler included),
    every process of the job's group is killed and waited for first: none is left running.
    """
    with tempfile.TemporaryFile() as result:
        _set_subreaper(True)  # workers orphaned by the job process's end are adopted here, and waited for
        sys.stdout.flush()
        sys.stderr.flush()
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPPING)  # until the child has its own group
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError:  # no process could be made (EAGAIN, ENOMEM): this process as it was
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            _set_subreaper(False)
            raise
        if pid == 0:
            _in_job_process(job, parent, log, result, watch_children, grace)
        try:
            try:
                os.setpgid(pid, pid)
            except OSError:  # the child did it first
                pass
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            while True:
                ended, status = os.waitpid(pid, os.WNOHANG)
                if ended:
                    break
                why = stop_when()
                if why:
                    raise JobStoppedError(why)
                time.sleep(0.1)
        finally:
            _end_group(pid)
            _set_subreaper(False)
        result.seek(0)
        try:
            outcome = pickle.load(result)
        except (EOFError, pickle.UnpicklingError):  # the job process itself was killed
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            raise WorkerDiedError(f"the job's process {how_it_ended(code)}", code) from None
    if outcome[0] == "died":
        raise WorkerDiedError(f"a worker process {how_it_ended(outcome[1])}", outcome[1])
    if outcome[0] == "failed":
        raise _rebuilt(outcome[1])


def _end_group(pgid: int, patience: float = 60.0) -> None:
    """SIGKILL every process of the group, then reap the ones that are (or, orphaned, became) children
    of this process, until none is left; a process that SIGKILL cannot end within `patience` seconds
    (stuck in the kernel: a hung network file system) is logged and left, not waited for for ever."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + patience
    while True:
        try:
            ended, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if not ended:
            if time.monotonic() > deadline:
                logging.getLogger("melshards.preprocess").warning(
                    "process group %d did not end %.0f s after SIGKILL (a process stuck in the kernel?); "
                    "not waiting for it",
                    pgid,
                    patience,
                )
                return
            time.sleep(0.02)


# -- in each worker ----------------------------------------------------------------------------
@functools.cache  # once per process
def _freeze_heap_at_exit() -> None:
    atexit.register(gc.freeze)


def _one_blas_thread() -> None:
    """Runners start one worker process per core; BLAS threads per worker then oversubscribe the
    cores and spin, spending CPU for nothing (docs/performance.md#preprocess-throughput)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)


def worker_setup() -> None:
    """In each worker (DoFn.setup): one BLAS thread, and no walk of the heap at exit.

    A worker's interpreter would end with garbage collections over every object librosa, numba and
    Beam made, and the local runner stops its workers one after the other, so each worker's
    collections add to the run's end (docs/performance.md#preprocess-start-up). The
    hook runs only when the process ends, so a long-lived (Dataflow) worker is unaffected.
    """
    _one_blas_thread()
    _freeze_heap_at_exit()
