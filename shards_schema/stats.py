"""Dataset statistics as pure functions: exact percentiles from mergeable histograms, cut-offs,
padding lengths, padding efficiency, and per-bin mel moments (Chan et al. parallel merge).

Lengths are small integers (symbols, frames, milliseconds), so a value->count histogram is exact,
merges associatively across Beam workers, and stays small: its size is the number of distinct
lengths, not the number of clips.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import sys
from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np

REPORT_PERCENTILES = (0, 1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9, 100)
LENGTH_KEYS = ("text_len", "mel_frames", "duration_ms")
# Reasons the filter gives (`Cutoffs.reason`, the quality rules): counted as "filtered", the rest of rejected.jsonl as "rejected".
# The quality rules' reasons (preprocess/stats/quality_rules.py), in the order the filter tries them.
QUALITY_REASONS = (
    "clipped",
    "narrowband",
    "noisy",
    "long_pause",
    "transcript_mismatch",
    "asr_repeat",
    "foreign_script",
    "speaking_rate_outlier",
    "duplicate_audio",  # last: of the copies that pass every other rule, the first is kept
)
FILTER_REASONS = (
    "speaker_too_few_clips",
    *QUALITY_REASONS,
    "too_short",
    "mel_frames_below_cutoff",
    "mel_frames_above_cutoff",
    "text_len_above_cutoff",
)
# The other reasons a row of rejected.jsonl can have (reading the rows file, then measuring the clip).
REJECT_REASONS = (
    "malformed_row",
    "duplicate_id",
    "ambiguous_audio",
    "missing_text",
    "missing_language",
    "missing_audio",
    "bad_segment",
    "overlapping_segment",
    "unreadable_audio",
    "invalid_samples",
    "empty_text",
    "unusable_text",
    "unsupported_language",
    "silent_audio",
    "missing_alignment",
    "alignment_mismatch",
    "extractor_failed",  # a per-clip extractor raised on the clip, or its output broke its declaration
    "no_reference_clip",  # reference.single_clip: reject, no other clip of its speaker may be its reference
)


def pkey(q: float) -> str:
    """A percentile's key in stats.json ("p99.9"), interned: every speaker's figures share its one string."""
    return sys.intern(f"p{q:g}")


def percentile(hist: Mapping[int, int], q: float) -> int:
    """Inverted-CDF percentile (numpy method='inverted_cdf'): the smallest value v with CDF(v) >= q/100.

    Always an observed value, so a cut-off at p99 keeps exactly the clips <= that observed length.
    """
    return percentiles(hist, (q,))[q]


def percentiles(hist: Mapping[int, int], qs: Iterable[float]) -> dict[float, int]:
    """`percentile` of `hist` at each of `qs` (the inverted-CDF rule, here alone), the histogram sorted once."""
    if not hist:
        raise ValueError("percentile of an empty histogram")
    values = sorted(hist)
    cumulative = list(itertools.accumulate(hist[v] for v in values))
    n = cumulative[-1]
    out = {}
    for q in qs:
        if not 0 <= q <= 100:
            raise ValueError(f"percentile {q} outside [0, 100]")
        i = 0 if q == 0 else bisect.bisect_left(cumulative, q / 100.0 * n - 1e-9 * n)
        out[q] = values[min(i, len(values) - 1)]
    return out


def summarize(hist: Mapping[int, int], scale: float = 1.0) -> dict:
    """Count, mean, min/max and the report percentiles of a histogram, values multiplied by `scale`."""
    n = sum(hist.values())
    if n == 0:
        return {"count": 0, "mean": None, "percentiles": {}}
    total = sum(v * c for v, c in hist.items())
    return {
        "count": n,
        "mean": round(total / n * scale, 4),
        "percentiles": {pkey(q): round(v * scale, 4) for q, v in percentiles(hist, REPORT_PERCENTILES).items()},
    }


def summarize_measure(hist: Mapping[int, int], scale: float, qs: Iterable[float] = REPORT_PERCENTILES) -> dict:
    """`summarize` of a quality measure's histogram (keys: values x `scale`, `measure_key`) in the measure's
    own units, at the percentiles `qs`: each percentile an observed key / scale, rounded to 6 places."""
    n = sum(hist.values())
    if n == 0:
        return {"count": 0, "mean": None, "percentiles": {}}
    return {
        "count": n,
        "mean": round(sum(v * c for v, c in hist.items()) / n / scale, 6),
        "percentiles": {pkey(q): round(v / scale, 6) for q, v in percentiles(hist, qs).items()},
    }


def merge_histograms(hists: Iterable[Mapping[int, int]]) -> Counter:
    out: Counter = Counter()
    for h in hists:
        out.update(h)
    return out


# -- quality measures: exact histograms on a declared grid ------------------------------------------
# A measure's value v is counted under the integer key side(v x scale) (`measure_key`): keys per unit
# `scale`, and `side` says which values share a key, so which bounds a histogram answers exactly:
#   floor: key k holds [k, k+1) / scale    (for a rule that drops values below a bound)
#   ceil:  key k holds (k-1, k] / scale    (for a rule that drops values above a bound)
#   round: key k holds about [k-1/2, k+1/2] / scale
#   exact: key k holds k / scale only      (the measure takes values on the grid)
MEASURE_SIDES = ("floor", "ceil", "round", "exact")
GRID_TOLERANCE = 1e-6  # of a key: v x scale this close to an integer is on the grid (float noise)


def measure_key(value: float, scale: float, side: str) -> int:
    """A measure's value as its histogram key (see MEASURE_SIDES); not for NaN."""
    x = value * scale
    if side == "floor":
        return math.floor(x + GRID_TOLERANCE)
    if side == "ceil":
        return math.ceil(x - GRID_TOLERANCE)
    if side in ("round", "exact"):
        return int(round(x))
    raise ValueError(f"side {side!r} is not one of {MEASURE_SIDES}")


