"""Each stage's PTransform on its own, with TestPipeline + assert_that."""
import json
import os
from collections import Counter

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to, is_not_empty

from preprocess.config import PreprocessConfig
from preprocess.corpus import Corpus, DropDuplicateIds, ReadCorpus, detect_corpus
from preprocess.pipeline import (ComputeMel, FilterByPercentiles, LengthHistograms, MeasureClips, MelStatistics,
                                 PadAndEncode, encode_clip, split_of)
from preprocess.shards import WriteShards, plan_shards
from shards_schema.stats import Cutoffs

CFG = PreprocessConfig()


def pipeline():
    # The in-process runner: the default DirectRunner first tries to download Prism.
    return TestPipeline(runner="FnApiRunner")


def _ids(rows):
    return sorted(r["id"] for r in rows)


def test_read_corpus_ljspeech_attaches_audio_and_rejects_malformed_rows(corpus_dir):
    corpus = detect_corpus(str(corpus_dir))
    with pipeline() as p:
        out = p | ReadCorpus(corpus)

        def check_rows(rows):
            assert len(rows) == 55
            by_id = {r["id"]: r for r in rows if r["id"] != "LJT001-0003" or r["row"] == 2}
            assert by_id["LJT001-0003"]["audio"].endswith("LJT001-0003.flac")
            assert by_id["LJT900-0001"]["audio"] is None  # no file: rejected later as missing_audio
            assert by_id["LJT001-0001"]["text"] == by_id["LJT001-0001"]["text"].strip()

        assert_that(out["rows"], check_rows, label="rows")
        assert_that(out["rejected"] | beam.Map(lambda r: (r["id"], r["reason"])),
                    equal_to([("row-55", "malformed_row")]), label="rejected")


def test_read_corpus_manifest_jsonl_resolves_relative_paths(tmp_path, corpus_dir):
    manifest = tmp_path / "m.jsonl"
    rows = [{"audio": str(corpus_dir / "wavs" / "LJT001-0001.wav"), "text": "Hello.", "speaker": "s1"},
            {"audio": "wavs/x.wav", "text": "There.", "id": "x"}]
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    with pipeline() as p:
        out = p | ReadCorpus(detect_corpus(str(manifest)))
        assert_that(out["rows"] | beam.Map(lambda r: (r["id"], r["speaker"], r["audio"])), equal_to([
            ("LJT001-0001", "s1", str(corpus_dir / "wavs" / "LJT001-0001.wav")),
            ("x", "", str(tmp_path / "wavs" / "x.wav"))]), label="rows")
        assert_that(out["rejected"] | beam.Map(lambda r: r["reason"]), equal_to(["malformed_row"]), label="rej")


