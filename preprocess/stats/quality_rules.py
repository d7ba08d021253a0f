"""The filter rules on a clip's quality measures (`melshards.preprocess.clip.quality`; docs/preprocess.md,
Quality rules): pure functions, no I/O, no Beam.

Three kinds of rule:

- the speaking rate against the clips it can fairly be compared with (a rate in symbols per second
  compares only within one writing system and one text front end, and speakers differ): a clip is
  `speaking_rate_outlier` outside Q1 - k*IQR .. Q3 + k*IQR of its speaker's rates in its language
  (one language has one front end in a run); a speaker with fewer than `rate_min_clips` rated clips
  there but at least `PACE_MIN_CLIPS` takes its language's within-speaker spread centred on its own
  median, at `PACE_K_FACTOR` times k (`pace_ratios`, `pace_bounds`); a smaller one takes its
  language's bounds; a language with fewer than `rate_min_clips` is left unjudged by the bounds
  (`rate_bounds`, `bounds_for`, `unjudged_languages`), never judged against other languages. The
  quartiles are exact, read from histograms of the rate in hundredths of a symbol per second
  (`rate_histograms`), the way the length cut-offs read theirs. Every clip, judged or not, is held to
  an absolute ceiling per kind of symbol (`RATE_CEILINGS`, `symbol_kind`): no speech is that fast;
- absolute bounds where the physics is clear: `clipped` (share of samples at full scale),
  `narrowband` (bandwidth below a share of the output's Nyquist), `noisy` (an SNR floor), `long_pause`,
  `transcript_mismatch` (CER against the corpus's ASR transcript), `asr_repeat`, `foreign_script`;
- `duplicate_audio` (one recording under two ids, in one input or several), decided last from the
  groups of clips with one `audio_hash` (`duplicates_of`): of the copies that pass every other rule,
  the first by input order (the earliest --input, then its earliest row) is kept and the others are
  duplicates of it; a copy another rule drops is dropped for that rule. So a group keeps a copy
  whenever any copy passes the rest. The verdict travels on the clip (`duplicate_marks.DUPLICATE_OF`, set
  by `duplicate_marks.mark_duplicates` when its batch is read back, `batch_files.read_clips`).

`quality_rejection` applies them all to one clip and gives the reason with a detail naming the measure,
its value and the bound; the writer counts what they dropped per speaker
(`filter_and_write.dropped_counts`; stats.json `quality_dropped_by_speaker` and `speakers[].per_reason`).

The quality family, one module each: the measures (`melshards.preprocess.clip.quality`), the rules
(`melshards.preprocess.stats.quality_rules`), the statistics for stats.json
(`melshards.preprocess.stats.quality_stats`), their Beam transforms (`melshards.preprocess.stats.quality_stage`)
and the tables of `melshards stats` (`melshards.reports.quality_tables`).
"""

from __future__ import annotations

import dataclasses
import math
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping

from melshards.preprocess.config import QualityRulesConfig
from melshards.preprocess.out_dir.duplicate_marks import DUPLICATE_OF
from melshards.shards_schema.stats import percentile

RATE_SCALE = 100  # the rate histograms count rates in hundredths of a symbol per second
RATIO_SCALE = 1000  # the pace-ratio histograms count a rate over its speaker's median in thousandths
# The fewest rated clips of a speaker in a language whose median sets its pace (`pace_bounds`) and whose
# rates are in its language's within-speaker spread (`pace_ratios`): the median of 5 is a clean clip's
# rate while 2 of them are faults (docs/preprocess.md, Quality rules).
PACE_MIN_CLIPS = 5
# The pace bounds' k is this times `rate_iqr_k`: one clip is more than 5% of a speaker of fewer than
# `rate_min_clips`, so its bounds must drop fewer clean clips per clip than a large speaker's; three times
# its pace still lies far outside them (docs/preprocess.md, Quality rules).
PACE_K_FACTOR = 2
SPEAKER, LANGUAGE = "speaker", "language"  # the rate rule's groups: a speaker in a language, a language
PACE = "pace"  # bounds of a speaker in a language: its own median times its language's spread

