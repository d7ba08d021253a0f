"""The quality rules as pure functions (exact values) and the duplicate-recording transform."""

from __future__ import annotations

import array
import contextlib
import dataclasses
import io
import json
import math
import re
import unicodedata
from collections import Counter

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to

from benchmarks.quality import faults
from melshards.preprocess.clip.quality import MEASURES
from melshards.preprocess.config import QualityRulesConfig
from melshards.preprocess.inputs.merge import MergedInputs
from melshards.preprocess.inputs.rows import row
from melshards.preprocess.inputs.working_set import WorkingSet
from melshards.preprocess.out_dir import duplicate_marks
from melshards.preprocess.stats import quality_rules
from melshards.preprocess.stats.filter_rule import filter_rejection
from melshards.preprocess.stats.quality_rules import QualityGate, quality_rejection
from melshards.preprocess.stats.quality_stage import DuplicateAudio, RepeatedHashes, hash_prefixes, repeated_prefixes
from melshards.preprocess.write.filter_and_write import dropped_counts
from melshards.preprocess.write.report import mostly_dropped, quality_dropped_by_speaker
from melshards.reports.stats_json_tables import mostly_dropped_lines, quality_loss_lines, rate_unjudged_lines
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


def _rated(speaker, language, rates):
    return [{"speaker": speaker, "language": language, "quality": {"speaking_rate": r}} for r in rates]


def test_rate_bounds_are_per_speaker_in_a_language_then_the_language_never_another_language():
    clips = _rated("fast", "en", (20, 21, 22, 23)) + _rated("slow", "en", (8, 9, 10, 11))
    clips += _rated("bi", "en", (12, 13, 14, 15)) + _rated("bi", "cmn", (2.5, 3, 3.5, 4))  # one speaker, two languages
    clips += _rated("new", "de", (15.0,)) + _rated("mute", "de", (math.nan,))
    hists = quality_rules.rate_histograms(clips)
    bounds = quality_rules.rate_bounds(hists, dataclasses.replace(RULES, rate_iqr_k=2.0, rate_min_clips=4))
    assert bounds["speaker"] == {
        ("fast", "en"): (16.0, 26.0),
        ("slow", "en"): (4.0, 14.0),
        ("bi", "en"): (8.0, 18.0),  # Q1 12, Q3 14
        ("bi", "cmn"): (0.5, 5.5),  # Q1 2.5, Q3 3.5: not pooled with bi's English
    }
    assert bounds["language"] == {"en": (-10.0, 40.0), "cmn": (0.5, 5.5)}  # en: Q1 10, Q3 20 of 12 rates
    assert "de" not in bounds["language"] and "corpus" not in bounds  # de: 1 rated clip < 4
    assert quality_rules.bounds_for(bounds, "fast", "en") == ((16.0, 26.0), "speaker fast")
    assert quality_rules.bounds_for(bounds, "bi", "cmn") == ((0.5, 5.5), "speaker bi")
    assert quality_rules.bounds_for(bounds, "new", "de") is None  # unjudged, not judged by en's or all's
    assert quality_rules.unjudged_languages(hists, dataclasses.replace(RULES, rate_min_clips=4)) == {"de": 1}
    assert quality_rules.unjudged_languages(hists, dataclasses.replace(RULES, rate_iqr_k=None)) == {}


def test_by_default_a_speaker_needs_20_rated_clips_for_bounds_of_its_own_and_5_for_its_pace_at_k_3():
    # one clip is more than 5% of a speaker of fewer than 20, whose quartiles are too noisy to judge it by
    # (benchmarks/quality/rate_bounds.py): from 5 clips its median sets its pace in its language's spread;
    # below 5 it takes its language's bounds
    clips = _rated("big", "en", [14.0] * 5 + [15.0] * 10 + [16.0] * 5)  # Q1 14, Q3 15
    clips += _rated("small", "en", [13.0 + 0.25 * i for i in range(19)])
    clips += _rated("few", "en", [13.0, 14.0, 15.0, 16.0])
    bounds = quality_rules.rate_bounds(quality_rules.rate_histograms(clips), RULES)
    assert bounds["speaker"] == {("big", "en"): (11.0, 18.0)}  # 14 - 3 x 1 .. 15 + 3 x 1
    assert set(bounds["pace"]) == {("small", "en")}
    assert quality_rules.bounds_for(bounds, "small", "en") == (
        bounds["pace"]["small", "en"],
        "speaker small at language en's spread",
    )
    assert quality_rules.bounds_for(bounds, "few", "en") == (bounds["language"]["en"], "language en")


