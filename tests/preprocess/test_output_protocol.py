"""The output directory's protocol, called directly (open_run, close_run, apply_journal, Lock): a
journal or lock that cannot be read stops the run rather than count as absent, the lock is held
through the publish, and what a publish will touch is checked before anything is touched."""

import json
import shutil
import time
from pathlib import Path

import pytest
from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.out_dir import lock, staging
from melshards.shards_schema.schema import PUBLISH_JOURNAL


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _cut_short_publish(out: Path, run_id: str = "x") -> Path:
    """A publish cut short: its journal, and its staging dir holding the rest of the new run."""
    stage = out / f"{staging.STAGE_PREFIX}{run_id}"
    stage.mkdir(parents=True)
    (stage / staging.RUN_FILE).write_text(json.dumps({"run_id": run_id}))
    (stage / "train-b00-00000-of-00001.tfrecord").write_bytes(b"the new run")
    (out / PUBLISH_JOURNAL).write_text(
        json.dumps({"run_id": run_id, "stage": stage.name, "remove": [], "move": ["train-b00-00000-of-00001.tfrecord"]})
    )
    return stage


def _failing_open(monkeypatch, name: str):
    real = FileSystems.open

    def open_(path, *a, **k):
        if Path(path).name == name:
            raise OSError(5, "Input/output error (a network file system hiccup)", path)
        return real(path, *a, **k)

    monkeypatch.setattr(FileSystems, "open", staticmethod(open_))


# -- item 4: a journal that cannot be read is never taken for no journal -----------------------------
@pytest.mark.parametrize("unreadable", [PUBLISH_JOURNAL, staging.RUN_FILE])
def test_a_journal_or_its_run_json_that_cannot_be_read_stops_the_run_and_keeps_the_staging_dir(
    tmp_path, monkeypatch, unreadable
):
    stage = _cut_short_publish(tmp_path)
    before = _snapshot(tmp_path)
    _failing_open(monkeypatch, unreadable)
    with pytest.raises(staging.OutputError, match="cannot read .*run again once it can be read") as e:
        staging.open_run(str(tmp_path), overwrite=True)
    assert "delete the journal" not in str(e.value) and "\n" not in str(e.value)
    assert stage.exists() and _snapshot(tmp_path) == before  # the lock was released, nothing else changed


@pytest.mark.parametrize(
    "journal",
    [
        "{not json",
        "[]",
        '{"run_id": "x", "stage": ".melshards-run-x"}',
        '{"run_id": "x", "stage": ".melshards-run-x", "remove": [], "move": ["../a"]}',
    ],
)
def test_a_journal_that_cannot_be_understood_stops_the_run_as_one_naming_no_staging_dir_does(tmp_path, journal):
    stage = _cut_short_publish(tmp_path)
    (tmp_path / PUBLISH_JOURNAL).write_text(journal)
    before = _snapshot(tmp_path)
    with pytest.raises(
        staging.OutputError,
        match="is not a publish journal melshards can read; move the directory's "
        "files somewhere safe, delete the journal, and run again",
    ):
        staging.open_run(str(tmp_path), overwrite=True)
    assert stage.exists() and _snapshot(tmp_path) == before


def _stage_a_finished_run(run: staging.OutputRun, shards_dir: Path) -> None:
    for p in shards_dir.iterdir():
        if p.is_file():
            shutil.copy(p, Path(run.stage) / p.name)


def _heartbeat(out: Path) -> float:
    return json.loads(lock._LocalMarker(str(out / lock.LOCK_FILE)).read()[0])["heartbeat"]


def test_a_publish_over_an_old_run_replaces_all_its_shards_and_keeps_the_users_other_files(
    tmp_path, shards_dir, bucketed_dir
):
    """`--overwrite` of a 4-bucket run by a finished 1-bucket run: every old shard is gone, the new run's
    are all there, and a file of the user's beside them stays."""
    from melshards.shards_schema import read_schema

    out = tmp_path / "o"
    shutil.copytree(bucketed_dir, out)
    (out / "notes.txt").write_text("mine")
    run = staging.open_run(str(out), overwrite=True)
    _stage_a_finished_run(run, shards_dir)
    staging.close_run(run, ok=True)
    assert run.published
    schema = read_schema(str(out))
    listed = {s["file"] for b in schema.buckets for split in b.shards.values() for s in split}
    assert {p.name for p in out.glob("*.tfrecord")} == listed  # the old 4 buckets' shards are gone
    assert len(schema.buckets) == 1
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".tfrecord")) == [
        "notes.txt",
        "rejected.jsonl",
        "schema.json",
        "stats.json",
    ]