# The most symbols per second of speech a kind of symbol is read at: about twice the fastest speech's
# rate in each kind, so no reading reaches it and a transcript that does is not the audio's
# (docs/preprocess.md, Quality rules).
RATE_CEILINGS = {
    "syllabic": 25.0,  # Han, kana, Hangul, Yi, Ethiopic: a character per syllable or mora
    "phone": 40.0,  # the phones of TextGrids (a run with alignments)
    "alphabetic": 60.0,  # any other script (Latin, Cyrillic, IPA, ...): letters, spaces and punctuation
}
# A letter whose Unicode name holds one of these stands for a syllable or a mora
SYLLABIC_NAMES = ("IDEOGRAPH", "HIRAGANA", "KATAKANA", "SYLLABLE", "SYLLABICS")


def symbol_kind(text: str, unit: str) -> str:
    """The kind of symbol a clip's text is counted in (a key of `RATE_CEILINGS`): "phone" in a run of
    phones (`unit`); else "syllabic" when at least half its letters are syllabic (`SYLLABIC_NAMES`, after
    NFKC), else "alphabetic"."""
    if unit == "phone":
        return "phone"
    letters = [ch for ch in unicodedata.normalize("NFKC", text) if ch.isalpha()]
    syllabic = sum(any(n in unicodedata.name(ch, "") for n in SYLLABIC_NAMES) for ch in letters)
    return "syllabic" if letters and 2 * syllabic >= len(letters) else "alphabetic"


def rate_key(rate: float) -> int:
    """A speaking rate as its histogram key: hundredths of a symbol per second, rounded."""
    return int(round(rate * RATE_SCALE))


def rate_histograms(clips: Iterable[dict]) -> dict[tuple, Counter]:
    """Measured clips -> the speaking-rate histogram {rate_key: clips} of each group the rule judges by:
    (SPEAKER, (speaker, language)) and (LANGUAGE, language); clips without a rate (NaN) are left out, and
    a group without a rated clip is not there. Histograms of parts of a corpus sum to the corpus's."""
    out: dict[tuple, Counter] = {}
    for c in clips:
        rate = c.get("quality", {}).get("speaking_rate", math.nan)
        if math.isnan(rate):
            continue
        k = rate_key(rate)
        for group in ((SPEAKER, (c["speaker"], c["language"])), (LANGUAGE, c["language"])):
            hist = out.get(group)
            if hist is None:
                hist = out[group] = Counter()
            hist[k] += 1
    return out


def iqr_bounds(hist: Mapping[int, int], k: float) -> tuple[float, float]:
    """Q1 - k*IQR .. Q3 + k*IQR of a rate histogram (inverted-CDF quartiles, so observed values), in
    symbols per second."""
    q1, q3 = percentile(hist, 25) / RATE_SCALE, percentile(hist, 75) / RATE_SCALE
    iqr = q3 - q1
    return (q1 - k * iqr, q3 + k * iqr)


def pace_ratio_key(key: int, median: int) -> int:
    """A rate's histogram key over its speaker's median key as a pace-ratio key: thousandths, rounded
    half up, in integers (so exact)."""
    return (2 * key * RATIO_SCALE + median) // (2 * median)


def pace_ratio_part(hist: Mapping[int, int]) -> Counter:
    """A speaker's rate histogram in a language -> its share of the language's pace ratios: each rate over
    the speaker's median (`pace_ratio_key`); none for fewer than `PACE_MIN_CLIPS` rated clips or a median
    of 0 (a smaller speaker's median is one of its few rates, which would pull the ratios to 1)."""
    out: Counter = Counter()
    if sum(hist.values()) < PACE_MIN_CLIPS:
        return out
    median = percentile(hist, 50)
    if median <= 0:
        return out
    for key, n in hist.items():
        out[pace_ratio_key(key, median)] += n
    return out


def pace_ratios(hists: Mapping[tuple, Mapping[int, int]]) -> dict[str, Counter]:
    """Each language's within-speaker spread (`rate_histograms`' form in): the `pace_ratio_part` of each of
    its speakers, summed; a language none of whose speakers has one is not there."""
    out: dict[str, Counter] = {}
    for (scope, name), hist in sorted(hists.items()):
        part = pace_ratio_part(hist) if scope == SPEAKER else Counter()
        if part:
            out.setdefault(name[1], Counter()).update(part)
    return out


