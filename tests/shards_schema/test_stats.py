from collections import Counter

import numpy as np
import pytest

from melshards.shards_schema.stats import (
    Cutoffs,
    Moments,
    compute_cutoffs,
    count_beyond,
    measure_key,
    padding_fraction,
    percentile,
    percentiles,
    round_up,
    summarize,
    summarize_measure,
)


@pytest.mark.parametrize("q", [0, 0.5, 1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9, 100])
def test_percentile_equals_numpy_inverted_cdf(q):
    values = np.random.default_rng(1).integers(1, 900, size=1013)
    hist = Counter(values.tolist())
    assert percentile(hist, q) == int(np.percentile(values, q, method="inverted_cdf"))


def test_percentiles_at_once_equal_percentile_at_each():
    hist = Counter(np.random.default_rng(2).integers(-50, 400, size=501).tolist())
    qs = (0, 0.5, 1, 5, 25, 50, 75, 99, 99.9, 100)
    assert percentiles(hist, qs) == {q: percentile(hist, q) for q in qs}
    assert percentiles({10: 1, 20: 1, 30: 1, 40: 1}, (25, 26, 100)) == {25: 10, 26: 20, 100: 40}


def test_percentile_of_small_sample_is_an_observed_value():
    hist = {10: 1, 20: 1, 30: 1, 40: 1}
    assert [percentile(hist, q) for q in (0, 25, 26, 50, 99, 100)] == [10, 10, 20, 20, 40, 40]


def test_summarize_scales_and_counts():
    s = summarize({1000: 2, 3000: 2}, scale=0.001)
    assert s["count"] == 4 and s["mean"] == 2.0
    assert s["percentiles"]["p50"] == 1.0 and s["percentiles"]["p100"] == 3.0


def test_cutoffs_round_padding_up_to_the_multiple():
    hists = {"mel_frames": Counter(range(100, 201)), "text_len": Counter(range(10, 61)), "duration_ms": {}}
    c = compute_cutoffs(hists, 0.5, 0.5, 99, 99, 8)
    assert c == Cutoffs(
        min_duration_ms=500,
        min_mel_frames=100,
        max_mel_frames=199,
        max_text_len=60,
        padded_mel_frames=200,
        padded_text_len=64,
    )
    assert c.reason(10, 150, 400) == "too_short"
    assert c.reason(10, 99, 900) == "mel_frames_below_cutoff"
    assert c.reason(10, 200, 900) == "mel_frames_above_cutoff"
    assert c.reason(61, 150, 900) == "text_len_above_cutoff"
    assert c.reason(60, 199, 900) is None


def test_round_up():
    assert [round_up(n, 8) for n in (1, 8, 9, 1189)] == [8, 8, 16, 1192]


def test_padding_fraction_counts_padded_cells():
    assert padding_fraction(14, 16) == pytest.approx(1 - 14 / 16)
    assert padding_fraction(0, 0) == 0.0


def test_moments_merge_equals_numpy_over_the_union():
    rng = np.random.default_rng(2)
    parts = [rng.normal(i, 1 + i, size=(n, 5)) for i, n in enumerate((3, 40, 1, 17))]
    merged = Moments.empty(5)
    for p in parts:
        merged = merged.merge(Moments.of(p))
    allx = np.concatenate(parts)
    assert merged.n == len(allx)
    np.testing.assert_allclose(merged.mean, allx.mean(0), rtol=1e-12)
    np.testing.assert_allclose(merged.std(), allx.std(0), rtol=1e-12)


def test_stats_json_declares_each_inputs_folded_language_codes():
    from melshards.shards_schema.stats_model import InputSummary

    given = {
        "input": "/c",
        "name": "c",
        "format": "manifest",
        "rows": 3,
        "prefixed_speakers": 0,
        "prefixed_ids": 0,
        "language_codes_folded": {"EN": "en"},
    }
    assert InputSummary.model_validate(given).language_codes_folded == {"EN": "en"}
    assert InputSummary.model_validate({**given, "language_codes_folded": {}}).language_codes_folded == {}
    with pytest.raises(ValueError):
        InputSummary.model_validate({**given, "language_codes_folded": {"EN": 1}})


# -- quality measures on a declared grid ---------------------------------------------------------
@pytest.mark.parametrize(
    "value, scale, side, key",
    [
        (0.29, 100, "floor", 29),  # 0.29 x 100 is 28.999999999999996 in floats: on the grid, not 28
        (0.29, 100, "ceil", 29),
        (0.2901, 100, "ceil", 30),
        (14.95, 10, "floor", 149),
        (15.0, 10, "floor", 150),
        (-5.25, 10, "floor", -53),
        (17.334, 100, "round", 1733),
        (5512.5, 1024 / 22050, "exact", 256),  # a bandwidth_hz: an STFT bin's centre
    ],
)
def test_measure_key_puts_a_value_on_its_side_of_the_grid(value, scale, side, key):
    assert measure_key(value, scale, side) == key


def test_count_beyond_is_exact_for_a_bound_on_the_grid():
    hist = {100: 2, 101: 3, 250: 1}  # ceil keys of a share at 1e-5: (99, 100], (100, 101], (249, 250] e-5
    assert count_beyond(hist, 100_000, "ceil", 0.001, above=True) == (4, 4)  # 0.001 itself is kept
    floor = {149: 1, 150: 2, 300: 4}  # floor keys of dB at 0.1: [14.9, 15), [15, 15.1), [30, 30.1)
    assert count_beyond(floor, 10, "floor", 15.0, above=False) == (1, 1)
    assert count_beyond(floor, 10, "floor", 30.0, above=False) == (3, 3)


def test_count_beyond_gives_a_range_for_a_bound_between_grid_points():
    floor = {149: 1, 150: 2, 300: 4}
    assert count_beyond(floor, 10, "floor", 15.05, above=False) == (1, 3)  # key 150 holds 15.0 .. 15.1
    exact = {153: 2, 154: 5}  # bins: values on the grid, so any bound is exact
    assert count_beyond(exact, 1.0, "exact", 153.6, above=False) == (2, 2)


def test_summarize_measure_gives_observed_values_in_the_measures_units():
    s = summarize_measure({149: 1, 150: 2, 300: 1}, 10, qs=(0, 50, 100))
    assert s == {"count": 4, "mean": 18.725, "percentiles": {"p0": 14.9, "p50": 15.0, "p100": 30.0}}
    assert summarize_measure({}, 10) == {"count": 0, "mean": None, "percentiles": {}}
