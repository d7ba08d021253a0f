"""Exact statistics of the quality measures (`melshards.preprocess.clip.quality`) over the clips measured, before
the filter, for stats.json (docs/stats.md, Quality): pure functions on plain values, each step of which
`quality_stage.QualityHistograms` runs as a Beam transform.

- **Exact.** Each measure is counted on its declared grid (`quality.measure_bins`, keys per unit and a
  side, `shards_schema.stats.measure_key`): a value->count histogram of integer keys, as the lengths
  are, so its percentiles are exact on the grid and it merges by summing, in any order. The grid's
  side follows the measure's rule, so a bound on the grid keeps and drops exactly what the rule does.
- **Per group, then a summary.** A batch gives one histogram per measure for each group of its clips
  (`group_histograms`: the corpus, each speaker, each language, and each speaker in a language for the
  speaking rate), summed per group (`add_group`) where that group's key lands. Each group is then
  reduced to what stats.json keeps of it (`group_summary`): the corpus and a language keep the whole
  histogram (its size is the distinct keys, at most the grid's); a speaker keeps its percentiles at
  `SPEAKER_PERCENTILES`, and each speaker in a language the speaking-rate rule's outliers at the k values
  of `RATE_WHAT_IF_K` (the rule reads its language's histogram too, `language_rates`). The summaries
  (`add_summary`) are what one worker holds: a fixed size per speaker, however many clips it has.
- A NaN (the measure does not apply: `cer` without an `asr_text`) is counted as not measured.

The quality family, one module each: the measures (`melshards.preprocess.clip.quality`), the rules
(`melshards.preprocess.stats.quality_rules`), the statistics for stats.json
(`melshards.preprocess.stats.quality_stats`), their Beam transforms (`melshards.preprocess.stats.quality_stage`)
and the tables of `melshards stats` (`melshards.reports.quality_tables`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping

from melshards.preprocess.clip import quality
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.stats import quality_rules
from melshards.shards_schema.stats import count_beyond, measure_key, summarize_measure

SPEAKER_PERCENTILES = (0, 5, 25, 50, 75, 95, 100)
RATE_WHAT_IF_K = (1.0, 1.5, 2.0, 2.5, 3.0)  # and the job's own rate_iqr_k
CORPUS = "corpus"  # the scope of the whole run's figures (stats.json `quality.global`)
SPEAKER_LANGUAGE = "speaker_language"  # the rate rule judges a speaker per language: (speaker, language)
RATE = "speaking_rate"


def group_histograms(clips: Iterable[dict], bins: Mapping[str, tuple[float, str]]) -> dict[tuple, dict[str, Counter]]:
    """Measured clips -> {(scope, name): {measure: Counter {key (None: NaN or not held): clips}}} for the
    corpus (scope CORPUS, name "", always there, empty without clips), each speaker and each language;
    and the speaking rate per speaker in a language (scope SPEAKER_LANGUAGE, name (speaker, language)).
    So every clip counts once in every measure of `bins` (`quality.measure_bins`: those the run computes)."""
    out: dict[tuple, dict[str, Counter]] = {(CORPUS, ""): {}}
    for c in clips:
        q = c.get("quality", {})
        groups = ((CORPUS, ""), ("speaker", c["speaker"]), ("language", c["language"]))
        with_pair = (*groups, (SPEAKER_LANGUAGE, (c["speaker"], c["language"])))
        for m, (scale, side) in bins.items():
            v = q.get(m, math.nan)
            key = None if math.isnan(v) else measure_key(v, scale, side)
            for g in with_pair if m == RATE else groups:
                group = out.setdefault(g, {})
                hist = group.get(m)
                if hist is None:
                    hist = group[m] = Counter()
                hist[key] += 1
    return out


def add_group(acc: dict[str, Counter], part: Mapping[str, Mapping]) -> dict[str, Counter]:
    """One group's histograms (`group_histograms`' values) added into `acc`, in place; returns `acc`."""
    for m, hist in part.items():
        mine = acc.get(m)
        if mine is None:
            mine = acc[m] = Counter()
        mine.update(hist)
    return acc


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


def rated(group: Mapping[str, Mapping]) -> Counter:
    """A group's speaking-rate histogram without its NaN (the clips the rate rule can judge)."""
    return Counter({k: n for k, n in group.get(RATE, {}).items() if k is not None})


