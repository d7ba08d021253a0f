"""A runner retries a bundle, and may run it twice: every DoFn with a side effect gives the same files
and outputs when its bundle runs again, whole or after failing half-way (docs/preprocess.md,
Retries). Each DoFn is driven through its own methods, a fresh instance per attempt as a runner
makes one; AssembleShards' retries are tested beside its other tests (test_transforms.py)."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from apache_beam.io.filesystems import FileSystems
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.windowed_value import WindowedValue
from google.api_core.exceptions import PreconditionFailed, ServiceUnavailable

from melshards.preprocess.clip import cache, measure_stage
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.out_dir import batch_files, lock, temp_files
from melshards.preprocess.out_dir.shards import TEMP_DIR
from melshards.preprocess.stats.tables import finish_part, finish_tables, summarize_clips
from melshards.preprocess.write import filter_and_write, report
from melshards.shards_schema.stats import Cutoffs
from tests.preprocess.test_output import _FakeBlob, _FakeBucket

CFG = PreprocessConfig()
IDS = ["LJT001-0001", "LJT001-0002", "LJT001-0004", "LJT900-0006"]  # the last one silent: rejected


def snapshot(*dirs: Path) -> dict[str, bytes]:
    """Every file under the directories: its path -> its bytes."""
    return {str(p): p.read_bytes() for d in dirs if d.exists() for p in sorted(d.rglob("*")) if p.is_file()}


def outputs(results) -> list[tuple[str | None, bytes]]:
    """What a DoFn's methods yielded: (tag, the value pickled), so arrays compare by their bytes."""
    out = []
    for r in results:
        tag, value = (r.tag, r.value) if isinstance(r, TaggedOutput) else (None, r)
        out.append((tag, pickle.dumps(value.value if isinstance(value, WindowedValue) else value)))
    return out


