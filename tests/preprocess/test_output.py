"""The output directory: never a file melshards did not write, never a good run before a new one
exists, one run at a time, and a failed, full or interrupted run leaves it as it was."""

import errno
import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from melshards.commands.preprocess import run
from melshards.preprocess.out_dir import lock, staging
from melshards.shards_schema.schema import PUBLISH_JOURNAL
from tests.conftest import TINY_CONFIG
from tests.preprocess.conftest import beam_worker_pids, start_long_run, workers_started


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _error_line(err: str) -> str:
    assert "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if line.startswith("Error:")]
    return line


def _preprocess(corpus, out, *extra):
    return run(
        [
            "--input",
            str(corpus),
            "--output",
            str(out),
            "--config",
            str(TINY_CONFIG),
            "--workers",
            "1",
            "--buckets",
            "1",
            *extra,
        ]
    )


def _copy_run(shards_dir: Path, dst: Path) -> Path:
    shutil.copytree(shards_dir, dst)
    return dst


@pytest.fixture()
def all_rejected_corpus(tmp_path) -> Path:
    d = tmp_path / "bad"
    (d / "wavs").mkdir(parents=True)
    (d / "metadata.csv").write_text("a|No audio file for this one.|\nb|Nor for this one.|\n")
    return d


def test_a_directory_of_the_users_files_is_refused_naming_them_and_left_untouched(capsys, tmp_path, corpus_dir):
    out = tmp_path / "o"
    (out / ".melshards-tmp").mkdir(parents=True)
    for name, text in [
        ("notes.txt", "mine"),
        ("stats.json", "{}"),
        ("rejected.jsonl", "{}\n"),
        ("train-important.tfrecord", "data"),
        ("val-keep.tfrecord", "data"),
        (".melshards-tmp/x", "x"),
    ]:
        (out / name).write_text(text)
    before = _snapshot(out)
    assert _preprocess(corpus_dir, out) == 2
    line = _error_line(capsys.readouterr().err)
    for name in ("stats.json", "rejected.jsonl", "train-important.tfrecord", "val-keep.tfrecord"):
        assert name in line
    assert "notes.txt" not in line and "move them out" in line
    assert _snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["notes.txt", "stats.json", "rejected.jsonl", "train-important.tfrecord", "val-keep.tfrecord", ".melshards-tmp"]
    )  # no lock, no staging dir


def test_overwrite_refuses_shard_named_files_the_finished_run_does_not_list(capsys, tmp_path, corpus_dir, shards_dir):
    out = _copy_run(shards_dir, tmp_path / "o")
    (out / "train-mydata.tfrecord").write_bytes(b"users")
    (out / "val-b07-00003-of-00009.tfrecord").write_bytes(b"users")
    before = _snapshot(out)
    assert _preprocess(corpus_dir, out, "--overwrite") == 2
    line = _error_line(capsys.readouterr().err)
    assert "train-mydata.tfrecord" in line and "val-b07-00003-of-00009.tfrecord" in line
    assert _snapshot(out) == before


def test_a_run_that_rejects_every_row_exits_2_keeps_only_rejected_jsonl_and_leaves_the_old_run_readable(
    capsys, tmp_path, shards_dir
):
    """`--overwrite` over a finished run, every input row rejected: exit 2 and one line naming the reasons
    and where rejected.jsonl was kept (in the run's staging dir, with run.json and nothing else: no
    stats.json, schema.json or shard); no lock left, the old run as it was and still whole for the
    trainer; the next run removes that staging dir (its run.json proves melshards made it)."""
    from melshards.shards_schema.shards import check_schemas, expand_globs

    corpus = tmp_path / "in"
    (corpus / "wavs").mkdir(parents=True)
    (corpus / "metadata.csv").write_text("a|No audio file for this one.|\nb|Rain fell | softly.|Rain fell | softly.\n")
    out = _copy_run(shards_dir, tmp_path / "o")
    before = _snapshot(out)
    assert _preprocess(corpus, out, "--overwrite") == 2
    line = _error_line(capsys.readouterr().err)
    assert "all 2 input rows were rejected (1 malformed_row, 1 missing_audio)" in line and "as it was" in line
    (stage,) = [p for p in out.iterdir() if p.name.startswith(staging.STAGE_PREFIX)]
    assert str(stage / "rejected.jsonl") in line
    assert sorted(p.name for p in stage.iterdir()) == ["rejected.jsonl", staging.RUN_FILE]
    reasons = sorted(json.loads(row)["reason"] for row in (stage / "rejected.jsonl").read_text().splitlines())
    assert reasons == ["malformed_row", "missing_audio"]
    assert {k: v for k, v in _snapshot(out).items() if not k.startswith(staging.STAGE_PREFIX)} == before
    files = expand_globs([str(out / "train-*.tfrecord")])
    schema, _ = check_schemas(files, None)  # what the trainer checks first: the old run is still whole
    assert schema.counts["train"] > 0
    # the next run (its opening, called directly) removes that staging dir, and only it
    staging.close_run(staging.open_run(str(out), overwrite=True), ok=False)
    assert not stage.exists() and _snapshot(out) == before