def test_a_ratio_key_is_thousandths_of_the_speakers_median_rounded_half_up():
    assert quality_rules.pace_ratio_key(1250, 1000) == 1250
    assert quality_rules.pace_ratio_key(1, 3) == 333  # 333.33
    assert quality_rules.pace_ratio_key(2, 3) == 667  # 666.67
    assert quality_rules.pace_ratio_key(1, 2000) == 1  # 0.5: half up


def _paces():
    # slow and fast read at 6..10 and 12..20 symbols/s: both 0.75..1.25 of their medians (8, 16);
    # tiny has 2 clips, too few for a median; in de only d1 has 5 clips, d2 4
    clips = _rated("slow", "en", (6, 7, 8, 9, 10)) + _rated("fast", "en", (12, 14, 16, 18, 20))
    clips += _rated("tiny", "en", (30, 31))
    clips += _rated("d1", "de", (10, 11, 12, 13, 14)) + _rated("d2", "de", (10, 11, 12, 13))
    return quality_rules.rate_histograms(clips), dataclasses.replace(RULES, rate_iqr_k=1.0, rate_min_clips=8)


def test_a_small_speaker_is_bounded_at_its_pace_its_median_times_its_languages_spread_at_twice_k():
    hists, rules = _paces()
    ratios = quality_rules.pace_ratios(hists)
    # speakers of at least 5 clips only: tiny's and d2's rates are not in the spread
    assert ratios == {
        "en": Counter({750: 2, 875: 2, 1000: 2, 1125: 2, 1250: 2}),
        "de": Counter([833, 917, 1000, 1083, 1167]),
    }
    bounds = quality_rules.rate_bounds(hists, rules)
    # en's ratios: q1 0.875, q3 1.125 (10 of them >= rate_min_clips 8) -> 0.375 .. 1.625 of the median at
    # k 2 (PACE_K_FACTOR x rate_iqr_k 1)
    assert bounds["pace"] == {("slow", "en"): (3.0, 13.0), ("fast", "en"): (6.0, 26.0)}
    assert bounds["speaker"] == {}
    assert bounds["language"] == {"en": (-2.0, 28.0), "de": (9.0, 15.0)}  # de: Q1 11, Q3 13 of 9 rates
    # tiny has too few clips for a median: en's bounds (Q1 8, Q3 18 of 12 rates, k 1); d1 is in a language
    # of 9 clips but 5 pace ratios (< 8): de's bounds
    assert quality_rules.bounds_for(bounds, "tiny", "en") == ((-2.0, 28.0), "language en")
    assert quality_rules.bounds_for(bounds, "d1", "de")[1] == "language de"
    gate = QualityGate(rules, 22050, bounds)
    assert quality_rejection(_clip("s", "slow", speaking_rate=14.0) | {"text": "abc"}, gate) == (
        "speaking_rate_outlier",
        "speaking_rate=14.00 outside 3.00..13.00 (speaker slow at language en's spread)",
    )
    assert quality_rejection(_clip("f", "fast", speaking_rate=14.0) | {"text": "abc"}, gate) is None
    off = quality_rules.rate_bounds(hists, dataclasses.replace(rules, rate_iqr_k=None))
    assert off == {"speaker": {}, "pace": {}, "language": {}}


def test_a_small_mandarin_group_is_left_unjudged_not_judged_by_latin_letter_bounds():
    # the run: 8 cmn clips (2 speakers) at 2.5-3.55 characters/s beside 40 Latin-letter clips at
    # 14-15.95 letters/s; with the default rate_min_clips (20) no cmn group has bounds of its own
    clips = _rated("en1", "en", [14 + 0.05 * i for i in range(40)])
    zh = [(f"zh{i}", "zh1" if i < 4 else "zh2", 2.5 + 0.15 * i) for i in range(8)]
    clips += [c for i, s, r in zh for c in _rated(s, "cmn", (r,))]
    hists = quality_rules.rate_histograms(clips)
    gate = _gate(rate=quality_rules.rate_bounds(hists, RULES))
    assert quality_rules.unjudged_languages(hists, RULES) == {"cmn": 8}
    for i, s, r in zh:
        cmn = _clip(i, s, "cmn", speaking_rate=r) | {"text": "今天天气很好。"}
        assert quality_rejection(cmn, gate) is None
    assert quality_rejection(_clip("x", "en1", speaking_rate=3.0) | {"text": "yes"}, gate) == (
        "speaking_rate_outlier",
        "speaking_rate=3.00 outside 11.45..18.45 (speaker en1)",  # en1: Q1 14.45, Q3 15.45; the default k 3
    )


