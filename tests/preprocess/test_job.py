"""The whole job: accounting, the round trip through schema.json, the CLI, bad invocations, Dataflow."""
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from preprocess import audio as A
from preprocess.config import PreprocessConfig, load_config
from preprocess.run import run
from shards_schema.stats import percentile
from shards_schema.text import normalize_text
from shards_schema import read_schema
from shards_schema.records import decode_parsed, parse_spec

from tests.conftest import REPO, TINY_CONFIG


def _records(out_dir, pattern="*.tfrecord"):
    schema = read_schema(str(out_dir))
    ds = tf.data.TFRecordDataset(sorted(str(p) for p in out_dir.glob(pattern))).batch(1)
    return schema, [decode_parsed(schema, tf.io.parse_example(b, parse_spec(schema)), 1) for b in ds]


def _input_rows(corpus_dir):
    return [l for l in (corpus_dir / "metadata.csv").read_text().splitlines() if l.strip()]


def test_every_input_row_is_in_a_shard_or_in_rejected_jsonl(shards_dir, corpus_dir):
    _, records = _records(shards_dir)
    rejected = [json.loads(l) for l in (shards_dir / "rejected.jsonl").read_text().splitlines()]
    rows = _input_rows(corpus_dir)
    assert len(records) + len(rejected) == len(rows) == 56
    stats = json.loads((shards_dir / "stats.json").read_text())
    c = stats["counts"]
    assert c["input_rows"] == 56 and c["in_shards"] == len(records)
    assert c["filtered"] + c["rejected"] == len(rejected) == sum(c["per_reason"].values())
    shard_ids = {r["id"].numpy()[0].decode() for r in records}
    ids = [l.split("|")[0] for l in rows if "|" in l]
    assert set(ids) == shard_ids | {r["id"] for r in rejected if r["id"] in ids}
    assert {r["reason"] for r in rejected} >= {
        "missing_audio", "unreadable_audio", "empty_text", "unusable_text", "silent_audio", "too_short",
        "duplicate_id", "malformed_row", "mel_frames_above_cutoff"}
    assert all(r["detail"] for r in rejected)
    assert sorted(p.name for p in shards_dir.iterdir() if not p.name.endswith(".tfrecord")) == [
        "rejected.jsonl", "schema.json", "stats.json"]  # the stashed mels and progress files are gone


def test_schema_json_is_the_contract_the_records_follow(shards_dir):
    schema, records = _records(shards_dir)
    assert schema.counts["train"] + schema.counts["val"] == len(records)
    assert sum(s["records"] for s in schema.shards["train"]) == schema.counts["train"]
    assert schema.max_mel_frames % 8 == 0 and schema.max_text_len % 8 == 0
    assert len(schema.mel_mean) == len(schema.mel_std) == schema.n_mels == 80
    for r in records:
        assert r["mel"].shape == (1, schema.max_mel_frames, 80)
        assert 0 < int(r["mel_len"][0]) <= schema.max_mel_frames
        assert 0 < int(r["text_len"][0]) <= schema.max_text_len
    assert not (shards_dir / ".melshards-tmp").exists()


def test_shards_hold_the_librosa_mel_and_normalised_text_of_each_clip(shards_dir, corpus_dir):
    schema, records = _records(shards_dir)
    cfg = load_config(str(TINY_CONFIG))
    rec = next(r for r in records if r["id"].numpy()[0] == b"LJT001-0003")  # 16 kHz FLAC, resampled
    y, _ = A.decode_audio((corpus_dir / "wavs" / "LJT001-0003.flac").read_bytes(), 22050)
    expected = A.log_mel(A.trim(y, cfg.audio), 22050, cfg.mel)
    n = int(rec["mel_len"][0])
    assert n == expected.shape[0]
    np.testing.assert_allclose(rec["mel"][0, :n].numpy(), expected, rtol=1e-3, atol=1e-2)
    row = next(l for l in _input_rows(corpus_dir) if l.startswith("LJT001-0003|"))
    text = normalize_text(row.split("|")[2] or row.split("|")[1])
    assert rec["text"].numpy()[0].decode() == text
    from shards_schema import Vocabulary
    ids = rec["text_ids"][0, : int(rec["text_len"][0])].numpy().tolist()
    assert Vocabulary(schema.vocabulary).decode(ids) == text


