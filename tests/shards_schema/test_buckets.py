import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.buckets.bounds import equal_count_bounds
from melshards.shards_schema.buckets import (
    BucketFill,
    Merge,
    bucket_index,
    choose_buckets,
    fill_buckets,
    optimal_bounds,
    padding_by_k,
    text_bound,
    total_padding_fraction,
)
from melshards.shards_schema.stats import round_up

# 12 clips, 283 valid frames; candidates at multiple 8: 16, 24, 32, 96
SMALL = {10: 5, 17: 3, 30: 1, 31: 2, 90: 1}


def cost(bounds, hist):
    """Padded frames, clip by clip, without the module's code paths."""
    total = 0
    for v, c in hist.items():
        total += c * min(b for b in bounds if b >= v)
    return total


def records_per_bucket(bounds, hist):
    out = [0] * len(bounds)
    for v, c in hist.items():
        out[next(i for i, b in enumerate(bounds) if b >= v)] += c
    return out


def merge_small_buckets(bounds, hist, min_records):
    """The greedy reference the exact constrained optimum is measured against: merge every bucket of
    given bounds with fewer than `min_records` clips into a neighbour (a clip is padded up, never down,
    so a small bucket merges upward by removing its bound; the last takes the one below). Scans from
    the shortest bucket, so a merged bucket is checked again; stops at one bucket even if too small."""
    bounds = list(bounds)
    records = [b.records for b in fill_buckets(bounds, hist)]
    merges = []
    i = 0
    while i < len(bounds) - 1:
        if records[i] < min_records:
            merges.append(Merge(bounds[i], records[i], min_records, bounds[i + 1]))
            small = records.pop(i)
            bounds.pop(i)
            records[i] += small  # the upper neighbour, now at index i
        else:
            i += 1
    while len(bounds) > 1 and records[-1] < min_records:
        merges.append(Merge(bounds[-1], records[-1], min_records, bounds[-1]))
        below = records.pop(-2)
        bounds.pop(-2)
        records[-1] += below
    return tuple(bounds), tuple(merges)


def brute_force(hist, k, multiple, min_records=0):
    """Least cost and fewest buckets at that cost, over every subset of candidates holding the last."""
    cands = sorted({round_up(v, multiple) for v, c in hist.items() if c})
    best = None
    for n in range(1, min(k, len(cands)) + 1):
        for rest in itertools.combinations(cands[:-1], n - 1):
            bounds = rest + (cands[-1],)
            if min(records_per_bucket(bounds, hist)) < min_records:
                continue
            key = (cost(bounds, hist), n)
            best = key if best is None or key < best else best
    return best


def random_hist(rng, distinct, max_len, max_count=6):
    lengths = rng.choice(np.arange(1, max_len + 1), size=distinct, replace=False)
    return {int(v): int(rng.integers(1, max_count + 1)) for v in lengths}


def test_dp_matches_brute_force_on_random_histograms():
    rng = np.random.default_rng(11)
    for case in range(300):
        multiple = int(rng.choice([1, 2, 3, 8]))
        hist = random_hist(rng, int(rng.integers(1, 11)), 80)
        k = int(rng.integers(1, 6))
        min_records = int(rng.choice([0, 0, 1, 4, 9]))
        expect = brute_force(hist, k, multiple, min_records)
        if expect is None:
            with pytest.raises(ValueError, match="cannot fill one bucket"):
                optimal_bounds(hist, k, multiple, min_records)
            continue
        bounds = optimal_bounds(hist, k, multiple, min_records)
        assert (cost(bounds, hist), len(bounds)) == expect, (case, hist, k, multiple, min_records)
        assert min(records_per_bucket(bounds, hist)) >= min_records


def test_one_bucket_is_the_rounded_maximum():
    assert optimal_bounds(SMALL, 1, 8) == (96,)
    assert optimal_bounds({1: 1, 1000: 3}, 1, 64) == (1024,)


def test_as_many_buckets_as_candidates_pads_only_to_the_multiple():
    hist = {3: 2, 9: 1, 10: 4, 25: 1}
    bounds = optimal_bounds(hist, 10, 4)
    assert bounds == (4, 12, 28)
    assert cost(bounds, hist) == sum(c * round_up(v, 4) for v, c in hist.items())
    assert optimal_bounds(hist, 10, 1) == (3, 9, 10, 25)
    assert total_padding_fraction(fill_buckets(optimal_bounds(hist, 10, 1), hist)) == 0.0