def language_rate(item: tuple[tuple, Mapping]) -> list[tuple[str, Counter]]:
    """A summed group (`add_group`) -> [(language, its rated clips' rate histogram)] for a language group
    with rated clips, else []: what `group_summary` judges a speaker by when it has too few of its own."""
    (scope, name), group = item
    hist = rated(group) if scope == "language" else Counter()
    return [(name, hist)] if hist else []


def language_rates(groups: Mapping[tuple, Mapping]) -> dict[str, Counter]:
    """`language_rate` of every group."""
    return dict(x for item in groups.items() for x in language_rate(item))


def pace_part(item: tuple[tuple, Mapping]) -> list[tuple[str, Counter]]:
    """A summed group (`add_group`) -> [(language, its share of the language's pace ratios)] for a speaker
    in a language with one (`quality_rules.pace_ratio_part`), else []."""
    (scope, name), group = item
    part = quality_rules.pace_ratio_part(rated(group)) if scope == SPEAKER_LANGUAGE else Counter()
    return [(name[1], part)] if part else []


def language_pace_ratios(groups: Mapping[tuple, Mapping]) -> dict[str, Counter]:
    """`pace_part` of every group (`group_histograms`' form), summed per language: what
    `quality_rules.pace_ratios` gives from `quality_rules.rate_histograms`' form."""
    out: dict[str, Counter] = {}
    for item in groups.items():
        for language, part in pace_part(item):
            out.setdefault(language, Counter()).update(part)
    return out


def rate_ks(rules) -> tuple[float, ...]:
    """The k values of the rate what-if: `RATE_WHAT_IF_K` and the job's own."""
    return tuple(sorted(set(RATE_WHAT_IF_K) | ({float(rules.rate_iqr_k)} if rules.rate_iqr_k is not None else set())))


def pair_outliers(
    hist: Mapping[int, int], language: Mapping[int, int], ratios: Mapping[int, int] | None, rules
) -> dict[float, tuple[int, int]]:
    """A speaker's rated clips in a language (`hist`) outside the speaking-rate bounds at each k of `rate_ks`
    -> {k: (least, most)}: the rule of `quality_rules` (`group_bounds`: its own bounds, else its pace in its
    language's spread, `ratios`, else its language's, `language`, with `rules.rate_min_clips`; none: no
    outlier), exact but for clips within half a key (0.005 symbols/s) of a bound, which `most` counts. The
    rule's ceiling (`quality_rules.RATE_CEILINGS`) is not counted."""
    scale, side = quality.GRIDS[RATE]
    out = {}
    for k in rate_ks(rules):
        at_k = dataclasses.replace(rules, rate_iqr_k=float(k))
        found = quality_rules.group_bounds(quality_rules.SPEAKER, hist, at_k, ratios)
        if found is None:
            found = quality_rules.group_bounds(quality_rules.LANGUAGE, language, at_k)
        if found is None:
            out[k] = (0, 0)
            continue
        low, high = found[1]
        below, above = count_beyond(hist, scale, side, low, False), count_beyond(hist, scale, side, high, True)
        out[k] = (below[0] + above[0], min(sum(hist.values()), below[1] + above[1]))
    return out


def empty_summary() -> dict:
    """What stats.json keeps of the groups (`group_summary`, summed by `add_summary`): `groups` {(scope,
    name): histograms} of the corpus and the languages; `speakers` {name: figures at SPEAKER_PERCENTILES};
    `outliers` {speaker: {k: (least, most)}} over its languages; `rated` {language: the speakers with a
    rated clip in it}."""
    return {"groups": {}, "speakers": {}, "outliers": {}, "rated": {}}


def group_summary(
    item: tuple[tuple, Mapping], bins: Mapping, rules, rates: Mapping[str, Mapping], paces: Mapping[str, Mapping]
) -> dict:
    """One summed group (`add_group`) -> its share of the summary (`empty_summary`); `bins`: the run's
    (`quality.measure_bins`), `rates`: `language_rates` of the run, `paces`: its `language_pace_ratios`."""
    (scope, name), group = item
    out = empty_summary()
    if scope in (CORPUS, "language"):
        out["groups"][(scope, name)] = group
    elif scope == "speaker":
        out["speakers"][name] = group_figures(group, bins, histogram=False, qs=SPEAKER_PERCENTILES)
    elif scope == SPEAKER_LANGUAGE:
        speaker, language = name
        hist = rated(group)
        out["outliers"][speaker] = pair_outliers(hist, rates.get(language, {}), paces.get(language), rules)
        if hist:
            out["rated"][language] = {speaker}
    return out