def _hold(out: Path, **holder):
    info = {
        "run_id": "other",
        **lock.machine_identity(),
        "pid": os.getpid(),
        "started": time.time(),
        "heartbeat": time.time(),
    }
    info.update(holder)
    out.mkdir(parents=True, exist_ok=True)
    (out / lock.LOCK_FILE).write_text(json.dumps(info))


def test_a_run_into_a_directory_a_live_run_holds_stops_at_once_naming_the_holder(capsys, tmp_path, corpus_dir):
    out = tmp_path / "o"
    _hold(out)  # this very process: alive
    assert _preprocess(corpus_dir, out) == 2
    line = _error_line(capsys.readouterr().err)
    assert "in use by another melshards preprocess run other" in line and f"pid {os.getpid()}" in line
    assert sorted(p.name for p in out.iterdir()) == [lock.LOCK_FILE]


@pytest.mark.parametrize(
    "holder,stale",
    [
        ({"pid": 2**22 + 12345}, True),  # this host, its process is gone
        ({"pid": 2**22 + 12345, "pidns": "pid:[1]"}, False),  # same host name, another container: heartbeat decides
        ({"host": "elsewhere", "heartbeat": time.time() - lock.STALE_AFTER_S - 5}, True),  # no heartbeat for too long
        ({"host": "elsewhere"}, False),  # another machine, heartbeat fresh
    ],
)
def test_a_stale_holder_is_taken_over_and_a_live_one_is_not(tmp_path, holder, stale):
    _hold(tmp_path, **holder)
    if not stale:
        with pytest.raises(lock.OutputBusyError, match="pid"):
            staging.open_run(str(tmp_path), overwrite=False)
        return
    run_ = staging.open_run(str(tmp_path), overwrite=False)
    assert json.loads((tmp_path / lock.LOCK_FILE).read_text())["run_id"] == run_.lock.info["run_id"]
    staging.close_run(run_, ok=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_lock_heartbeat_rewrites_the_marker_and_release_removes_only_its_own(tmp_path):
    held = lock.Lock(str(tmp_path), "me")
    held.acquire()
    first = json.loads((tmp_path / lock.LOCK_FILE).read_text())["heartbeat"]
    held.start_heartbeat(every=0.05)
    deadline = time.time() + 30
    while json.loads((tmp_path / lock.LOCK_FILE).read_text())["heartbeat"] == first and time.time() < deadline:
        time.sleep(0.05)
    assert json.loads((tmp_path / lock.LOCK_FILE).read_text())["heartbeat"] > first
    held.stop_heartbeat()
    (tmp_path / lock.LOCK_FILE).write_text(json.dumps({"run_id": "someone else"}))  # taken over meanwhile
    held.release()
    assert json.loads((tmp_path / lock.LOCK_FILE).read_text())["run_id"] == "someone else"


class _FakeBlob:
    """google-cloud-storage's Blob as far as the lock uses it: generation preconditions."""

    def __init__(self, store, name):
        self.store, self.name, self.generation = store, name, None

    def upload_from_string(self, data, if_generation_match=None):
        from google.api_core.exceptions import PreconditionFailed

        current = self.store.get(self.name)
        if if_generation_match is not None and (current[1] if current else 0) != if_generation_match:
            raise PreconditionFailed("generation mismatch")
        self.store[self.name] = (data, (current[1] if current else 0) + 1)
        self.generation = self.store[self.name][1]  # as the client sets it from the upload's response

    def reload(self):
        from google.api_core.exceptions import NotFound

        if self.name not in self.store:
            raise NotFound("no such object")
        self.generation = self.store[self.name][1]

    def download_as_bytes(self, if_generation_match=None):
        from google.api_core.exceptions import NotFound, PreconditionFailed

        if self.name not in self.store:
            raise NotFound("no such object")
        if if_generation_match is not None and self.store[self.name][1] != if_generation_match:
            raise PreconditionFailed("generation mismatch")
        return self.store[self.name][0]

    def delete(self, if_generation_match=None):
        from google.api_core.exceptions import NotFound, PreconditionFailed

        if self.name not in self.store:
            raise NotFound("no such object")
        if if_generation_match is not None and self.store[self.name][1] != if_generation_match:
            raise PreconditionFailed("generation mismatch")
        del self.store[self.name]


class _FakeBucket:
    def __init__(self):
        self.store = {}

    def blob(self, name):
        return _FakeBlob(self.store, name)


def test_on_gcs_the_lock_is_an_object_created_only_if_absent():
    bucket = _FakeBucket()
    first = lock.Lock("gs://b/out", "first", gcs_bucket=bucket)
    first.acquire()
    assert json.loads(bucket.store["out/.melshards-lock"][0])["run_id"] == "first"
    with pytest.raises(lock.OutputBusyError, match="run first"):
        lock.Lock("gs://b/out", "second", gcs_bucket=bucket).acquire()
    first.release()
    second = lock.Lock("gs://b/out", "second", gcs_bucket=bucket)
    second.acquire()
    # a stale holder's object is deleted only at the generation that was judged stale
    data = json.loads(bucket.store["out/.melshards-lock"][0])
    data["heartbeat"] -= lock.STALE_AFTER_S + 1
    data["host"] = "elsewhere"
    bucket.store["out/.melshards-lock"] = (json.dumps(data).encode(), bucket.store["out/.melshards-lock"][1])
    third = lock.Lock("gs://b/out", "third", gcs_bucket=bucket)
    third.acquire()
    assert json.loads(bucket.store["out/.melshards-lock"][0])["run_id"] == "third"
    # a delete or a renewal at a generation that is no longer the object's changes nothing
    judged_stale = bucket.store["out/.melshards-lock"][1]
    third.marker.replace(b'{"run_id": "third", "heartbeat": 1}', judged_stale)  # renewed meanwhile
    assert third.marker.delete(judged_stale) is False and "out/.melshards-lock" in bucket.store
    assert third.marker.replace(b"{}", judged_stale) is None
    assert not third.still_held()  # its token is the stale generation: it will not publish


def test_release_removes_the_runs_own_lock(tmp_path):
    held = lock.Lock(str(tmp_path), "me")
    held.acquire()
    assert held.still_held()
    held.release()
    assert not (tmp_path / lock.LOCK_FILE).exists()


def test_one_directory_spelt_two_ways_is_one_directory(capsys, tmp_path, corpus_dir, monkeypatch):
    """`out//`, `./out/` and `out` hold the same files: the check for the user's files sees them all."""
    out = tmp_path / "u"
    out.mkdir()
    (out / "stats.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    for spelling in ("u//", "./u/", str(out) + "//"):
        assert _preprocess(corpus_dir, spelling) == 2
        assert "stats.json" in _error_line(capsys.readouterr().err)
    assert sorted(p.name for p in out.iterdir()) == ["stats.json"]


def test_staging_dirs_of_unfinished_runs_are_removed_and_nothing_else(tmp_path):
    ours = tmp_path / f"{staging.STAGE_PREFIX}20260101-000000-abcd1234"
    (ours / ".melshards-tmp").mkdir(parents=True)
    (ours / staging.RUN_FILE).write_text(json.dumps({"run_id": "20260101-000000-abcd1234"}))
    (ours / ".melshards-tmp" / "train-b00-x.tfrecord").write_bytes(b"x")
    lookalike = tmp_path / f"{staging.STAGE_PREFIX}mine"  # no run.json naming it: not proven ours
    lookalike.mkdir()
    (lookalike / "data.bin").write_bytes(b"users")
    (tmp_path / ".melshards-tmp").mkdir()
    (tmp_path / ".melshards-tmp" / "x").write_text("users")
    run_ = staging.open_run(str(tmp_path), overwrite=False)
    staging.close_run(run_, ok=False)
    assert not ours.exists()
    assert (lookalike / "data.bin").read_bytes() == b"users"
    assert (tmp_path / ".melshards-tmp" / "x").read_text() == "users"


def test_a_publish_cut_short_is_refused_by_the_trainer_and_finished_by_the_next_run(tmp_path, shards_dir, bucketed_dir):
    from melshards.shards_schema.shards import InputError, check_schemas

    out = _copy_run(bucketed_dir, tmp_path / "o")
    old = staging.run_files(staging.read_schema_at(str(out / "schema.json")))
    stage = out / f"{staging.STAGE_PREFIX}x"
    shutil.copytree(shards_dir, stage)
    (stage / staging.RUN_FILE).write_text(json.dumps({"run_id": "x"}))
    new = staging.run_files(staging.read_schema_at(str(stage / "schema.json")))
    journal = {"run_id": "x", "stage": stage.name, "remove": old, "move": new}
    (out / PUBLISH_JOURNAL).write_text(json.dumps(journal))
    # cut short after the old schema.json and one new shard moved: a mix on disk
    (out / "schema.json").unlink()
    moved = next(n for n in new if n.endswith(".tfrecord"))
    os.replace(stage / moved, out / moved)
    (out / "schema.json").write_text((bucketed_dir / "schema.json").read_text())  # worst case: looks finished
    with pytest.raises(InputError, match="having its run replaced"):
        check_schemas([str(out / moved)], None)
    moved_away = shutil.move(str(out), str(tmp_path / "elsewhere"))  # the directory moved since: no matter
    run_ = staging.open_run(moved_away, overwrite=True)
    staging.close_run(run_, ok=False)
    assert not (Path(moved_away) / PUBLISH_JOURNAL).exists() and not (Path(moved_away) / stage.name).exists()
    assert _snapshot(Path(moved_away)) == {k: v for k, v in _snapshot(shards_dir).items()}


def test_a_journal_naming_no_staging_dir_of_ours_stops_and_removes_nothing(tmp_path, shards_dir):
    out = _copy_run(shards_dir, tmp_path / "o")
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "data").write_text("users")
    for stage in ("../precious", str(tmp_path / "precious"), f"{staging.STAGE_PREFIX}gone"):
        (out / PUBLISH_JOURNAL).write_text(
            json.dumps({"run_id": "gone", "stage": stage, "remove": [], "move": ["schema.json"]})
        )
        before = _snapshot(out)
        with pytest.raises(staging.OutputError, match="names no staging dir of melshards"):
            staging.open_run(str(out), overwrite=True)
        assert _snapshot(out) == before and (tmp_path / "precious" / "data").exists()


def test_a_run_made_by_another_melshards_version_is_named_as_such_not_replaced(
    capsys, tmp_path, corpus_dir, shards_dir
):
    out = _copy_run(shards_dir, tmp_path / "o")
    (out / "schema.json").write_text(json.dumps({"version": "1.2.0", "max_mel_frames": 800}))
    before = _snapshot(out)
    assert _preprocess(corpus_dir, out, "--overwrite") == 2
    line = _error_line(capsys.readouterr().err)
    assert "made by another version of melshards (schema.json 1.2.0)" in line and "move its" in line
    assert _snapshot(out) == before


def test_a_full_disk_stops_the_run_with_one_line_and_leaves_the_old_run(
    monkeypatch, capsys, tmp_path, corpus_dir, shards_dir
):
    from melshards.preprocess.out_dir import shards

    out = _copy_run(shards_dir, tmp_path / "o")
    before = _snapshot(out)
    real = shards.RollingFiles.write
    writes = []

    def write(self, split, bucket, data):
        writes.append(1)
        if len(writes) > 3:
            path = os.path.join(self.out_dir, "x.tfrecord")
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real(self, split, bucket, data)

    monkeypatch.setattr(shards.RollingFiles, "write", write)
    assert _preprocess(corpus_dir, out, "--overwrite") == 1
    line = _error_line(capsys.readouterr().err)
    assert "no space left on the device of" in line and f"{out}/{staging.STAGE_PREFIX}" in line
    assert "needs about" in line and "rows" in line
    assert re.search(r"\(\d+(\.\d)? [KMGT]?B free\)", line), line
    assert _snapshot(out) == before  # no staging dir, no lock, the old run whole


def test_a_second_run_into_an_output_a_running_job_holds_stops_and_ctrl_c_of_the_first_exits_130_leaving_the_old_run(
    capsys, tmp_path, corpus_dir, shards_dir
):
    """One real run over a finished one (`--overwrite`), two things shown on it: a second run into the same
    output while the first runs (in this process: two real processes, each with its own pid) stops at once
    naming the first, which it leaves unharmed; then Ctrl-C of the first prints one line, exits 130 and
    leaves the old run as it was (no lock, no staging dir)."""
    out = _copy_run(shards_dir, tmp_path / "o")
    before = _snapshot(out)
    p = start_long_run(tmp_path, corpus_dir, out, "--workers", "2", "--overwrite", ready=workers_started)
    second = _preprocess(corpus_dir, out, "--overwrite")
    err = capsys.readouterr().err
    assert p.poll() is None, "the first run should still be running"
    assert second == 2, err
    assert "is in use by another melshards preprocess run" in err and f"pid {p.pid}" in err
    (stage,) = out.glob(f"{staging.STAGE_PREFIX}*")
    assert json.loads((stage / staging.RUN_FILE).read_text())["pid"] == p.pid  # the first run's staging dir
    os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert stderr.splitlines()[-1] == f"interrupted: the run's temporary files were removed; {out} is as it was"
    assert [line for line in stderr.splitlines() if " INFO " not in line] == [stderr.splitlines()[-1]]
    assert _snapshot(out) == before


def test_a_worker_killed_mid_run_stops_the_job_with_one_line_and_leaves_the_old_run(tmp_path, corpus_dir, shards_dir):
    """What the out-of-memory killer does: Beam's local runner alone would wait for the dead worker
    for ever. The job stops at once, says what happened, and removes its staging dir."""
    out = _copy_run(shards_dir, tmp_path / "o")
    before = _snapshot(out)
    p = start_long_run(tmp_path, corpus_dir, out, "--workers", "2", "--overwrite", ready=workers_started)
    os.kill(beam_worker_pids(p.pid)[0], signal.SIGKILL)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 1, stderr
    assert [line for line in stderr.splitlines() if " INFO " not in line] == [stderr.splitlines()[-1]], stderr
    assert stderr.splitlines()[-1] == (
        "Error: a worker process was killed (SIGKILL) while the job ran, most often by the kernel's out-of-memory "
        f"killer (try fewer --workers); the run's temporary files were removed and {out} is as it was: run it "
        "again (with --cache DIR, a re-run computes only the clips not yet cached)"
    )
    assert _snapshot(out) == before
    assert not beam_worker_pids(p.pid)


def test_ctrl_c_during_a_publish_lets_it_finish_and_says_the_new_run_is_in_place(capsys, tmp_path):
    import logging

    import click

    from melshards.commands.ctrl_c import StopOnCtrlC

    out = str(tmp_path / "o")
    # Python's own Ctrl-C handler, SIGINT unblocked: StopOnCtrlC starts from a command's state whatever
    # the test process was started with. Pytest started with SIGINT ignored (a background job of a
    # non-interactive shell: `sh -c 'make test &'`; the xdist workers inherit it) left this test failing
    # (STOPPING unset), since StopOnCtrlC rightly stands aside when SIGINT is ignored; no test leaves it
    # changed (tests/conftest.py's signals_as_they_were checks that after every test).
    given = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(click.exceptions.Exit) as ended:
            with StopOnCtrlC(out):
                staging.PUBLISHING = True  # as OutputRun.publish sets it
                os.kill(os.getpid(), signal.SIGINT)  # the handler runs here and raises nothing
                assert staging.STOPPING.is_set()
                staging.PUBLISHING = False
                staging.PUBLISHED.append(out)
        # the process goes on as it was: a later run in it is not stopped nor silenced by this one
        assert not staging.STOPPING.is_set() and logging.root.manager.disable == logging.NOTSET
    finally:
        staging.PUBLISHING = False
        staging.STOPPING.clear()
        staging.PUBLISHED.clear()
        logging.disable(logging.NOTSET)
        after = signal.signal(signal.SIGINT, signal.default_int_handler if given is None else given)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    assert ended.value.exit_code == 130
    assert capsys.readouterr().err == f"interrupted: the new run was already in place in {out}\n"
    assert after is before
