"""`melshards inspect`: counts, a truncated shard, records of the wrong shape or length, --show."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from melshards.commands.inspect import inspect_command
from melshards.shards_schema import read_schema
from melshards.shards_schema.records import encode_example


def run_inspect(*args):
    return CliRunner().invoke(inspect_command, [str(a) for a in args])


@pytest.fixture
def copy_dir(shards_dir, tmp_path):
    """A writable copy of the demo run (the session's shards_dir is read-only)."""
    out = tmp_path / "shards"
    shutil.copytree(shards_dir, out)
    return out


def good_values(schema, clip_id: str = "ok-1", mel_len: int = 10, text_len: int = 3) -> dict:
    text_ids = np.zeros(schema.max_text_len, np.int32)
    text_ids[:3] = [15, 16, 17]
    return {
        "id": clip_id,
        "speaker": "ljspeech_tiny",
        "speaker_id": 0,
        "language": "en",
        "language_id": 0,
        "text": "abc",
        "text_ids": text_ids,
        "text_len": text_len,
        "mel": np.full((schema.max_mel_frames, schema.n_mels), -11.5, np.float32),
        "mel_len": mel_len,
    }


def write_records(path, records: list[bytes]) -> None:
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as w:
        for r in records:
            w.write(r)


def test_demo_shards_pass_and_are_counted_per_shard_and_split(shards_dir):
    result = run_inspect(f"{shards_dir}/*.tfrecord")
    assert result.exit_code == 0, result.output
    counts = json.loads((shards_dir / "schema.json").read_text())["counts"]
    assert f"({', '.join(f'{s} {n}' for s, n in counts.items())})" in result.output
    assert f"train-b00-00000-of-00001.tfrecord  train       {counts['train']}" in result.output
    assert "OK: every record parses" in result.output


def test_truncated_shard_is_named_and_fails(copy_dir):
    shard = copy_dir / "train-b00-00000-of-00001.tfrecord"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 5000])  # cut inside the last record
    result = run_inspect(f"{copy_dir}/*.tfrecord")
    assert result.exit_code == 1, result.output
    n = read_schema(str(copy_dir)).counts["train"]
    assert f"{shard}: truncated or corrupt after {n - 1} readable records" in result.output
    assert f"{shard}: holds {n - 1} records, schema.json lists {n}" in result.output
    assert "val-b00-00000-of-00001.tfrecord: " not in result.output.split("PROBLEMS")[1]


def test_record_with_wrong_mel_shape_is_reported_with_its_index(copy_dir):
    schema = read_schema(str(copy_dir))
    short = tuple(
        dataclasses.replace(f, shape=(schema.max_mel_frames - 1, schema.n_mels)) if f.name == "mel" else f
        for f in schema.features
    )
    bad = good_values(schema, "bad-1")
    bad["mel"] = bad["mel"][:-1]
    write_records(
        copy_dir / "extra-00000-of-00001.tfrecord",
        [
            encode_example(schema.features, good_values(schema)),
            encode_example(short, bad),
            encode_example(schema.features, good_values(schema, "ok-2")),
        ],
    )
    result = run_inspect(f"{copy_dir}/extra-*.tfrecord")
    assert result.exit_code == 1, result.output
    problems = result.output.split("PROBLEMS (1):")[1]
    mel = schema.feature("mel")
    assert (
        f"{copy_dir}/extra-00000-of-00001.tfrecord: record 1: wrong shape: mel holds "
        f"{(schema.max_mel_frames - 1) * schema.n_mels * 2} bytes, schema shape {list(mel.shape)} of "
        f"raw_float16 needs {schema.max_mel_frames * schema.n_mels * 2}"
    ) in problems
    assert "record 0" not in problems and "record 2" not in problems


def test_lengths_outside_the_schema_are_reported(copy_dir):
    schema = read_schema(str(copy_dir))
    write_records(
        copy_dir / "extra-00000-of-00001.tfrecord",
        [
            encode_example(schema.features, good_values(schema, "long", mel_len=schema.max_mel_frames + 1)),
            encode_example(schema.features, good_values(schema, "empty", text_len=0)),
        ],
    )
    result = run_inspect(f"{copy_dir}/extra-*.tfrecord")
    assert result.exit_code == 1, result.output
    assert f"record 0: mel_len {schema.max_mel_frames + 1} outside 1..{schema.max_mel_frames}" in result.output
    assert f"record 1: text_len 0 outside 1..{schema.max_text_len}" in result.output


def test_speaker_and_language_ids_are_checked_against_the_schemas_tables(copy_dir):
    schema = read_schema(str(copy_dir))
    write_records(
        copy_dir / "extra-00000-of-00001.tfrecord",
        [
            encode_example(schema.features, dict(good_values(schema, "a"), speaker_id=1)),
            encode_example(schema.features, dict(good_values(schema, "b"), language="de")),
        ],
    )
    result = run_inspect(f"{copy_dir}/extra-*.tfrecord")
    assert result.exit_code == 1, result.output
    assert "record 0: speaker_id 1 outside 0..0 (schema.json speakers)" in result.output
    assert "record 1: language_id 0 is 'en' in schema.json, the record says 'de'" in result.output