def test_the_kind_of_symbol_is_phones_in_a_phone_run_else_syllabic_for_mostly_han_kana_hangul():
    kinds = {
        "今天天气很好。": "syllabic",
        "こんにちは": "syllabic",
        "ｶﾀｶﾅ": "syllabic",  # halfwidth katakana
        unicodedata.normalize("NFD", "안녕"): "syllabic",  # Hangul as jamo, composed into syllables by NFKC
        "CDを買った": "syllabic",  # 4 of 6 letters
        "안녕하세요": "syllabic",
        "the quick brown fox": "alphabetic",
        "ˈhɛloʊ wˈɜːld": "alphabetic",  # the phonemes front end's IPA
        "12, 13.": "alphabetic",  # no letter
    }
    assert {text: quality_rules.symbol_kind(text, "character") for text in kinds} == kinds
    assert quality_rules.symbol_kind("HH AH0 L OW1", "phone") == "phone"


def test_no_clip_is_read_faster_than_its_kind_of_symbols_ceiling_even_unjudged():
    gate = _gate()  # no group has bounds: a corpus too small for any
    huge = _clip(speaking_rate=100_000 / 3.808) | {"text": "a" * 100_000}
    assert quality_rejection(huge, gate) == (
        "speaking_rate_outlier",
        "speaking_rate=26260.50 > 60 (alphabetic symbols: faster than any speech)",
    )
    zh = _clip(language="cmn", speaking_rate=30.0) | {"text": "今天天气很好。"}
    assert quality_rejection(zh, gate) == (
        "speaking_rate_outlier",
        "speaking_rate=30.00 > 25 (syllabic symbols: faster than any speech)",
    )
    assert quality_rejection(zh | {"text": "jintian tianqi hen hao"}, gate) is None  # 30 letters/s: possible
    phones = QualityGate(RULES, 22050, text_unit="phone")
    assert quality_rejection(_clip(speaking_rate=41.0) | {"text": "AH0 " * 40}, phones) == (
        "speaking_rate_outlier",
        "speaking_rate=41.00 > 40 (phone symbols: faster than any speech)",
    )
    off = QualityGate(dataclasses.replace(RULES, rate_iqr_k=None), 22050)
    assert quality_rejection(huge, off) is None  # rate_iqr_k: null turns the whole rate rule off


def test_speaking_rate_outlier_is_judged_against_its_own_speaker():
    gate = _gate(rate={"speaker": {("fast", "en"): (16.0, 26.0), ("slow", "en"): (4.0, 14.0)}})
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


CUT = Cutoffs(0, 1, 10_000, 100, 10_000, 10_000)  # text_len above 100: text_len_above_cutoff
TABLES = {"dropped_speakers": {}, "min_speaker_clips": 1}


def _copy(clip_id, text_len=5, **quality):
    return _clip(clip_id, **quality) | {"text_len": text_len, "mel_frames": 100, "duration_ms": 1000, "text": "x"}


def _verdicts(copies, places):
    """The filter's verdict on each copy of one recording: `duplicates_of` over the copies that pass the
    rest, marked on the clips (as the writer reads them back), then `filter_rejection`."""
    gate = _gate()
    members = [(place, c["id"], filter_rejection(c, CUT, TABLES, gate) is None) for place, c in zip(places, copies)]
    marked = duplicate_marks.mark_duplicates(copies, dict(quality_rules.duplicates_of(members)))
    return {c["id"]: filter_rejection(c, CUT, TABLES, gate) for c in marked}


