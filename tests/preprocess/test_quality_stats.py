"""The quality measures' statistics for stats.json (`melshards.preprocess.stats.quality_stats`): exact histograms per
corpus, speaker and language, and the speaking-rate rule's outliers at other k, on a few synthetic clips; summed
per group in parts, in any order, and reduced to a fixed size per speaker, they give the figures of the whole run
summed at once, the outliers the rule itself drops, and the shipped corpus's stats.json."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import pickle
import random

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that

from melshards.preprocess.clip.clips import ClipRejected, featurize, prepare_texts
from melshards.preprocess.clip.quality import measure_bins
from melshards.preprocess.config import PreprocessConfig, QualityRulesConfig, load_config
from melshards.preprocess.inputs.sources import detect_corpus, read_input
from melshards.preprocess.stats import quality_rules
from melshards.preprocess.stats.quality_rules import rate_key
from melshards.preprocess.stats.quality_stage import QualityHistograms, SpeakingRateBounds
from melshards.preprocess.stats.quality_stats import QualityFigures, add_group, group_histograms, summary_of
from melshards.preprocess.write.filter_and_write import dropped_counts
from tests.conftest import TINY_CONFIG
from tests.preprocess.conftest import beam_pipeline

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


def figures_of(clips, cfg=CFG, bins=BINS) -> QualityFigures:
    """The quality figures of `clips` by the job's steps (`summary_of` what the workers sum per group), the
    whole run summed as one part."""
    return QualityFigures.of(summary_of(group_histograms(clips, bins), cfg), cfg)


def test_group_histograms_count_each_clip_on_its_grid_per_corpus_speaker_and_language():
    h = group_histograms(CLIPS, BINS)
    assert h[("corpus", "")]["snr_db"][149] == 1  # bert's 14.95 dB: floor key of 0.1 dB
    assert h[("speaker", "cleo")]["snr_db"][None] == 1  # NaN: not measured
    assert h[("language", "en-GB")]["cer"][250] == 4
    assert h[("speaker", "anna")]["cer"][None] == 7
    assert h[("speaker", "anna")]["speaking_rate"][rate_key(30)] == 1  # the rate rule's own key
    assert h[("speaker_language", ("anna", "en-US"))] == {"speaking_rate": h[("speaker", "anna")]["speaking_rate"]}
    assert sum(h[("corpus", "")]["snr_db"].values()) == len(CLIPS)
    assert group_histograms([], BINS) == {("corpus", ""): {}}  # a batch of no clips: the corpus's group, empty


def test_figures_hold_exact_histograms_and_percentiles_in_the_measures_units():
    q = figures_of(CLIPS)
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
    q = figures_of(CLIPS)
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
    q = figures_of(clips)
    assert q.section()["rate_unjudged"] == [
        {"language": "cmn", "frontend": "characters", "rated": 2, "speakers": ["dai"]}
    ]
    assert [(r["least"], r["most"]) for r in q.speaker("dai")["rate_outliers"]] == [(0, 0)] * 5
    assert figures_of(CLIPS).section()["rate_unjudged"] == []


def _varied_clips() -> list[dict]:
    """CLIPS, a Mandarin speaker too small for bounds, a speaker in two languages, one with no rate (NaN), and
    40 clips of 25 speakers with rates on and off the grid's keys (so the bounds fall near keys)."""
    rnd = random.Random(7)
    clips = CLIPS + [clip("dai", "cmn", 3.0, 40), clip("dai", "cmn", 3.2, 41)]
    clips += [clip("bi", "en-US", 14 + 0.5 * i, 30) for i in range(6)] + [
        clip("bi", "cmn", 3 + 0.1 * i, 30) for i in range(5)
    ]
    clips += [clip("mute", "en-GB", NAN, 20, 0.1), clip("mute", "en-GB", NAN, 21)]
    clips += [
        clip(f"v{i % 25}", ("en-US", "en-GB")[i % 2], rnd.choice((12.005, 12.5, 13, 14.255, 30)), rnd.uniform(0, 60))
        for i in range(40)
    ]
    return clips


RULE_SETS = [
    CFG,
    PreprocessConfig(),  # rate_min_clips 10: most speakers take their language's bounds
    PreprocessConfig(quality_rules=dataclasses.replace(QualityRulesConfig(), rate_iqr_k=None)),  # the rule off
    PreprocessConfig(quality_rules=dataclasses.replace(QualityRulesConfig(), rate_iqr_k=1.75, rate_min_clips=2)),
    PreprocessConfig(quality_rules=dataclasses.replace(QualityRulesConfig(), rate_min_clips=8)),  # anna, bi: pace
]


def _as_json(q) -> str:
    """Everything stats.json takes from quality figures `q` (a `QualityFigures`), as its text."""
    speakers = sorted({c["speaker"] for c in _varied_clips()} | {"nobody"})
    languages = sorted({c["language"] for c in _varied_clips()} | {"xx"})
    rows = {"section": q.section(), "speakers": [q.speaker(s) for s in speakers]}
    return json.dumps(dict(rows, languages=[q.language(code) for code in languages]), indent=2)