def test_read_corpus_csv_manifest_reads_header_columns(tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_text("audio,text,speaker\na.wav,\"Hi, there\",bob\n")
    with pipeline() as p:
        out = p | ReadCorpus(detect_corpus(str(manifest)))
        assert_that(out["rows"] | beam.Map(lambda r: (r["id"], r["text"], r["speaker"])),
                    equal_to([("a", "Hi, there", "bob")]))


def test_drop_duplicate_ids_keeps_the_first_row():
    rows = [{"id": "a", "row": 3}, {"id": "a", "row": 1}, {"id": "b", "row": 2}]
    with pipeline() as p:
        out = p | beam.Create(rows) | DropDuplicateIds()
        assert_that(out.rows | beam.Map(lambda r: (r["id"], r["row"])), equal_to([("a", 1), ("b", 2)]), label="kept")
        assert_that(out["rejected"] | beam.Map(lambda r: (r["id"], r["reason"])),
                    equal_to([("a", "duplicate_id")]), label="dups")


def _row(corpus_dir, clip_id, text="Hello there.", ext="wav"):
    return {"id": clip_id, "text": text, "speaker": "", "audio": str(corpus_dir / "wavs" / f"{clip_id}.{ext}"),
            "row": 0}


def test_measure_clips_gives_lengths_and_a_reason_per_bad_clip(corpus_dir):
    rows = [_row(corpus_dir, "LJT001-0001"), _row(corpus_dir, "LJT900-0006"), _row(corpus_dir, "LJT900-0003"),
            _row(corpus_dir, "LJT001-0002", text=" "), dict(_row(corpus_dir, "nope"), audio=str(corpus_dir / "x.wav"))]
    with pipeline() as p:
        out = p | beam.Create(rows) | MeasureClips(CFG)

        def check(clips):
            (c,) = clips
            assert c["text"] == "hello there." and c["text_len"] == len("hello there.")
            assert c["mel_frames"] == 1 + c["num_samples"] // CFG.mel.hop_length
            assert c["duration_ms"] == round(1000 * c["num_samples"] / 22050)

        assert_that(out.clips, check, label="clips")
        assert_that(out["rejected"] | beam.Map(lambda r: (r["id"], r["reason"])), equal_to([
            ("LJT900-0006", "silent_audio"), ("LJT900-0003", "unreadable_audio"), ("LJT001-0002", "empty_text"),
            ("nope", "missing_audio")]), label="rejected")


def _clip(clip_id, text_len, mel_frames, duration_ms):
    return {"id": clip_id, "text_len": text_len, "mel_frames": mel_frames, "duration_ms": duration_ms}


def test_length_histograms_are_exact_counts():
    clips = [_clip("a", 5, 100, 1000), _clip("b", 5, 120, 1300), _clip("c", 7, 100, 1000)]
    with pipeline() as p:
        out = p | beam.Create(clips) | LengthHistograms()
        assert_that(out, equal_to([{"text_len": {5: 2, 7: 1}, "mel_frames": {100: 2, 120: 1},
                                    "duration_ms": {1000: 2, 1300: 1}}]))


def test_filter_drops_clips_outside_cutoffs_given_as_side_input():
    cut = Cutoffs(500, 50, 200, 40, 200, 40)
    clips = [_clip("ok", 40, 200, 2000), _clip("short", 5, 60, 400), _clip("long", 5, 201, 3000),
             _clip("wordy", 41, 100, 2000), _clip("tiny", 5, 49, 600)]
    with pipeline() as p:
        cutoffs = p | "Cut" >> beam.Create([cut])
        out = p | beam.Create(clips) | FilterByPercentiles(cutoffs)
        assert_that(out.kept | beam.Map(lambda c: c["id"]), equal_to(["ok"]), label="kept")
        assert_that(out["rejected"] | beam.Map(lambda r: (r["id"], r["reason"])), equal_to([
            ("short", "too_short"), ("long", "mel_frames_above_cutoff"), ("wordy", "text_len_above_cutoff"),
            ("tiny", "mel_frames_below_cutoff")]), label="rejected")


@pytest.mark.parametrize("stash", [True, False], ids=["stashed", "in_element"])
def test_mel_computed_at_measure_reaches_compute_mel_once_decoded(corpus_dir, tmp_path, monkeypatch, stash):
    from preprocess import audio as A
    from preprocess.clips import featurize
    from shards_schema import Vocabulary
    decodes = []
    real_decode = A.decode_audio
    monkeypatch.setattr(A, "decode_audio", lambda *a: decodes.append(1) or real_decode(*a))
    expected = featurize(_row(corpus_dir, "LJT001-0001"), CFG, Vocabulary())["mel"]
    decodes.clear()
    with pipeline() as p:
        measured = p | beam.Create([_row(corpus_dir, "LJT001-0001")]) | MeasureClips(
            CFG, str(tmp_path) if stash else None)
        out = measured.clips | ComputeMel(CFG)

        def check(clips):
            (c,) = clips
            assert c["split"] == split_of("LJT001-0001", 0.05, "melshards")
            assert c["mel"].shape == (c["mel_frames"], 80) and c["mel"].dtype == np.float16
            np.testing.assert_array_equal(c["mel"], expected.astype(np.float16))
            assert c["moments"].n == c["mel_frames"]
            np.testing.assert_allclose(c["moments"].mean, expected.mean(axis=0), rtol=1e-6)

        assert_that(out.clips, check)
    assert len(decodes) == 1  # the in-process runner shares this module
    assert len(list(tmp_path.glob("mel-*.f16"))) == (1 if stash else 0)


def test_split_is_deterministic_and_near_the_fraction():
    splits = [split_of(f"id{i}", 0.1, "s") for i in range(5000)]
    assert splits == [split_of(f"id{i}", 0.1, "s") for i in range(5000)]
    assert 0.08 < splits.count("val") / 5000 < 0.12


def test_mel_statistics_use_training_frames_only():
    from shards_schema.stats import Moments
    a = {"split": "train", "moments": Moments.of(np.array([[0.0, 2.0], [2.0, 2.0]], np.float32))}
    b = {"split": "val", "moments": Moments.of(np.full((3, 2), 100.0, np.float32))}
    with pipeline() as p:
        out = p | beam.Create([a, b]) | MelStatistics(2)
        assert_that(out | beam.Map(lambda m: (m.n, m.mean.tolist(), m.std().tolist())),
                    equal_to([(2, [1.0, 2.0], [1.0, 0.0])]))


def test_pad_and_encode_pads_each_clip_to_its_buckets_shapes(corpus_dir):
    import tensorflow as tf
    from shards_schema.records import decode_parsed, parse_spec

    from preprocess.clips import featurize
    from preprocess.report import build_schema
    from shards_schema.stats import Moments
    from shards_schema import Vocabulary
    clip = dict(featurize(_row(corpus_dir, "LJT001-0001"), CFG, Vocabulary()), split="train")
    buckets = {"bounds": (8, 400, 800), "plan": None, "raised_last_bound": None}
    text = {1: {clip["text_len"]: 1, 75: 1}}  # bucket 1's text lengths: padded to 80
    with pipeline() as p:
        out = p | beam.Create([clip]) | PadAndEncode(p | "B" >> beam.Create([buckets]),
                                                     p | "T" >> beam.Create(list(text.items())), CFG)
        assert_that(out | beam.Map(lambda r: r[:3]), equal_to([("train", 1, "LJT001-0001")]))
    _, bucket, _, data = encode_clip(clip, buckets, text, CFG)
    schema = build_schema(CFG, buckets, text, Moments.empty(80), [])
    assert [(b.max_mel_frames, b.max_text_len) for b in schema.buckets] == [(8, 8), (400, 80), (800, 8)]
    shapes = schema.buckets[bucket]
    rec = decode_parsed(shapes, tf.io.parse_example([data], parse_spec(shapes)), 1)
    n = clip["mel"].shape[0]
    assert rec["mel"].shape == (1, 400, 80) and rec["text_ids"].shape == (1, 80) and int(rec["mel_len"][0]) == n
    np.testing.assert_allclose(rec["mel"][0, :n].numpy(), clip["mel"], atol=1e-2 * np.abs(clip["mel"]).max())
    assert np.all(rec["mel"][0, n:].numpy() == np.float16(np.log(1e-5)))
    assert rec["text_ids"][0, clip["text_len"]:].numpy().sum() == 0


def test_write_shards_rolls_files_at_the_target_size(tmp_path):
    records = ([("train", 0, f"id{i}", bytes(1000)) for i in range(30)] + [("val", 0, "v0", bytes(1000))]
               + [("train", 2, f"b{i}", bytes(1000)) for i in range(3)])
    with pipeline() as p:
        out = p | beam.Create(records) | WriteShards(str(tmp_path), target_shard_mb=0.01)
        assert_that(out | beam.Map(lambda s: (s["split"], s["bucket"], s["records"])),
                    equal_to([("train", 0, 10), ("train", 0, 10), ("train", 0, 10), ("val", 0, 1), ("train", 2, 3)]))
    written = sorted(f.name for f in tmp_path.glob("*.tfrecord"))
    assert written == ["train-b00-00000-of-00003.tfrecord", "train-b00-00001-of-00003.tfrecord",
                       "train-b00-00002-of-00003.tfrecord", "train-b02-00000-of-00001.tfrecord",
                       "val-b00-00000-of-00001.tfrecord"]
    import tensorflow as tf
    assert sum(1 for _ in tf.data.TFRecordDataset([str(tmp_path / w) for w in written])) == 34
    bucket2 = tf.data.TFRecordDataset(str(tmp_path / "train-b02-00000-of-00001.tfrecord"))
    assert sum(1 for _ in bucket2) == 3  # a bucket's shards hold its records only


def test_plan_packs_small_parts_and_keeps_full_ones_whole():
    parts = [{"split": "train", "bucket": 0, "path": f"t{i}", "records": r, "bytes": b}
             for i, (r, b) in enumerate([(10, 100), (3, 30), (9, 95), (2, 20), (1, 5)])]
    parts.append({"split": "val", "bucket": 0, "path": "v", "records": 1, "bytes": 10})
    parts.append({"split": "train", "bucket": 1, "path": "u", "records": 1, "bytes": 10})
    plan = plan_shards(parts, target_bytes=100)
    assert [(s["file"], s["parts"], s["records"]) for s in plan] == [
        ("train-b00-00000-of-00003.tfrecord", ["t0"], 10),
        ("train-b00-00001-of-00003.tfrecord", ["t2", "t4"], 10),
        ("train-b00-00002-of-00003.tfrecord", ["t1", "t3"], 5),
        ("train-b01-00000-of-00001.tfrecord", ["u"], 1),  # buckets never share a shard
        ("val-b00-00000-of-00001.tfrecord", ["v"], 1)]


def test_concatenated_parts_read_as_one_tfrecord_file(tmp_path):
    import tensorflow as tf
    for i in range(2):
        with tf.io.TFRecordWriter(str(tmp_path / f"part{i}")) as w:
            for j in range(3):
                w.write(f"{i}-{j}".encode())
    with pipeline() as p:
        plan = [{"split": "train", "bucket": 0, "file": "train-b00-00000-of-00001.tfrecord", "records": 6, "bytes": 0,
                 "parts": [str(tmp_path / "part0"), str(tmp_path / "part1")]}]
        from preprocess.shards import _AssembleShard
        p | beam.Create(plan) | beam.ParDo(_AssembleShard(str(tmp_path)))
    got = [r.numpy().decode() for r in tf.data.TFRecordDataset(str(tmp_path / "train-b00-00000-of-00001.tfrecord"))]
    assert got == ["0-0", "0-1", "0-2", "1-0", "1-1", "1-2"]
    assert not (tmp_path / "part0").exists() and not (tmp_path / "part1").exists()


def test_remove_temp_dir_deletes_leftover_parts(tmp_path):
    from preprocess.shards import TEMP_DIR, remove_temp_dir
    (tmp_path / TEMP_DIR).mkdir()
    (tmp_path / TEMP_DIR / "train-abc.tfrecord").write_bytes(b"x")
    remove_temp_dir(str(tmp_path))
    assert not (tmp_path / TEMP_DIR).exists()
    remove_temp_dir(str(tmp_path))  # nothing there: a no-op


def _plan_with_parts(tmp_path):
    """Two shards: one concatenated from two parts, one renamed from a single part."""
    from preprocess.shards import TEMP_DIR
    from shards_schema.records import frame_record
    tmp = tmp_path / TEMP_DIR
    tmp.mkdir(exist_ok=True)
    expected = {}
    plan = []
    for file, n_parts in (("train-b00-00000-of-00001.tfrecord", 2), ("val-b00-00000-of-00001.tfrecord", 1)):
        parts, whole = [], b""
        for i in range(n_parts):
            data = b"".join(frame_record(f"{file}-{i}-{j}".encode()) for j in range(3))
            (tmp / f"{file}.part{i}").write_bytes(data)
            parts.append(str(tmp / f"{file}.part{i}"))
            whole += data
        expected[file] = whole
        plan.append({"split": file[:file.index("-")], "bucket": 0, "file": file, "parts": parts,
                     "records": 3 * n_parts, "bytes": len(whole)})
    return plan, expected


def _assemble(tmp_path, plan):
    from preprocess.shards import _AssembleShard
    fn = _AssembleShard(str(tmp_path))
    return [out for shard in plan for out in fn.process(shard)]


def _check_shards(tmp_path, plan, expected):
    for shard in plan:
        assert (tmp_path / shard["file"]).read_bytes() == expected[shard["file"]]
        assert not any(os.path.exists(p) for p in shard["parts"])
    assert sorted(p.name for p in tmp_path.glob("*.tfrecord")) == sorted(expected)


def test_assembling_the_same_plan_twice_leaves_identical_complete_shards(tmp_path):
    plan, expected = _plan_with_parts(tmp_path)
    first = _assemble(tmp_path, plan)
    _check_shards(tmp_path, plan, expected)
    assert _assemble(tmp_path, plan) == first  # the retry: final present, parts gone -> done
    _check_shards(tmp_path, plan, expected)


@pytest.mark.parametrize("deleted_before_crash", [0, 1], ids=["before_delete", "mid_delete"])
def test_assembly_retried_after_a_crash_between_concatenation_and_deletion(tmp_path, monkeypatch,
                                                                           deleted_before_crash):
    from apache_beam.io.filesystems import FileSystems
    plan, expected = _plan_with_parts(tmp_path)
    real_delete = FileSystems.delete

    def crash(paths):
        real_delete(paths[:deleted_before_crash])
        raise RuntimeError("worker died")

    monkeypatch.setattr(FileSystems, "delete", staticmethod(crash))
    with pytest.raises(RuntimeError, match="worker died"):
        _assemble(tmp_path, plan[:1])
    assert (tmp_path / plan[0]["file"]).read_bytes() == expected[plan[0]["file"]]  # never partial
    monkeypatch.setattr(FileSystems, "delete", staticmethod(real_delete))
    _assemble(tmp_path, plan)
    _check_shards(tmp_path, plan, expected)


def test_assembly_fails_when_parts_are_gone_and_the_shard_was_never_written(tmp_path):
    plan, _ = _plan_with_parts(tmp_path)
    os.remove(plan[0]["parts"][1])
    with pytest.raises(IOError, match="never written"):
        _assemble(tmp_path, plan[:1])


# The rows: a "|" inside the text shifted the fields, and the shard got the wrong transcript.
EXTRA_FIELD_ROWS = [
    "LJT001-0004|Rain fell | softly on the tin roof.|Rain fell | softly on the tin roof.",
    "LJT001-0008|Well|are you coming|with us|she asked.",
]


@pytest.mark.parametrize("line", EXTRA_FIELD_ROWS)
def test_ljspeech_line_with_more_than_three_fields_is_malformed(line):
    from preprocess.corpus import parse_ljspeech_line
    with pytest.raises(ValueError, match=r"\|-separated fields, expected at most 3"):
        parse_ljspeech_line(line, 0)


def test_ljspeech_line_with_two_or_three_fields_is_a_row():
    from preprocess.corpus import parse_ljspeech_line
    assert parse_ljspeech_line("a|Hello.", 0)["text"] == "Hello."
    assert parse_ljspeech_line("a|Dr. Who|Doctor Who", 0)["text"] == "Doctor Who"


def _counters(result) -> dict:
    from apache_beam.metrics.metric import MetricsFilter
    return {c.key.metric.name: c.committed
            for c in result.metrics().query(MetricsFilter().with_namespace("melshards"))["counters"]}


def _read_and_dedupe(tmp_path, lines):
    (tmp_path / "wavs").mkdir()
    (tmp_path / "metadata.csv").write_text("\n".join(lines) + "\n")
    p = pipeline()
    read = p | ReadCorpus(detect_corpus(str(tmp_path)))
    unique = read["rows"] | DropDuplicateIds()
    rejected = (read["rejected"], unique["rejected"]) | beam.Flatten()
    return p, unique.rows, rejected


def test_rows_with_extra_fields_are_rejected_as_malformed_not_read(tmp_path):
    p, rows, rejected = _read_and_dedupe(tmp_path, ["a|Hello there.|Hello there.", *EXTRA_FIELD_ROWS])
    assert_that(rows | beam.Map(lambda r: (r["id"], r["text"])), equal_to([("a", "Hello there.")]), label="rows")
    assert_that(rejected | beam.Map(lambda r: (r["id"], r["reason"])),
                equal_to([("row-2", "malformed_row"), ("row-3", "malformed_row")]), label="rejected")
    p.run().wait_until_finish()


def test_malformed_rows_and_duplicate_ids_have_counters(tmp_path):
    p, _, rejected = _read_and_dedupe(tmp_path, ["a|Hello.|Hello.", "lonely", "a|Again.|Again.", "", "b|Bye.|"])
    assert_that(rejected | beam.Map(lambda r: (r["id"], r["reason"])),
                equal_to([("row-2", "malformed_row"), ("a", "duplicate_id")]))
    result = p.run()
    result.wait_until_finish()
    counters = _counters(result)
    assert (counters["input_rows"], counters["malformed_row"], counters["duplicate_id"]) == (4, 1, 1)


def test_ljspeech_layout_finds_mp3_ogg_and_flac(tmp_path):
    from tests.preprocess.conftest import encode, tone
    (tmp_path / "wavs").mkdir()
    for clip_id, fmt in (("m", "MP3"), ("o", "OGG"), ("f", "FLAC")):
        (tmp_path / "wavs" / f"{clip_id}.{fmt.lower()}").write_bytes(encode(tone(0.5), 22050, fmt))
    (tmp_path / "metadata.csv").write_text("m|One.|One.\no|Two.|Two.\nf|Three.|Three.\n")
    with pipeline() as p:
        out = p | ReadCorpus(detect_corpus(str(tmp_path)))
        assert_that(out["rows"] | beam.Map(lambda r: (r["id"], r["audio"].rsplit(".", 1)[1])),
                    equal_to([("m", "mp3"), ("o", "ogg"), ("f", "flac")]))


@pytest.mark.parametrize("name,content,problem", [
    ("metadata.csv", "", "holds no rows"),
    ("metadata.csv", "\n  \n", "holds no rows"),
    ("m.csv", "", "holds no rows"),
    ("m.csv", "path,transcript\na.wav,Hi\n", "missing audio, text"),
    ("m.tsv", "\naudio\ttext\n", None),  # blank lines before the header
    ("m.tsv", "audio,text\na.wav,Hi\n", "missing audio, text"),  # commas are not the TSV separator
    ("m.jsonl", '{"audio": "a.wav", "txt": "Hi"}\n', "missing text"),
    ("m.jsonl", 'not json\n{"audio": "a.wav", "text": "Hi"}\n', None),  # a malformed row, not a header
])
def test_rows_file_check_reads_the_first_line(tmp_path, name, content, problem):
    from preprocess.corpus import CorpusError, check_rows_file
    (tmp_path / name).write_text(content)
    corpus = detect_corpus(str(tmp_path / name) if name != "metadata.csv" else str(tmp_path))
    if problem is None:
        check_rows_file(corpus)
    else:
        with pytest.raises(CorpusError, match=problem):
            check_rows_file(corpus)
