from collections import Counter

import numpy as np
import pytest

from melshards.shards_schema.stats import (
    Cutoffs,
    Moments,
    compute_cutoffs,
    padding_fraction,
    percentile,
    round_up,
    summarize,
)


@pytest.mark.parametrize("q", [0, 0.5, 1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9, 100])
def test_percentile_equals_numpy_inverted_cdf(q):
    values = np.random.default_rng(1).integers(1, 900, size=1013)
    hist = Counter(values.tolist())
    assert percentile(hist, q) == int(np.percentile(values, q, method="inverted_cdf"))


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
