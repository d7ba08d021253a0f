"""Exact statistics of the quality measures (`melshards.preprocess.quality`) over the clips measured, before
the filter, for stats.json (docs/stats.md, Quality): pure functions on plain values; a CombineFn sums
`measure_histograms` over the batches (`global_stats.QualityHistograms`), the report calls the rest.

- **Exact.** Each measure is counted on its declared grid (`quality.measure_bins`, keys per unit and a
  side, `shards_schema.stats.measure_key`): a value->count histogram of integer keys, as the lengths
  are, so its percentiles are exact on the grid and it merges by summing, in any order. The grid's
  side follows the measure's rule, so a bound on the grid keeps and drops exactly what the rule does.
- **Bounded.** The corpus and each language keep the whole histogram (its size is the distinct keys);
  a speaker keeps its percentiles at `SPEAKER_PERCENTILES`, a fixed size however many clips it has,
  and the speaking-rate rule's outliers at the k values of `RATE_WHAT_IF_K` (the rule reads a speaker's
  histogram per language, and its language's, which no speaker row holds).
- A NaN (the measure does not apply: `cer` without an `asr_text`) is counted as not measured.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping

from melshards.preprocess import quality, quality_rules
from melshards.preprocess.config import PreprocessConfig
from melshards.shards_schema.stats import count_beyond, measure_key, summarize_measure

SPEAKER_PERCENTILES = (0, 5, 25, 50, 75, 95, 100)
RATE_WHAT_IF_K = (1.0, 1.5, 2.0, 2.5, 3.0)  # and the job's own rate_iqr_k
CORPUS = "corpus"  # the scope of the whole run's figures (stats.json `quality.global`)
SPEAKER_LANGUAGE = "speaker_language"  # the rate rule judges a speaker per language: (speaker, language)
RATE = "speaking_rate"


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


def figures(counts: Mapping, scale: float, histogram: bool, qs: tuple = ()) -> dict:
    """One measure of one group: clips measured (`count`), `not_measured` (NaN), mean and percentiles in
    the measure's units (`summarize_measure`, at `qs` or the report percentiles), and with `histogram`
    the exact histogram itself (key as a string -> clips, keys ascending)."""
    hist = {k: n for k, n in counts.items() if k is not None}
    out = summarize_measure(hist, scale, qs) if qs else summarize_measure(hist, scale)
    out["not_measured"] = int(counts.get(None, 0))
    if histogram:
        out["histogram"] = {str(k): n for k, n in sorted(hist.items())}
    return out


def group_figures(group: Mapping[str, Mapping], bins: Mapping, histogram: bool, qs: tuple = ()) -> dict:
    return {m: figures(group[m], bins[m][0], histogram, qs) for m in bins if m in group}


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
    unjudged = quality_rules.unjudged_languages(rate_histograms(groups), rules)
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
    bounds = quality_rules.rate_bounds(rates, dataclasses.replace(rules, rate_iqr_k=float(k)))
    scale, side = quality.GRIDS[RATE]
    out: dict[str, tuple[int, int]] = {}
    for (scope, pair), g in groups.items():
        if scope != SPEAKER_LANGUAGE or RATE not in g:
            continue
        hist = g[RATE]
        speaker, language = pair
        least, most = out.get(speaker, (0, 0))
        found = quality_rules.bounds_for(bounds, speaker, language)
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
