"""The quality measures' statistics for stats.json (`melshards.preprocess.quality_stats`): exact histograms per
corpus, speaker and language, and the speaking-rate rule's outliers at other k, on a few synthetic clips."""

from __future__ import annotations

import dataclasses
import math

from melshards.preprocess import quality_rules
from melshards.preprocess.config import PreprocessConfig, QualityRulesConfig
from melshards.preprocess.filter_and_write import dropped_counts
from melshards.preprocess.quality import measure_bins
from melshards.preprocess.quality_rules import rate_key
from melshards.preprocess.quality_stats import QualityFigures, measure_histograms

NAN = math.nan


def clip(speaker: str, language: str, rate: float, snr: float, cer: float = NAN) -> dict:
    return {"speaker": speaker, "language": language, "quality": {"speaking_rate": rate, "snr_db": snr, "cer": cer}}


# anna (en-US) speaks at 14..17 symbols/s but for one clip at 30; bert (en-GB) at 10..13; cleo (en-US) has 2 clips
CLIPS = [
    *(clip("anna", "en-US", r, s) for r, s in zip((14, 15, 15.5, 16, 16.5, 17, 30), (30, 32, 35, 12, 40, 41, 33))),
    *(clip("bert", "en-GB", r, s, 0.25) for r, s in zip((10, 11, 12, 13), (20, 25, 14.95, 28))),
    clip("cleo", "en-US", 15, 50),
    clip("cleo", "en-US", 16, NAN),
]
CFG = PreprocessConfig(quality_rules=dataclasses.replace(QualityRulesConfig(), rate_min_clips=3))
BINS = {m: b for m, b in measure_bins(22050, 1024).items() if m in ("speaking_rate", "snr_db", "cer")}


def test_measure_histograms_count_each_clip_on_its_grid_per_corpus_speaker_and_language():
    h = measure_histograms(CLIPS, BINS)
    assert h[("corpus", "", "snr_db", 149)] == 1  # bert's 14.95 dB: floor key of 0.1 dB
    assert h[("speaker", "cleo", "snr_db", None)] == 1  # NaN: not measured
    assert h[("language", "en-GB", "cer", 250)] == 4
    assert h[("speaker", "anna", "cer", None)] == 7
    assert h[("speaker", "anna", "speaking_rate", rate_key(30))] == 1  # the rate rule's own key
    assert sum(n for (scope, _, m, _), n in h.items() if scope == "corpus" and m == "snr_db") == len(CLIPS)


def test_figures_hold_exact_histograms_and_percentiles_in_the_measures_units():
    q = QualityFigures.of(measure_histograms(CLIPS, BINS), CFG)
    section = q.section()
    snr = section["global"]["snr_db"]
    assert (snr["count"], snr["not_measured"]) == (12, 1)
    assert snr["histogram"]["149"] == 1 and sum(snr["histogram"].values()) == 12
    assert snr["percentiles"]["p0"] == 12.0 and snr["percentiles"]["p100"] == 50.0
    assert section["measures"]["snr_db"] == {"unit": "dB", "scale": 10, "side": "floor"}
    assert section["rules"]["rate_min_clips"] == 3 and section["sample_rate"] == CFG.audio.sample_rate
    anna = q.speaker("anna")["quality"]["speaking_rate"]
    assert "histogram" not in anna and anna["percentiles"]["p25"] == 15.0 and anna["percentiles"]["p75"] == 17.0
    assert q.language("en-GB")["quality"]["cer"]["histogram"] == {"250": 4}


def test_rate_outliers_follow_the_rule_per_speaker_with_its_language_fallback():
    q = QualityFigures.of(measure_histograms(CLIPS, BINS), CFG)
    # anna: Q1 15, Q3 17 -> k=1: 13..19, k=2: 11..21, so her 30 only; bert: 10..12 -> k=1: 8..14, none;
    # cleo (2 clips < rate_min_clips 3) takes en-US's (anna's and hers): Q1 15, Q3 16.5 -> her 15 and 16 inside
    rows = {r["k"]: (r["least"], r["most"]) for r in q.section()["rate_what_if"]}
    assert rows == {1.0: (1, 1), 1.5: (1, 1), 2.0: (1, 1), 2.5: (1, 1), 3.0: (1, 1)}
    assert [r["least"] for r in q.speaker("anna")["rate_outliers"]] == [1] * 5
    assert [r["most"] for r in q.speaker("cleo")["rate_outliers"]] == [0] * 5


def test_the_filters_drops_are_counted_per_speaker_and_language():
    got = dropped_counts([(CLIPS[0], "noisy"), (CLIPS[1], "noisy"), (CLIPS[7], "clipped")])
    assert got == {
        ("dropped", "speaker", "anna", "noisy"): 2,
        ("dropped", "language", "en-US", "noisy"): 2,
        ("dropped", "speaker", "bert", "clipped"): 1,
        ("dropped", "language", "en-GB", "clipped"): 1,
    }


def test_a_language_too_small_for_rate_bounds_is_recorded_unjudged_and_counts_no_outlier():
    # dai's 2 Mandarin clips at 3 characters/s: fewer than rate_min_clips (3), and never judged by the
    # English speakers' bounds (there are no corpus-wide ones)
    clips = CLIPS + [clip("dai", "cmn", 3.0, 40), clip("dai", "cmn", 3.2, 41)]
    q = QualityFigures.of(measure_histograms(clips, BINS), CFG)
    assert q.section()["rate_unjudged"] == [
        {"language": "cmn", "frontend": "characters", "rated": 2, "speakers": ["dai"]}
    ]
    assert [(r["least"], r["most"]) for r in q.speaker("dai")["rate_outliers"]] == [(0, 0)] * 5
    assert QualityFigures.of(measure_histograms(CLIPS, BINS), CFG).section()["rate_unjudged"] == []


def test_rate_outliers_of_a_small_speaker_are_counted_at_its_pace_as_the_rule_drops_them():
    # slow (6 clips, median 8) and fast (5, median 16) read at 0.75..1.25 of their medians but slow's 17;
    # with rate_min_clips 8 neither has bounds of its own: each is judged at its median times en's spread
    clips = [clip("slow", "en", r, 40) for r in (6, 7, 8, 9, 10, 17)]
    clips += [clip("fast", "en", r, 40) for r in (12, 14, 16, 18, 20)]
    cfg = PreprocessConfig(quality_rules=dataclasses.replace(QualityRulesConfig(), rate_min_clips=8))
    q = QualityFigures.of(measure_histograms(clips, BINS), cfg)
    hists = quality_rules.rate_histograms(clips)
    for k, out in q.per_k.items():
        rules = dataclasses.replace(cfg.quality_rules, rate_iqr_k=k)
        gate = quality_rules.QualityGate(rules, 22050, quality_rules.rate_bounds(hists, rules))
        for name in ("slow", "fast"):
            dropped = sum(quality_rules.rate_rejection(c, gate) is not None for c in clips if c["speaker"] == name)
            assert out.get(name, (0, 0)) == (dropped, dropped)
    # k 1 (pace bounds at k 2): en's pace ratios q1 0.875, q3 1.25 -> slow 1..16, so its 17 (en's bounds,
    # Q1 8, Q3 17 of 11 rates: -1..26, keep it)
    assert [r["least"] for r in q.speaker("slow")["rate_outliers"] if r["k"] == 1.0] == [1]
