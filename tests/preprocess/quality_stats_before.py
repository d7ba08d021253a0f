"""`melshards.preprocess.stats.quality_stats` and the speaking-rate bounds of `quality_rules` as they were before the
quality statistics were summed per group (one flat Counter of (scope, name, measure, key) summed over the whole
run in one worker): what stats.json's quality figures must stay, byte for byte. Test code only."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping

from melshards.preprocess.clip import quality
from melshards.preprocess.config import PreprocessConfig, QualityRulesConfig
from melshards.preprocess.stats import quality_rules
from melshards.preprocess.stats.quality_rules import (
    LANGUAGE,
    PACE,
    PACE_K_FACTOR,
    PACE_MIN_CLIPS,
    SPEAKER,
    iqr_bounds,
    pace_bounds,
    pace_ratio_key,
)
from melshards.preprocess.stats.quality_stats import group_figures
from melshards.shards_schema.stats import count_beyond, measure_key, percentile

SPEAKER_PERCENTILES = (0, 5, 25, 50, 75, 95, 100)
RATE_WHAT_IF_K = (1.0, 1.5, 2.0, 2.5, 3.0)
CORPUS = "corpus"
SPEAKER_LANGUAGE = "speaker_language"
RATE = "speaking_rate"


def _groups(hists: Mapping[tuple, int]) -> dict[tuple, Counter]:
    groups: dict[tuple, Counter] = {}
    for (scope, name, k), n in hists.items():
        groups.setdefault((scope, name), Counter())[k] += n
    return groups


def pace_ratios(hists: Mapping[tuple, int]) -> dict[str, Counter]:
    """Each language's within-speaker spread: the histogram of its speakers' rates each over its own
    speaker's median (`pace_ratio_key`), summed over the speakers with at least `PACE_MIN_CLIPS` rated
    clips in it and a median above 0 (a smaller speaker's median is one of its few rates, which would
    pull the ratios to 1)."""
    out: dict[str, Counter] = {}
    for (scope, name), hist in sorted(_groups(hists).items()):
        if scope != SPEAKER or sum(hist.values()) < PACE_MIN_CLIPS:
            continue
        median = percentile(hist, 50)
        if median <= 0:
            continue
        ratios = out.setdefault(name[1], Counter())
        for key, n in hist.items():
            ratios[pace_ratio_key(key, median)] += n
    return out


def rate_bounds(hists: Mapping[tuple, int], rules: QualityRulesConfig) -> dict:
    """The speaking-rate bounds of every group (`rate_histograms`) with at least `rules.rate_min_clips`
    rated clips, and of every speaker in a language with fewer but at least `PACE_MIN_CLIPS` whose
    language's pace ratios (`pace_ratios`) number at least `rules.rate_min_clips` (`pace_bounds` at
    `PACE_K_FACTOR` times `rules.rate_iqr_k`):
    {SPEAKER: {(speaker, language): (low, high)}, PACE: {(speaker, language): (low, high)},
    LANGUAGE: {code: (low, high)}}; none when `rules.rate_iqr_k` is None."""
    out: dict[str, dict] = {SPEAKER: {}, PACE: {}, LANGUAGE: {}}
    if rules.rate_iqr_k is None:  # the rule is off
        return out
    ratios = pace_ratios(hists)
    for (scope, name), hist in sorted(_groups(hists).items()):
        n = sum(hist.values())
        if n >= rules.rate_min_clips:
            out[scope][name] = iqr_bounds(hist, rules.rate_iqr_k)
        elif scope == SPEAKER and n >= PACE_MIN_CLIPS and sum(ratios.get(name[1], {}).values()) >= rules.rate_min_clips:
            out[PACE][name] = pace_bounds(hist, ratios[name[1]], PACE_K_FACTOR * rules.rate_iqr_k)
    return out


def unjudged_languages(hists: Mapping[tuple, int], rules: QualityRulesConfig) -> dict[str, int]:
    """The languages with rated clips but fewer than `rules.rate_min_clips`, each with its rated clips:
    no clip of theirs is judged by the rate bounds (a speaker's clips in a language are never more than
    the language's), only by the ceiling. None when the rule is off."""
    if rules.rate_iqr_k is None:
        return {}
    rated = {name: sum(h.values()) for (scope, name), h in _groups(hists).items() if scope == LANGUAGE}
    return {code: n for code, n in sorted(rated.items()) if n < rules.rate_min_clips}


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


def measure_histograms(clips: Iterable[dict], bins: Mapping[str, tuple[float, str]]) -> Counter:
    """Measured clips -> {(scope, name, measure, key): clips} for the corpus (scope "corpus", name ""),
    each speaker and each language, key None for a NaN or a measure of `bins` the clip does not hold;
    and the speaking rate per (speaker, language) (scope SPEAKER_LANGUAGE, name the pair). So every clip
    counts once in every measure of `bins` (`quality.measure_bins`: those the run computes)."""
    out: Counter[tuple] = Counter()
    for c in clips:
        q = c.get("quality", {})
        groups = ((CORPUS, ""), ("speaker", c["speaker"]), ("language", c["language"]))
        for m, (scale, side) in bins.items():
            v = q.get(m, math.nan)
            key = None if math.isnan(v) else measure_key(v, scale, side)
            for scope, name in groups:
                out[(scope, name, m, key)] += 1
            if m == RATE:
                out[(SPEAKER_LANGUAGE, (c["speaker"], c["language"]), m, key)] += 1
    return out


def grouped(hists: Mapping[tuple, int]) -> dict[tuple, dict[str, Counter]]:
    """`measure_histograms` -> {(scope, name): {measure: Counter {key (None: NaN): clips}}}."""
    out: dict[tuple, dict[str, Counter]] = {}
    for (scope, name, m, key), n in hists.items():
        group = out.get((scope, name))
        if group is None:
            group = out[(scope, name)] = {}
        hist = group.get(m)
        if hist is None:
            hist = group[m] = Counter()
        hist[key] += n
    return out


RATE_SCOPES = {SPEAKER_LANGUAGE: quality_rules.SPEAKER, "language": quality_rules.LANGUAGE}


def rate_histograms(groups: Mapping[tuple, Mapping]) -> Counter:
    """The groups' speaking-rate histograms as `quality_rules.rate_bounds` reads them (`quality_rules
    .rate_histograms`' keys): a speaker in a language, and a language."""
    return Counter(
        {
            (RATE_SCOPES[scope], name, key): c
            for (scope, name), g in groups.items()
            if RATE in g and scope in RATE_SCOPES
            for key, c in g[RATE].items()
            if key is not None
        }
    )


def rate_unjudged(groups: Mapping[tuple, Mapping], rules, frontend_for) -> list[dict]:
    """stats.json `quality.rate_unjudged`: each language whose clips the speaking-rate bounds do not
    judge (fewer than `rules.rate_min_clips` rated clips, `quality_rules.unjudged_languages`): its code,
    its text front end (`frontend_for(code)`), its rated clips and the speakers with rated clips in it."""
    unjudged = unjudged_languages(rate_histograms(groups), rules)
    speakers: dict[str, set] = {}
    for (scope, pair), g in groups.items():
        if scope == SPEAKER_LANGUAGE and any(k is not None for k in g.get(RATE, {})):
            speakers.setdefault(pair[1], set()).add(pair[0])
    return [
        {"language": code, "frontend": frontend_for(code), "rated": n, "speakers": sorted(speakers.get(code, ()))}
        for code, n in unjudged.items()
    ]


def rate_outliers(groups: Mapping[tuple, Mapping], rules, k: float, rates: Counter | None = None) -> dict:
    """Each speaker's clips outside its speaking-rate bounds at `k` (the rule of `quality_rules`,
    `bounds_for`: its own in its clip's language, else its pace in that language's spread, else that
    language's, with `rules.rate_min_clips`; a clip of an unjudged
    language counts as inside), as (least, most): exact but for clips within half a key (0.005 symbols/s)
    of a bound, which `most` counts. The rule's ceiling (`quality_rules.RATE_CEILINGS`) is not counted.
    `rates`: `rate_histograms(groups)`, computed once for several k."""
    rates = rate_histograms(groups) if rates is None else rates
    bounds = rate_bounds(rates, dataclasses.replace(rules, rate_iqr_k=float(k)))
    scale, side = quality.GRIDS[RATE]
    out: dict[str, tuple[int, int]] = {}
    for (scope, pair), g in groups.items():
        if scope != SPEAKER_LANGUAGE or RATE not in g:
            continue
        hist = g[RATE]
        speaker, language = pair
        least, most = out.get(speaker, (0, 0))
        found = bounds_for(bounds, speaker, language)
        if found is not None:
            (low, high), _ = found
            rated = {key: c for key, c in hist.items() if key is not None}
            below, above = count_beyond(rated, scale, side, low, False), count_beyond(rated, scale, side, high, True)
            least += below[0] + above[0]
            most += min(sum(rated.values()), below[1] + above[1])
        out[speaker] = (least, most)
    return out


def rate_ks(rules) -> tuple[float, ...]:
    """The k values of the rate what-if: `RATE_WHAT_IF_K` and the job's own."""
    return tuple(sorted(set(RATE_WHAT_IF_K) | ({float(rules.rate_iqr_k)} if rules.rate_iqr_k is not None else set())))


@dataclasses.dataclass(frozen=True)
class QualityFigures:
    """The summed `measure_histograms` of a run, grouped, with the grids of the measures it holds and
    the speaking-rate rule's outliers per speaker at each k of `rate_ks`: what stats.json's `quality`
    and the speaker and language rows' `quality` are made from."""

    groups: dict[tuple, dict[str, Counter]]
    bins: dict[str, tuple[float, str]]
    per_k: dict[float, dict[str, tuple[int, int]]]
    rules: quality_rules.QualityRulesConfig
    sample_rate: int
    unjudged: list[dict] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, hists: Mapping[tuple, int], cfg: PreprocessConfig) -> QualityFigures:
        groups = grouped(hists)
        present = {m for g in groups.values() for m in g}
        run_bins = quality.measure_bins(cfg.audio.sample_rate, cfg.mel.n_fft, cfg.quality.dnsmos)
        bins = {m: b for m, b in run_bins.items() if m in present}
        rules = cfg.quality_rules
        rates = rate_histograms(groups)
        per_k = {k: rate_outliers(groups, rules, k, rates) for k in rate_ks(rules)} if RATE in present else {}
        unjudged = rate_unjudged(groups, rules, cfg.frontend_for) if RATE in present else []
        return cls(groups, bins, per_k, rules, cfg.audio.sample_rate, unjudged)

    def section(self) -> dict:
        """stats.json `quality`: each measure's grid and unit, the rules as the run used them, the
        corpus's figures per measure (with the exact histograms), the rate rule's outliers per k and the
        languages its bounds do not judge."""
        return {
            "measures": {
                m: {"unit": quality.UNITS[m], "scale": scale, "side": side} for m, (scale, side) in self.bins.items()
            },
            "rules": dataclasses.asdict(self.rules),
            "sample_rate": self.sample_rate,
            "global": group_figures(self.groups.get((CORPUS, ""), {}), self.bins, histogram=True),
            "rate_what_if": [
                {"k": k, "least": sum(v[0] for v in out.values()), "most": sum(v[1] for v in out.values())}
                for k, out in self.per_k.items()
            ],
            "rate_unjudged": self.unjudged,
        }

    def speaker(self, name: str) -> dict:
        """A speaker row's `quality` (percentiles at SPEAKER_PERCENTILES, no histogram) and `rate_outliers`."""
        group = self.groups.get(("speaker", name), {})
        return {
            "quality": group_figures(group, self.bins, histogram=False, qs=SPEAKER_PERCENTILES),
            "rate_outliers": [
                {"k": k, "least": out.get(name, (0, 0))[0], "most": out.get(name, (0, 0))[1]}
                for k, out in self.per_k.items()
            ],
        }

    def language(self, code: str) -> dict:
        """A language row's `quality`: every measure with its exact histogram."""
        return {"quality": group_figures(self.groups.get(("language", code), {}), self.bins, histogram=True)}
