"""Each stage's PTransform on its own, in an in-process pipeline with assert_that."""

import dataclasses
import json
import os
import pickle

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to

from melshards.preprocess.clip.measure_stage import MeasureClips
from melshards.preprocess.config import PadConfig, PreprocessConfig
from melshards.preprocess.inputs.read_stage import ReadCorpus, batch_rows, detect_corpus
from melshards.preprocess.inputs.rows import LayoutRows, unique_ids
from melshards.preprocess.inputs.working_set import WorkingSet
from melshards.preprocess.out_dir.batch_files import read_clips, read_features, read_rows, write_measured, write_rows
from melshards.preprocess.out_dir.shards import AssembleShards, RollingFiles, group_into_shards
from melshards.preprocess.stats.choose_buckets import ChooseBuckets
from melshards.preprocess.stats.filter_rule import filter_rejection
from melshards.preprocess.stats.global_stats import CorpusTables, LengthHistograms, MelStatistics
from melshards.preprocess.stats.tables import finish_part, finish_tables, split_of, summarize_clips
from melshards.preprocess.write.encode import encode_clip
from melshards.preprocess.write.filter_and_write import FilterAndWrite
from melshards.shards_schema.stats import Cutoffs
from tests.preprocess.conftest import beam_pipeline

CFG = PreprocessConfig()


def _ids(rows):
    return sorted(r["id"] for r in rows)


def _flat(batches):
    """ReadCorpus' elements (lists of batch references) -> their rows."""
    return batches | "Unbatch" >> beam.FlatMap(lambda refs: [r for ref in refs for r in read_rows(ref)])


def test_read_corpus_ljspeech_attaches_audio_and_rejects_malformed_rows(corpus_dir, tmp_path):
    corpus = detect_corpus(str(corpus_dir))
    with beam_pipeline() as p:
        out = p | ReadCorpus(corpus, str(tmp_path))

        def check_rows(rows):
            assert len(rows) == 54  # 56 rows, less one malformed and one repeated id
            by_id = {r["id"]: r for r in rows}
            assert by_id["LJT001-0003"]["row"] == 2  # the first of the two rows with this id
            assert by_id["LJT001-0003"]["audio"].endswith("LJT001-0003.flac")
            assert by_id["LJT900-0001"]["audio"] is None  # no file: rejected later as missing_audio
            assert by_id["LJT001-0001"]["text"] == by_id["LJT001-0001"]["text"].strip()

        assert_that(_flat(out["batches"]), check_rows, label="rows")
        assert_that(
            out["rejected"] | beam.Map(lambda r: (r["id"], r["reason"])),
            equal_to([("row-55", "malformed_row"), ("LJT001-0003", "duplicate_id")]),
            label="rejected",
        )
        assert_that(out["input_rows"], equal_to([56]), label="input_rows")


def test_read_corpus_manifest_jsonl_resolves_relative_paths(tmp_path, corpus_dir):
    manifest = tmp_path / "m.jsonl"
    rows = [
        {"audio": str(corpus_dir / "wavs" / "LJT001-0001.wav"), "text": "Hello.", "speaker": "s1"},
        {"audio": "wavs/x.wav", "text": "There.", "id": "x"},
    ]
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    with beam_pipeline() as p:
        out = p | ReadCorpus(detect_corpus(str(manifest), language="en"), str(tmp_path / "temp"))
        assert_that(
            _flat(out["batches"]) | beam.Map(lambda r: (r["id"], r["speaker"], r["audio"])),
            equal_to(
                [
                    ("LJT001-0001", "s1", str(corpus_dir / "wavs" / "LJT001-0001.wav")),
                    ("x", "m", str(tmp_path / "wavs" / "x.wav")),
                ]
            ),
            label="rows",
        )  # no speaker: the input's name
        assert_that(out["rejected"] | beam.Map(lambda r: r["reason"]), equal_to(["malformed_row"]), label="rej")