def _key_range(k: int, side: str) -> tuple[float, bool, float, bool]:
    """(low, low open, high, high open) of the values (in keys) key k holds."""
    if side == "floor":
        return k, False, k + 1, True
    if side == "ceil":
        return k - 1, True, k, False
    if side == "round":
        return k - 0.5, False, k + 0.5, False
    return k, False, k, False


def count_beyond(hist: Mapping[int, int], scale: float, side: str, bound: float, above: bool) -> tuple[int, int]:
    """(least, most) clips of a measure's histogram whose value is above `bound` (`above`; else below it),
    in the measure's units: `least` counts the keys whose every value is beyond, `most` adds the key
    whose values lie on both sides. Equal (exact) when the bound is on the histogram's grid."""
    b = bound * scale
    if abs(b - round(b)) < GRID_TOLERANCE:
        b = float(round(b))
    least = most = 0
    for k, c in hist.items():
        lo, lo_open, hi, hi_open = _key_range(k, side)
        if above:
            surely, maybe = lo > b or (lo == b and lo_open), hi > b
        else:
            surely, maybe = hi < b or (hi == b and hi_open), lo < b
        least += c if surely else 0
        most += c if maybe else 0
    return least, most


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple of `multiple` (integer arithmetic: exact for any length)."""
    return -(-int(n) // int(multiple)) * int(multiple)


@dataclasses.dataclass(frozen=True)
class Cutoffs:
    """Filter bounds (inclusive) and the padded lengths they imply. Text lengths are cut per language
    (a symbol is a letter in one, a phoneme or a Chinese character in another); `max_text_len` is the
    largest of them."""

    min_duration_ms: int
    min_mel_frames: int
    max_mel_frames: int
    max_text_len: int
    padded_mel_frames: int
    padded_text_len: int
    max_text_len_by_language: dict[str, int] = dataclasses.field(default_factory=dict)

    def text_limit(self, language: str) -> int:
        return self.max_text_len_by_language.get(language, self.max_text_len)

    def reason(self, text_len: int, mel_frames: int, duration_ms: int, language: str = "") -> str | None:
        """Why a clip is filtered out, or None if it is kept."""
        if duration_ms < self.min_duration_ms:
            return "too_short"
        if mel_frames < self.min_mel_frames:
            return "mel_frames_below_cutoff"
        if mel_frames > self.max_mel_frames:
            return "mel_frames_above_cutoff"
        if text_len > self.text_limit(language):
            return "text_len_above_cutoff"
        return None


def compute_cutoffs(
    hists: Mapping[str, Mapping[int, int]],
    min_duration_s: float,
    mel_lower_q: float,
    mel_upper_q: float,
    text_upper_q: float,
    multiple: int,
    text_by_language: Mapping[str, Mapping[int, int]] | None = None,
) -> Cutoffs:
    """The cut-offs from the before-filter histograms; `text_by_language` (code -> text_len histogram)
    gives each language its own text-length percentile (else one over all clips)."""
    mel_hi = percentile(hists["mel_frames"], mel_upper_q)
    by_language = {code: percentile(h, text_upper_q) for code, h in sorted((text_by_language or {}).items()) if h}
    text_hi = max(by_language.values()) if by_language else percentile(hists["text_len"], text_upper_q)
    return Cutoffs(
        min_duration_ms=int(round(min_duration_s * 1000)),
        min_mel_frames=percentile(hists["mel_frames"], mel_lower_q),
        max_mel_frames=mel_hi,
        max_text_len=text_hi,
        padded_mel_frames=round_up(mel_hi, multiple),
        padded_text_len=round_up(text_hi, multiple),
        max_text_len_by_language=by_language,
    )


def padding_fraction(valid: int, padded: int) -> float:
    """Share of `padded` cells (mel frames, text ids) that is padding when `valid` of them hold data; 0.0
    when there are none. The one rule of every padding figure (buckets, stats.json, what-if tables)."""
    return 1.0 - valid / padded if padded else 0.0


# -- per-bin mel moments -----------------------------------------------------------------------
@dataclasses.dataclass
class Moments:
    """Count, mean and sum of squared deviations per bin; merges exactly (Chan et al. 1979)."""

    n: int
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def empty(cls, dim: int) -> Moments:
        return cls(0, np.zeros(dim, np.float64), np.zeros(dim, np.float64))

    @classmethod
    def of(cls, frames: np.ndarray) -> Moments:
        x = np.asarray(frames, np.float64)
        mean = x.mean(axis=0)
        return cls(len(x), mean, ((x - mean) ** 2).sum(axis=0))

    def merge(self, other: Moments) -> Moments:
        if other.n == 0:
            return self
        if self.n == 0:
            return other
        n = self.n + other.n
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.n / n)
        m2 = self.m2 + other.m2 + delta**2 * (self.n * other.n / n)
        return Moments(n, mean, m2)

    def std(self) -> np.ndarray:
        return np.sqrt(self.m2 / max(self.n, 1))