# -- item 5: the lock is renewed through the publish ---------------------------------------------------
def test_the_lock_is_renewed_while_a_finished_run_is_published(tmp_path, monkeypatch, shards_dir):
    """A publish longer than the stale limit (gs://: a copy per shard) must not be taken over."""
    monkeypatch.setattr(lock, "HEARTBEAT_S", 0.02)
    out = tmp_path / "o"
    run = staging.open_run(str(out), overwrite=False)
    _stage_a_finished_run(run, shards_dir)
    real, renewed = staging.apply_journal, []

    def long_publish(out_dir, journal):
        first, deadline = _heartbeat(out), time.time() + 30
        while _heartbeat(out) == first and time.time() < deadline:
            time.sleep(0.02)
        renewed.append(_heartbeat(out) > first)
        real(out_dir, journal)

    monkeypatch.setattr(staging, "apply_journal", long_publish)
    staging.close_run(run, ok=True)
    assert renewed == [True] and run.published
    assert (out / "schema.json").exists() and not (out / lock.LOCK_FILE).exists()


# -- item 8: what a publish will touch is checked before anything is touched ---------------------------
def _users_dir_in_place_of_a_shard(out: Path, how: str) -> Path:
    shard = sorted(out.glob("train-*.tfrecord"))[0]
    shard.unlink()
    users = out.parent / "users-data"
    users.mkdir(exist_ok=True)
    (users / "mine").write_text("users")
    if how == "directory":
        shutil.copytree(users, shard)
    else:
        shard.symlink_to(users, target_is_directory=True)
    return shard


@pytest.mark.parametrize("how", ["directory", "symbolic link"])
def test_overwrite_refuses_up_front_a_users_directory_where_the_finished_run_lists_a_shard(tmp_path, shards_dir, how):
    out = tmp_path / "o"
    shutil.copytree(shards_dir, out)
    shard = _users_dir_in_place_of_a_shard(out, how)
    before = _snapshot(out)
    with pytest.raises(staging.OutputError, match=f"{shard} is a {how}, not a file melshards wrote") as e:
        staging.open_run(str(out), overwrite=True)
    assert "\n" not in str(e.value) and "move it out of" in str(e.value)
    assert _snapshot(out) == before and not (out / lock.LOCK_FILE).exists()
    assert (shard / "mine").read_text() == "users"


def _finished_run_staged_over_an_old_one(tmp_path, shards_dir):
    """A copy of a finished run in tmp_path/o, and a new run opened over it that has staged its files."""
    out = tmp_path / "o"
    shutil.copytree(shards_dir, out)
    run = staging.open_run(str(out), overwrite=True)
    _stage_a_finished_run(run, shards_dir)
    return out, run


def _published_part(out):
    """The output's files but the live run's own (its staging dir and lock)."""
    return {k: v for k, v in _snapshot(out).items() if not k.startswith(staging.STAGE_PREFIX) and k != lock.LOCK_FILE}


def test_a_directory_put_where_a_shard_goes_during_the_run_stops_the_publish_before_it_touches_anything(
    tmp_path, shards_dir
):
    out, run = _finished_run_staged_over_an_old_one(tmp_path, shards_dir)
    shard = _users_dir_in_place_of_a_shard(out, "directory")
    before = _published_part(out)
    with pytest.raises(staging.OutputError, match=f"{shard} is a directory.*nothing was published"):
        staging.close_run(run, ok=True)
    assert _snapshot(out) == before  # the old run's schema.json and files as they were; no journal, lock or stage
    assert staging.read_schema_at(str(out / "schema.json"))


def test_a_users_shard_named_file_that_appears_during_the_run_stops_the_publish_before_it_touches_anything(
    tmp_path, shards_dir
):
    out, run = _finished_run_staged_over_an_old_one(tmp_path, shards_dir)
    (out / "train-b09-00000-of-00001.tfrecord").write_bytes(b"the user's")
    before = _published_part(out)
    with pytest.raises(staging.OutputError, match="train-b09-00000-of-00001.tfrecord.*nothing was published"):
        staging.close_run(run, ok=True)
    assert _snapshot(out) == before


