"""The output directory's protocol, called directly (open_run, close_run, apply_journal, Lock): a
journal or lock that cannot be read stops the run rather than count as absent, the lock is held
through the publish, and what a publish will touch is checked before anything is touched."""
import json
import time
import shutil
from pathlib import Path

import pytest
from apache_beam.io.filesystems import FileSystems

from melshards.preprocess import lock as L
from melshards.preprocess import output as O
from melshards.shards_schema.schema import PUBLISH_JOURNAL


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _cut_short_publish(out: Path, run_id: str = "x") -> Path:
    """A publish cut short: its journal, and its staging dir holding the rest of the new run."""
    stage = out / f"{O.STAGE_PREFIX}{run_id}"
    stage.mkdir(parents=True)
    (stage / O.RUN_FILE).write_text(json.dumps({"run_id": run_id}))
    (stage / "train-b00-00000-of-00001.tfrecord").write_bytes(b"the new run")
    (out / PUBLISH_JOURNAL).write_text(json.dumps({"run_id": run_id, "stage": stage.name, "remove": [],
                                                  "move": ["train-b00-00000-of-00001.tfrecord"]}))
    return stage


def _failing_open(monkeypatch, name: str):
    real = FileSystems.open

    def open_(path, *a, **k):
        if Path(path).name == name:
            raise OSError(5, "Input/output error (a network file system hiccup)", path)
        return real(path, *a, **k)
    monkeypatch.setattr(FileSystems, "open", staticmethod(open_))


# -- item 4: a journal that cannot be read is never taken for no journal -----------------------------
@pytest.mark.parametrize("unreadable", [PUBLISH_JOURNAL, O.RUN_FILE])
def test_a_journal_or_its_run_json_that_cannot_be_read_stops_the_run_and_keeps_the_staging_dir(
        tmp_path, monkeypatch, unreadable):
    stage = _cut_short_publish(tmp_path)
    before = _snapshot(tmp_path)
    _failing_open(monkeypatch, unreadable)
    with pytest.raises(O.OutputError, match="cannot read .*run again once it can be read") as e:
        O.open_run(str(tmp_path), overwrite=True)
    assert "delete the journal" not in str(e.value) and "\n" not in str(e.value)
    assert stage.exists() and _snapshot(tmp_path) == before  # the lock was released, nothing else changed


@pytest.mark.parametrize("journal", ["{not json", "[]", '{"run_id": "x", "stage": ".melshards-run-x"}',
                                     '{"run_id": "x", "stage": ".melshards-run-x", "remove": [], "move": ["../a"]}'])
def test_a_journal_that_cannot_be_understood_stops_the_run_as_one_naming_no_staging_dir_does(tmp_path, journal):
    stage = _cut_short_publish(tmp_path)
    (tmp_path / PUBLISH_JOURNAL).write_text(journal)
    before = _snapshot(tmp_path)
    with pytest.raises(O.OutputError, match="is not a publish journal melshards can read; move the directory's "
                                            "files somewhere safe, delete the journal, and run again"):
        O.open_run(str(tmp_path), overwrite=True)
    assert stage.exists() and _snapshot(tmp_path) == before


def _stage_a_finished_run(run: O.OutputRun, shards_dir: Path) -> None:
    for p in shards_dir.iterdir():
        if p.is_file():
            shutil.copy(p, Path(run.stage) / p.name)


def _heartbeat(out: Path) -> float:
    return json.loads(L._LocalMarker(str(out / L.LOCK_FILE)).read()[0])["heartbeat"]


# -- item 5: the lock is renewed through the publish ---------------------------------------------------
def test_the_lock_is_renewed_while_a_finished_run_is_published(tmp_path, monkeypatch, shards_dir):
    """A publish longer than the stale limit (gs://: a copy per shard) must not be taken over."""
    monkeypatch.setattr(L, "HEARTBEAT_S", 0.02)
    out = tmp_path / "o"
    run = O.open_run(str(out), overwrite=False)
    _stage_a_finished_run(run, shards_dir)
    real, renewed = O.apply_journal, []

    def long_publish(out_dir, journal):
        first, deadline = _heartbeat(out), time.time() + 30
        while _heartbeat(out) == first and time.time() < deadline:
            time.sleep(0.02)
        renewed.append(_heartbeat(out) > first)
        real(out_dir, journal)
    monkeypatch.setattr(O, "apply_journal", long_publish)
    O.close_run(run, ok=True)
    assert renewed == [True] and run.published
    assert (out / "schema.json").exists() and not (out / L.LOCK_FILE).exists()