def test_stats_json_percentiles_come_from_its_histograms(shards_dir):
    stats = json.loads((shards_dir / "stats.json").read_text())
    for part in ("before_filter", "after_filter"):
        hist = {int(k): v for k, v in stats["histograms"][part]["mel_frames"].items()}
        assert stats[part]["mel_frames"]["percentiles"]["p50"] == percentile(hist, 50)
        assert stats[part]["mel_frames"]["count"] == sum(hist.values())
    assert stats["padding"]["max_mel_frames"] >= stats["after_filter"]["mel_frames"]["percentiles"]["p100"]
    assert 0 < stats["padding"]["mel_padding_fraction"] < 1


def test_cli_with_two_worker_processes_writes_the_same_records_quietly(shards_dir, corpus_dir, tmp_path):
    out = tmp_path / "mp"
    proc = subprocess.run(
        [sys.executable, "-m", "preprocess", "--input", str(corpus_dir), "--output", str(out),
         "--config", str(TINY_CONFIG), "--workers", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "56 input rows" in proc.stdout and "p99.9" in proc.stdout
    assert "Worker:" not in proc.stderr  # the worker processes' own log lines stay out of the console
    _, a = _records(shards_dir)
    _, b = _records(out)
    assert sorted(r["id"].numpy()[0] for r in a) == sorted(r["id"].numpy()[0] for r in b)
    assert json.loads((out / "schema.json").read_text())["mel_mean"] == \
        pytest.approx(json.loads((shards_dir / "schema.json").read_text())["mel_mean"], abs=1e-4)


def _fails(capsys, argv, *fragments):
    assert run(argv) == 2
    err = capsys.readouterr().err
    for f in fragments:
        assert f in err, err
    return err


def _options(argv, workers):
    from preprocess.run import apply_workers, pipeline_options
    options = pipeline_options(argv)
    apply_workers(options, argv, workers)
    from apache_beam.options.pipeline_options import DirectOptions
    d = options.view_as(DirectOptions)
    return d.direct_num_workers, d.direct_running_mode


def test_workers_default_to_every_core_in_worker_processes(monkeypatch):
    import preprocess.run as R
    monkeypatch.setattr(R, "all_cores", lambda: 4)
    assert _options([], None) == (4, "multi_processing")
    assert _options([], 3) == (3, "multi_processing")
    assert _options([], 1) == (1, "in_memory")


def test_beams_own_worker_options_win_over_workers():
    assert _options(["--direct_num_workers", "3"], 2) == (3, "multi_processing")
    assert _options(["--direct_num_workers=1"], None) == (1, "in_memory")
    assert _options(["--direct_running_mode", "multi_threading"], 2) == (2, "multi_threading")


def test_workers_is_refused_for_dataflow_and_below_one(capsys, tmp_path, corpus_dir):
    _fails(capsys, ["--input", str(corpus_dir), "--output", str(tmp_path / "o"), "--workers", "0"],
           "--workers must be at least 1")
    _fails(capsys, ["--input", str(corpus_dir), "--output", str(tmp_path / "o"), "--workers", "2",
                    "--runner", "DataflowRunner", "--dry_run=True"], "--max_num_workers")


def test_missing_input_path_fails_before_any_work(capsys, tmp_path):
    _fails(capsys, ["--input", str(tmp_path / "nope"), "--output", str(tmp_path / "o")], "does not exist")
    assert not (tmp_path / "o").exists()


def test_directory_that_is_not_a_corpus_is_refused(capsys, tmp_path):
    (tmp_path / "x.txt").write_text("hi")
    _fails(capsys, ["--input", str(tmp_path), "--output", str(tmp_path / "o")], "is not a corpus", "metadata.csv")


def test_unknown_config_key_is_refused_with_the_valid_keys(capsys, tmp_path, corpus_dir):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("mel:\n  n_mel: 80\n")
    _fails(capsys, ["--input", str(corpus_dir), "--output", str(tmp_path / "o"), "--config", str(cfg)],
           "unknown key(s) n_mel", "n_mels")


def test_finished_output_is_not_overwritten_without_the_flag(capsys, tmp_path, corpus_dir):
    (tmp_path / "schema.json").write_text("{}")
    _fails(capsys, ["--input", str(corpus_dir), "--output", str(tmp_path)], "already holds a finished run",
           "--overwrite")


def test_invalid_config_value_is_refused():
    with pytest.raises(ValueError, match="above Nyquist"):
        PreprocessConfig(mel=PreprocessConfig().mel.__class__(fmax=20000.0)).validate()


def test_dataflow_job_graph_builds_offline(tmp_path, corpus_dir):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from preprocess.corpus import detect_corpus
    from preprocess.pipeline import build

    options = PipelineOptions([
        "--runner", "DataflowRunner", "--project", "melshards-test", "--region", "us-central1",
        "--temp_location", "gs://melshards-test/tmp", "--setup_file", str(REPO / "setup.py"),
        "--dry_run=True", "--no_auth"])
    p = beam.Pipeline(options=options)
    build(p, detect_corpus(str(corpus_dir)), "gs://melshards-test/out", PreprocessConfig())
    result = p.run()
    names = {t.unique_name for t in result.job.proto_pipeline.components.transforms.values()}
    for stage in ("Read", "Dedupe", "Measure", "StatsBefore", "FilterByPercentiles", "ComputeMel", "MelStats",
                  "PadAndEncode", "WriteShards", "WriteRejected", "Report"):
        assert stage in names
    assert not any(tmp_path.iterdir())


def test_documented_dataflow_dry_run_builds_offline_through_the_cli(capsys, monkeypatch, tmp_path, corpus_dir):
    from apache_beam.io.gcp.gcsfilesystem import GCSFileSystem

    def no_gcs(*args, **kwargs):
        raise AssertionError("a dry run contacted GCS")

    for method in ("exists", "match", "delete", "create", "open", "rename"):
        monkeypatch.setattr(GCSFileSystem, method, no_gcs)
    monkeypatch.chdir(tmp_path)
    code = run(["--input", str(corpus_dir), "--output", "gs://melshards-test/out",
                "--runner", "DataflowRunner", "--project", "melshards-test", "--region", "us-central1",
                "--temp_location", "gs://melshards-test/tmp", "--setup_file", str(REPO / "setup.py"),
                "--dry_run=True", "--no_auth"])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    assert "dry run: the job graph was built and not submitted" in out.out
    assert not any(tmp_path.iterdir())


def test_files_of_an_unfinished_run_are_cleared_before_a_new_one(tmp_path):
    from preprocess.run import prepare_output
    from preprocess.shards import TEMP_DIR
    (tmp_path / TEMP_DIR).mkdir()
    (tmp_path / TEMP_DIR / "train-x.tfrecord").write_bytes(b"x")
    (tmp_path / "train-00000-of-00002.tfrecord").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("the user's own file")
    prepare_output(str(tmp_path), overwrite=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_progress_sums_the_workers_counts_and_ignores_files_being_written(tmp_path):
    from preprocess.run import ProgressReporter
    from preprocess.shards import TEMP_DIR
    (tmp_path / TEMP_DIR).mkdir()
    (tmp_path / TEMP_DIR / "progress-a.txt").write_text("120")
    (tmp_path / TEMP_DIR / "progress-b.txt").write_text("80")
    (tmp_path / TEMP_DIR / "progress-b.txt.writing").write_text("9")
    reporter = ProgressReporter(str(tmp_path), total=1000)
    assert reporter.rows_done() == 200
    assert reporter.line(200, 40.0) == "progress: 200/1000 rows (20%), 40.0 clips/s, ETA 20s"