def add_summary(acc: dict, part: dict) -> dict:
    """A share of the summary (`group_summary`) added into `acc`, in place; returns `acc`."""
    for key, group in part["groups"].items():
        add_group(acc["groups"].setdefault(key, {}), group)
    acc["speakers"].update(part["speakers"])
    for speaker, per_k in part["outliers"].items():
        mine = acc["outliers"].setdefault(speaker, {})
        for k, (least, most) in per_k.items():
            had = mine.get(k, (0, 0))
            mine[k] = (had[0] + least, had[1] + most)
    for language, speakers in part["rated"].items():
        acc["rated"].setdefault(language, set()).update(speakers)
    return acc


def summary_of(groups: Mapping[tuple, Mapping], cfg: PreprocessConfig) -> dict:
    """The summed groups of a run -> its summary: `group_summary` of each, added (what the job does
    across its workers)."""
    bins = quality.measure_bins(cfg.audio.sample_rate, cfg.mel.n_fft, cfg.quality.dnsmos)
    rates, paces = language_rates(groups), language_pace_ratios(groups)
    acc = empty_summary()
    for item in groups.items():
        add_summary(acc, group_summary(item, bins, cfg.quality_rules, rates, paces))
    return acc


def rate_unjudged(summary: dict, rules, frontend_for) -> list[dict]:
    """stats.json `quality.rate_unjudged`: each language whose clips the speaking-rate bounds do not
    judge (fewer than `rules.rate_min_clips` rated clips, `quality_rules.unjudged_languages`): its code,
    its text front end (`frontend_for(code)`), its rated clips and the speakers with rated clips in it."""
    rates = {(quality_rules.LANGUAGE, code): h for code, h in language_rates(summary["groups"]).items()}
    unjudged = quality_rules.unjudged_languages(rates, rules)
    return [
        {
            "language": code,
            "frontend": frontend_for(code),
            "rated": n,
            "speakers": sorted(summary["rated"].get(code, ())),
        }
        for code, n in unjudged.items()
    ]


@dataclasses.dataclass(frozen=True)
class QualityFigures:
    """A run's quality summary (`summary_of`, or the job's), with the grids of the measures it holds and
    the speaking-rate rule's outliers per speaker at each k of `rate_ks`: what stats.json's `quality`
    and the speaker and language rows' `quality` are made from."""

    groups: dict[tuple, dict[str, Counter]]  # the corpus's and the languages'
    speakers: dict[str, dict]
    bins: dict[str, tuple[float, str]]
    per_k: dict[float, dict[str, tuple[int, int]]]
    rules: quality_rules.QualityRulesConfig
    sample_rate: int
    unjudged: list[dict] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, summary: dict, cfg: PreprocessConfig) -> QualityFigures:
        present = set(summary["groups"].get((CORPUS, ""), {}))  # every clip counts in every measure there
        run_bins = quality.measure_bins(cfg.audio.sample_rate, cfg.mel.n_fft, cfg.quality.dnsmos)
        bins = {m: b for m, b in run_bins.items() if m in present}
        rules = cfg.quality_rules
        per_k: dict[float, dict[str, tuple[int, int]]] = {}
        unjudged: list[dict] = []
        if RATE in present:
            per_k = {k: {s: out[k] for s, out in summary["outliers"].items()} for k in rate_ks(rules)}
            unjudged = rate_unjudged(summary, rules, cfg.frontend_for)
        return cls(summary["groups"], summary["speakers"], bins, per_k, rules, cfg.audio.sample_rate, unjudged)

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
        return {
            "quality": self.speakers.get(name, {}),
            "rate_outliers": [
                {"k": k, "least": out.get(name, (0, 0))[0], "most": out.get(name, (0, 0))[1]}
                for k, out in self.per_k.items()
            ],
        }

    def language(self, code: str) -> dict:
        """A language row's `quality`: every measure with its exact histogram."""
        return {"quality": group_figures(self.groups.get(("language", code), {}), self.bins, histogram=True)}