def test_bounds_are_multiples_and_the_last_covers_the_longest_clip():
    rng = np.random.default_rng(3)
    for multiple in (1, 5, 8, 64):
        hist = random_hist(rng, 40, 2000)
        for k in (1, 3, 8):
            bounds = optimal_bounds(hist, k, multiple)
            assert all(b % multiple == 0 for b in bounds)
            assert bounds[-1] == round_up(max(hist), multiple)
            assert list(bounds) == sorted(set(bounds)) and len(bounds) <= k


def test_exact_optimum_on_a_hand_checked_histogram():
    # (32, 96): 11*32 + 96 = 448 padded frames; (24, 96): 576; (16, 96): 752
    assert optimal_bounds(SMALL, 2, 8) == (32, 96)
    buckets = fill_buckets((32, 96), SMALL)
    assert buckets == (BucketFill(32, 11, 193), BucketFill(96, 1, 90))
    assert buckets[0].padded_frames == 352 and buckets[0].padding_fraction == 1 - 193 / 352
    assert total_padding_fraction(buckets) == 1 - 283 / 448


def test_equal_count_is_the_quantile_baseline_and_never_beats_the_optimum():
    assert equal_count_bounds(SMALL, 2, 8) == (24, 96)  # median clip is 17 frames
    assert equal_count_bounds(SMALL, 4, 8) == (16, 24, 32, 96)
    assert equal_count_bounds({5: 10}, 4, 8) == (8,)  # coinciding bounds merge
    rng = np.random.default_rng(5)
    strictly_better = 0
    for _ in range(100):
        hist = random_hist(rng, int(rng.integers(2, 30)), 500, 20)
        for k in (2, 4, 8):
            eq, opt = equal_count_bounds(hist, k, 8), optimal_bounds(hist, k, 8)
            assert len(eq) <= k
            assert cost(opt, hist) <= cost(eq, hist)
            strictly_better += cost(opt, hist) < cost(eq, hist)
    assert strictly_better > 0


def test_small_bucket_merges_into_its_upper_neighbour():
    bounds, merges = merge_small_buckets((16, 24, 32, 96), {10: 1, 17: 3, 30: 3, 90: 2}, 2)
    assert bounds == (24, 32, 96)
    assert merges == (Merge(16, 1, 2, 24),)


def test_merged_bucket_is_checked_again_with_its_new_count():
    bounds, merges = merge_small_buckets((8, 16, 24, 32), {8: 1, 16: 1, 24: 1, 32: 5}, 3)
    assert bounds == (24, 32)
    assert merges == (Merge(8, 1, 3, 16), Merge(16, 2, 3, 24))  # 8+16 hold 2, then 8+16+24 hold 3
    bounds, merges = merge_small_buckets((8, 16, 24, 32), {8: 1, 16: 1, 24: 1, 32: 5}, 4)
    assert bounds == (32,)
    assert merges == (Merge(8, 1, 4, 16), Merge(16, 2, 4, 24), Merge(24, 3, 4, 32))


def test_small_last_bucket_takes_the_one_below():
    bounds, merges = merge_small_buckets((32, 96), SMALL, 2)
    assert bounds == (96,) and merges == (Merge(96, 1, 2, 96),)
    bounds, merges = merge_small_buckets((32, 96), SMALL, 100)  # one bucket stays even if too small
    assert bounds == (96,) and merges == (Merge(32, 11, 100, 96),)
    assert merge_small_buckets((32, 96), SMALL, 1) == ((32, 96), ())


def test_constrained_optimum_is_never_worse_than_merging_and_sometimes_better():
    rng = np.random.default_rng(7)
    better = 0
    for _ in range(150):
        hist = random_hist(rng, int(rng.integers(2, 12)), 200)
        k, m = int(rng.integers(2, 6)), int(rng.integers(2, 8))
        if sum(hist.values()) < m:
            continue
        merged, _ = merge_small_buckets(optimal_bounds(hist, k, 8), hist, m)
        exact = optimal_bounds(hist, k, 8, m)
        assert cost(exact, hist) <= cost(merged, hist)
        better += cost(exact, hist) < cost(merged, hist)
    assert better > 0


