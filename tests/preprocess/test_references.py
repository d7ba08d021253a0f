"""References (config `reference: source: other_clip`): the pure chooser and cutter with exact values, and
the shared run over a three-speaker manifest (tests/conftest.py `reference_runs`, twice over one cache)."""

import numpy as np

from melshards.preprocess.references import choose_references, cut_reference
from melshards.shards_schema import read_schema


def test_each_clip_gets_another_long_clip_and_a_start_inside_it_whatever_the_input_order():
    clips = [("a", 400), ("b", 100), ("c", 300), ("d", 50)]
    chosen = choose_references(clips, seed=7, min_frames=200, frames=256)
    assert chosen == choose_references(list(reversed(clips)), seed=7, min_frames=200, frames=256)
    assert chosen["a"] == ("c", chosen["a"][1]) and 0 <= chosen["a"][1] <= 300 - 256  # c: the other long one
    assert chosen["c"] == ("a", chosen["c"][1]) and 0 <= chosen["c"][1] <= 400 - 256
    for short in ("b", "d"):  # the long ones only
        assert chosen[short][0] in ("a", "c")
    assert chosen == {
        "a": ("c", 8),
        "b": ("a", 33),
        "c": ("a", 90),
        "d": ("a", 34),
    }  # sha256 draws: a change moves every reference
    assert choose_references(clips, seed=8, min_frames=200, frames=256) != chosen


def test_no_long_clip_falls_back_to_any_other_and_a_lone_clip_to_itself_or_nothing():
    assert choose_references([("a", 10), ("b", 20)], 0, 1000, 256) == {"a": ("b", 0), "b": ("a", 0)}
    assert choose_references([("a", 300)], 0, 10, 256) == {
        "a": ("a", choose_references([("a", 300)], 0, 10, 256)["a"][1])
    }
    assert choose_references([("a", 300)], 0, 10, 256, "reject") == {"a": None}


def test_a_cut_reference_is_the_mels_frames_padded_after_its_end():
    mel = np.arange(10 * 2, dtype=np.float16).reshape(10, 2)
    part, n = cut_reference(mel, 6, 6, -11.5)
    assert n == 4 and part.dtype == np.float16 and part.shape == (6, 2)
    np.testing.assert_array_equal(part[:4], mel[6:])
    np.testing.assert_array_equal(part[4:], np.full((2, 2), -11.5, np.float16))


def _records(out):
    import tensorflow as tf

    from melshards.shards_schema.records import decode_parsed, parse_spec

    schema = read_schema(str(out))
    recs = []
    for f in sorted(out.glob("*.tfrecord")):
        bucket = schema.bucket_of_file(f.name)
        for raw in tf.data.TFRecordDataset(str(f)):
            rec = decode_parsed(bucket, tf.io.parse_example([raw], parse_spec(bucket)), 1)
            recs.append({k: v.numpy()[0] for k, v in rec.items()} | {"split": f.name.split("-")[0]})
    return schema, recs


def test_every_reference_is_a_slice_of_another_clip_of_the_speaker_and_split(reference_runs):
    rows, (out, _) = reference_runs
    schema, recs = _records(out)
    assert schema.reference == {
        "source": "other_clip",
        "frames": 40,
        "min_seconds": 1.5,
        "seed": 3,
        "single_clip": "own_clip",
        "own_clip": 1,
    }
    by_id = {r["id"].decode(): r for r in recs}
    assert len(by_id) == len(rows)  # none rejected
    for rec in recs:
        ref = by_id[rec["reference_id"].decode()]
        assert (ref["speaker"], ref["split"]) == (rec["speaker"], rec["split"])
        assert rec["reference_mel"].shape == (40, schema.n_mels)
        n, start = int(rec["reference_len"]), int(rec["reference_start"])
        assert n == min(40, int(ref["mel_len"]) - start) and 0 <= start <= max(int(ref["mel_len"]) - 40, 0)
        np.testing.assert_array_equal(ref["mel"][start : start + n], rec["reference_mel"][:n])
        assert np.all(rec["reference_mel"][n:] == np.float32(np.float16(schema.mel.pad_value)))
        if rec["speaker"] != b"cleo":
            assert ref["id"] != rec["id"]
    assert by_id[good_cleo(rows)]["reference_id"].decode() == good_cleo(rows)


def good_cleo(rows):
    return next(r["id"] for r in rows if r["speaker"] == "cleo")


def test_references_survive_a_cached_rerun_byte_identically(reference_runs):
    _, (first, again) = reference_runs
    names = sorted(p.name for p in first.glob("*.tfrecord"))
    assert names == sorted(p.name for p in again.glob("*.tfrecord"))
    for name in names:
        assert (first / name).read_bytes() == (again / name).read_bytes(), name


def test_inspect_finds_every_reference_is_the_slice_it_names(reference_runs):
    from click.testing import CliRunner

    from melshards.commands.inspect import inspect_command

    _, (out, _) = reference_runs
    result = CliRunner().invoke(inspect_command, [str(out / "*.tfrecord")])
    assert result.exit_code == 0 and "PROBLEMS" not in result.output, result.output


def test_the_dataset_returns_the_stored_references_with_their_static_shape(reference_runs):
    import melshards

    _, (out, _) = reference_runs
    ds = melshards.dataset(
        str(out / "train-*.tfrecord"), 2, features=("mel", "reference_mel", "reference_len"), repeat=False
    )
    assert ds.element_spec["reference_mel"].shape == (2, 40, 80)
    batch = next(iter(ds))
    assert set(batch) == {"mel", "reference_mel", "reference_len"} and batch["reference_len"].numpy().max() <= 40
