"""The local worker processes: a job whose worker dies stops, saying how, instead of waiting for ever."""

import os
import signal
import threading

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from melshards.preprocess import workers as W


@pytest.mark.parametrize(
    "code,words",
    [
        (139, "crashed (SIGSEGV) in native code while the job ran"),
        (-11, "crashed (SIGSEGV) in native code while the job ran"),
        (134, "crashed (SIGABRT) in native code while the job ran"),
        (
            137,
            "was killed (SIGKILL) while the job ran, most often by the kernel's out-of-memory killer "
            "(try fewer --workers)",
        ),
        (
            -9,
            "was killed (SIGKILL) while the job ran, most often by the kernel's out-of-memory killer "
            "(try fewer --workers)",
        ),
        (143, "was stopped by SIGTERM while the job ran"),
        (1, "exited with status 1 while the job ran"),
    ],
)
def test_a_workers_return_code_is_told_in_words(code, words):
    assert W.how_it_ended(code) == words


def _element(x):
    """Element 3 does what $MELSHARDS_TEST_ELEMENT_3 says (read in the worker process)."""
    what = os.environ.get("MELSHARDS_TEST_ELEMENT_3")
    if x == 3 and what == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if x == 3 and what == "raise":
        raise ValueError("element 3 is bad")
    return x


def _watched_two_worker_job(monkeypatch, what: str) -> BaseException | None:
    """Runs a two-process job under the watch in a thread: the test fails, not hangs, if it hangs."""
    monkeypatch.setenv("MELSHARDS_TEST_ELEMENT_3", what)
    p = beam.Pipeline(options=PipelineOptions(["--direct_num_workers=2", "--direct_running_mode=multi_processing"]))
    _ = p | beam.Create(list(range(8))) | beam.Reshuffle() | beam.Map(_element)
    raised: list[BaseException | None] = []

    def job():
        try:
            W.run_watching_workers(lambda: p.run().wait_until_finish())
            raised.append(None)
        except BaseException as e:
            raised.append(e)

    t = threading.Thread(target=job, daemon=True)
    t.start()
    t.join(240)
    assert raised, "the watched job did not end"
    return raised[0]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # Beam's broken channels
def test_a_worker_that_crashes_stops_the_job_with_its_signal_and_no_worker_left(monkeypatch):
    e = _watched_two_worker_job(monkeypatch, "segfault")
    assert isinstance(e, W.WorkerDiedError)
    assert str(e) == "a worker process crashed (SIGSEGV) in native code while the job ran"
    assert W._beam_workers() == []


def test_a_job_that_fails_on_its_own_raises_its_own_error_and_a_good_one_nothing(monkeypatch):
    e = _watched_two_worker_job(monkeypatch, "raise")
    assert not isinstance(e, W.WorkerDiedError) and "element 3 is bad" in str(e)
    assert _watched_two_worker_job(monkeypatch, "nothing") is None


def test_a_failure_told_in_one_line_quiets_the_console_as_the_job_fails_before_the_grace_for_a_death(monkeypatch):
    """A worker prints its failed bundle's traceback straight to the stderr it inherited, a moment
    before the job fails: the console relay, which holds what it copies half a second, must go mute
    at once, not after the grace the watch gives a worker's death to be reported."""
    quiet_during_grace = []

    class Died:
        def wait(self, timeout):
            quiet_during_grace.append(W.QUIET.is_set())

        def clear(self):
            pass

    monkeypatch.setattr(W, "WORKER_DIED", Died())
    monkeypatch.setattr(W, "QUIET", threading.Event())

    def job():
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        W.run_watching_workers(job, told_in_one_line=lambda e: isinstance(e, OSError))
    assert quiet_during_grace == [True]
    with pytest.raises(ValueError):
        W.run_watching_workers(lambda: int("x"), told_in_one_line=lambda e: isinstance(e, OSError))
    assert not W.QUIET.is_set()


def test_the_console_relay_holds_a_workers_traceback_until_the_failure_it_belongs_to_is_known(tmp_path):
    """A worker prints its failed bundle's traceback a second or more before the launcher learns that
    the job failed: once that failure is one the command tells in one line, the traceback is dropped
    (and what came after it); what came before it, and a traceback of a job that goes on, is shown."""
    import time

    from melshards.commands.ctrl_c import _Relay

    def console(quiet_after_traceback: bool) -> bytes:
        path = tmp_path / f"console-{quiet_after_traceback}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        quiet = threading.Event()
        relay = _Relay((fd,), None, quiet.is_set)
        os.write(fd, b"progress\n")
        os.write(fd, b"Traceback (most recent call last):\n  File ...\nOSError: [Errno 28] No space left on device\n")
        os.write(fd, b"progress 2\n")
        time.sleep(3 * _Relay.HOLD)  # the launcher learns of the failure later than a worker's death
        if quiet_after_traceback:
            quiet.set()
        relay.restore()
        os.close(fd)
        return path.read_bytes()

    assert console(True) == b"progress\n"
    assert console(False).count(b"\n") == 5


def test_a_job_whose_output_is_removed_is_stopped_by_the_watch_with_the_reason(monkeypatch):
    monkeypatch.setattr(W, "QUIET", threading.Event())
    killed = []
    monkeypatch.setattr(W, "kill_and_wait", killed.append)
    monkeypatch.setattr(W, "_beam_workers", lambda: [12345])
    release = threading.Event()
    asked = []

    def stop_when():
        asked.append(1)
        return "the run's staging dir D was removed" if len(asked) > 1 else None

    try:
        with pytest.raises(W.JobStoppedError, match="the run's staging dir D was removed"):
            W.run_watching_workers(lambda: release.wait(60), stop_when=stop_when)
    finally:
        release.set()
    assert W.QUIET.is_set() and killed == [[12345]]