def test_show_prints_records_and_writes_one_png_each(shards_dir, tmp_path):
    out = tmp_path / "inspect"
    result = run_inspect(f"{shards_dir}/*.tfrecord", "--show", 2, "--out", out)
    assert result.exit_code == 0, result.output
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == 2
    assert all(p.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") for p in pngs)
    for p in pngs:
        assert f"{p.stem}  (" in result.output and f"mel PNG   {p}" in result.output
    assert result.output.count("text_ids  decode to the text") == 2


def test_a_glob_that_matches_nothing_is_a_usage_error(tmp_path):
    result = run_inspect(f"{tmp_path}/*.tfrecord")
    assert result.exit_code == 2 and "matches no file" in result.output


def test_shards_without_schema_json_say_how_to_fix_it(shards_dir, tmp_path):
    shutil.copy(shards_dir / "val-b00-00000-of-00001.tfrecord", tmp_path)
    result = run_inspect(f"{tmp_path}/*.tfrecord")
    assert result.exit_code == 1 and "schema.json does not exist" in result.output
    ok = run_inspect(f"{tmp_path}/*.tfrecord", "--schema", shards_dir / "schema.json")
    assert ok.exit_code == 0, ok.output


def test_records_are_checked_against_their_own_buckets_shapes(bucketed_dir, tmp_path):
    result = run_inspect(f"{bucketed_dir}/*.tfrecord")
    assert result.exit_code == 0, result.output
    schema = read_schema(str(bucketed_dir))
    assert (
        f"b01 text_ids [{schema.buckets[1].max_text_len}] mel [{schema.buckets[1].max_mel_frames}, 80]" in result.output
    )
    copy = tmp_path / "run"
    shutil.copytree(bucketed_dir, copy)
    small, big = schema.buckets[0], schema.buckets[3]
    # a record of the largest bucket's shape in a shard of bucket 0: named, with both sizes
    write_records(copy / "train-b00-00007-of-00009.tfrecord", [encode_example(big.features, good_values(big))])
    result = run_inspect(f"{copy}/*.tfrecord")
    assert result.exit_code == 1
    assert "train-b00-00007-of-00009.tfrecord: record 0: wrong shape: " in result.output
    assert (
        f"mel holds {big.max_mel_frames * 80 * 2} bytes, schema shape [{small.max_mel_frames}, 80] of raw_float16"
    ) in result.output
    assert result.output.count("wrong shape") == 1  # every listed shard still passes against its bucket


def test_show_gives_a_records_lengths_against_its_own_bucket(bucketed_dir, tmp_path):
    schema = read_schema(str(bucketed_dir))
    first = schema.buckets[0]
    result = run_inspect(f"{bucketed_dir}/{first.shards['train'][0]['file']}", "--show", 1, "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert f"of {first.max_text_len} ids" in result.output and f"of {first.max_mel_frames} frames" in result.output
    assert first.max_mel_frames < schema.max_mel_frames  # not the largest bucket's, which it used to print


def test_inspect_out_that_is_a_file_is_one_line_exit_2_before_any_shard_is_read(shards_dir, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    for out, problem in (
        (tmp_path / "notes.txt", "is a file; pass a directory"),
        (tmp_path / "notes.txt" / "pngs", f"cannot create it, {tmp_path / 'notes.txt'} is a file"),
    ):
        result = run_inspect(f"{shards_dir}/*.tfrecord", "--show", 1, "--out", out)
        assert result.exit_code == 2, result.output
        assert f"--out {out}" in result.output and problem in result.output
        assert "total:" not in result.output  # refused before the shards are read
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_inspect_writes_over_its_own_pngs_only(shards_dir, tmp_path):
    out = tmp_path / "pngs"
    for _ in range(2):  # the second run writes over the first one's PNGs
        result = run_inspect(f"{shards_dir}/*.tfrecord", "--show", 1, "--out", out)
        assert result.exit_code == 0, result.output
    (png,) = out.glob("*.png")
    png.write_bytes(b"\x89PNG\r\n\x1a\n a picture of the user's")
    result = run_inspect(f"{shards_dir}/*.tfrecord", "--show", 1, "--out", out)
    assert result.exit_code == 2, result.output
    assert f"--out {png}: it exists and is not a mel PNG `melshards inspect --show` wrote" in result.output
    assert png.read_bytes().endswith(b"a picture of the user's")


def test_png_names_are_one_to_one_even_on_a_case_insensitive_filesystem():
    """`a/b` and `a_b` (and `a b`, `a__b`) used to share one PNG; every id now has a name of its own, the
    same id twice (two runs) or ids that differ in case only get distinct ones too."""
    from melshards.reports.record_view import png_name, png_names

    ids = ["a/b", "a_b", "a b", "a__b", "a_2fb", "", "_", "LJ001-0001", "spk/001", "spkB/001", "é", "A1", "a1", "a1"]
    names = png_names([{"id": i.encode()} for i in ids])
    assert len({n.casefold() for n in names}) == len(ids)
    assert names[:8] == ["a_2fb", "a_5fb", "a_20b", "a_5f_5fb", "a_5f2fb", "_", "_5f", "LJ001-0001"]
    assert names[10:] == ["_c3_a9", "A1", "a1_+2", "a1_+3"]
    assert all(re.fullmatch(r"[A-Za-z0-9._+-]+", n) for n in names)  # safe on every filesystem
    assert png_name("LJT001-0002") == "LJT001-0002"  # an id of letters, digits, - and . is its own name
