"""Speakers and languages through the whole job: ids in the records, tables in schema.json and
stats.json, the per-speaker validation split, min_speaker_clips, per-language text cut-offs."""

import csv
import json

import pytest
import yaml

from melshards.commands.preprocess import run
from melshards.shards_schema import read_schema
from tests.conftest import QUALITY_RULES_OFF

GOOD = [f"LJT001-{i:04d}" for i in range(1, 31)]  # clips of the shipped corpus that measure fine


@pytest.fixture(scope="module")
def two_speaker_run(corpus_dir, tmp_path_factory):
    """A manifest over the shipped corpus's audio: speaker "anna" (en-US) and "bert" (en-GB) with
    14 clips each, "cleo" with 2 (below min_speaker_clips 3)."""
    tmp = tmp_path_factory.mktemp("speakers")
    texts = dict(
        line.split("|")[:2] for line in (corpus_dir / "metadata.csv").read_text().splitlines() if line.count("|") == 2
    )
    wavs = {p.stem: p for p in (corpus_dir / "wavs").iterdir()}
    rows = []
    for i, clip in enumerate(c for c in GOOD if c in wavs and texts.get(c, "").strip()):
        speaker, language = ("cleo", "en-US") if i < 2 else (("anna", "en-US") if i % 2 else ("bert", "en-GB"))
        rows.append(
            {"audio": str(wavs[clip]), "text": texts[clip], "id": clip, "speaker": speaker, "language": language}
        )
    manifest = tmp / "corpus.csv"
    with manifest.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cfg = tmp / "cfg.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "filter": {
                    "min_speaker_clips": 3,
                    "mel_frames_upper_percentile": 100.0,
                    "text_len_upper_percentile": 90.0,
                },
                "split": {"val_fraction": 0.2},
                "pad": {"buckets": 1},
                **QUALITY_RULES_OFF,
            }
        )
    )
    out = tmp / "out"
    assert run(["--input", str(manifest), "--output", str(out), "--config", str(cfg), "--workers", "1"]) == 0
    return rows, out


def _records(out):
    import tensorflow as tf

    schema = read_schema(str(out))
    from melshards.shards_schema.records import decode_parsed, parse_spec

    files = sorted(str(p) for p in out.glob("*.tfrecord"))
    recs = []
    for f in files:
        split = "val" if "/val-" in f else "train"
        for raw in tf.data.TFRecordDataset(f):
            rec = decode_parsed(schema, tf.io.parse_example([raw], parse_spec(schema)), 1)
            recs.append({k: v.numpy()[0] for k, v in rec.items()} | {"split": split})
    return schema, recs


def test_records_carry_ids_that_map_back_through_the_schemas_tables(two_speaker_run):
    rows, out = two_speaker_run
    schema, recs = _records(out)
    assert [(s.id, s.name) for s in schema.speakers] == [(0, "anna"), (1, "bert")]
    assert [(x.id, x.code, x.text_frontend["name"]) for x in schema.languages] == [
        (0, "en-GB", "english"),
        (1, "en-US", "english"),
    ]
    by_id = {r["id"]: r for r in rows}
    for rec in recs:
        row = by_id[rec["id"].decode()]
        assert schema.speakers[rec["speaker_id"]].name == rec["speaker"].decode() == row["speaker"]
        assert schema.languages[rec["language_id"]].code == rec["language"].decode() == row["language"]
        text = "".join(schema.vocabulary[i] for i in rec["text_ids"][: rec["text_len"]])
        assert text == rec["text"].decode()
    for s in schema.speakers:
        assert s.clips == sum(r["speaker"].decode() == s.name for r in recs)
        assert s.hours == pytest.approx(
            sum(r["mel_len"] for r in recs if r["speaker_id"] == s.id) * 256 / 22050 / 3600, rel=0.02
        )


def test_every_kept_speaker_has_validation_clips_and_the_counts_add_up(two_speaker_run):
    rows, out = two_speaker_run
    stats = json.loads((out / "stats.json").read_text())
    c = stats["counts"]
    assert c["input_rows"] == len(rows) == c["in_shards"] + c["filtered"] + c["rejected"]
    assert c["per_reason"]["speaker_too_few_clips"] == 2
    speakers = {s["name"]: s for s in stats["speakers"]}
    assert speakers["cleo"]["id"] is None and speakers["cleo"]["measured"] == 2
    for name in ("anna", "bert"):
        assert speakers[name]["per_split"]["val"] >= 2  # round(0.2 * 14) = 3, less any filtered
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rejected if r["reason"] == "speaker_too_few_clips") == sorted(
        r["id"] for r in rows if r["speaker"] == "cleo"
    )


def test_text_length_cut_offs_are_per_language(two_speaker_run):
    rows, out = two_speaker_run
    stats = json.loads((out / "stats.json").read_text())
    by_language = stats["cutoffs"]["max_text_len_by_language"]
    assert set(by_language) == {"en-GB", "en-US"}
    assert stats["cutoffs"]["max_text_len"] == max(by_language.values())
    for lang in stats["languages"]:
        assert lang["max_text_len"] == by_language[lang["code"]]
        assert lang["before_filter"]["text_len"]["percentiles"]["p90"] == by_language[lang["code"]]
    _, recs = _records(out)
    for rec in recs:
        assert rec["text_len"] <= by_language[rec["language"].decode()]