def pace_bounds(hist: Mapping[int, int], ratios: Mapping[int, int], k: float) -> tuple[float, float]:
    """A speaker's bounds at its own pace: its median rate (of `hist`, rate keys) times q1 - k*(q3 - q1)
    .. q3 + k*(q3 - q1), q1 and q3 the quartiles of its language's pace ratios (`pace_ratios`), in
    symbols per second."""
    median = percentile(hist, 50) / RATE_SCALE
    q1, q3 = percentile(ratios, 25) / RATIO_SCALE, percentile(ratios, 75) / RATIO_SCALE
    iqr = q3 - q1
    return (median * (q1 - k * iqr), median * (q3 + k * iqr))


def group_bounds(
    scope: str, hist: Mapping[int, int], rules: QualityRulesConfig, ratios: Mapping[int, int] | None = None
) -> tuple[str, tuple[float, float]] | None:
    """One group's speaking-rate bounds, from its rate histogram, and their kind: its own (`iqr_bounds`
    at `rules.rate_iqr_k`; `scope`, SPEAKER or LANGUAGE) with at least `rules.rate_min_clips` rated
    clips; else for a speaker in a language with at least `PACE_MIN_CLIPS` whose language's pace ratios
    (`ratios`, `pace_ratios`) number at least `rules.rate_min_clips`, its pace (PACE, `pace_bounds` at
    `PACE_K_FACTOR` times `rules.rate_iqr_k`); else None, and None when the rule is off."""
    if rules.rate_iqr_k is None:
        return None
    n = sum(hist.values())
    if n >= rules.rate_min_clips:
        return scope, iqr_bounds(hist, rules.rate_iqr_k)
    if scope == SPEAKER and n >= PACE_MIN_CLIPS and ratios and sum(ratios.values()) >= rules.rate_min_clips:
        return PACE, pace_bounds(hist, ratios, PACE_K_FACTOR * rules.rate_iqr_k)
    return None


def rate_bounds(hists: Mapping[tuple, Mapping[int, int]], rules: QualityRulesConfig) -> dict:
    """The speaking-rate bounds of every group of `hists` (`rate_histograms`' form) that has them
    (`group_bounds`, with its language's `pace_ratios`): {SPEAKER: {(speaker, language): (low, high)},
    PACE: {(speaker, language): (low, high)}, LANGUAGE: {code: (low, high)}}; none when
    `rules.rate_iqr_k` is None."""
    out: dict[str, dict] = {SPEAKER: {}, PACE: {}, LANGUAGE: {}}
    ratios = pace_ratios(hists)
    for (scope, name), hist in sorted(hists.items()):
        found = group_bounds(scope, hist, rules, ratios.get(name[1]) if scope == SPEAKER else None)
        if found is not None:
            out[found[0]][name] = found[1]
    return out


def unjudged_languages(hists: Mapping[tuple, Mapping[int, int]], rules: QualityRulesConfig) -> dict[str, int]:
    """The languages with rated clips but fewer than `rules.rate_min_clips` (in `rate_histograms`' form),
    each with its rated clips: no clip of theirs is judged by the rate bounds (a speaker's clips in a
    language are never more than the language's), only by the ceiling. None when the rule is off."""
    if rules.rate_iqr_k is None:
        return {}
    rated = {name: sum(h.values()) for (scope, name), h in hists.items() if scope == LANGUAGE}
    return {code: n for code, n in sorted(rated.items()) if 0 < n < rules.rate_min_clips}


def bounds_for(bounds: Mapping, speaker: str, language: str) -> tuple[tuple[float, float], str] | None:
    """A clip's speaking-rate bounds and where they come from: its speaker's in its language, else its
    speaker's pace in its language's spread, else its language's; None when none has enough rated clips
    (the clip is not judged by bounds)."""
    for scope, name, label in (
        (SPEAKER, (speaker, language), f"speaker {speaker}"),
        (PACE, (speaker, language), f"speaker {speaker} at language {language}'s spread"),
        (LANGUAGE, language, f"language {language}"),
    ):
        if name in bounds.get(scope, {}):
            return tuple(bounds[scope][name]), label
    return None