class WriteFails:
    """Wrap a file writer (`temp_files.write`) so that its `at`-th call writes half its data, then fails."""

    def __init__(self, real, at: int):
        self.real, self.at, self.calls = real, at, 0

    def __call__(self, path, data, *rest):
        self.calls += 1
        if self.calls == self.at:
            self.real(path, data[: len(data) // 2], *rest)
            raise OSError("the worker died half-way through the bundle")
        return self.real(path, data, *rest)


# -- the read stage's rows files ----------------------------------------------------------------------
def test_the_rows_files_written_twice_or_after_failing_half_way_is_the_same_files(tmp_path, monkeypatch):
    monkeypatch.setattr(batch_files, "ROWS_FILE_BYTES", 200)  # several batches, several files
    batches = [[{"id": f"r{b}-{i}", "text": "x" * 40} for i in range(3)] for b in range(5)] + [[]]
    first = list(batch_files.write_rows(str(tmp_path), batches))
    clean = snapshot(tmp_path)
    assert len(clean) > 1
    assert list(batch_files.write_rows(str(tmp_path), batches)) == first and snapshot(tmp_path) == clean
    shutil.rmtree(tmp_path)
    monkeypatch.setattr(temp_files, "write", WriteFails(temp_files.write, at=2))
    with pytest.raises(OSError, match="half-way"):
        list(batch_files.write_rows(str(tmp_path), batches))
    assert snapshot(tmp_path) != clean  # a file half-written
    monkeypatch.undo()
    monkeypatch.setattr(batch_files, "ROWS_FILE_BYTES", 200)
    assert list(batch_files.write_rows(str(tmp_path), batches)) == first and snapshot(tmp_path) == clean


# -- every temp file: written whole or not at all ----------------------------------------------------
@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_scan_that_fails_half_way_leaves_no_temp_file_locally_or_on_gcs(tmp_path, request, where):
    """`temp_files.writing`: a container file whose scan fails after its first chunk leaves nothing
    of it (was: the chunk, at the name a later attempt's reader takes as a whole scan)."""
    from melshards.preprocess.inputs import read_stage

    if where == "gcs":
        from tests.preprocess.test_gcs import _bucket

        temp = f"gs://{_bucket(request.getfixturevalue('gcs'))}/run/{TEMP_DIR}"
    else:
        (tmp_path / TEMP_DIR).mkdir()
        temp = str(tmp_path / TEMP_DIR)

    def found() -> list[str]:
        return [m.path for m in FileSystems.match([f"{temp}/*"])[0].metadata_list]

    def records():
        yield from ({"row": i} for i in range(read_stage.SCAN_CHUNK))
        raise OSError("the container file cannot be read past its first chunk")

    with pytest.raises(OSError, match="first chunk"):
        read_stage.write_scan(temp, "corpus/part-0.parquet", records())
    assert found() == []
    path = read_stage.write_scan(temp, "corpus/part-0.parquet", iter([{"row": 0}]))  # the next attempt
    assert found() == [path] and list(read_stage.read_scan(path)) == [{"row": 0}]


# -- Measure: the clips and features files, the feature cache's entries, the progress files ------------
def _row(corpus_dir, clip_id):
    audio = corpus_dir / "wavs" / f"{clip_id}.wav"
    return {"id": clip_id, "text": "Hello there.", "speaker": "s", "language": "en", "gender": "", "audio": str(audio)}


@pytest.fixture(scope="module")
def rows(corpus_dir, tmp_path_factory):
    """Two batches of rows in a rows file of their own (read-only)."""
    where = tmp_path_factory.mktemp("rows")
    return list(
        batch_files.write_rows(
            str(where), [[_row(corpus_dir, i) for i in IDS[:2]], [_row(corpus_dir, i) for i in IDS[2:]]]
        )
    )


EMPTY_CACHE = cache.CacheIndex.of([])  # the side input of a run with a new cache: every attempt's


def _measure(work: Path, batches, with_cache: bool) -> list:
    """One attempt at a bundle of `batches`: a fresh DoFn, as a runner makes for a retry; the temp and
    progress files in `work`'s temp dir, the cache in `work/cache`."""
    cache_dir = str(work / "cache") if with_cache else None
    fn = measure_stage._MeasureFn(CFG, str(work / TEMP_DIR), str(work / TEMP_DIR), cache_dir)
    fn.setup()
    # each batch its own element: a list of the batches that travel together (one, but a row group's)
    return [out for batch in batches for out in fn.process([batch], EMPTY_CACHE if with_cache else None)]


@pytest.mark.parametrize("with_cache", [True, False], ids=["cache", "no_cache"])
def test_measure_run_twice_or_after_failing_half_way_writes_the_same_temp_cache_and_progress_files(
    rows, tmp_path, monkeypatch, with_cache
):
    """The temp and cache files are named by their ids and keys; a batch's progress file by its rows,
    so the progress line counts a retried batch once."""
    from melshards.preprocess.inputs.progress import ProgressReporter

    first = outputs(_measure(tmp_path, rows, with_cache))
    clean = snapshot(tmp_path)
    kinds = {Path(p).name.split("-")[0] for p in clean if TEMP_DIR in p}
    assert kinds == ({"clips", "progress"} if with_cache else {"clips", "features", "progress"})
    assert any(p.endswith(".keys") for p in clean) == with_cache
    assert outputs(_measure(tmp_path, rows, with_cache)) == first
    assert snapshot(tmp_path) == clean
    assert ProgressReporter(str(tmp_path), echo=print).rows_done() == 4  # each row once, measured twice

    shutil.rmtree(tmp_path)
    # the second batch's clips file half-written: the first batch's files, and the cache's entries, are there
    # (each batch writes its progress file, then its features file without a cache, then its clips file)
    monkeypatch.setattr(temp_files, "write", WriteFails(temp_files.write, at=4 if with_cache else 6))
    with pytest.raises(OSError, match="half-way"):
        _measure(tmp_path, rows, with_cache)
    monkeypatch.undo()
    assert outputs(_measure(tmp_path, rows, with_cache)) == first
    assert snapshot(tmp_path) == clean


# -- FilterAndWrite: the temp TFRecord files ----------------------------------------------------------
@pytest.fixture(scope="module")
def measured(rows, tmp_path_factory):
    """The two batches measured (with a feature cache), and the side inputs the writer takes (read-only)."""
    work = tmp_path_factory.mktemp("measured")
    out = _measure(work, rows, with_cache=True)
    batches = [o.value for o in out if isinstance(o, TaggedOutput) and o.tag == measure_stage.MEASURED]
    clips = [c for b in batches for c in batch_files.read_clips(b)]
    frames = max(c["mel_frames"] for c in clips)
    side = (
        Cutoffs(0, 1, frames - 1, 1000, frames - 1, 1000),  # the longest clip is dropped
        {"buckets": {"bounds": (1000,), "plan": None, "raised_last_bound": None}, "text": {0: {200: 1}}},
        finish_tables(
            {
                key: row
                for item in summarize_clips(clips, CFG.split.salt).items()
                for key, row in finish_part(item, CFG).items()
            },
            CFG,
        ),
        None,
    )
    return batches, side


def _filter_and_write(out_dir: Path, batches, side) -> list:
    fn = filter_and_write._FilterAndWriteFn(str(out_dir), 1, CFG)  # a file per record: several roll over
    fn.setup()
    fn.start_bundle()
    results = [out for batch in batches for out in fn.process(batch, *side)]
    return results + list(fn.finish_bundle())


def test_filter_and_write_run_twice_or_after_failing_half_way_writes_the_same_temp_files(
    measured, tmp_path, monkeypatch
):
    """A temp file is named by its bytes: the same outputs, names and bytes, and nothing left of the
    failed attempt."""
    batches, side = measured
    (tmp_path / TEMP_DIR).mkdir()
    first = outputs(_filter_and_write(tmp_path, batches, side))
    clean = snapshot(tmp_path)
    parts = [pickle.loads(v) for tag, v in first if tag is None]
    assert len(parts) == 2 and sorted(clean) == sorted(p["path"] for p in parts)
    assert [tag for tag, _ in first].count(filter_and_write.REJECTED) == 1
    assert outputs(_filter_and_write(tmp_path, batches, side)) == first
    assert snapshot(tmp_path) == clean

    shutil.rmtree(tmp_path / TEMP_DIR)
    (tmp_path / TEMP_DIR).mkdir()
    real, calls = filter_and_write.encode_clip, []

    def fails_at_the_second_record(*args):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("the worker died half-way through the bundle")
        return real(*args)

    monkeypatch.setattr(filter_and_write, "encode_clip", fails_at_the_second_record)
    with pytest.raises(OSError, match="half-way"):
        _filter_and_write(tmp_path, batches, side)
    monkeypatch.undo()
    assert outputs(_filter_and_write(tmp_path, batches, side)) == first
    assert snapshot(tmp_path) == clean


# -- the report stage: the rejected shards, the reports, the temp dir, the cache's run record ----------
def test_a_rejected_shard_written_twice_or_after_failing_half_way_is_the_same_file(tmp_path, monkeypatch):
    (tmp_path / TEMP_DIR).mkdir()
    rows = [{"id": f"r{i:02d}", "reason": "too_short", "detail": "d"} for i in (3, 1, 2)]
    fn = report._WriteRejectedShardFn(str(tmp_path))
    first = list(fn.process((7, rows)))
    clean = snapshot(tmp_path)
    assert list(report._WriteRejectedShardFn(str(tmp_path)).process((7, rows))) == first
    assert snapshot(tmp_path) == clean
    real, lines = report.rejected_line, []

    def fails_at_the_second_line(row):
        lines.append(1)
        if len(lines) == 2:
            raise OSError("the worker died half-way through the bundle")
        return real(row)

    shutil.rmtree(tmp_path / TEMP_DIR)
    (tmp_path / TEMP_DIR).mkdir()
    monkeypatch.setattr(report, "rejected_line", fails_at_the_second_line)
    with pytest.raises(OSError, match="half-way"):
        list(report._WriteRejectedShardFn(str(tmp_path)).process((7, rows)))
    monkeypatch.undo()
    assert snapshot(tmp_path) == {}  # no half-written shard, no temp file
    assert list(report._WriteRejectedShardFn(str(tmp_path)).process((7, rows))) == first
    assert snapshot(tmp_path) == clean


class _Built:
    def to_json(self) -> str:
        return '{"schema": 1}\n'


def _report(out_dir: Path, cache_dir: Path, finished: bool) -> list:
    """One attempt at the report's bundle: stats.json and schema.json as built from the side inputs
    stand in (`build_stats`, `build_schema`: pure, tested on their own)."""
    shard = str(out_dir / TEMP_DIR / "rejected-00000.jsonl")
    plan = {"buckets": {"bounds": (100,)} if finished else None, "text": {}, "after": {}, "train_hist": {}}
    use = [{"counts": {"hits": 1}, "files": {str(cache_dir / "entries" / "a.npz")}}]
    fn = report._WriteReportFn(str(out_dir), CFG, str(cache_dir))
    side = (4, {}, "cutoffs" if finished else None, plan, {}, [shard], [], None, {}, [], [], [], use, {})
    return list(fn.process(None, *side))


@pytest.mark.parametrize("finished", [True, False], ids=["finished", "every_row_rejected"])
def test_the_report_run_twice_or_after_failing_half_way_through_removing_the_temp_dir_writes_the_same_files(
    tmp_path, monkeypatch, finished
):
    """The second attempt once found the rejected shards gone with the temp dir, and failed the job
    after every report was written."""
    monkeypatch.setattr(report, "build_stats", lambda *a: {"stats": 1})
    monkeypatch.setattr(report, "build_schema", lambda *a: _Built())
    monkeypatch.setattr(report.QualityFigures, "of", staticmethod(lambda *a: None))
    out, cache_dir = tmp_path / ".melshards-run-x", tmp_path / "cache"

    def staged():
        (out / TEMP_DIR).mkdir(parents=True)
        (out / TEMP_DIR / "rejected-00000.jsonl").write_text('{"id": "a", "reason": "too_short"}\n')
        (out / TEMP_DIR / "clips-0a.pkl").write_bytes(b"measured")

    staged()
    first = _report(out, cache_dir, finished)
    clean = snapshot(tmp_path)
    assert sorted(Path(p).name for p in clean) == sorted(
        ["rejected.jsonl", "stats.json", "melshards-run-x.txt"] + (["schema.json"] if finished else [])
    )
    assert _report(out, cache_dir, finished) == first
    assert snapshot(tmp_path) == clean

    shutil.rmtree(tmp_path)
    staged()
    real = FileSystems.delete

    def dies_after_the_first(paths):
        real(sorted(paths, key=lambda p: "rejected-" not in p)[:1])  # the rejected shard goes first
        raise OSError("the worker died half-way through the bundle")

    monkeypatch.setattr(FileSystems, "delete", staticmethod(dies_after_the_first))
    with pytest.raises(OSError, match="half-way"):
        _report(out, cache_dir, finished)
    monkeypatch.setattr(FileSystems, "delete", staticmethod(real))
    assert _report(out, cache_dir, finished) == first
    assert snapshot(tmp_path) == clean


# -- the output's lock on gs://: a create or renewal whose answer was lost ------------------------------
class _AnswersLost(_FakeBucket):
    """Its next `lost` uploads land, then fail as the client reports them: `PreconditionFailed` (its
    retry of the upload, at the generation before, finds the one the first made) or the `error` given."""

    def __init__(self):
        super().__init__()
        self.lost, self.error = 0, PreconditionFailed("the retry's precondition: the upload had landed")

    def blob(self, name):
        blob, bucket = _FakeBlob(self.store, name), self
        real = blob.upload_from_string

        def upload(data, if_generation_match=None):
            real(data, if_generation_match=if_generation_match)
            if bucket.lost:
                bucket.lost -= 1
                raise bucket.error

        blob.upload_from_string = upload
        return blob


def test_a_lock_whose_create_answer_was_lost_is_the_runs_own_not_another_runs():
    bucket = _AnswersLost()
    bucket.lost = 1
    held = lock.Lock("gs://b/out", "me", gcs_bucket=bucket)
    held.acquire()  # was: "in use by another melshards preprocess run me"
    assert held.still_held()
    held.release()
    assert bucket.store == {}


@pytest.mark.parametrize("error", ["precondition", "unavailable"])
def test_a_lock_renewal_whose_answer_was_lost_keeps_the_lock(error):
    """Reported as the client's retry failing its precondition (the renewal then keeps the lock), or as
    an error (the heartbeat tries again at the next beat, which then keeps it)."""
    bucket = _AnswersLost()
    held = lock.Lock("gs://b/out", "me", gcs_bucket=bucket)
    held.acquire()
    bucket.lost = 1
    if error == "unavailable":
        bucket.error = ServiceUnavailable("no answer")
        with pytest.raises(ServiceUnavailable):
            held.renew()
    assert held.renew() is True and held.still_held()  # was: False, and the run would not publish
    assert held.renew() is True and held.still_held()
    someone = dict(lock.machine_identity(), run_id="someone else", pid=1, heartbeat=0)
    bucket.store["out/.melshards-lock"] = (json.dumps(someone).encode(), 99)  # taken over meanwhile
    assert held.renew() is False and not held.still_held()


def test_on_gcs_the_temp_files_written_twice_or_after_failing_half_way_are_the_same_objects(gcs):
    """The temp files' renames and a failed attempt's removal, through Beam's GcsIO on the emulator."""
    from melshards.preprocess.out_dir.shards import RollingFiles
    from tests.preprocess.test_gcs import _bucket

    out = f"gs://{_bucket(gcs)}/run"
    records = [("train", 0, f"record {i}".encode()) for i in range(5)] + [("val", 0, b"record v")]

    def attempt(fail_at: int | None = None) -> list[dict]:
        files, written = RollingFiles(out, 40), []
        try:
            for i, record in enumerate(records):
                if i == fail_at:
                    raise OSError("the worker died half-way through the bundle")
                written += files.write(*record)
        except OSError:
            files.discard()
            raise
        return written + files.close_all()

    def objects() -> dict[str, bytes]:
        found = FileSystems.match([f"{out}/**"])[0].metadata_list
        return {m.path: FileSystems.open(m.path).read() for m in found}

    first = attempt()
    clean = objects()
    assert sorted(clean) == sorted(p["path"] for p in first) and len(first) == 4
    assert attempt() == first and objects() == clean
    FileSystems.delete(list(clean))
    with pytest.raises(OSError, match="half-way"):
        attempt(fail_at=4)
    assert attempt() == first and objects() == clean