def test_a_refusal_at_publish_is_told_as_itself_not_as_a_staging_dir_removed_during_the_run(tmp_path, shards_dir):
    from melshards.preprocess.job.run import one_line_error

    out, run = _finished_run_staged_over_an_old_one(tmp_path, shards_dir)
    _users_dir_in_place_of_a_shard(out, "directory")
    with pytest.raises(staging.OutputError) as refused:
        staging.close_run(run, ok=True)
    assert one_line_error(refused.value, run, str(out), None, 0, None) is None  # the OutputError is the line


def test_a_directory_in_the_way_of_a_cut_short_publish_stops_its_replay_before_it_touches_anything(tmp_path):
    stage = _cut_short_publish(tmp_path)
    (tmp_path / "train-b00-00000-of-00001.tfrecord").mkdir()
    (tmp_path / "train-b00-00000-of-00001.tfrecord" / "mine").write_text("users")
    before = _snapshot(tmp_path)
    with pytest.raises(staging.OutputError, match="is a directory.*the journal is kept"):
        staging.open_run(str(tmp_path), overwrite=True)
    assert stage.exists() and _snapshot(tmp_path) == before


# -- item 7: an empty --output is refused, not taken for the working directory -------------------------
@pytest.mark.parametrize("spelling", ["", "gs://"])
def test_an_output_naming_no_directory_is_refused_and_the_working_directory_left_alone(tmp_path, monkeypatch, spelling):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(staging.OutputError, match="names no directory"):
        staging.open_run(spelling, overwrite=True)
    assert list(tmp_path.iterdir()) == []


# -- item 3: a model dir, or the user's own schema.json, is never a run to replace ----------------------
def _model_dir(d: Path, shards_dir: Path, marks: tuple[str, ...]) -> Path:
    d.mkdir()
    shutil.copy(shards_dir / "schema.json", d / "schema.json")  # the trainer's copy
    (d / "run_summary.json").write_text("{}")
    (d / "tensorboard").mkdir()
    if "train_config.json" in marks:
        (d / "train_config.json").write_text("{}")
    if "checkpoints" in marks:
        (d / "checkpoints").mkdir()
        (d / "checkpoints" / "ckpt-1.index").write_bytes(b"weights")
    return d


@pytest.mark.parametrize("overwrite", [True, False])
@pytest.mark.parametrize("marks", [("train_config.json", "checkpoints"), ("train_config.json",)])
def test_a_train_model_dir_is_refused_as_such_with_or_without_overwrite(tmp_path, shards_dir, marks, overwrite):
    """train_config.json marks a model dir (`checkpoints/` alone does not: every trainer writes one)."""
    out = _model_dir(tmp_path / "m", shards_dir, marks)
    before = _snapshot(out)
    with pytest.raises(staging.OutputError, match="is a melshards train model dir") as e:
        staging.open_run(str(out), overwrite=overwrite)
    assert "--overwrite" not in str(e.value) and "finished run" not in str(e.value)
    assert _snapshot(out) == before and sorted(p.name for p in out.iterdir()) == sorted(
        ["schema.json", "run_summary.json", "tensorboard", *marks]
    )