def test_min_records_may_depend_on_the_bound():
    hist = {8: 3, 16: 3, 64: 2}
    # a bucket needs 64 / bound records (larger batches for shorter buckets): 8 -> 8, 16 -> 4, 64 -> 1
    bounds = optimal_bounds(hist, 3, 8, lambda b: 64 // b)
    assert bounds == (16, 64)  # records (6, 2); a bucket at 8 would hold 3 < 8
    assert optimal_bounds(hist, 3, 8) == (8, 16, 64)


def test_fixed_k_plan_reports_buckets_padding_and_no_merges():
    plan = choose_buckets(SMALL, 2, 8, 0.10, 8, 1)
    assert plan.bounds == (32, 96) and plan.records == (11, 1) and plan.k_used == 2
    assert plan.padding_fraction == 1 - 283 / 448 and plan.merges == ()
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["k_requested"] == 2 and d["k_used"] == 2 and d["bounds"] == [32, 96]
    assert d["buckets"][1] == {
        "bound": 96,
        "records": 1,
        "valid_frames": 90,
        "padded_frames": 96,
        "padding_fraction": round(1 - 90 / 96, 6),
    }
    assert d["padding_fraction"] == round(1 - 283 / 448, 6) == d["unconstrained_padding_fraction"]


def test_plan_names_the_buckets_the_minimum_removed():
    plan = choose_buckets(SMALL, 2, 8, 0.10, 8, 2)
    # unconstrained (32, 96) leaves 1 clip at 96; best with >= 2 each is (24, 96): 8*24 + 4*96 = 576
    assert plan.bounds == (24, 96) and plan.records == (8, 4)
    assert plan.merges == (Merge(96, 1, 2, 96),)
    assert plan.unconstrained_padding == 1 - 283 / 448 and plan.padding_fraction == 1 - 283 / 576


def test_auto_takes_the_smallest_k_within_the_target():
    hist = {100: 10, 200: 20, 300: 10}  # multiple 100: K=1 pads 1/3, K=2 1/9 (200, 300), K=3 0
    assert choose_buckets(hist, "auto", 8, 0.34, 100).k_used == 1
    assert choose_buckets(hist, "auto", 8, 0.12, 100).bounds == (200, 300)
    assert choose_buckets(hist, "auto", 8, 0.0, 100).bounds == (100, 200, 300)
    assert choose_buckets(hist, "auto", 8, 0.10, 100).k_used == 3


def test_auto_falls_back_to_max_buckets_when_the_target_is_out_of_reach():
    hist = {100: 10, 200: 20, 300: 10}
    plan = choose_buckets(hist, "auto", 2, 0.05, 100)
    assert plan.bounds == (200, 300) and plan.k_requested == "auto" and plan.max_buckets == 2


def test_too_few_clips_for_one_batch_give_one_bucket_and_say_so():
    plan = choose_buckets(SMALL, "auto", 8, 0.1, 8, 13)
    assert plan.bounds == (96,) and not plan.min_records_met
    assert plan.merges == (Merge(96, 12, 13, 96),)


def test_bad_bucket_counts_are_refused():
    for bad in (0, -1, True, "eight", 2.0):
        with pytest.raises(ValueError, match="buckets"):
            choose_buckets(SMALL, bad, 8, 0.1, 8)
    with pytest.raises(ValueError, match="empty"):
        optimal_bounds({}, 2, 8)
    with pytest.raises(ValueError, match="ascending"):
        fill_buckets((32, 16), SMALL)


def test_what_if_over_k_gives_padding_and_compile_count():
    hist = {100: 10, 200: 20, 300: 10}
    rows = padding_by_k(hist, 100)
    assert [r["k"] for r in rows] == [1, 2, 4, 8, 16]
    assert [r["buckets_used"] for r in rows] == [1, 2, 3, 3, 3]
    assert [r["padding_fraction"] for r in rows] == [round(1 / 3, 6), round(1 / 9, 6), 0.0, 0.0, 0.0]


def test_text_bound_and_bucket_index():
    assert text_bound(33, 8) == 40 and text_bound(32, 8) == 32 and text_bound(0, 8) == 8
    bounds = (32, 96)
    assert [bucket_index(v, bounds) for v in (1, 32, 33, 96)] == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="exceed"):
        bucket_index(97, bounds)


def test_module_imports_neither_beam_nor_tensorflow():
    code = (
        "import sys, melshards.shards_schema.buckets; "
        "print([m for m in sys.modules if m.split('.')[0] in ('apache_beam', 'tensorflow') or "
        "(m.startswith('melshards.') and not m.startswith('melshards.shards_schema'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