def test_read_corpus_csv_manifest_reads_header_columns(tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_text('audio,text,speaker\na.wav,"Hi, there",bob\n')
    with beam_pipeline() as p:
        out = p | ReadCorpus(detect_corpus(str(manifest), language="en"), str(tmp_path / "temp"))
        assert_that(
            _flat(out["batches"]) | beam.Map(lambda r: (r["id"], r["text"], r["speaker"])),
            equal_to([("a", "Hi, there", "bob")]),
        )


@pytest.mark.parametrize("on_disk", [False, True])
def test_unique_ids_keeps_the_first_row_of_an_id_in_memory_or_in_a_sqlite_working_set(on_disk):
    items = [
        {"id": "a", "row": 1},
        {"id": "x", "reason": "malformed_row", "detail": "d"},
        {"id": "b", "row": 2},
        {"id": "a", "row": 3},
    ]
    with WorkingSet() as working_set:
        out = list(unique_ids(items, working_set.map() if on_disk else {}))
    assert out[:3] == items[:3]
    assert out[3] == {"id": "a", "reason": "duplicate_id", "detail": "row 4 repeats the id of row 2"}


@pytest.mark.parametrize(
    "rows, size, batches", [(1, 1, 1), (16, 1, 16), (17, 2, 9), (56, 4, 14), (1000, 32, 32), (13100, 32, 410)]
)
def test_rows_are_batched_into_at_least_16_elements_of_at_most_32(rows, size, batches):
    assert batch_rows(rows) == size and -(-rows // size) == batches


def test_read_corpus_spreads_every_row_in_batches(tmp_path):
    (tmp_path / "wavs").mkdir()
    (tmp_path / "metadata.csv").write_text("".join(f"id{i}|Text {i}.|\n" for i in range(40)))
    with beam_pipeline() as p:
        out = p | ReadCorpus(detect_corpus(str(tmp_path)), str(tmp_path / "temp"))
        assert_that(
            out["batches"] | beam.Map(lambda refs: [b["count"] for b in refs]),
            equal_to([[3]] * 13 + [[1]]),
            label="sizes",
        )
        assert_that(
            _flat(out["batches"]) | beam.Map(lambda r: r["id"]), equal_to([f"id{i}" for i in range(40)]), label="ids"
        )


def _row(corpus_dir, clip_id, text="Hello there.", ext="wav"):
    return {
        "id": clip_id,
        "text": text,
        "speaker": "s",
        "language": "en",
        "gender": "",
        "audio": str(corpus_dir / "wavs" / f"{clip_id}.{ext}"),
        "row": 0,
    }


def test_measure_clips_gives_lengths_and_a_reason_per_bad_clip(corpus_dir, tmp_path):
    rows = [
        _row(corpus_dir, "LJT001-0001"),
        _row(corpus_dir, "LJT900-0006"),
        _row(corpus_dir, "LJT900-0003"),
        _row(corpus_dir, "LJT001-0002", text=" "),
        dict(_row(corpus_dir, "nope"), audio=str(corpus_dir / "x.wav")),
    ]
    with beam_pipeline() as p:
        out = p | beam.Create([[ref] for ref in write_rows(str(tmp_path), [rows])]) | MeasureClips(CFG, str(tmp_path))

        def check(batches):
            ((c,),) = [b["clips"] for b in batches]
            assert c["text"] == "hello there." and c["text_len"] == len("hello there.")
            assert c["mel_frames"] == 1 + c["num_samples"] // CFG.mel.hop_length
            assert c["duration_ms"] == round(1000 * c["num_samples"] / 22050)

        assert_that(out.clips, check, label="clips")
        assert_that(
            out["rejected"] | beam.Map(lambda r: (r["id"], r["reason"])),
            equal_to(
                [
                    ("LJT900-0006", "silent_audio"),
                    ("LJT900-0003", "unreadable_audio"),
                    ("LJT001-0002", "empty_text"),
                    ("nope", "missing_audio"),
                ]
            ),
            label="rejected",
        )


def _clip(clip_id, text_len, mel_frames, duration_ms, speaker="s", language="en"):
    return {
        "id": clip_id,
        "text": "a" * text_len,
        "text_len": text_len,
        "mel_frames": mel_frames,
        "duration_ms": duration_ms,
        "speaker": speaker,
        "language": language,
    }


def _tables(clips, cfg=CFG):
    """The corpus tables of `clips`, as the job computes them (`melshards.preprocess.stats.tables`)."""
    rows: dict = {}
    for item in summarize_clips(clips, cfg.split.salt).items():
        rows.update(finish_part(item, cfg))
    return finish_tables(rows, cfg)


def test_length_histograms_are_exact_counts():
    clips = [_clip("a", 5, 100, 1000), _clip("b", 5, 120, 1300), _clip("c", 7, 100, 1000)]
    with beam_pipeline() as p:
        out = p | beam.Create([{"clips": clips[:2]}, {"clips": []}, {"clips": clips[2:]}]) | LengthHistograms()
        assert_that(
            out,
            equal_to([{"text_len": {5: 2, 7: 1}, "mel_frames": {100: 2, 120: 1}, "duration_ms": {1000: 2, 1300: 1}}]),
        )


def test_filter_drops_clips_outside_cutoffs_with_the_reason():
    cut = Cutoffs(500, 50, 200, 40, 200, 40)
    clips = [
        _clip("ok", 40, 200, 2000),
        _clip("short", 5, 60, 400),
        _clip("long", 5, 201, 3000),
        _clip("wordy", 41, 100, 2000),
        _clip("tiny", 5, 49, 600),
    ]
    tables = _tables(clips)
    out = [(c["id"], (filter_rejection(c, cut, tables) or {}).get("reason")) for c in clips]
    assert out == [
        ("ok", None),
        ("short", "too_short"),
        ("long", "mel_frames_above_cutoff"),
        ("wordy", "text_len_above_cutoff"),
        ("tiny", "mel_frames_below_cutoff"),
    ]
    assert filter_rejection(clips[2], cut, tables)["detail"] == (
        "text_len=5 mel_frames=201 duration_ms=3000; kept: duration_ms>=500, 50<=mel_frames<=200, text_len<=40 (en)"
    )


def test_text_length_is_cut_per_language():
    cut = Cutoffs(0, 1, 200, 40, 200, 40, {"de": 40, "zh-CN": 12})
    clips = [
        _clip("de", 30, 100, 1000, language="de"),
        _clip("zh", 30, 100, 1000, language="zh-CN"),
        _clip("zh-ok", 12, 100, 1000, language="zh-CN"),
    ]
    tables = _tables(clips)
    assert [(filter_rejection(c, cut, tables) or {}).get("reason") for c in clips] == [
        None,
        "text_len_above_cutoff",
        None,
    ]


def test_speakers_with_too_few_clips_are_dropped_with_their_reason():
    cfg = PreprocessConfig(filter=dataclasses.replace(CFG.filter, min_speaker_clips=2))
    clips = [_clip("a1", 5, 100, 1000, "a"), _clip("a2", 5, 100, 1000, "a"), _clip("b1", 5, 100, 1000, "b")]
    tables = _tables(clips, cfg)
    cut = Cutoffs(0, 1, 200, 40, 200, 40)
    assert [(c["id"], (filter_rejection(c, cut, tables) or {}).get("reason")) for c in clips] == [
        ("a1", None),
        ("a2", None),
        ("b1", "speaker_too_few_clips"),
    ]
    assert filter_rejection(clips[2], cut, tables)["detail"] == (
        "speaker 'b' has 1 measured clip(s), fewer than filter.min_speaker_clips 2"
    )
    assert list(tables["speakers"]) == ["a"] and tables["dropped_speakers"] == {"b": 1}


def test_clip_decoded_once_at_measure_reaches_its_record_with_the_same_mel(corpus_dir, tmp_path, monkeypatch):
    """Measure -> temp files -> FilterAndWrite: each clip is decoded once; the record holds the mel
    Measure computed; filtered clips are rejected with their reason; moments count training
    frames only; the measured batch is one file per batch."""
    import tensorflow as tf

    from melshards.preprocess.clip import audio
    from melshards.preprocess.clip.clips import featurize
    from melshards.preprocess.write.report import build_schema
    from melshards.shards_schema.records import decode_parsed, parse_spec
    from melshards.shards_schema.stats import Moments

    decodes = []
    real_decode = audio.decode_audio
    monkeypatch.setattr(audio, "decode_audio", lambda *a: decodes.append(1) or real_decode(*a))
    ids = ["LJT001-0001", "LJT001-0002", "LJT001-0004"]
    featurized = {i: featurize(_row(corpus_dir, i), CFG) for i in ids}
    clips = {i: c for i, (c, _) in featurized.items()}
    expected = {i: f["mel"] for i, (_, f) in featurized.items()}
    tables = _tables(list(clips.values()))
    splits = {"LJT001-0001": "train", "LJT001-0002": "val", "LJT001-0004": "train"}
    frames = {i: m.shape[0] for i, m in expected.items()}
    longest = max(frames, key=frames.get)
    monkeypatch.setattr("melshards.preprocess.stats.tables.split_of", lambda clip, *_: splits[clip["id"]])
    decodes.clear()
    cut = Cutoffs(0, 1, frames[longest] - 1, 1000, frames[longest] - 1, 1000)  # the longest clip is filtered
    buckets = {"bounds": (1000,), "plan": None, "raised_last_bound": None}
    text = {0: {200: 1}}
    with beam_pipeline() as p:
        rows = write_rows(str(tmp_path), [[_row(corpus_dir, i) for i in ids]])
        measured = p | beam.Create([[ref] for ref in rows]) | MeasureClips(CFG, str(tmp_path))
        plan = {"buckets": buckets, "text": text}
        written = measured["batches"] | FilterAndWrite(
            p | "C" >> beam.Create([cut]),
            p | "P" >> beam.Create([plan]),
            p | "T" >> beam.Create([tables]),
            p | "G" >> beam.Create([None]),
            str(tmp_path),
            CFG,
        )
        assert_that(
            written["rejected"] | beam.Map(lambda r: (r["id"], r["reason"])),
            equal_to([(longest, "mel_frames_above_cutoff")]),
            label="rejected",
        )
        kept_train = [i for i in ids if i != longest and splits[i] == "train"]
        n = sum(frames[i] for i in kept_train)
        assert_that(written["moments"] | beam.Map(lambda m: m.n), equal_to([n]), label="moments")
        assert_that(
            written["parts"] | beam.Map(lambda f: (f["split"], f["records"])),
            equal_to(sorted((splits[i], 1) for i in ids if i != longest)),
            label="parts",
        )
    assert len(decodes) == len(ids)  # once per clip (the in-process runner shares this module)
    assert len(list(tmp_path.glob("features-*.npz"))) == len(list(tmp_path.glob("clips-*.pkl"))) == 1  # one batch
    shapes = build_schema(CFG, buckets, text, Moments.empty(80), [], tables, {}).buckets[0]
    files = [str(f) for f in tmp_path.rglob("*.tfrecord")]
    recs = {}
    for data in tf.data.TFRecordDataset(files):
        rec = decode_parsed(shapes, tf.io.parse_example([data], parse_spec(shapes)), 1)
        recs[rec["id"][0].numpy().decode()] = rec
    assert sorted(recs) == sorted(i for i in ids if i != longest)
    for clip_id, rec in recs.items():
        m = frames[clip_id]
        np.testing.assert_array_equal(rec["mel"][0, :m].numpy(), expected[clip_id].astype(np.float16))


def test_measured_clips_wait_for_the_cutoffs_in_temp_files_not_in_the_runner(corpus_dir, tmp_path):
    """What crosses the statistics barrier in the runner is a reference per batch: two paths and a
    count, whatever the clips carry; the clips (with their moments) and arrays are read back from it."""
    ids = ["LJT001-0001", "LJT001-0002"]

    def check(refs):
        assert sorted((sorted(r), r["count"]) for r in refs) == [
            (["clips", "count", "features"], 0),
            (["clips", "count", "features"], 2),
        ]
        (ref,) = [r for r in refs if r["count"]]
        clips, arrays = read_clips(ref), read_features(ref)
        assert [c["id"] for c in clips] == ids
        assert (
            [c["moments"].n for c in clips] == [a["mel"].shape[0] for a in arrays] == [c["mel_frames"] for c in clips]
        )
        (empty,) = [r for r in refs if not r["count"]]
        assert empty["clips"] is None and read_clips(empty) == [] and read_features(empty) == []

    with beam_pipeline() as p:
        batches = list(write_rows(str(tmp_path), [[_row(corpus_dir, i) for i in ids], []]))
        out = p | beam.Create([[ref] for ref in batches]) | MeasureClips(CFG, str(tmp_path))
        assert_that(out["batches"], check)


def test_a_batch_whose_arrays_are_all_in_the_feature_cache_writes_no_features_file(tmp_path):
    ref = write_measured(str(tmp_path), [{"id": "a"}, {"id": "b"}], [{}, {}])
    assert ref["features"] is None and read_features(ref) == [{}, {}]
    assert [p.name.split("-")[0] for p in tmp_path.iterdir()] == ["clips"]


def test_choose_buckets_plans_from_the_kept_clips_of_every_batch(monkeypatch, tmp_path):
    cut = Cutoffs(0, 10, 200, 50, 200, 50)  # keeps 10..200 frames and text <= 50

    def clip(clip_id, text_len, frames, split="train"):
        return dict(_clip(clip_id, text_len, frames, 1000), split=split)

    batches = [
        {"clips": [clip("a", 10, 100), clip("b", 30, 104), clip("dropped", 60, 100)]},
        {"clips": []},
        {"clips": [clip("c", 20, 200), clip("v", 40, 150, "val"), clip("short", 5, 9)]},
    ]
    cfg = PreprocessConfig(pad=PadConfig(buckets=2, min_bucket_records=1))
    tables = _tables([c for b in batches for c in b["clips"]])
    monkeypatch.setattr("melshards.preprocess.stats.tables.split_of", lambda clip, *_: clip["split"])
    measured = [write_measured(str(tmp_path), b["clips"], [{} for _ in b["clips"]]) for b in batches]
    with beam_pipeline() as p:
        plan = (p | beam.Create(measured)) | ChooseBuckets(
            p | "Cut" >> beam.Create([cut]),
            p | "Tables" >> beam.Create([tables]),
            p | "Gate" >> beam.Create([None]),
            cfg,
        )

        def check(plans):
            (got,) = plans
            assert got["buckets"]["bounds"] == (104, 200)
            assert got["text"] == {0: {10: 1, 30: 1}, 1: {20: 1, 40: 1}}  # val clips count for text too
            assert got["train_hist"] == {100: 1, 104: 1, 200: 1}
            assert got["after"]["mel_frames"] == {100: 1, 104: 1, 200: 1, 150: 1}

        assert_that(plan, check)


def test_val_clips_are_drawn_within_each_speaker_and_stable():
    cfg = PreprocessConfig(split=dataclasses.replace(CFG.split, val_fraction=0.1))
    sizes = {"big": 200, "mid": 25, "ten": 5, "few": 4}
    clips = [_clip(f"{s}{i}", 5, 100, 1000, s) for s, n in sizes.items() for i in range(n)]
    tables = _tables(clips, cfg)
    val = {s: sum(split_of(c, tables, cfg.split.salt) == "val" for c in clips if c["speaker"] == s) for s in sizes}
    assert val == {"big": 20, "mid": 3, "ten": 1, "few": 0}  # round(0.1 * n), halves up: 2.5 -> 3, 0.5 -> 1
    again = _tables(list(reversed(clips)), cfg)  # another order of the same clips: the same split
    assert [split_of(c, again, cfg.split.salt) for c in clips] == [split_of(c, tables, cfg.split.salt) for c in clips]
    more = _tables(clips + [_clip("big-new", 5, 100, 1000, "big")], cfg)  # one clip more: the others barely move
    moved = sum(split_of(c, more, cfg.split.salt) != split_of(c, tables, cfg.split.salt) for c in clips)
    assert moved <= 1


def test_val_speakers_are_held_out_whole():
    cfg = PreprocessConfig(split=dataclasses.replace(CFG.split, val_speakers=("mid", "nobody")))
    clips = [_clip(f"{s}{i}", 5, 100, 1000, s) for s, n in (("big", 40), ("mid", 6)) for i in range(n)]
    tables = _tables(clips, cfg)
    assert all(split_of(c, tables, cfg.split.salt) == "val" for c in clips if c["speaker"] == "mid")
    assert sum(split_of(c, tables, cfg.split.salt) == "val" for c in clips if c["speaker"] == "big") == 2
    assert tables["missing_val_speakers"] == ["nobody"]


def test_tables_give_ids_in_name_order_and_the_corpus_vocabulary():
    from melshards.shards_schema.vocab import EOS, PAD

    clips = [
        dict(_clip("1", 3, 100, 1000, "zoe", "de"), text="schön", gender="F"),
        dict(_clip("2", 3, 100, 1000, "adam", "zh-CN"), text="妈马"),
        _clip("3", 3, 100, 1000, "adam", "de"),
    ]
    tables = _tables(clips)
    assert {n: (s["id"], s["gender"], s["measured"]) for n, s in tables["speakers"].items()} == {
        "adam": (0, "", 2),
        "zoe": (1, "F", 1),
    }
    assert {c: x["id"] for c, x in tables["languages"].items()} == {"de": 0, "zh-CN": 1}
    assert tables["vocabulary"] == [PAD, EOS, "a", "c", "h", "n", "s", "ö", "妈", "马"]
    assert tables["language_lengths"]["de"]["text_len"] == {3: 2}


def test_tables_are_summed_per_speaker_and_the_run_wide_sum_holds_a_row_per_speaker_not_its_clips():
    # a speaker's split hashes (8 bytes a clip) go no further than the worker its key lands on: what the
    # one worker summing the run's tables holds is a row per speaker, the same size for 1 clip and 300
    cfg = PreprocessConfig(split=dataclasses.replace(CFG.split, val_fraction=0.1, val_speakers=("mid",)))
    sizes = {"big": 300, "mid": 6, "one": 1}
    clips = [
        _clip(f"{s}{i}", 3 + i % 4, 100 + i % 9, 1000, s, ("de", "en")[i % 2])
        for s, n in sizes.items()
        for i in range(n)
    ]
    rows: dict = {}
    for item in summarize_clips(clips, cfg.split.salt).items():
        rows.update(finish_part(item, cfg))
    assert {key[1]: row["measured"] for key, row in rows.items() if key[0] == "speaker"} == sizes
    assert all(
        set(row) == {"measured", "gender", "languages", "val_below"} for k, row in rows.items() if k[0] == "speaker"
    )
    assert len(pickle.dumps(rows[("speaker", "big")])) - len(pickle.dumps(rows[("speaker", "one")])) < 16
    with beam_pipeline() as p:
        batches = [{"clips": clips[i : i + 32]} for i in range(0, len(clips), 32)] + [{"clips": []}]
        out = p | beam.Create(batches) | CorpusTables(cfg)
        assert_that(out, equal_to([_tables(clips, cfg)]))


def test_mel_statistics_merge_the_batches_moments_exactly():
    from melshards.shards_schema.stats import Moments

    a = Moments.of(np.array([[0.0, 2.0], [2.0, 2.0]], np.float32))
    b = Moments.of(np.array([[4.0, 2.0]], np.float32))
    with beam_pipeline() as p:
        out = p | beam.Create([a, Moments.empty(2), b]) | MelStatistics(2)
        assert_that(
            out | beam.Map(lambda m: (m.n, m.mean.tolist(), m.std().round(6).tolist())),
            equal_to([(3, [2.0, 2.0], [round(float(np.sqrt(8 / 3)), 6), 0.0])]),
        )


def test_encode_clip_pads_each_clip_to_its_buckets_shapes(corpus_dir):
    import tensorflow as tf

    from melshards.preprocess.clip.clips import featurize
    from melshards.preprocess.write.report import build_schema
    from melshards.shards_schema import Vocabulary
    from melshards.shards_schema.records import decode_parsed, parse_spec
    from melshards.shards_schema.stats import Moments

    clip, features = featurize(_row(corpus_dir, "LJT001-0001"), CFG)
    clip = dict(clip, split="train")
    tables = _tables([clip])
    buckets = {"bounds": (8, 400, 800), "plan": None, "raised_last_bound": None}
    text = {1: {clip["text_len"]: 1, 75: 1}}  # bucket 1's text lengths: padded to 80
    vocab = Vocabulary(tables["vocabulary"])
    split, bucket, data = encode_clip(
        clip, {"mel": features["mel"].astype(np.float16)}, buckets, text, tables, vocab, CFG
    )
    assert (split, bucket) == ("train", 1)
    schema = build_schema(CFG, buckets, text, Moments.empty(80), [], tables, {})
    assert [(b.max_mel_frames, b.max_text_len) for b in schema.buckets] == [(8, 8), (400, 80), (800, 8)]
    shapes = schema.buckets[bucket]
    rec = decode_parsed(shapes, tf.io.parse_example([data], parse_spec(shapes)), 1)
    n = features["mel"].shape[0]
    assert rec["mel"].shape == (1, 400, 80) and rec["text_ids"].shape == (1, 80) and int(rec["mel_len"][0]) == n
    np.testing.assert_allclose(rec["mel"][0, :n].numpy(), features["mel"], atol=1e-2 * np.abs(features["mel"]).max())
    assert np.all(rec["mel"][0, n:].numpy() == np.float16(np.log(1e-5)))
    assert rec["text_ids"][0, clip["text_len"] :].numpy().sum() == 0
    assert vocab.decode(rec["text_ids"][0].numpy().tolist()) == clip["text"] == "hello there."
    assert (int(rec["speaker_id"][0]), rec["language"][0].numpy(), int(rec["language_id"][0])) == (0, b"en", 0)


def test_rolling_files_and_assembly_give_shards_of_the_target_size(tmp_path):
    def record(i):  # records differ, as a run's do (each holds its clip's id)
        return str(i).encode().ljust(1000, b"\0")

    records = (
        [("train", 0, record(i)) for i in range(30)]
        + [("val", 0, record(30))]
        + [("train", 2, record(31 + i)) for i in range(3)]
    )
    files = RollingFiles(str(tmp_path), 10_000)
    parts = [part for r in records for part in files.write(*r)] + files.close_all()
    assert sorted(p["records"] for p in parts) == [1, 3, 10, 10, 10]  # a file rolls once it holds >= 10 kB
    with beam_pipeline() as p:
        out = p | beam.Create(parts) | AssembleShards(str(tmp_path), target_shard_mb=0.01)
        assert_that(
            out | beam.Map(lambda s: (s["split"], s["bucket"], s["records"])),
            equal_to([("train", 0, 10), ("train", 0, 10), ("train", 0, 10), ("val", 0, 1), ("train", 2, 3)]),
        )
    written = sorted(f.name for f in tmp_path.glob("*.tfrecord"))
    assert written == [
        "train-b00-00000-of-00003.tfrecord",
        "train-b00-00001-of-00003.tfrecord",
        "train-b00-00002-of-00003.tfrecord",
        "train-b02-00000-of-00001.tfrecord",
        "val-b00-00000-of-00001.tfrecord",
    ]
    import tensorflow as tf

    assert sum(1 for _ in tf.data.TFRecordDataset([str(tmp_path / w) for w in written])) == 34
    bucket2 = tf.data.TFRecordDataset(str(tmp_path / "train-b02-00000-of-00001.tfrecord"))
    assert sum(1 for _ in bucket2) == 3  # a bucket's shards hold its records only


def test_plan_packs_small_parts_and_keeps_full_ones_whole():
    parts = [
        {"split": "train", "bucket": 0, "path": f"t{i}", "records": r, "bytes": b}
        for i, (r, b) in enumerate([(10, 100), (3, 30), (9, 95), (2, 20), (1, 5)])
    ]
    parts.append({"split": "val", "bucket": 0, "path": "v", "records": 1, "bytes": 10})
    parts.append({"split": "train", "bucket": 1, "path": "u", "records": 1, "bytes": 10})
    plan = group_into_shards(parts, target_bytes=100)
    assert [(s["file"], s["parts"], s["records"]) for s in plan] == [
        ("train-b00-00000-of-00003.tfrecord", ["t0"], 10),
        ("train-b00-00001-of-00003.tfrecord", ["t2", "t4"], 10),
        ("train-b00-00002-of-00003.tfrecord", ["t1", "t3"], 5),
        ("train-b01-00000-of-00001.tfrecord", ["u"], 1),  # buckets never share a shard
        ("val-b00-00000-of-00001.tfrecord", ["v"], 1),
    ]


def test_concatenated_parts_read_as_one_tfrecord_file(tmp_path):
    import tensorflow as tf

    for i in range(2):
        with tf.io.TFRecordWriter(str(tmp_path / f"part{i}")) as w:
            for j in range(3):
                w.write(f"{i}-{j}".encode())
    with beam_pipeline() as p:
        plan = [
            {
                "split": "train",
                "bucket": 0,
                "file": "train-b00-00000-of-00001.tfrecord",
                "records": 6,
                "bytes": 0,
                "parts": [str(tmp_path / "part0"), str(tmp_path / "part1")],
            }
        ]
        from melshards.preprocess.out_dir.shards import _AssembleShard

        p | beam.Create(plan) | beam.ParDo(_AssembleShard(str(tmp_path)))
    got = [r.numpy().decode() for r in tf.data.TFRecordDataset(str(tmp_path / "train-b00-00000-of-00001.tfrecord"))]
    assert got == ["0-0", "0-1", "0-2", "1-0", "1-1", "1-2"]
    assert not (tmp_path / "part0").exists() and not (tmp_path / "part1").exists()


def test_remove_temp_dir_deletes_leftover_parts(tmp_path):
    from melshards.preprocess.out_dir.shards import TEMP_DIR, remove_temp_dir

    (tmp_path / TEMP_DIR).mkdir()
    (tmp_path / TEMP_DIR / "train-abc.tfrecord").write_bytes(b"x")
    remove_temp_dir(str(tmp_path))
    assert not (tmp_path / TEMP_DIR).exists()
    remove_temp_dir(str(tmp_path))  # nothing there: a no-op


def _plan_with_parts(tmp_path):
    """Two shards: one concatenated from two parts, one renamed from a single part."""
    from melshards.preprocess.out_dir.shards import TEMP_DIR
    from melshards.shards_schema.records import frame_record

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
        plan.append(
            {
                "split": file[: file.index("-")],
                "bucket": 0,
                "file": file,
                "parts": parts,
                "records": 3 * n_parts,
                "bytes": len(whole),
            }
        )
    return plan, expected


def _assemble(tmp_path, plan):
    from melshards.preprocess.out_dir.shards import _AssembleShard

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
def test_assembly_retried_after_a_crash_between_concatenation_and_deletion(tmp_path, monkeypatch, deleted_before_crash):
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
    from melshards.preprocess.inputs.layouts import parse_ljspeech_line

    with pytest.raises(ValueError, match=r"\|-separated fields, expected at most 3"):
        parse_ljspeech_line(line, 0)


def test_ljspeech_line_with_two_or_three_fields_is_a_row():
    from melshards.preprocess.inputs.layouts import parse_ljspeech_line

    assert parse_ljspeech_line("a|Hello.", 0)["text"] == "Hello."
    assert parse_ljspeech_line("a|Dr. Who|Doctor Who", 0)["text"] == "Doctor Who"


def _counters(result) -> dict:
    from apache_beam.metrics.metric import MetricsFilter

    return {
        c.key.metric.name: c.committed
        for c in result.metrics().query(MetricsFilter().with_namespace("melshards"))["counters"]
    }


def _read_and_dedupe(tmp_path, lines):
    (tmp_path / "wavs").mkdir()
    (tmp_path / "metadata.csv").write_text("\n".join(lines) + "\n")
    p = beam_pipeline()
    read = p | ReadCorpus(detect_corpus(str(tmp_path)), str(tmp_path / "temp"))
    return p, _flat(read["batches"]), read["rejected"]


def test_rows_with_extra_fields_are_rejected_as_malformed_not_read(tmp_path):
    p, rows, rejected = _read_and_dedupe(tmp_path, ["a|Hello there.|Hello there.", *EXTRA_FIELD_ROWS])
    assert_that(rows | beam.Map(lambda r: (r["id"], r["text"])), equal_to([("a", "Hello there.")]), label="rows")
    assert_that(
        rejected | beam.Map(lambda r: (r["id"], r["reason"])),
        equal_to([("row-2", "malformed_row"), ("row-3", "malformed_row")]),
        label="rejected",
    )
    p.run().wait_until_finish()


def test_malformed_rows_and_duplicate_ids_have_counters(tmp_path):
    p, _, rejected = _read_and_dedupe(tmp_path, ["a|Hello.|Hello.", "lonely", "a|Again.|Again.", "", "b|Bye.|"])
    assert_that(
        rejected | beam.Map(lambda r: (r["id"], r["reason"])),
        equal_to([("row-2", "malformed_row"), ("a", "duplicate_id")]),
    )
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
    with beam_pipeline() as p:
        out = p | ReadCorpus(detect_corpus(str(tmp_path)), str(tmp_path / "temp"))
        assert_that(
            _flat(out["batches"]) | beam.Map(lambda r: (r["id"], r["audio"].rsplit(".", 1)[1])),
            equal_to([("m", "mp3"), ("o", "ogg"), ("f", "flac")]),
        )


@pytest.mark.parametrize(
    "name,content,problem",
    [
        ("metadata.csv", "", "holds no rows"),
        ("metadata.csv", "\n  \n", "holds no rows"),
        ("m.csv", "", "holds no rows"),
        ("m.csv", "path,transcript\na.wav,Hi\n", "missing audio, text"),
        ("m.tsv", "\naudio\ttext\n", None),  # blank lines before the header
        ("m.tsv", "audio,text\na.wav,Hi\n", "missing audio, text"),  # commas are not the TSV separator
        ("m.jsonl", '{"audio": "a.wav", "txt": "Hi"}\n', "missing text"),
        ("m.jsonl", 'not json\n{"audio": "a.wav", "text": "Hi"}\n', None),  # a malformed row, not a header
    ],
)
def test_rows_file_check_reads_the_first_line(tmp_path, name, content, problem):
    from melshards.preprocess.inputs.read_stage import CorpusError, check_rows_file

    (tmp_path / name).write_text(content)
    corpus = detect_corpus(str(tmp_path / name) if name != "metadata.csv" else str(tmp_path), language="en")
    if problem is None:
        check_rows_file(corpus)
    else:
        with pytest.raises(CorpusError, match=problem):
            check_rows_file(corpus)


# -- rows that would be read silently wrong ------------------------------------------------------
def test_audio_files_of_an_id_are_listed_in_extension_order_local_or_gcs():
    from melshards.preprocess.inputs.layouts import audio_files

    listing = [
        "gs://b/lj/wavs/c1.wav",
        "gs://b/lj/wavs/c1.flac",
        "gs://b/lj/wavs/c2.ogg",
        "gs://b/lj/wavs/c2.MP3",
        "gs://b/lj/wavs/c3.flac",
        "gs://b/lj/wavs/notes.txt",
        "/d/wavs/c4.mp3",
        "/d/wavs/c4.WAV",
    ]
    with WorkingSet() as working_set:
        by_id = dict(working_set.lists(audio_files(listing)))
    assert by_id == {
        "c1": ["gs://b/lj/wavs/c1.wav", "gs://b/lj/wavs/c1.flac"],
        "c2": ["gs://b/lj/wavs/c2.ogg", "gs://b/lj/wavs/c2.MP3"],
        "c3": ["gs://b/lj/wavs/c3.flac"],
        "c4": ["/d/wavs/c4.WAV", "/d/wavs/c4.mp3"],
    }


def test_an_id_with_two_audio_files_is_rejected_naming_both_not_guessed():
    from melshards.preprocess.inputs.layouts import attach_audio

    files = {"c1": ["gs://b/wavs/c1.wav", "gs://b/wavs/c1.flac"], "c2": ["gs://b/wavs/c2.flac"]}
    rows = [{"id": i, "audio": None, "row": n} for n, i in enumerate(["c1", "c2", "c3"])]
    read = LayoutRows.of(attach_audio(rows, files))
    kept, rejected = read.rows, read.rejected
    assert kept == [{"id": "c2", "audio": "gs://b/wavs/c2.flac", "row": 1}, {"id": "c3", "audio": None, "row": 2}]
    assert rejected == [
        {
            "id": "c1",
            "reason": "ambiguous_audio",
            "detail": "2 audio files for this id: gs://b/wavs/c1.wav, gs://b/wavs/c1.flac; keep one",
        }
    ]


def test_read_corpus_rejects_an_ljspeech_id_with_a_wav_and_a_flac_and_counts_it(tmp_path):
    (tmp_path / "wavs").mkdir()
    for name in ("c1.wav", "c1.flac", "c2.flac"):
        (tmp_path / "wavs" / name).write_bytes(b"")  # the read stage lists files, it does not open them
    (tmp_path / "metadata.csv").write_text("c1|The speech of the wav.|\nc2|Only a flac.|\nc1|Again.|\n")
    p = beam_pipeline()
    out = p | ReadCorpus(detect_corpus(str(tmp_path)), str(tmp_path / "temp"))
    assert_that(
        _flat(out["batches"]) | beam.Map(lambda r: (r["id"], r["audio"])),
        equal_to([("c2", str(tmp_path / "wavs" / "c2.flac"))]),
        label="rows",
    )
    assert_that(
        out["rejected"] | beam.Map(lambda r: (r["id"], r["reason"], r["detail"])),
        equal_to(
            [
                (
                    "c1",
                    "ambiguous_audio",
                    f"2 audio files for this id: {tmp_path / 'wavs' / 'c1.wav'}, {tmp_path / 'wavs' / 'c1.flac'}; keep one",
                ),
                ("c1", "duplicate_id", "row 3 repeats the id of row 1"),
            ]
        ),
        label="rejected",
    )
    result = p.run()
    result.wait_until_finish()
    counters = _counters(result)
    assert (counters["input_rows"], counters["ambiguous_audio"], counters["duplicate_id"]) == (3, 1, 1)


def test_a_manifest_names_its_audio_file_so_a_second_file_beside_it_is_no_ambiguity(tmp_path):
    (tmp_path / "wavs").mkdir()
    for name in ("c1.wav", "c1.flac"):
        (tmp_path / "wavs" / name).write_bytes(b"")
    (tmp_path / "m.csv").write_text("audio,text\nwavs/c1.wav,The speech of the wav.\n")
    with beam_pipeline() as p:
        out = p | ReadCorpus(detect_corpus(str(tmp_path / "m.csv"), language="en"), str(tmp_path / "temp"))
        assert_that(
            _flat(out["batches"]) | beam.Map(lambda r: (r["id"], r["audio"])),
            equal_to([("c1", str(tmp_path / "wavs" / "c1.wav"))]),
            label="rows",
        )
        assert_that(out["rejected"], equal_to([]), label="rejected")


@pytest.mark.parametrize(
    "name,content",
    [
        ("m.csv", "audio,text\na.wav,Hello.\nb.wav\n"),
        ("m.csv", "audio,text,speaker\na.wav,Hello.,s1\nb.wav,Bye.\n"),  # short by its optional column too
        ("m.tsv", "audio\ttext\na.wav\tHello.\nb.wav\n"),
        ("m.jsonl", '{"audio": "a.wav", "text": "Hello."}\n{"audio": "b.wav"}\n'),
    ],
)
def test_a_manifest_row_with_too_few_columns_is_malformed_not_empty_text(tmp_path, name, content):
    from melshards.preprocess.inputs.manifests import parse_manifest

    (tmp_path / name).write_text(content)
    (i, first), (j, second) = parse_manifest(content.splitlines(keepends=True), str(tmp_path / name), str(tmp_path))
    assert (i, first["id"], first["text"], j) == (0, "a", "Hello.", 1)
    assert isinstance(second, ValueError) and str(second).startswith("row 2: ")
    with beam_pipeline() as p:
        out = p | ReadCorpus(detect_corpus(str(tmp_path / name), language="en"), str(tmp_path / "temp"))
        assert_that(_flat(out["batches"]) | beam.Map(lambda r: r["id"]), equal_to(["a"]), label="rows")
        assert_that(
            out["rejected"] | beam.Map(lambda r: (r["id"], r["reason"])),
            equal_to([("row-2", "malformed_row")]),
            label="rejected",
        )


def test_a_short_csv_row_is_named_with_the_header_it_falls_short_of():
    from melshards.preprocess.inputs.manifests import parse_manifest

    (_, _), (_, err) = parse_manifest(["audio,text,speaker\n", "a.wav,Hi,s\n", "b.wav,Hi\n"], "m.csv", ".")
    assert str(err) == "row 2: 2 fields, the header has 3 (audio, text, speaker); a missing separator?"


def test_a_csv_row_with_more_fields_than_the_header_is_malformed_not_cut_short():
    """An unquoted comma in the text: reading the first fields would silently drop the rest of it."""
    from melshards.preprocess.inputs.manifests import parse_manifest

    text = 'audio,text\na.wav,Hello, world.\nb.wav,"Hi, there."\nc.wav,Bye.,\n'
    rows = list(parse_manifest(text.splitlines(keepends=True), "m.csv", "."))
    (_, first), (_, quoted), (_, trailing) = rows
    assert str(first) == "row 1: 3 fields, the header has 2 (audio, text); quote a field that holds the separator"
    assert quoted["text"] == "Hi, there." and trailing["text"] == "Bye."  # an empty extra field loses nothing


def test_measure_clips_rejects_constant_dc_as_silent_and_nan_as_invalid_samples(corpus_dir, tmp_path):
    import soundfile as sf

    from tests.preprocess.conftest import tone

    nan = tone(1.0)
    nan[300] = np.nan
    sf.write(tmp_path / "nan.wav", nan, 22050, subtype="FLOAT")
    sf.write(tmp_path / "dc.wav", np.full(2 * 22050, 0.3, np.float32), 22050, subtype="PCM_16")
    rows = [
        _row(corpus_dir, "LJT001-0001"),
        dict(_row(corpus_dir, "nan"), audio=str(tmp_path / "nan.wav")),
        dict(_row(corpus_dir, "dc"), audio=str(tmp_path / "dc.wav")),
    ]
    with beam_pipeline() as p:
        out = p | beam.Create([[ref] for ref in write_rows(str(tmp_path), [rows])]) | MeasureClips(CFG, str(tmp_path))
        assert_that(
            out.clips | beam.FlatMap(lambda b: [c["id"] for c in b["clips"]]), equal_to(["LJT001-0001"]), label="clips"
        )
        assert_that(
            out["rejected"] | beam.Map(lambda r: (r["id"], r["reason"])),
            equal_to([("nan", "invalid_samples"), ("dc", "silent_audio")]),
            label="rejected",
        )


def test_the_jobs_writers_make_no_directory_in_a_staging_dir_a_removed_one_stays_removed(tmp_path):
    removed = tmp_path / "o" / ".melshards-run-x" / ".melshards-tmp"
    with pytest.raises(FileNotFoundError):
        list(write_rows(str(removed), [[{"id": "a"}]]))
    with pytest.raises(FileNotFoundError):
        RollingFiles(str(removed.parent), 1000).write("train", 0, b"record")
    assert not (tmp_path / "o").exists()


def test_rejected_rows_are_counted_by_a_combiner_and_written_in_sorted_shards_merged_into_one_sorted_file(tmp_path):
    """No worker holds every rejected row: each shard holds about `rows_per_shard` of them, sorted, and
    rejected.jsonl is their merge, in the order it always had (id, reason, detail)."""
    from melshards.preprocess.out_dir.shards import TEMP_DIR
    from melshards.preprocess.write.report import (
        WriteRejected,
        rejected_line,
        rejected_order,
        rejected_shard_count,
        rejected_shard_of,
        write_merged,
    )

    (tmp_path / TEMP_DIR).mkdir()
    rows = [
        {"id": f"r{i % 97:03d}", "reason": ("missing_audio", "too_short")[i % 2], "detail": f"d{i % 5}"}
        for i in range(500)
    ]
    with beam_pipeline() as p:
        out = p | beam.Create(rows) | WriteRejected(str(tmp_path), rows_per_shard=40)
        assert_that(out["reasons"], equal_to([("missing_audio", 250), ("too_short", 250)]), label="reasons")
        used = {rejected_shard_of(r, rejected_shard_count(len(rows), 40)) for r in rows}
        assert_that(
            out["shards"] | beam.Map(os.path.basename),
            equal_to([f"rejected-{i:05d}.jsonl" for i in used]),
            label="shards",
        )
    shards = sorted(str(p) for p in (tmp_path / TEMP_DIR).glob("rejected-*.jsonl"))
    assert len(shards) > 1
    held = [[json.loads(line) for line in open(s)] for s in shards]
    assert max(map(len, held)) < 250 and all(h == sorted(h, key=rejected_order) for h in held)
    write_merged(str(tmp_path), "rejected.jsonl", shards)
    assert (tmp_path / "rejected.jsonl").read_text() == "".join(map(rejected_line, sorted(rows, key=rejected_order)))


def test_no_rejected_row_gives_no_count_and_an_empty_rejected_jsonl(tmp_path):
    from melshards.preprocess.out_dir.shards import TEMP_DIR
    from melshards.preprocess.write.report import WriteRejected, write_merged

    (tmp_path / TEMP_DIR).mkdir()
    with beam_pipeline() as p:
        out = p | beam.Create([]) | WriteRejected(str(tmp_path))
        assert_that(out["reasons"], equal_to([]), label="reasons")
        assert_that(out["shards"], equal_to([]), label="shards")
    write_merged(str(tmp_path), "rejected.jsonl", [])
    assert (tmp_path / "rejected.jsonl").read_text() == ""