def test_of_copies_that_all_pass_the_first_by_input_order_is_kept_and_the_rest_name_it():
    got = _verdicts([_copy("b"), _copy("a"), _copy("c")], [(0, 5), (0, 2), (1, 0)])
    assert got["a"] is None  # input 0, row 2: the first
    assert got["b"] == {"id": "b", "reason": "duplicate_audio", "detail": "audio_hash=h same as kept a"}
    assert got["c"]["detail"] == "audio_hash=h same as kept a"


def test_a_copy_pair_whose_first_copy_fails_a_cutoff_or_a_rule_keeps_the_second():
    cut = _verdicts([_copy("first", text_len=500), _copy("second")], [(0, 0), (1, 0)])
    assert cut["first"]["reason"] == "text_len_above_cutoff" and cut["second"] is None
    noisy = _verdicts([_copy("first", snr_db=3.0), _copy("second"), _copy("third")], [(0, 0), (0, 1), (0, 2)])
    assert noisy["first"]["reason"] == "noisy" and noisy["second"] is None
    assert noisy["third"]["detail"] == "audio_hash=h same as kept second"  # a copy actually kept
    both = _verdicts([_copy("first", snr_db=3.0), _copy("second", clipped_fraction=0.5)], [(0, 0), (0, 1)])
    assert [r["reason"] for r in both.values()] == ["noisy", "clipped"]  # none passes: each its own reason
    assert quality_rules.duplicates_of([((0, 0), "a", False), ((0, 1), "b", False)]) == []


def test_duplicate_audio_joins_each_batch_with_its_verdicts_first_passing_copy_by_input_then_row(tmp_path):
    from melshards.preprocess.out_dir.batch_files import read_clips, write_measured

    # the second input's rows come first in it (rows 0, 1), the first input's late (rows 7..9): the
    # first input still wins; within it row 7 comes before row 9, but row 7's text is cut off: row 9 is kept
    first = [row("late", "x", "1.wav", 7), row("solo", "x", "2.wav", 8), row("later", "x", "3.wav", 9)]
    second = [row("early", "x", "4.wav", 0), row("again", "x", "5.wav", 1)]
    with WorkingSet() as working_set:
        rows = list(MergedInputs([("a", first), ("b", second)], working_set).rows())
    assert [r["input"] for r in rows] == [0, 0, 0, 1, 1]
    # audio hashes (SHA-256 in hex): solo's shares its first 8 bytes with the others', not the rest
    same, other = "ab" * 32, "ab" * 8 + "cd" * 24
    hashes = {"late": same, "solo": other, "later": same, "early": same, "again": same}
    clips = [
        dict(r, **_copy(r["id"], text_len=500 if r["id"] == "late" else 5) | {"audio_hash": hashes[r["id"]]})
        for r in rows
    ]
    batches = [write_measured(str(tmp_path), part, [{}] * len(part)) for part in (clips[3:], clips[:3])]
    empty = {"clips": None, "features": None, "count": 0}  # a batch of no clips passes through
    with beam_pipeline() as p:
        side = [p | name >> beam.Create([v]) for name, v in (("Cut", CUT), ("Tables", TABLES), ("Gate", _gate()))]
        side.append(p | "Clips" >> beam.Create([{"clips": clips[:2]}, {"clips": clips[2:]}]) | RepeatedHashes())
        out = (
            p
            | beam.Create([*batches, empty])
            | DuplicateAudio(*side)
            | beam.FlatMap(
                lambda b: [(c["id"], c.get(duplicate_marks.DUPLICATE_OF)) for c in read_clips(b)] or [("-", None)]
            )
        )
        expected = [
            ("late", None),
            ("solo", None),
            ("later", None),
            ("early", "later"),
            ("again", "later"),
            ("-", None),
        ]
        assert_that(out, equal_to(expected))


