"""The filter rules on a clip's quality measures (`melshards.preprocess.quality`; docs/preprocess.md,
Quality rules): pure functions, no I/O, no Beam.

Two kinds of rule:

- a robust per-speaker outlier rule for the speaking rate, which differs between speakers (a
  corpus-wide bound would cut a whole fast or slow speaker): a clip is `speaking_rate_outlier` outside
  Q1 - k*IQR .. Q3 + k*IQR of its speaker's rates; a speaker with fewer than `rate_min_clips` measured
  clips takes its language's bounds, and a language with too few its corpus's (`rate_bounds`). The
  quartiles are exact, read from histograms of the rate in hundredths of a symbol per second
  (`rate_histograms`), the way the length cut-offs read theirs;
- absolute bounds where the physics is clear: `clipped` (share of samples at full scale),
  `narrowband` (bandwidth below a share of the output's Nyquist), `noisy` (an SNR floor), `long_pause`,
  `transcript_mismatch` (CER against the corpus's ASR transcript), `asr_repeat`, `foreign_script`.

`duplicate_audio` (one recording under two ids, in one input or several) is decided from the groups
of clips with one `audio_hash` (`duplicates_of`): the first by input order (the earliest --input,
then its earliest row) is kept. `quality_rejection` applies them all
to one clip and gives the reason with a detail naming the measure, its value and the bound; the
writer counts what they dropped per speaker (`filter_and_write.dropped_counts`; stats.json
`quality_dropped_by_speaker` and `speakers[].per_reason`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping

from melshards.preprocess.config import QualityRulesConfig
from melshards.shards_schema.stats import percentile

RATE_SCALE = 100  # the rate histograms count rates in hundredths of a symbol per second
CORPUS = "corpus"


def rate_key(rate: float) -> int:
    """A speaking rate as its histogram key: hundredths of a symbol per second, rounded."""
    return int(round(rate * RATE_SCALE))


def rate_histograms(clips: Iterable[dict]) -> Counter:
    """Measured clips -> the speaking-rate histogram of each group: keys (scope, name, rate_key) for
    ("speaker", speaker), ("language", language) and ("corpus", ""); clips without a rate (NaN) are
    left out."""
    out: Counter[tuple] = Counter()
    for c in clips:
        rate = c.get("quality", {}).get("speaking_rate", math.nan)
        if math.isnan(rate):
            continue
        k = rate_key(rate)
        out[("speaker", c["speaker"], k)] += 1
        out[("language", c["language"], k)] += 1
        out[(CORPUS, "", k)] += 1
    return out


def iqr_bounds(hist: Mapping[int, int], k: float) -> tuple[float, float]:
    """Q1 - k*IQR .. Q3 + k*IQR of a rate histogram (inverted-CDF quartiles, so observed values), in
    symbols per second."""
    q1, q3 = percentile(hist, 25) / RATE_SCALE, percentile(hist, 75) / RATE_SCALE
    iqr = q3 - q1
    return (q1 - k * iqr, q3 + k * iqr)


def rate_bounds(hists: Mapping[tuple, int], rules: QualityRulesConfig) -> dict:
    """The speaking-rate bounds of every group with at least `rules.rate_min_clips` rated clips:
    {"speaker": {name: (low, high)}, "language": {code: (low, high)}, "corpus": {"": (low, high)}};
    none when `rules.rate_iqr_k` is None."""
    groups: dict[tuple[str, str], Counter] = {}
    for (scope, name, k), n in hists.items():
        groups.setdefault((scope, name), Counter())[k] += n
    out: dict[str, dict] = {"speaker": {}, "language": {}, CORPUS: {}}
    if rules.rate_iqr_k is None:  # the rule is off
        return out
    for (scope, name), hist in sorted(groups.items()):
        if sum(hist.values()) >= rules.rate_min_clips:
            out[scope][name] = iqr_bounds(hist, rules.rate_iqr_k)
    return out


def bounds_for(bounds: Mapping, speaker: str, language: str) -> tuple[tuple[float, float], str] | None:
    """A clip's speaking-rate bounds and where they come from: its speaker's, else its language's, else
    the corpus's; None when no group has enough clips."""
    for scope, name in (("speaker", speaker), ("language", language), (CORPUS, "")):
        if name in bounds.get(scope, {}):
            return tuple(bounds[scope][name]), f"{scope} {name}".rstrip()
    return None