@pytest.mark.parametrize("cfg", RULE_SETS, ids=["min3", "defaults", "rule_off", "k1.75", "min8"])
def test_summed_per_group_in_parts_the_figures_are_those_of_the_whole_run_and_the_rules_outliers(cfg):
    # and a speaker whose tail clips fall outside the bounds at some k and not at others
    clips = _varied_clips() + [
        clip("wide", "en-GB", r, 30) for r in (10, 11, 12, 12, 13, 13, 14, 15, 17, 18.5, 20, 22, 25)
    ]
    parts = [group_histograms(clips[i : i + 7], BINS) for i in range(0, len(clips), 7)]
    groups: dict = {}
    for part in reversed(parts):  # any order
        for key, group in part.items():
            add_group(groups.setdefault(key, {}), group)
    now = QualityFigures.of(summary_of(groups, cfg), cfg)
    assert _as_json(now) == _as_json(figures_of(clips, cfg))
    # each speaker's outliers at each k: the clips the rule itself drops (a range where rates fall between keys)
    hists = quality_rules.rate_histograms(clips)
    for k, out in now.per_k.items():
        rules = dataclasses.replace(cfg.quality_rules, rate_iqr_k=k)
        gate = quality_rules.QualityGate(rules, 22050, quality_rules.rate_bounds(hists, rules))
        for name in {c["speaker"] for c in clips}:
            dropped = sum(quality_rules.rate_rejection(c, gate) is not None for c in clips if c["speaker"] == name)
            least, most = out.get(name, (0, 0))
            assert least <= dropped <= most, (k, name)


def test_the_job_sums_each_group_where_its_key_lands_and_one_worker_holds_figures_per_speaker():
    # 60 speakers of 1 to 30 clips: the element the run's summary is summed into holds each speaker's figures
    # (a fixed size), the corpus's and each language's histograms, and no histogram of any speaker
    rnd = random.Random(3)
    clips = [
        clip(f"s{i}", ("en-US", "en-GB")[i % 2], rnd.uniform(8, 20), rnd.uniform(5, 60))
        for i in range(60)
        for _ in range(1 + i % 30)
    ]
    cfg = PreprocessConfig()
    bins = measure_bins(cfg.audio.sample_rate, cfg.mel.n_fft)
    then = figures_of(clips, cfg, bins)
    with beam_pipeline() as p:
        batches = p | beam.Create([{"clips": clips[i : i + 32]} for i in range(0, len(clips), 32)] + [{"clips": []}])
        summary = batches | QualityHistograms(cfg)
        gate = batches | SpeakingRateBounds(cfg)

        def check(found):
            ((s,),) = [found]
            assert _as_json(QualityFigures.of(s, cfg)) == _as_json(then)
            assert set(s["groups"]) == {("corpus", ""), ("language", "en-US"), ("language", "en-GB")}
            assert len(s["speakers"]) == 60 and all(
                "histogram" not in f for x in s["speakers"].values() for f in x.values()
            )
            sizes = {len(pickle.dumps(s["speakers"][name])) for name in ("s0", "s29")}  # 1 clip and 30
            assert max(sizes) - min(sizes) < 16  # digits of the figures, not clips

        def check_gate(found):
            ((g,),) = [found]
            assert g.rate == quality_rules.rate_bounds(quality_rules.rate_histograms(clips), cfg.quality_rules)

        assert_that(summary, check, label="summary")
        assert_that(gate, check_gate, label="gate")


def test_the_shipped_corpus_stats_json_quality_figures_are_those_of_the_pure_functions(shards_dir, corpus_dir):
    # the clips measured in this process as the job measures them, their figures by the pure functions summed
    # at once, against the session run's stats.json: the same text
    cfg = load_config(str(TINY_CONFIG))
    rows = read_input(detect_corpus(str(corpus_dir))).rows
    clips = []
    for row, text in zip(rows, prepare_texts(rows, cfg)):
        with contextlib.suppress(ClipRejected):
            clips.append(featurize(row, cfg, text)[0])
    bins = measure_bins(cfg.audio.sample_rate, cfg.mel.n_fft, cfg.quality.dnsmos)
    then = figures_of(clips, cfg, bins)
    stats = json.loads((shards_dir / "stats.json").read_text())
    assert json.dumps(stats["quality"], indent=2) == json.dumps(then.section(), indent=2)
    for row in stats["speakers"]:
        expected = then.speaker(row["name"])
        assert json.dumps({k: row[k] for k in expected}, indent=2) == json.dumps(expected, indent=2)
    for row in stats["languages"]:
        assert json.dumps(row["quality"], indent=2) == json.dumps(then.language(row["code"])["quality"], indent=2)
    assert stats["quality"]["global"]["snr_db"]["count"] == len(clips)  # every measured clip


def test_rate_outliers_of_a_small_speaker_are_counted_at_its_pace_as_the_rule_drops_them():
    # slow (6 clips, median 8) and fast (5, median 16) read at 0.75..1.25 of their medians but slow's 17;
    # with rate_min_clips 8 neither has bounds of its own: each is judged at its median times en's spread
    clips = [clip("slow", "en", r, 40) for r in (6, 7, 8, 9, 10, 17)]
    clips += [clip("fast", "en", r, 40) for r in (12, 14, 16, 18, 20)]
    cfg = PreprocessConfig(quality_rules=dataclasses.replace(QualityRulesConfig(), rate_min_clips=8))
    q = figures_of(clips, cfg)
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
