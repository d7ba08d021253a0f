"""Choosing the job's buckets (pure): bounds from the training histogram, fitted to validation."""

from melshards.preprocess.config import PadConfig
from melshards.preprocess.stats.bucketing import bucket_stats, choose, text_bounds


def test_bounds_come_from_the_training_histogram_with_the_minimum_records():
    hist = {10: 4, 20: 4, 30: 1, 100: 4}
    got = choose(hist, 100, PadConfig(multiple=8, buckets=4, min_bucket_records=4))
    # the unconstrained optimum (16, 24, 32, 104) has a bucket for 30 alone: 1 < 4 records; the exact
    # constrained optimum moves the bound instead, 20 and 30 share a bucket of 32
    assert got["bounds"] == (16, 32, 104) and got["raised_last_bound"] is None
    assert [m["bound"] for m in got["plan"]["merges"]] == [32]


def test_the_last_bound_is_raised_to_fit_a_longer_validation_clip():
    got = choose({10: 5, 20: 5}, 41, PadConfig(multiple=8, buckets=2, min_bucket_records=1))
    assert got["bounds"] == (16, 48) and got["raised_last_bound"] == {"from": 24, "to": 48}


def test_without_training_clips_one_bucket_fits_the_longest_clip():
    got = choose({}, 41, PadConfig(multiple=8))
    assert got["bounds"] == (48,) and got["plan"] is None
    assert choose({}, 0, PadConfig()) is None


def test_text_bound_is_the_buckets_longest_text_rounded_up():
    assert text_bounds({0: {3: 1, 17: 2}, 2: {8: 1}}, 3, 8) == {0: 24, 1: 8, 2: 8}


def test_bucket_stats_count_records_per_split_and_padding_per_bucket():
    buckets = {"bounds": (16, 24), "plan": None, "raised_last_bound": None}
    shards = [
        {"split": "train", "bucket": 0, "records": 3},
        {"split": "val", "bucket": 1, "records": 1},
        {"split": "train", "bucket": 1, "records": 1},
    ]
    s = bucket_stats(buckets, {8: 2, 16: 1, 24: 2}, {0: {4: 3}, 1: {8: 2}}, shards, PadConfig(multiple=8), {8: 2})
    assert [r["records"] for r in s["buckets"]] == [{"train": 3, "val": 0}, {"train": 1, "val": 1}]
    assert [r["mel_padding_fraction"] for r in s["buckets"]] == [round(1 - 32 / 48, 6), 0.0]
    assert s["mel_padding_fraction"] == round(1 - 80 / 96, 6)
    assert [r["text_padding_fraction"] for r in s["buckets"]] == [0.5, 0.0]