def duplicates_of(members: Iterable[tuple[tuple, str]]) -> list[tuple[str, str]]:
    """The clips of one audio hash, each as ((input index, row), id) -> (id, kept id) for every clip but
    the first by input order: the earliest input, then the earliest row in it (ties, which input order
    does not have, by id)."""
    ordered = sorted(members)
    kept = ordered[0][1]
    return [(clip_id, kept) for _, clip_id in ordered[1:]]


@dataclasses.dataclass(frozen=True)
class QualityGate:
    """What the quality rules need beside a clip: the rules, the output's sample rate, the speaking-rate
    bounds (`rate_bounds`) and the duplicates (id -> the kept id)."""

    rules: QualityRulesConfig
    sample_rate: int
    rate: Mapping = dataclasses.field(default_factory=dict)
    duplicates: Mapping[str, str] = dataclasses.field(default_factory=dict)


def _above(value: float, bound: float | None) -> bool:
    return bound is not None and not math.isnan(value) and value > bound


def _below(value: float, bound: float | None) -> bool:
    return bound is not None and not math.isnan(value) and value < bound


def quality_rejection(clip: dict, gate: QualityGate) -> tuple[str, str] | None:
    """The first rule a clip breaks, as (reason, detail naming the measure, its value and the bound), or
    None. A rule whose bound is None is off; a NaN measure breaks no rule."""
    if clip["id"] in gate.duplicates:
        return "duplicate_audio", f"audio_hash={clip.get('audio_hash', '')} same as kept {gate.duplicates[clip['id']]}"
    q, r = clip.get("quality", {}), gate.rules
    nan = math.nan
    clipped = q.get("clipped_fraction", nan)
    if _above(clipped, r.max_clipped_fraction):
        return "clipped", f"clipped_fraction={clipped:.5f} > {r.max_clipped_fraction}"
    bandwidth = q.get("bandwidth_hz", nan)
    if r.min_bandwidth_share is not None and _below(bandwidth, r.min_bandwidth_share * gate.sample_rate / 2):
        floor = r.min_bandwidth_share * gate.sample_rate / 2
        return "narrowband", f"bandwidth_hz={bandwidth:.0f} < {floor:.0f} ({r.min_bandwidth_share} of Nyquist)"
    snr = q.get("snr_db", nan)
    if _below(snr, r.min_snr_db):
        return "noisy", f"snr_db={snr:.1f} < {r.min_snr_db}"
    pause = q.get("longest_pause_s", nan)
    if _above(pause, r.max_pause_s):
        return "long_pause", f"longest_pause_s={pause:.2f} > {r.max_pause_s}"
    cer = q.get("cer", nan)
    if _above(cer, r.max_cer):
        return "transcript_mismatch", f"cer={cer:.3f} > {r.max_cer}"
    repeat = q.get("asr_repeat", nan)
    if _above(repeat, r.max_asr_repeat):
        return "asr_repeat", f"asr_repeat={repeat:.0f} > {r.max_asr_repeat}"
    foreign = q.get("foreign_script_fraction", nan)
    if _above(foreign, r.max_foreign_script_fraction):
        return "foreign_script", f"foreign_script_fraction={foreign:.3f} > {r.max_foreign_script_fraction}"
    rate = q.get("speaking_rate", nan)
    found = bounds_for(gate.rate, clip["speaker"], clip["language"]) if r.rate_iqr_k is not None else None
    if found is not None and not math.isnan(rate):
        (low, high), source = found
        if not low <= rate <= high:
            return "speaking_rate_outlier", f"speaking_rate={rate:.2f} outside {low:.2f}..{high:.2f} ({source})"
    return None