def test_only_copies_whose_hash_prefix_another_clip_shares_are_grouped_by_their_whole_hash(tmp_path):
    # a million distinct recordings cross the shuffle as 8 packed bytes each; the clips of a repeated prefix
    # (here a duplicate pair, and a clip sharing their first 8 bytes only) as (hash, place) pairs
    from melshards.preprocess.out_dir.batch_files import write_measured
    from melshards.preprocess.stats.quality_stage import _copies

    hashes = ["ab" * 32, "ab" * 8 + "cd" * 24, "ab" * 32, *(f"{i:016x}" + "0" * 48 for i in range(1, 98))]
    clips = [dict(_copy(f"c{i}"), audio_hash=h, input=0, row=i) for i, h in enumerate(hashes)]
    parts = {}
    for first, prefixes in hash_prefixes(clips[:50]) + hash_prefixes(clips[50:]):
        parts.setdefault(first, array.array("Q")).extend(prefixes)
    repeated = np.sort(np.concatenate([np.frombuffer(repeated_prefixes(kv), np.uint64) for kv in parts.items()]))
    assert repeated.tolist() == [int("ab" * 8, 16)]
    batch = write_measured(str(tmp_path), clips, [{}] * len(clips))
    found = list(_copies(batch, CUT, TABLES, _gate(), repeated))
    assert [(key.hex(), place[2]) for key, place in found] == [(hashes[0], "c0"), (hashes[1], "c1"), (hashes[2], "c2")]
    assert list(_copies(batch, CUT, TABLES, _gate(), None)) == []  # none repeated (no clips): none read


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory):
    """One `melshards preprocess` (default quality rules; in this process, its job in a job process) of a
    one-speaker fault corpus (benchmarks/quality/faults.py): 13 clean clips and one clip of each fault kind
    (21 clips: enough for rate bounds of the speaker's own) -> its rows, its rejected.jsonl rows, its
    stats.json and the summary it printed."""
    from melshards.commands.preprocess import run

    work = tmp_path_factory.mktemp("faults")
    rows = faults.build_fault_corpus(work / "corpus", clean=13, per_fault=1, speakers=("fast",), parts=1)
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
    rules = "clipped 1, narrowband 1, noisy 1, long_pause 1, transcript_mismatch 1, speaking_rate_outlier 1"
    assert f"  fast  7 of {fast['measured']} ({share}): {rules}, duplicate_audio 1\n" in printed


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


def test_the_speakers_and_languages_mostly_dropped_are_listed_languages_first_largest_share_first():
    speakers = [
        {"name": "a", "measured": 10, "per_reason": {"noisy": 5}},  # half: not most
        {"name": "b", "measured": 4, "per_reason": {"clipped": 2, "too_short": 1}},
        {"name": "c", "measured": 2, "per_reason": {"speaker_too_few_clips": 2}},
    ]
    languages = [
        {"code": "en", "before_filter": {"text_len": {"count": 14}}, "per_reason": {"noisy": 5, "clipped": 2}},
        {"code": "cmn", "before_filter": {"text_len": {"count": 2}}, "per_reason": {"speaker_too_few_clips": 2}},
    ]
    found = mostly_dropped(speakers, languages)
    assert [(x["kind"], x["name"], x["dropped"], x["measured"]) for x in found] == [
        ("language", "cmn", 2, 2),
        ("speaker", "c", 2, 2),
        ("speaker", "b", 3, 4),
    ]
    assert mostly_dropped_lines({"mostly_dropped": found}, most=2) == [
        "WARNING: the filter dropped most of the clips of 1 language and 2 speakers (stats.json mostly_dropped); "
        "listen to some of their rejected.jsonl rows before training without them:",
        "  language cmn  2 of 2 (100.0%): speaker_too_few_clips 2",
        "  speaker c     2 of 2 (100.0%): speaker_too_few_clips 2",
        "  ... and 1 more (stats.json mostly_dropped)",
    ]
    assert mostly_dropped_lines({"mostly_dropped": []}) == mostly_dropped_lines({}) == []


def test_the_summary_says_which_languages_the_rate_bounds_did_not_judge_and_why():
    unjudged = [{"language": "cmn", "frontend": "characters", "rated": 8, "speakers": ["zh1", "zh2"]}]
    stats = {"quality": {"rules": {"rate_min_clips": 10}, "rate_unjudged": unjudged}}
    assert rate_unjudged_lines(stats) == [
        "speaking-rate rule: 1 language with fewer than 10 rated clips (quality_rules.rate_min_clips) judged by no "
        "bounds, only by the ceiling on symbols per second (other languages' rates are no measure of theirs):",
        "  cmn (characters front end): 8 rated clips; speakers zh1, zh2",
    ]
    assert rate_unjudged_lines({"quality": {"rate_unjudged": []}}) == rate_unjudged_lines({}) == []


ZH = ("今天天气很好。", "我们明天去北京。", "这本书非常有意思。")


