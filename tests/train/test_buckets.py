"""Length buckets in the trainer: batch per bucket, the schedule, and every bucket's pipeline."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from melshards.shards_schema import Schema, read_schema, shard_name
from melshards.train.buckets import (
    BatchError,
    Schedule,
    batch_sizes,
    calls_per_epoch,
    files_by_bucket,
    schedule,
    trainer_buckets,
)
from melshards.train.config import DataConfig
from melshards.train.input_pipeline import (
    InputError,
    check_schemas,
    expand_globs,
    python_ops_in,
    train_dataset,
    val_dataset,
)
from melshards.train.step import MODEL_INPUTS
from tests.train.conftest import ids_in, made, real_ids


def test_batch_per_bucket_keeps_padded_frames_per_batch_at_most_the_longest_buckets():
    # B * T_max / T = 16*1000/250 = 64, /400 = 40, /700 = 22.9 -> 16 (multiple of 8), 1000 -> 16
    assert batch_sizes([250, 400, 700, 1000], [10**6] * 4, 16) == [64, 40, 16, 16]
    # B = 4: multiples of gcd(4, 8) = 4; capped by each bucket's records (9 -> 8), never below B
    assert batch_sizes([184, 224, 320, 552], [9, 12, 11, 8], 4) == [8, 8, 4, 4]
    # B = 6: multiples of 2
    assert batch_sizes([100, 300], [100, 100], 6) == [18, 6]
    assert batch_sizes([250, 400, 1000], [10**6] * 3, 16, fixed=True) == [16, 16, 16]
    assert batch_sizes([552], [40], 8) == [8]


@pytest.mark.parametrize("replicas", [3, 5, 6, 7])
def test_every_buckets_batch_divides_by_the_replicas(replicas):
    b = 4 * replicas  # a global batch the replicas divide; gcd(B, 8) = 4 alone would not suffice
    frames = [184, 224, 320, 552]
    batches = batch_sizes(frames, [10**6] * 4, b, replicas=replicas)
    assert [x % replicas for x in batches] == [0] * 4 and min(batches) == batches[-1] == b
    # still about the longest bucket's padded frames per batch, never more
    assert all(x * t <= b * 552 for x, t in zip(batches, frames))
    capped = batch_sizes(frames, [b + replicas - 1, 10**6, 10**6, 10**6], b, replicas=replicas)
    assert capped[0] == b  # capped at the records, rounded down to a multiple the replicas divide
    assert batch_sizes([184, 552], [10**6] * 2, 12, replicas=3) == [36, 12]


def test_a_batch_larger_than_a_buckets_records_is_refused_naming_the_largest_that_fits():
    with pytest.raises(
        BatchError,
        match=r"batch_size 64 is more than the training records \(the shards hold "
        r"8\).* largest batch that fits is 8: pass --batch-size 8 or less",
    ):
        batch_sizes([552], [8], 64)
    # a small bucket never repeats records either (this used to give [4, 4] for 2 and 3 records)
    with pytest.raises(BatchError, match=r"bucket 0 has 2, bucket 1 has 3\).* largest batch that fits is 2"):
        batch_sizes([100, 200], [2, 3], 4)
    with pytest.raises(BatchError, match="largest batch that fits is 6"):  # a multiple of the replicas
        batch_sizes([100, 200], [7, 30], 12, replicas=3)
    with pytest.raises(BatchError, match="largest batch that fits is 8"):
        batch_sizes([100, 200], [8, 30], 12, fixed=True)
    assert batch_sizes([100, 200], [0, 30], 12) == [12, 12]  # a bucket without records is never run


def test_calls_per_epoch_follow_each_buckets_batches_and_none_starves():
    assert calls_per_epoch([96, 40, 3, 0], [8, 8, 4, 4], 1) == [12, 5, 1, 0]
    assert calls_per_epoch([96, 40, 3], [8, 8, 4], 2) == [6, 2, 1]  # 2.5 rounds to even


def test_schedule_is_a_seeded_permutation_per_epoch_in_proportion_to_the_calls():
    calls = [6, 3, 1]
    order = schedule(calls, seed=7, first=0, count=50)
    for e in range(5):  # every epoch of 10 calls holds exactly 6, 3 and 1 calls of the buckets
        assert collections.Counter(order[10 * e : 10 * e + 10].tolist()) == {0: 6, 1: 3, 2: 1}
    assert not np.array_equal(order[:10], order[10:20])  # a new order every epoch
    assert np.array_equal(order, schedule(calls, seed=7, first=0, count=50))
    assert not np.array_equal(order, schedule(calls, seed=8, first=0, count=50))
    # any position is a pure function of the call index: a resumed run continues the same sequence
    assert np.array_equal(order[13:37], schedule(calls, seed=7, first=13, count=24))
    live = Schedule(calls, seed=7)
    assert [live.bucket(c) for c in range(23, 50)] == order[23:].tolist()


def test_schedule_of_one_bucket_is_all_that_bucket():
    assert schedule([5], 0, 3, 8).tolist() == [0] * 8
    assert schedule([0, 4, 0], 0, 0, 6).tolist() == [1] * 6


@pytest.fixture(scope="module")
def bucketed(bucketed_dir):
    files = expand_globs([str(bucketed_dir / "train-*.tfrecord")])
    val = expand_globs([str(bucketed_dir / "val-*.tfrecord")])
    schema, _ = check_schemas(files, None)
    return schema, trainer_buckets(files, val, schema, 4, False, 1)


def test_the_plan_gives_every_bucket_its_files_shapes_batch_and_records(bucketed):
    schema, tbs = bucketed
    assert len(tbs) == len(schema.buckets) > 1
    for tb, b in zip(tbs, schema.buckets):
        assert tb.bucket == b and tb.records == b.counts["train"] and tb.calls_per_epoch >= 1
        assert all(f"-b{b.index:02d}-" in f for f in tb.files + tb.val_files)
        # no bucket's batch holds more padded frames than the longest bucket's batch of B = 4
        assert tb.batch_size * b.max_mel_frames <= 4 * schema.max_mel_frames


def _three_buckets(schema):
    """Buckets of 128, 256 and 512 frames; train records 640 + 320, 320, 80; val in buckets 0 and 2."""

    def shard(split, bucket, index, count, records):
        return {"split": split, "file": shard_name(split, bucket, index, count), "records": records}

    shards = [
        [shard("train", 0, 0, 2, 640), shard("train", 0, 1, 2, 320), shard("val", 0, 0, 1, 5)],
        [shard("train", 1, 0, 1, 320)],
        [shard("train", 2, 0, 1, 80), shard("val", 2, 0, 1, 3)],
    ]
    buckets = tuple(
        Schema.make_bucket(i, 16 * (i + 1), frames, schema.n_mels, shards[i])
        for i, frames in enumerate((128, 256, 512))
    )
    return dataclasses.replace(schema, buckets=buckets)


def test_the_plan_of_a_concrete_run_by_hand(bucketed):
    schema = _three_buckets(bucketed[0])
    names = {b.index: [f["file"] for f in b.shards["train"]] for b in schema.buckets}
    val = [f"/d/{f['file']}" for f in schema.shards["val"]]
    train = [f"/d/{f}" for i in (0, 1, 2) for f in names[i]]
    tbs = trainer_buckets(train, val, schema, 8, False, 2)
    # B = 8 for 512 frames: 8 * 512 / 256 = 16 records of 256 frames, 32 of 128 (none capped by records)
    assert [tb.batch_size for tb in tbs] == [32, 16, 8]
    assert [tb.records for tb in tbs] == [960, 320, 80]
    # calls of 2 steps per epoch: 960 / (32 * 2), 320 / (16 * 2), 80 / (8 * 2)
    assert [tb.calls_per_epoch for tb in tbs] == [15, 10, 5]
    assert [tb.files for tb in tbs] == [tuple(f"/d/{f}" for f in names[i]) for i in (0, 1, 2)]
    assert [tb.val_files for tb in tbs] == [
        ("/d/val-b00-00000-of-00001.tfrecord",),
        (),
        ("/d/val-b02-00000-of-00001.tfrecord",),
    ]
    assert [tb.bucket.max_mel_frames for tb in tbs] == [128, 256, 512]

    # a run given some of the files: its records are those files' records, a bucket without files has no calls
    tbs = trainer_buckets(
        ["/d/train-b00-00000-of-00002.tfrecord", "/d/train-b02-00000-of-00001.tfrecord"], [], schema, 8, False, 1
    )
    assert [tb.records for tb in tbs] == [640, 0, 80]
    assert [tb.calls_per_epoch for tb in tbs][::2] == [640 // 32, 80 // 8] and tbs[1].calls_per_epoch == 0
    # fixed_batch_size: every bucket gets B
    assert [tb.batch_size for tb in trainer_buckets(train, [], schema, 8, True, 1)] == [8, 8, 8]


def test_every_buckets_pipeline_has_its_own_static_shapes_and_no_python_ops(bucketed):
    schema, tbs = bucketed
    for tb in tbs:
        data = DataConfig(batch_size=tb.batch_size)
        train = train_dataset(tb.files, tb.bucket, data, MODEL_INPUTS, steps_per_execution=2)
        assert train.element_spec["mel"].shape.as_list() == [2, tb.batch_size, tb.bucket.max_mel_frames, schema.n_mels]
        assert train.element_spec["text_ids"].shape.as_list() == [2, tb.batch_size, tb.bucket.max_text_len]
        assert python_ops_in(train) == []
        if tb.val_files:
            val = val_dataset(tb.val_files, schema, data, MODEL_INPUTS, tb.bucket)
            assert python_ops_in(val) == []


def test_validation_covers_every_bucket_every_record_once_with_a_masked_top_up(bucketed, bucketed_dir):
    schema, tbs = bucketed
    seen = []
    for tb in tbs:
        if not tb.val_files:
            continue
        batches = list(val_dataset(tb.val_files, schema, DataConfig(batch_size=3), (*MODEL_INPUTS, "id"), tb.bucket))
        lens = tf.concat([b["mel_len"] for b in batches], 0).numpy()
        assert all(b["mel"].shape[1:] == (tb.bucket.max_mel_frames, schema.n_mels) for b in batches)
        assert sorted(real_ids(batches)) == sorted(ids_in(tb.val_files)) and len(lens) % 3 == 0
        seen += real_ids(batches)
    # every validation record of every bucket, each once: none missing, none repeated
    every = ids_in(sorted(str(p) for p in bucketed_dir.glob("val-*.tfrecord")))
    assert len(set(every)) == len(every) == schema.counts["val"] > 0
    assert sorted(seen) == sorted(every)


def test_a_file_of_no_bucket_is_refused_naming_it(bucketed_dir, tmp_path):
    schema = read_schema(str(bucketed_dir))
    with pytest.raises(InputError, match="renamed.tfrecord: schema.json does not list it"):
        files_by_bucket([str(tmp_path / "renamed.tfrecord")], schema)


@pytest.fixture(scope="module")
def bucketed_run(two_speaker_bucketed_run):
    """16 steps on the two length buckets of `two_speakers_bucketed_dir`, two steps per call, validating,
    through the CLI (tests/train/conftest.py `two_speaker_bucketed_run`, read by test_speakers.py too). That
    a bucket without files has no step: test_fastspeech2.py (a run given two of four buckets' files)."""
    return two_speaker_bucketed_run[1]


def test_each_bucket_traces_its_train_step_once_and_the_total_is_the_buckets_used(
    bucketed_run, two_speakers_bucketed_dir
):
    schema = read_schema(str(two_speakers_bucketed_dir))
    buckets = bucketed_run["buckets"]
    assert [b["max_mel_frames"] for b in buckets] == [b.max_mel_frames for b in schema.buckets]
    assert made(bucketed_run) == [1] * len(schema.buckets)  # traced once, or restored untraced (shared cache)
    assert sum(made(bucketed_run)) == bucketed_run["buckets_used"] == len(schema.buckets) > 1
    # an eval step for each bucket with validation records, traced once; none for a bucket without
    with_val = [int(b.counts["val"] > 0) for b in schema.buckets]
    assert made(bucketed_run, "eval") == with_val and 0 in with_val
    assert sum(made(bucketed_run, "eval")) == sum(with_val) > 0


def test_a_bucketed_run_validates_every_record_and_reports_padding_and_compile_time(
    bucketed_run, two_speakers_bucketed_dir
):
    schema = read_schema(str(two_speakers_bucketed_dir))
    assert bucketed_run["final_losses"]["val"]["examples"] == schema.counts["val"] > 0
    assert 0.0 < bucketed_run["padding_fraction"] < 1.0
    # 8 calls, the first of each bucket (its compile) not in the steady state
    assert bucketed_run["compile_seconds"] > 0 and bucketed_run["steady_state"]["calls"] == 8 - len(schema.buckets)
