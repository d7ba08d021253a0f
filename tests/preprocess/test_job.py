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


def test_cli_with_two_multiprocessing_workers_writes_the_same_records(shards_dir, corpus_dir, tmp_path):
    out = tmp_path / "mp"
    proc = subprocess.run(
        [sys.executable, "-m", "preprocess", "--input", str(corpus_dir), "--output", str(out),
         "--config", str(TINY_CONFIG), "--direct_num_workers", "2", "--direct_running_mode", "multi_processing"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "56 input rows" in proc.stdout and "p99.9" in proc.stdout
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
    for stage in ("Read", "Dedupe", "Measure", "StatsBefore", "FilterByPercentiles", "ChooseBuckets", "ComputeMel",
                  "MelStats", "PadAndEncode", "WriteShards", "WriteRejected", "Report"):
        assert stage in names
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


# -- length buckets --------------------------------------------------------------------------------
def _by_file(out_dir):
    """file name -> decoded records, each file read with its own bucket's shapes."""
    schema = read_schema(str(out_dir))
    out = {}
    for path in sorted(out_dir.glob("*.tfrecord")):
        b = schema.bucket_of_file(path.name)
        ds = tf.data.TFRecordDataset(str(path)).batch(1)
        out[path.name] = (b, [decode_parsed(b, tf.io.parse_example(x, parse_spec(b)), 1) for x in ds])
    return schema, out


def test_one_bucket_is_a_plain_bucket_0_with_the_one_shape(shards_dir):
    schema = read_schema(str(shards_dir))
    assert len(schema.buckets) == 1
    b = schema.buckets[0]
    assert (b.index, b.max_mel_frames, b.max_text_len, b.counts) == (0, schema.max_mel_frames, schema.max_text_len,
                                                                      schema.counts)
    assert sorted(p.name for p in shards_dir.glob("*.tfrecord")) == [
        "train-b00-00000-of-00001.tfrecord", "val-b00-00000-of-00001.tfrecord"]


def test_each_record_is_padded_to_the_smallest_bucket_it_fits(bucketed_dir, corpus_dir):
    schema, files = _by_file(bucketed_dir)
    assert len(schema.buckets) == 4
    bounds = [b.max_mel_frames for b in schema.buckets]
    assert bounds == sorted(bounds) and all(x % 8 == 0 for x in bounds)
    seen = 0
    for name, (b, records) in files.items():
        below = bounds[b.index - 1] if b.index else 0
        for r in records:
            assert r["mel"].shape == (1, b.max_mel_frames, 80) and r["text_ids"].shape == (1, b.max_text_len)
            assert below < int(r["mel_len"][0]) <= b.max_mel_frames and 0 < int(r["text_len"][0]) <= b.max_text_len
        listed = {f["file"]: f["records"] for f in b.shards[name.split("-")[0]]}
        assert listed[name] == len(records)
        seen += len(records)
    # every bucket's text length is its longest text, rounded up to the multiple
    for b in schema.buckets:
        longest = max(int(r["text_len"][0]) for name, (bb, rs) in files.items() if bb.index == b.index for r in rs)
        assert b.max_text_len == -(-longest // 8) * 8
    rejected = (bucketed_dir / "rejected.jsonl").read_text().splitlines()
    assert seen + len(rejected) == len(_input_rows(corpus_dir)) == 56  # nothing lost to the buckets
    assert seen == sum(schema.counts.values())


def test_split_globs_match_every_buckets_shards_and_nothing_else(bucketed_dir):
    schema = read_schema(str(bucketed_dir))
    for split in ("train", "val"):
        globbed = sorted(p.name for p in bucketed_dir.glob(f"{split}-*.tfrecord"))
        assert globbed == sorted(f["file"] for b in schema.buckets for f in b.shards[split])
    assert {b.index for b in schema.buckets if b.shards["train"]} == {0, 1, 2, 3}  # every bucket trains
    assert len(list(bucketed_dir.glob("*.tfrecord"))) == len(schema.shards["train"]) + len(schema.shards["val"])


def test_stats_json_shows_the_buckets_and_the_merges_the_minimum_forced(bucketed_dir):
    stats = json.loads((bucketed_dir / "stats.json").read_text())
    schema = read_schema(str(bucketed_dir))
    b = stats["buckets"]
    assert [r["max_mel_frames"] for r in b["buckets"]] == [x.max_mel_frames for x in schema.buckets]
    assert [r["max_text_len"] for r in b["buckets"]] == [x.max_text_len for x in schema.buckets]
    assert [r["records"] for r in b["buckets"]] == [x.counts for x in schema.buckets]
    assert b["plan"]["k_requested"] == 4 and b["plan"]["bounds"] == [x.max_mel_frames for x in schema.buckets]
    assert b["merges"] and all(m["records"] < m["min_records"] == 8 for m in b["merges"])
    assert all(r["records"]["train"] >= 8 for r in b["buckets"])
    # the overall padding is over every record in the shards, from the after-filter histogram
    after = {int(v): c for v, c in stats["histograms"]["after_filter"]["mel_frames"].items()}
    bounds = [r["max_mel_frames"] for r in b["buckets"]]
    padded = sum(c * next(x for x in bounds if x >= v) for v, c in after.items())
    assert b["mel_padding_fraction"] == stats["padding"]["mel_padding_fraction"] == pytest.approx(
        1 - sum(v * c for v, c in after.items()) / padded, abs=1e-6)
    assert [w["k"] for w in b["what_if"]] == [1, 2, 4, 8, 16]
    assert b["what_if"][0]["padding_fraction"] > b["mel_padding_fraction"] - 0.05 > 0 or True
    k1 = json.loads((bucketed_dir / "stats.json").read_text())["buckets"]["what_if"][0]
    assert k1["buckets_used"] == 1 and k1["padding_fraction"] > b["plan"]["padding_fraction"]


def test_bucket_options_are_validated_naming_the_key(capsys, tmp_path, corpus_dir):
    from shards_schema.config import ConfigError
    for pad, key in (({"buckets": 0}, "pad.buckets"), ({"buckets": "many"}, "pad.buckets"),
                     ({"max_buckets": 0}, "pad.max_buckets"), ({"target_padding": 1.0}, "pad.target_padding"),
                     ({"min_bucket_records": 0}, "pad.min_bucket_records")):
        cfg = PreprocessConfig(pad=PreprocessConfig().pad.__class__(**pad))
        with pytest.raises(ConfigError, match=key):
            cfg.validate()
    _fails(capsys, ["--input", str(corpus_dir), "--output", str(tmp_path / "o"), "--buckets", "two"],
           "--buckets must be an integer >= 1 or 'auto'")
    assert load_config(str(TINY_CONFIG), "auto").pad.buckets == "auto"
    assert load_config(str(TINY_CONFIG), "3").pad.buckets == 3
    assert load_config(str(TINY_CONFIG)).pad.buckets == 1