@pytest.fixture(scope="module")
def merged_run(tmp_path_factory):
    """One `melshards preprocess` of two manifests (the demo speech, default quality rules but
    `rate_min_clips` 10, so that English has rate bounds): input a holds 11 clips of en1, one of them
    `copy_a` with another clip's text (its asr_text is what it says), three Mandarin clips of zh1 and a
    French clip of big with a 100,000-character text; input b holds `copy_b`, copy_a's audio with its right
    text. -> its rejected.jsonl rows by id, stats.json and the summary."""
    import soundfile
    import yaml

    from benchmarks.make_big_corpus import good_clips
    from melshards.commands.preprocess import run

    work = tmp_path_factory.mktemp("merged")
    (work / "wavs").mkdir()
    demo = good_clips()[:16]  # (id, text, audio)
    inputs: dict[str, list[dict]] = {"a": [], "b": []}

    def add(part, clip_id, speaker, language, text, audio, **extra):
        soundfile.write(work / "wavs" / f"{clip_id}.wav", audio, 22050, subtype="PCM_16")
        row = {"id": clip_id, "speaker": speaker, "language": language, "text": text, "audio": f"wavs/{clip_id}.wav"}
        inputs[part].append(row | extra)

    for i, (_, text, audio) in enumerate(demo[:10]):
        add("a", f"en1_{i}", "en1", "en", text, audio)
    _, text, audio = demo[10]
    add("a", "copy_a", "en1", "en", demo[11][1], audio, asr_text=text)  # a wrong transcript
    for i, zh in enumerate(ZH):
        add("a", f"zh_{i}", "zh1", "cmn", zh, demo[12 + i][2])
    add("a", "big", "big", "fr", "bonjour " * 12_500, demo[15][2])
    add("b", "copy_b", "en2", "en", text, audio)  # the same recording, its right transcript
    for part, rows in inputs.items():
        (work / f"{part}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = work / "out"
    config = work / "config.yaml"
    config.write_text(
        yaml.safe_dump(yaml.safe_load(TINY_CONFIG.read_text()) | {"quality_rules": {"rate_min_clips": 10}})
    )
    args = ["--input", str(work / "a.jsonl"), "--input", str(work / "b.jsonl"), "--output", str(out)]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert run([*args, "--config", str(config)]) == 0
    rejected = {r["id"]: r for r in map(json.loads, (out / "rejected.jsonl").read_text().splitlines())}
    return rejected, json.loads((out / "stats.json").read_text()), printed.getvalue()


def test_a_merged_run_keeps_the_good_copy_judges_no_language_by_another_and_says_so_first(merged_run):
    rejected, stats, printed = merged_run
    assert rejected["copy_a"]["reason"] == "transcript_mismatch" and "copy_b" not in rejected  # the good copy kept
    assert not [i for i in rejected if i.startswith("zh_")]  # 3 Mandarin clips: too few to judge, none judged
    assert rejected["big"]["reason"] == "speaking_rate_outlier"
    assert re.fullmatch(
        r"speaking_rate=[0-9.]+ > 60 \(alphabetic symbols: faster than any speech\)", rejected["big"]["detail"]
    )
    assert stats["padding"]["max_text_len"] < 1000  # the 100,000 characters set no padding
    assert stats["quality"]["rate_unjudged"] == [
        {"language": "cmn", "frontend": "characters", "rated": 3, "speakers": ["zh1"]},
        {"language": "fr", "frontend": "characters", "rated": 1, "speakers": ["big"]},
    ]
    assert stats["mostly_dropped"] == [
        {"kind": "language", "name": "fr", "measured": 1, "dropped": 1, "per_reason": {"speaking_rate_outlier": 1}},
        {"kind": "speaker", "name": "big", "measured": 1, "dropped": 1, "per_reason": {"speaking_rate_outlier": 1}},
    ]
    summary = printed[printed.index("\nWARNING") :]  # the summary's first line
    assert summary.startswith("\nWARNING: the filter dropped most of the clips of 1 language and 1 speaker")
    assert summary.index("  speaker big  1 of 1 (100.0%): speaking_rate_outlier 1") < summary.index(" input rows in ")
    assert "  cmn (characters front end): 3 rated clips; speakers zh1\n" in summary
