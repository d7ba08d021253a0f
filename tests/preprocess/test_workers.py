"""The job process and the local worker processes: a job whose worker dies stops, saying how, instead of
waiting for ever; nothing of the job is left running."""

import logging
import os
import signal
import sys
import tempfile
import threading
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from melshards.preprocess import workers
from tests.preprocess.conftest import descendants


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
    assert workers.how_it_ended(code) == words


def _element(x):
    """Element 3 does what $MELSHARDS_TEST_ELEMENT_3 says (read in the worker process); every element
    notes the worker's pid and process group in $MELSHARDS_TEST_NOTES."""
    notes = os.environ.get("MELSHARDS_TEST_NOTES")
    if notes:
        with open(os.path.join(notes, f"{os.getpid()}"), "w") as f:
            f.write(f"{os.getpgid(0)}")
    what = os.environ.get("MELSHARDS_TEST_ELEMENT_3")
    if x == 3 and what == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if x == 3 and what == "raise":
        raise ValueError("element 3 is bad")
    return x


def _local_workers(num_workers: int) -> PipelineOptions:
    """Beam's multi_processing runner with `num_workers` worker processes, as `--workers N` runs a job."""
    return PipelineOptions([f"--direct_num_workers={num_workers}", "--direct_running_mode=multi_processing"])


def _job_in_a_job_process(monkeypatch, what: str, num_workers: int) -> BaseException | None:
    """Runs a job of `num_workers` worker processes in a job process, watched, from a thread: the test fails,
    not hangs, if it hangs."""
    monkeypatch.setenv("MELSHARDS_TEST_ELEMENT_3", what)
    p = beam.Pipeline(options=_local_workers(num_workers))
    _ = p | beam.Create(list(range(8))) | beam.Reshuffle() | beam.Map(_element)
    raised: list[BaseException | None] = []

    def job():
        try:
            with tempfile.TemporaryFile() as log:
                workers.run_in_job_process(lambda: p.run().wait_until_finish(), log, watch_children=True)
            raised.append(None)
        except BaseException as e:
            raised.append(e)

    t = threading.Thread(target=job, daemon=True)
    t.start()
    t.join(240)
    assert raised, "the job process did not end"
    return raised[0]


def test_a_worker_that_crashes_stops_the_job_with_its_signal_and_no_process_left(monkeypatch):
    # two workers: the one left alive is what Beam's local runner alone would wait for for ever
    e = _job_in_a_job_process(monkeypatch, "segfault", num_workers=2)
    assert isinstance(e, workers.WorkerDiedError)
    assert str(e) == "a worker process crashed (SIGSEGV) in native code while the job ran"
    assert descendants(os.getpid()) == []


def test_a_job_that_fails_on_its_own_raises_its_own_error(monkeypatch):
    # a good job raises nothing: test_beams_local_workers_run_in_the_job_processs_group_and_a_good_job_raises_nothing
    # runs one. One worker: the worker that raised is the one the runner stops after the error.
    e = _job_in_a_job_process(monkeypatch, "raise", num_workers=1)
    assert not isinstance(e, workers.WorkerDiedError) and "element 3 is bad" in str(e)
    assert descendants(os.getpid()) == []


def test_beams_local_workers_run_in_the_job_processs_group_and_a_good_job_raises_nothing(monkeypatch, tmp_path):
    """What the job process relies on in Beam's multi_processing runner: its workers are started below
    the process that runs the pipeline, in its process group (killing the group kills them), and a
    worker the runner stops at the job's end exits with status 0 (not taken for a death): the good job
    raises nothing and leaves no process. (One worker: each worker is started and stopped alike.)"""
    monkeypatch.setenv("MELSHARDS_TEST_NOTES", str(tmp_path))
    job_pgid = []

    def job():
        job_pgid.append(os.getpgid(0))
        p = beam.Pipeline(options=_local_workers(1))
        _ = p | beam.Create(list(range(8))) | beam.Reshuffle() | beam.Map(_element)
        p.run().wait_until_finish()
        with open(tmp_path / "job", "w") as f:
            f.write(f"{os.getpid()} {os.getpgid(0)}")

    with tempfile.TemporaryFile() as log:
        workers.run_in_job_process(job, log, watch_children=True)  # a good job: raises nothing
    assert descendants(os.getpid()) == [], "a good job left a process"
    job_pid, group = (int(n) for n in (tmp_path / "job").read_text().split())
    assert group == job_pid  # the job process leads its own group
    worker_pids = {int(f.name): int(f.read_text()) for f in tmp_path.iterdir() if f.name != "job"}
    assert worker_pids and job_pid not in worker_pids
    assert set(worker_pids.values()) == {job_pid}


def test_the_job_processs_error_keeps_its_causes_and_its_output_goes_to_the_log(tmp_path):
    def job():
        print("printed by the job")
        logging.getLogger("apache_beam.runners.common").error("logged by the job")
        try:
            raise OSError(28, "No space left on device", "/x/y.tfrecord")
        except OSError as e:
            raise RuntimeError("OSError: [Errno 28] No space left on device [while running 'Write']") from e

    with tempfile.TemporaryFile() as log:
        with pytest.raises(RuntimeError, match="while running 'Write'") as raised:
            workers.run_in_job_process(job, log)
        log.seek(0)
        text = log.read().decode()
    assert isinstance(raised.value.__cause__, OSError) and raised.value.__cause__.filename == "/x/y.tfrecord"
    assert "printed by the job" in text and "logged by the job" in text and "Traceback" in text


def test_a_job_whose_output_is_removed_is_stopped_with_the_reason_and_no_process_left():
    asked = []

    def stop_when():
        asked.append(1)
        return "the run's staging dir D was removed" if len(asked) > 1 else None

    with tempfile.TemporaryFile() as log:
        with pytest.raises(workers.JobStoppedError, match="the run's staging dir D was removed"):
            workers.run_in_job_process(lambda: time.sleep(60), log, stop_when=stop_when)
    assert descendants(os.getpid()) == []


def test_a_job_process_that_is_killed_is_told_as_such():
    with tempfile.TemporaryFile() as log:
        with pytest.raises(workers.WorkerDiedError, match=r"the job's process was killed \(SIGKILL\)"):
            workers.run_in_job_process(lambda: os.kill(os.getpid(), signal.SIGKILL), log)


def test_a_child_stopped_and_continued_is_not_taken_for_dead_and_one_exiting_with_an_error_is():
    """kill -STOP / -CONT (a debugger or py-spy attaching) leave a worker alive: the job goes on. A child
    that exits with status 3 is told with its status, so the command can show the log that explains it."""
    import subprocess
    import sys

    def paused_then_resumed():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
        time.sleep(0.2)
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(0.2)
        os.kill(child.pid, signal.SIGCONT)
        assert child.wait() == 0

    def failing_child():
        subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]).wait()
        time.sleep(30)  # the watch ends the job process before this ends

    with tempfile.TemporaryFile() as log:
        workers.run_in_job_process(paused_then_resumed, log, watch_children=True)
        with pytest.raises(workers.WorkerDiedError, match="exited with status 3") as died:
            workers.run_in_job_process(failing_child, log, watch_children=True)
    assert not died.value.by_signal


def test_a_job_that_exits_is_told_as_an_error_not_as_a_silent_exit():
    with tempfile.TemporaryFile() as log, pytest.raises(RuntimeError, match="the job ended with SystemExit: 4"):
        workers.run_in_job_process(lambda: sys.exit(4), log)