def duplicates_of(members: Iterable[tuple[tuple, str, bool]]) -> list[tuple[str, str]]:
    """The copies of one audio hash, each as ((input index, row), id, whether it passes every other
    rule) -> (id, kept id) for every copy that passes but the first such by input order: the earliest
    input, then the earliest row in it (ties, which input order does not have, by id). A copy that fails
    another rule is dropped for that rule and is in no pair; no copy passing: no pair."""
    passing = sorted((place, clip_id) for place, clip_id, passes in members if passes)
    if not passing:
        return []
    kept = passing[0][1]
    return [(clip_id, kept) for _, clip_id in passing[1:]]


@dataclasses.dataclass(frozen=True)
class QualityGate:
    """What the quality rules need beside a clip: the rules, the output's sample rate, the speaking-rate
    bounds (`rate_bounds`) and the run's text unit (`symbol_kind`); the job's is made by
    `quality_stage.SpeakingRateBounds`. The duplicates travel on the clips (`DUPLICATE_OF`)."""

    rules: QualityRulesConfig
    sample_rate: int
    rate: Mapping = dataclasses.field(default_factory=dict)
    text_unit: str = "character"


def _above(value: float, bound: float | None) -> bool:
    return bound is not None and not math.isnan(value) and value > bound


def _below(value: float, bound: float | None) -> bool:
    return bound is not None and not math.isnan(value) and value < bound


def rate_rejection(clip: dict, gate: QualityGate) -> str | None:
    """The speaking-rate rule's detail when a clip breaks it, else None: outside its group's bounds
    (`bounds_for`; a clip of an unjudged language has none), then above its kind of symbol's ceiling
    (`RATE_CEILINGS`). Off, and NaN, break nothing."""
    rate = clip.get("quality", {}).get("speaking_rate", math.nan)
    if gate.rules.rate_iqr_k is None or math.isnan(rate):
        return None
    found = bounds_for(gate.rate, clip["speaker"], clip["language"])
    if found is not None:
        (low, high), source = found
        if not low <= rate <= high:
            return f"speaking_rate={rate:.2f} outside {low:.2f}..{high:.2f} ({source})"
    kind = symbol_kind(clip.get("text", ""), gate.text_unit)
    if rate > RATE_CEILINGS[kind]:
        return f"speaking_rate={rate:.2f} > {RATE_CEILINGS[kind]:g} ({kind} symbols: faster than any speech)"
    return None


def quality_rejection(clip: dict, gate: QualityGate) -> tuple[str, str] | None:
    """The first rule a clip breaks, as (reason, detail naming the measure, its value and the bound), or
    None: the measures' rules in `QUALITY_REASONS` order, then `duplicate_audio` (the clip's
    `DUPLICATE_OF`, given only to a copy that passes the rest). A rule whose bound is None is off; a NaN
    measure breaks no rule."""
    q, r = clip.get("quality", {}), gate.rules
    share = r.min_bandwidth_share
    floor = None if share is None else share * gate.sample_rate / 2
    bounded = (  # reason, measure, the comparison that breaks the rule, bound, value's and bound's format, note
        ("clipped", "clipped_fraction", ">", r.max_clipped_fraction, ".5f", "", ""),
        ("narrowband", "bandwidth_hz", "<", floor, ".0f", ".0f", f" ({share} of Nyquist)"),
        ("noisy", "snr_db", "<", r.min_snr_db, ".1f", "", ""),
        ("long_pause", "longest_pause_s", ">", r.max_pause_s, ".2f", "", ""),
        ("transcript_mismatch", "cer", ">", r.max_cer, ".3f", "", ""),
        ("asr_repeat", "asr_repeat", ">", r.max_asr_repeat, ".0f", "", ""),
        ("foreign_script", "foreign_script_fraction", ">", r.max_foreign_script_fraction, ".3f", "", ""),
    )
    for reason, measure, breaks, bound, value_format, bound_format, note in bounded:
        value = q.get(measure, math.nan)
        if (_above if breaks == ">" else _below)(value, bound):
            return reason, f"{measure}={value:{value_format}} {breaks} {bound:{bound_format}}{note}"
    rate = rate_rejection(clip, gate)
    if rate is not None:
        return "speaking_rate_outlier", rate
    if clip.get(DUPLICATE_OF):
        return "duplicate_audio", f"audio_hash={clip.get('audio_hash', '')} same as kept {clip[DUPLICATE_OF]}"
    return None
