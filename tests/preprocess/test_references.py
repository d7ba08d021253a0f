"""References (config `reference: source: other_clip`): the pure chooser and cutter with exact values, and
the shared run over a three-speaker manifest (tests/conftest.py `reference_runs`, twice over one cache)."""

import hashlib
import json
import random

import numpy as np

from melshards.commands.preprocess import reference_lines
from melshards.preprocess.write.other_clip_references import choose_references, cut_reference
from melshards.shards_schema import read_schema


def test_each_clip_gets_another_long_clip_and_a_start_inside_it_whatever_the_input_order():
    clips = [("a", 400, "train"), ("b", 100, "train"), ("c", 300, "train"), ("d", 50, "train")]
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
    assert choose_references([("a", 10, "train"), ("b", 20, "train")], 0, 1000, 256) == {
        "a": ("b", 0),
        "b": ("a", 0),
    }
    (own,) = choose_references([("a", 300, "train")], 0, 10, 256).values()
    assert own[0] == "a" and 0 <= own[1] <= 300 - 256
    assert choose_references([("a", 300, "val")], 0, 10, 256, "reject") == {"a": None}


def test_a_lone_validation_clip_takes_a_training_clip_and_a_training_clip_never_a_validation_one():
    clips = [("t1", 300, "train"), ("t2", 50, "train"), ("v1", 300, "val")]
    chosen = choose_references(clips, 0, 200, 256, "reject")
    assert chosen["v1"][0] == "t1"  # the speaker's long training clip, not itself nor nothing
    assert chosen["t1"][0] == "t2" and chosen["t2"][0] == "t1"  # never v1
    # two validation clips take each other; a lone training clip beside them takes itself (or nothing)
    clips = [("t1", 300, "train"), ("v1", 300, "val"), ("v2", 300, "val")]
    assert {k: v[0] for k, v in choose_references(clips, 0, 200, 256).items()} == {"t1": "t1", "v1": "v2", "v2": "v1"}
    assert choose_references(clips, 0, 200, 256, "reject")["t1"] is None


def _draw(seed, clip_id, what, n):
    return int.from_bytes(hashlib.sha256(f"{seed}:{what}:{clip_id}".encode()).digest()[:8], "little") % n


def _brute_force(clips, seed, min_frames, frames, single_clip):
    """The rule as docs/preprocess.md states it, one candidate list per clip."""
    out = {}
    for clip_id, n, split in clips:
        pool = sorted((i, m) for i, m, s in clips if s == split and i != clip_id)
        if not pool and split == "val":
            pool = sorted((i, m) for i, m, s in clips if s == "train")
        pool = [c for c in pool if c[1] >= min_frames] or pool
        if not pool and single_clip == "reject":
            out[clip_id] = None
            continue
        ref_id, ref_frames = pool[_draw(seed, clip_id, "clip", len(pool))] if pool else (clip_id, n)
        out[clip_id] = (ref_id, _draw(seed, clip_id, "start", max(0, ref_frames - frames) + 1))
    return out


def test_the_choice_is_the_rules_brute_force_choice_on_small_speakers():
    rng = random.Random(0)
    for trial in range(400):
        clips = [
            (f"c{rng.randrange(10**6)}-{i}", rng.randrange(1, 400), rng.choice(("train", "train", "val")))
            for i in range(rng.randrange(1, 9))
        ]
        seed, min_frames, single_clip = (
            rng.randrange(5),
            rng.choice((0, 100, 250, 1000)),
            rng.choice(("own_clip", "reject")),
        )
        got = choose_references(clips, seed, min_frames, 64, single_clip)
        assert got == _brute_force(clips, seed, min_frames, 64, single_clip), (trial, clips, seed, min_frames)


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


def test_every_reference_is_a_slice_of_another_clip_of_the_speaker_a_lone_val_clip_of_a_training_one(reference_runs):
    rows, (out, _) = reference_runs
    schema, recs = _records(out)
    assert schema.reference == {
        "source": "other_clip",
        "frames": 40,
        "min_seconds": 1.5,
        "seed": 3,
        "single_clip": "own_clip",
        "own_clip": {"train": 2, "val": 0},  # cleo's only clip; dora's only training clip (never a val one)
        "val_from_train": 1,  # dora's only val clip
    }
    stats = json.loads((out / "stats.json").read_text())
    assert stats["references"] == {"own_clip": {"train": 2, "val": 0}, "val_from_train": 1}
    assert reference_lines(stats) == [  # the run's summary
        "references: 1 val record(s) cut from a training clip of their speaker (no other val clip); 2 cut from "
        "their own clip (train 2, val 0: their speaker has no other clip to take)"
    ]
    by_id = {r["id"].decode(): r for r in recs}
    assert len(by_id) == len(rows)  # none rejected
    for rec in recs:
        ref = by_id[rec["reference_id"].decode()]
        assert ref["speaker"] == rec["speaker"]
        assert ref["split"] == rec["split"] or (rec["split"], ref["split"], rec["speaker"]) == ("val", "train", b"dora")
        assert rec["reference_mel"].shape == (40, schema.n_mels)
        n, start = int(rec["reference_len"]), int(rec["reference_start"])
        assert n == min(40, int(ref["mel_len"]) - start) and 0 <= start <= max(int(ref["mel_len"]) - 40, 0)
        np.testing.assert_array_equal(ref["mel"][start : start + n], rec["reference_mel"][:n])
        assert np.all(rec["reference_mel"][n:] == np.float32(np.float16(schema.mel.pad_value)))
    own = sorted(r["id"].decode() for r in recs if r["reference_id"] == r["id"])
    dora = {r["split"]: r["id"].decode() for r in recs if r["speaker"] == b"dora"}
    assert own == sorted([good_cleo(rows), dora["train"]])
    assert by_id[dora["val"]]["reference_id"].decode() == dora["train"]


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
