"""The quality rules as pure functions (exact values) and the duplicate-recording transform."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import re
from collections import Counter

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from benchmarks import quality_faults
from melshards.preprocess import quality_rules
from melshards.preprocess.clips import filter_rejection
from melshards.preprocess.config import QualityRulesConfig
from melshards.preprocess.filter_and_write import dropped_counts
from melshards.preprocess.global_stats import DuplicateAudio
from melshards.preprocess.merge import MergedInputs
from melshards.preprocess.quality import MEASURES
from melshards.preprocess.quality_rules import QualityGate, quality_rejection
from melshards.preprocess.report import quality_dropped_by_speaker
from melshards.preprocess.rows import row
from melshards.preprocess.spill import Spill
from melshards.reports.stats_json_tables import quality_loss_lines
from melshards.shards_schema.stats import QUALITY_REASONS, Cutoffs
from tests.conftest import TINY_CONFIG
from tests.preprocess.conftest import beam_pipeline

RULES = QualityRulesConfig()
CLEAN = dict.fromkeys(MEASURES, math.nan) | {
    "speaking_rate": 12.0,
    "longest_pause_s": 0.3,
    "clipped_fraction": 0.0,
    "clipped_run_max": 0.0,
    "bandwidth_hz": 10000.0,
    "snr_db": 40.0,
}


def _clip(clip_id="a", speaker="s1", language="en", **quality):
    return {"id": clip_id, "speaker": speaker, "language": language, "quality": CLEAN | quality, "audio_hash": "h"}


def _gate(**kw):
    return QualityGate(RULES, 22050, **kw)


def test_iqr_bounds_are_q1_minus_k_iqr_to_q3_plus_k_iqr_of_observed_rates():
    # rates 10, 11, 12, 13 symbols/s: inverted-CDF Q1 = 10 (CDF 0.25), Q3 = 12; IQR 2
    hist = {1000: 1, 1100: 1, 1200: 1, 1300: 1}
    assert quality_rules.iqr_bounds(hist, 2.0) == (6.0, 16.0)


def test_rate_bounds_per_speaker_fall_back_to_language_then_corpus():
    clips = [{"speaker": "fast", "language": "en", "quality": {"speaking_rate": r}} for r in (20, 21, 22, 23)]
    clips += [{"speaker": "slow", "language": "en", "quality": {"speaking_rate": r}} for r in (8, 9, 10, 11)]
    clips += [{"speaker": "new", "language": "de", "quality": {"speaking_rate": 15.0}}]
    clips += [{"speaker": "mute", "language": "de", "quality": {"speaking_rate": math.nan}}]
    hists = quality_rules.rate_histograms(clips)
    bounds = quality_rules.rate_bounds(hists, dataclasses.replace(RULES, rate_min_clips=4))
    assert bounds["speaker"] == {"fast": (16.0, 26.0), "slow": (4.0, 14.0)}
    assert bounds["language"] == {"en": (-15.0, 45.0)}  # Q1 9, Q3 21 of 8 rates
    assert bounds["corpus"] == {"": (-12.0, 43.0)}  # Q1 10, Q3 21 of 9 rates
    assert "de" not in bounds["language"]  # 1 rated clip < 4
    assert quality_rules.bounds_for(bounds, "fast", "en") == ((16.0, 26.0), "speaker fast")
    assert quality_rules.bounds_for(bounds, "new", "de") == ((-12.0, 43.0), "corpus")
    assert quality_rules.bounds_for({"speaker": {}, "language": {}, "corpus": {}}, "x", "en") is None


def test_speaking_rate_outlier_is_judged_against_its_own_speaker():
    gate = _gate(rate={"speaker": {"fast": (16.0, 26.0), "slow": (4.0, 14.0)}})
    assert quality_rejection(_clip(speaker="fast", speaking_rate=22.0), gate) is None
    assert quality_rejection(_clip(speaker="slow", speaking_rate=22.0), gate) == (
        "speaking_rate_outlier",
        "speaking_rate=22.00 outside 4.00..14.00 (speaker slow)",
    )


def test_each_absolute_bound_names_measure_value_and_bound():
    gate = _gate()
    cases = {
        "clipped": ({"clipped_fraction": 0.02}, "clipped_fraction=0.02000 > 0.001"),
        "narrowband": ({"bandwidth_hz": 3990.0}, "bandwidth_hz=3990 < 5512 (0.5 of Nyquist)"),
        "noisy": ({"snr_db": 3.25}, "snr_db=3.2 < 15.0"),
        "long_pause": ({"longest_pause_s": 1.5}, "longest_pause_s=1.50 > 1.0"),
        "transcript_mismatch": ({"cer": 0.8}, "cer=0.800 > 0.5"),
    }
    for reason, (quality, detail) in cases.items():
        assert quality_rejection(_clip(**quality), gate) == (reason, detail)
    asr = QualityGate(dataclasses.replace(RULES, max_asr_repeat=2.0, max_foreign_script_fraction=0.1), 22050)
    assert quality_rejection(_clip(asr_repeat=3.0), asr) == ("asr_repeat", "asr_repeat=3 > 2.0")
    assert quality_rejection(_clip(foreign_script_fraction=0.25), asr) == (
        "foreign_script",
        "foreign_script_fraction=0.250 > 0.1",
    )
    assert quality_rejection(_clip(), gate) is None


def test_a_bound_of_none_turns_its_rule_off_and_nan_breaks_no_rule():
    off = QualityGate(dataclasses.replace(RULES, min_snr_db=None), 22050)
    assert quality_rejection(_clip(snr_db=0.0), off) is None
    assert quality_rejection(_clip(snr_db=math.nan, cer=math.nan), _gate()) is None


def test_the_filter_rule_rejects_a_duplicate_naming_the_kept_id():
    tables = {"dropped_speakers": {}, "min_speaker_clips": 1}
    cut = Cutoffs(0, 1, 10_000, 10_000, 10_000, 10_000)
    clip = _clip("b") | {"text_len": 5, "mel_frames": 100, "duration_ms": 1000}
    got = filter_rejection(clip, cut, tables, _gate(duplicates={"b": "a"}))
    assert got is not None and got["reason"] == "duplicate_audio"
    assert got["detail"] == "audio_hash=h same as kept a"


def test_duplicate_audio_keeps_the_earliest_input_then_its_earliest_row():
    # the second input's rows come first in it (rows 0, 1), the first input's late (rows 7..9): the
    # first input still wins; within it, row 7 before row 9
    first = [row("late", "x", "1.wav", 7), row("solo", "x", "2.wav", 8), row("later", "x", "3.wav", 9)]
    second = [row("early", "x", "4.wav", 0), row("again", "x", "5.wav", 1)]
    with Spill() as spill:
        rows = list(MergedInputs([("a", first), ("b", second)], spill).rows())
    assert [r["input"] for r in rows] == [0, 0, 0, 1, 1]
    hashes = {"late": "H", "solo": "S", "later": "H", "early": "H", "again": "H"}
    clips = [dict(r, audio_hash=hashes[r["id"]]) for r in rows]
    with beam_pipeline() as p:
        out = p | beam.Create([{"clips": clips[3:]}, {"clips": clips[:3]}]) | DuplicateAudio()
        assert_that(out, equal_to([("later", "late"), ("early", "late"), ("again", "late")]))


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory):
    """One `melshards preprocess` (default quality rules; in this process, its job in a job process) of a
    one-speaker fault corpus (benchmarks/quality_faults.py): 6 clean clips and one clip of each fault kind
    -> its rows, its rejected.jsonl rows, its stats.json and the summary it printed."""
    from melshards.commands.preprocess import run

    work = tmp_path_factory.mktemp("faults")
    rows = quality_faults.build_fault_corpus(work / "corpus", clean=6, per_fault=1, speakers=("fast",), parts=1)
    out = work / "out"
    args = ["--input", str(work / "corpus" / "manifest.jsonl"), "--output", str(out), "--config", str(TINY_CONFIG)]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert run(args) == 0
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines() if line.strip()]
    return rows, rejected, json.loads((out / "stats.json").read_text()), printed.getvalue()


def test_each_fault_kind_is_rejected_with_its_reason(fault_run):
    rows, rejected, *_ = fault_run
    why = {r["id"]: r["reason"] for r in rejected}
    expected = {
        "transcript": "transcript_mismatch",
        "clipped": "clipped",
        "narrowband": "narrowband",
        "noisy": "noisy",
        "pause": "long_pause",
        "rate": "speaking_rate_outlier",
        "duplicate": "duplicate_audio",
    }
    assert {r["fault"]: why.get(r["id"]) for r in rows if r["fault"]} == expected
    lost = [r["id"] for r in rows if r["fault"] is None and why.get(r["id"]) in QUALITY_REASONS]
    assert not lost


def test_a_duplicate_names_the_clip_kept_and_the_counts_add_up(fault_run):
    rows, rejected, stats, _ = fault_run
    (pair,) = [r for r in rows if r["fault"] == "duplicate"]
    (entry,) = [r for r in rejected if r["id"] == pair["id"]]
    assert entry["detail"].endswith(f"same as kept {pair['pair']}")
    counts = stats["counts"]
    assert counts["input_rows"] == len(rows)
    assert counts["in_shards"] + counts["filtered"] + counts["rejected"] == len(rows)
    assert counts["filtered"] >= sum(counts["per_reason"].get(r, 0) for r in QUALITY_REASONS) == 7
    assert counts["in_shards"] == len(rows) - len(rejected)
    assert counts["per_reason"]["duplicate_audio"] == 1


def test_stats_json_holds_the_quality_figures_and_each_speakers_drops_per_rule(fault_run):
    from collections import Counter

    from melshards.reports.quality_tables import quality_report
    from melshards.shards_schema.stats import FILTER_REASONS

    _, rejected, stats, _ = fault_run
    (speaker,) = stats["speakers"]
    assert speaker["per_reason"] == dict(Counter(r["reason"] for r in rejected if r["reason"] in FILTER_REASONS))
    snr = stats["quality"]["global"]["snr_db"]
    assert (
        snr["count"] + snr["not_measured"]
        == speaker["measured"]
        == sum(snr["histogram"].values()) + snr["not_measured"]
    )
    assert stats["quality"]["global"]["cer"]["count"] >= 1  # the rows with an asr_text
    noisy = next(w for w in quality_report(stats)["what_if"] if w["rule"] == "noisy")["rows"]
    job = next(r for r in noisy if r["is_job"])
    assert job["least"] == job["most"] >= stats["counts"]["per_reason"]["noisy"] == 1


# The measure each rule reads, as its rejected.jsonl detail names it: "measure=value <op> bound".
DETAIL = {
    "clipped": r"clipped_fraction=[0-9.]+ > 0\.001",
    "narrowband": r"bandwidth_hz=[0-9]+ < [0-9]+ \(0\.5 of Nyquist\)",
    "noisy": r"snr_db=-?[0-9.]+ < 15\.0",
    "long_pause": r"longest_pause_s=[0-9.]+ > 1\.0",
    "transcript_mismatch": r"cer=[0-9.]+ > 0\.5",
    "speaking_rate_outlier": r"speaking_rate=[0-9.]+ outside -?[0-9.]+\.\.[0-9.]+ \(speaker fast\)",
    "duplicate_audio": r"audio_hash=[0-9a-f]+ same as kept \S+",
}


def test_each_quality_rejection_in_rejected_jsonl_names_its_measure_value_and_bound(fault_run):
    _, rejected, *_ = fault_run
    quality = [r for r in rejected if r["reason"] in QUALITY_REASONS]
    assert sorted(r["reason"] for r in quality) == sorted(DETAIL)
    for r in quality:
        assert re.fullmatch(DETAIL[r["reason"]], r["detail"]), r


def test_the_summary_says_what_each_rule_dropped_from_a_speaker_losing_many(fault_run):
    _, _, stats, printed = fault_run
    assert stats["quality_dropped_by_speaker"] == {
        "fast": {reason: 1 for reason in QUALITY_REASONS if reason in DETAIL}
    }
    (fast,) = [s for s in stats["speakers"] if s["name"] == "fast"]
    share = f"{100 * 7 / fast['measured']:.1f}%"
    assert f"quality rules dropped 7 clips of {fast['measured']} measured ({share}); speakers losing 10%" in printed
    rules = "duplicate_audio 1, clipped 1, narrowband 1, noisy 1, long_pause 1, transcript_mismatch 1"
    assert f"  fast  7 of {fast['measured']} ({share}): {rules}, speaking_rate_outlier 1\n" in printed


def test_quality_drops_are_counted_per_speaker_and_rule_from_the_filters_reasons():
    a, b = {"speaker": "a", "language": "en"}, {"speaker": "b", "language": "en"}
    dropped = [(a, "noisy"), (a, "noisy"), (b, "clipped")]
    dropped += [(a, "too_short")]  # not a quality rule
    counts = dropped_counts(dropped) + Counter({("speaker", "a", "clips"): 4})
    assert quality_dropped_by_speaker(counts) == {"a": {"noisy": 2}, "b": {"clipped": 1}}


def test_the_summary_names_the_speakers_losing_at_least_a_tenth_largest_share_first():
    stats = {
        "speakers": [{"name": n, "measured": m} for n, m in (("a", 100), ("b", 10), ("c", 20), ("d", 5))],
        "quality_dropped_by_speaker": {
            "a": {"noisy": 9},  # 9%: not named
            "b": {"clipped": 1, "noisy": 1},  # 20%
            "c": {"long_pause": 5},  # 25%
            "d": {"noisy": 1},  # 20%, fewer clips than b
        },
    }
    assert quality_loss_lines(stats, most=2) == [
        "quality rules dropped 17 clips of 135 measured (12.6%); speakers losing 10% or more of their clips to them:",
        "  c  5 of 20 (25.0%): long_pause 5",
        "  b  2 of 10 (20.0%): clipped 1, noisy 1",
        "  ... and 1 more (stats.json quality_dropped_by_speaker)",
    ]
    stats["quality_dropped_by_speaker"] = {"a": {"noisy": 9}}
    assert quality_loss_lines(stats) == [
        "quality rules dropped 9 clips of 135 measured (6.7%); no speaker lost 10% or more of its clips to them"
    ]
    assert quality_loss_lines({"quality_dropped_by_speaker": {}}) == quality_loss_lines({}) == []