def test_an_output_that_cannot_be_listed_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    def denied(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(staging.os, "listdir", denied)
    with pytest.raises(staging.OutputError, match=r"is not writable \(PermissionError.*Permission denied"):
        staging.open_run(str(tmp_path), overwrite=False)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("overwrite", [True, False])
@pytest.mark.parametrize("schema", ["not melshards", "a run's schema.json without its shards"])
def test_the_users_own_schema_json_is_never_called_a_finished_run_nor_replaced(tmp_path, shards_dir, schema, overwrite):
    if schema == "not melshards":
        (tmp_path / "schema.json").write_text(json.dumps({"fields": ["my", "own"]}))
    else:
        shutil.copy(shards_dir / "schema.json", tmp_path / "schema.json")
    before = _snapshot(tmp_path)
    with pytest.raises(staging.OutputError, match="move it away or choose another --output") as e:
        staging.open_run(str(tmp_path), overwrite=overwrite)
    assert "--overwrite" not in str(e.value) and "finished run" not in str(e.value)
    assert _snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["schema.json"]


# -- the lock: a check and the write after it are one step ---------------------------------------------
def test_a_lock_replaced_between_its_two_gcs_reads_is_read_again_not_taken_for_an_unwritable_output():
    from tests.preprocess.test_output import _FakeBlob, _FakeBucket

    bucket = _FakeBucket()
    first = lock.Lock("gs://b/out", "first", gcs_bucket=bucket)
    first.acquire()
    renewed = []

    class RenewedMeanwhile(_FakeBlob):
        def reload(self):  # the holder's heartbeat lands between the reader's two requests
            super().reload()
            if not renewed:
                renewed.append(first.renew())

    bucket.blob = lambda name: RenewedMeanwhile(bucket.store, name)
    with pytest.raises(lock.OutputBusyError, match="in use by another melshards preprocess run first"):
        lock.Lock("gs://b/out", "second", gcs_bucket=bucket).acquire()
    assert renewed == [True] and first.still_held()


def test_a_local_renewal_and_a_takeover_of_the_same_lock_never_both_succeed(tmp_path, monkeypatch):
    """The takeover of a run judged stale comes while the run renews its lock: one of them wins."""
    import builtins
    import threading

    path = str(tmp_path / lock.LOCK_FILE)
    holder = lock._LocalMarker(path)
    token = holder.create(b'{"run_id": "a", "heartbeat": 1}')
    taken = {}

    def take_over():  # another run, which judged the holder stale from `token`
        other = lock._LocalMarker(path)
        if other.delete(token):
            taken["b"] = other.create(b'{"run_id": "b"}')

    taker = threading.Thread(target=take_over)

    class TakenOverAfterRead:
        def __init__(self, f):
            self.f = f

        def read(self, *a):
            data = self.f.read(*a)
            if not taker.is_alive() and not taker.ident:
                taker.start()
                taker.join(2)  # it runs to its end unless something it needs is held
            return data

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    def open_(file, mode="r", *a, **k):
        f = builtins.open(file, mode, *a, **k)
        hooked = file == path and "w" not in mode and threading.current_thread() is threading.main_thread()
        return TakenOverAfterRead(f) if hooked else f

    monkeypatch.setattr(lock, "open", open_, raising=False)
    renewed = holder.replace(b'{"run_id": "a", "heartbeat": 2}', token)
    taker.join(30)
    assert (renewed is None) != (taken.get("b") is None), (renewed, taken)
    assert Path(path).read_bytes() == (renewed if renewed is not None else taken["b"])


# -- an --output that globbing would misread is refused before any work --------------------------------
@pytest.mark.parametrize("name", ["run[1]", "run]", "run?", "run*"])
def test_an_output_holding_glob_characters_is_refused_before_any_work(tmp_path, monkeypatch, name):
    with pytest.raises(staging.OutputError, match=r"its path holds .*glob pattern") as e:
        staging.open_run(str(tmp_path / name), overwrite=False)
    assert "\n" not in str(e.value) and list(tmp_path.iterdir()) == []
    monkeypatch.chdir(tmp_path)  # relative, the directory it names is what counts
    (tmp_path / "a[b]").mkdir()
    monkeypatch.chdir(tmp_path / "a[b]")
    with pytest.raises(staging.OutputError, match=r"a\[b\]/out: its path holds \[ \]"):
        staging.open_run("out", overwrite=False)
    assert list((tmp_path / "a[b]").iterdir()) == []


def test_a_directory_named_schema_json_is_named_not_a_traceback(tmp_path):
    (tmp_path / "schema.json").mkdir()
    with pytest.raises(staging.OutputError, match="schema.json is a directory, not a file melshards wrote"):
        staging.open_run(str(tmp_path), overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["schema.json"]


def test_a_stale_lock_of_another_user_that_this_one_cannot_write_is_taken_over(tmp_path, monkeypatch):
    """A group-shared output: the stale holder's marker is its owner's (mode 0644); taking it over
    needs the directory's write permission only, as a rename does."""
    import builtins

    (tmp_path / lock.LOCK_FILE).write_text(
        json.dumps(
            {"run_id": "theirs", "host": "elsewhere", "pid": 1, "heartbeat": time.time() - lock.STALE_AFTER_S - 5}
        )
    )
    lock_path = str(tmp_path / lock.LOCK_FILE)

    def open_as_another_user(path, mode="r", *args, **kwargs):
        if str(path) == lock_path and ("+" in mode or "w" in mode or "a" in mode):
            raise PermissionError(13, "Permission denied", path)
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(lock, "open", open_as_another_user, raising=False)
    held = lock.Lock(str(tmp_path), "mine")
    held.acquire()
    assert json.loads((tmp_path / lock.LOCK_FILE).read_text())["run_id"] == "mine"
    held.release()
