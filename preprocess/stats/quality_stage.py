"""Stage 4's quality transforms: what the quality rules (`melshards.preprocess.stats.quality_rules`) and
stats.json's quality figures (`melshards.preprocess.stats.quality_stats`) need from the whole corpus, as Beam
transforms over the measured clips (their measures: `melshards.preprocess.clip.quality`; their tables in
`melshards stats`: `melshards.reports.quality_tables`).

- `SpeakingRateBounds`: the speaking-rate bounds the quality rules read, in one `quality_rules.QualityGate`
  (a side input), each group's from its histogram summed where its key lands;
- `QualityHistograms`: exact histograms of the quality measures of the measured clips, per corpus,
  speaker and language, each group summed where its key lands and reduced there to what stats.json
  keeps of it (`quality_stats`);
- `RepeatedHashes` and `DuplicateAudio`: the duplicate_audio rule's verdicts, not a side input but a keyed
  join: each measured batch with the verdicts of its clips, once the cut-offs, the tables and the gate
  are known.

Every combine is exact and merges in any order (`global_stats.AddParts`; docs/performance.md lists each
combine and side input with its size).

The quality family, one module each: the measures (`melshards.preprocess.clip.quality`), the rules
(`melshards.preprocess.stats.quality_rules`), the statistics for stats.json
(`melshards.preprocess.stats.quality_stats`), their Beam transforms (`melshards.preprocess.stats.quality_stage`)
and the tables of `melshards stats` (`melshards.reports.quality_tables`).
"""

from __future__ import annotations

import array
import hashlib
from collections import Counter

import apache_beam as beam
import numpy as np

from melshards.preprocess.clip import quality
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.inputs.merge import INPUT
from melshards.preprocess.out_dir.batch_files import DUPLICATES, read_clips
from melshards.preprocess.stats import quality_rules, quality_stats
from melshards.preprocess.stats.filter_rule import filter_rejection
from melshards.preprocess.stats.global_stats import AddParts


class QualityHistograms(beam.PTransform):
    """Batches of measured clips -> one summary (`quality_stats.empty_summary`) for stats.json: every quality
    measure's exact histogram per group (the corpus, each speaker, each language, each speaker in a
    language) summed per group (`CombinePerKey`), each group reduced where it is summed to what stats.json
    keeps of it (`quality_stats.group_summary`; its side inputs: the languages' rate histograms and pace
    ratios), and the reductions summed."""

    def __init__(self, cfg: PreprocessConfig):
        super().__init__()
        self.bins = quality.measure_bins(cfg.audio.sample_rate, cfg.mel.n_fft, cfg.quality.dnsmos)
        self.rules = cfg.quality_rules

    def expand(self, batches):
        bins = self.bins
        groups = (
            batches
            | "GroupHists" >> beam.FlatMap(lambda b: quality_stats.group_histograms(b["clips"], bins).items())
            | "SumPerGroup" >> beam.CombinePerKey(AddParts(dict, quality_stats.add_group))
        )
        rates = groups | "LanguageRates" >> beam.FlatMap(quality_stats.language_rate)
        paces = (
            groups
            | "PaceParts" >> beam.FlatMap(quality_stats.pace_part)
            | "PaceRatios" >> beam.CombinePerKey(AddParts(Counter, _add_counter))
        )
        S = beam.pvalue
        return (  # every batch gives the corpus's group: never empty, no default needed
            groups
            | "Summaries" >> beam.Map(quality_stats.group_summary, bins, self.rules, S.AsDict(rates), S.AsDict(paces))
            | "SumSummaries"
            >> beam.CombineGlobally(AddParts(quality_stats.empty_summary, quality_stats.add_summary)).without_defaults()
        )


def _no_bounds() -> dict:
    return {quality_rules.SPEAKER: {}, quality_rules.PACE: {}, quality_rules.LANGUAGE: {}}


def _pace_part(item) -> list[tuple[str, Counter]]:
    """A group's summed rate histogram -> [(its language, its share of the pace ratios)] for a speaker
    with one (`quality_rules.pace_ratio_part`), else []."""
    (scope, name), hist = item
    part = quality_rules.pace_ratio_part(hist) if scope == quality_rules.SPEAKER else Counter()
    return [(name[1], part)] if part else []


def _group_bounds(item, rules, ratios: dict) -> list[dict]:
    """A group's summed rate histogram -> [its share of the bounds (`_no_bounds`' shape)], [] without
    bounds; `ratios`: each language's pace ratios."""
    (scope, name), hist = item
    found = quality_rules.group_bounds(
        scope, hist, rules, ratios.get(name[1]) if scope == quality_rules.SPEAKER else None
    )
    return [] if found is None else [{found[0]: {name: found[1]}}]


def _add_bounds(acc: dict, part: dict) -> dict:
    for scope, found in part.items():
        acc[scope].update(found)
    return acc


def _add_counter(acc: Counter, part) -> Counter:
    acc.update(part)
    return acc


def _gate(bounds: dict, cfg: PreprocessConfig) -> quality_rules.QualityGate:
    return quality_rules.QualityGate(cfg.quality_rules, cfg.audio.sample_rate, bounds, cfg.text_unit)


class SpeakingRateBounds(beam.PTransform):
    """Batches of measured clips -> one `quality_rules.QualityGate` (what the rules read beside a clip)
    holding the speaking-rate bounds per speaker in a language and per language (`quality_rules.rate_bounds`' form), each group's from its exact rate
    histogram summed where its key lands (`CombinePerKey`) and its language's pace ratios (summed per
    language from its speakers', a side input); the gate holds two numbers a group."""

    def __init__(self, cfg: PreprocessConfig):
        super().__init__()
        self.cfg = cfg

    def expand(self, batches):
        rules = self.cfg.quality_rules
        groups = (
            batches
            | "RateHists" >> beam.FlatMap(lambda b: quality_rules.rate_histograms(b["clips"]).items())
            | "SumPerGroup" >> beam.CombinePerKey(AddParts(Counter, _add_counter))
        )
        ratios = (
            groups
            | "PaceParts" >> beam.FlatMap(_pace_part)
            | "PaceRatios" >> beam.CombinePerKey(AddParts(Counter, _add_counter))
        )
        return (
            groups
            | "Bounds" >> beam.FlatMap(_group_bounds, rules, beam.pvalue.AsDict(ratios))
            | "AllBounds" >> beam.CombineGlobally(AddParts(_no_bounds, _add_bounds))  # none rated: still a gate
            | "Gate" >> beam.Map(_gate, self.cfg)
        )


def _batch_key(batch: dict) -> bytes:
    """A measured batch's key in the join: 12 bytes of a digest of its clips file's path (b"" for a batch of
    no clips). Two batches sharing a key would only share their verdicts, which name their clips' ids."""
    return hashlib.blake2b(batch["clips"].encode(), digest_size=12).digest() if batch["clips"] else b""


def hash_prefix(audio_hash: str) -> int:
    """An audio hash's (`quality.audio_hash`, hex) first 8 bytes as an unsigned int: what the search for
    duplicates compares first (`RepeatedHashes`)."""
    return int(audio_hash[:16], 16)


def hash_prefixes(clips) -> list[tuple[int, array.array]]:
    """Measured clips -> [(a first byte, the `hash_prefix` of each clip's hash that starts with it, packed)]."""
    out: dict[int, array.array] = {}
    for c in clips:
        if c.get("audio_hash"):
            prefix = hash_prefix(c["audio_hash"])
            out.setdefault(prefix >> 56, array.array("Q")).append(prefix)
    return list(out.items())


def _extend(acc: array.array, part) -> array.array:
    acc.extend(part)
    return acc


def _prefix_array() -> array.array:
    return array.array("Q")


def repeated_prefixes(item: tuple[int, array.array]) -> array.array:
    """(a first byte, every prefix starting with it) -> the prefixes found more than once, packed."""
    values, counts = np.unique(np.frombuffer(item[1], dtype=np.uint64), return_counts=True)
    return array.array("Q", values[counts > 1].tolist())


def _sorted(prefixes: array.array) -> np.ndarray:
    return np.sort(np.frombuffer(prefixes, dtype=np.uint64))


class RepeatedHashes(beam.PTransform):
    """Batches of measured clips -> one sorted uint64 array: the hash prefixes (`hash_prefix`) that two
    clips or more share, the only clips `DuplicateAudio` groups by their whole hash. The prefixes are
    packed 8 bytes a clip and summed per first byte where that key lands (`CombinePerKey`); what is
    gathered is the repeated ones (a few bytes a duplicate). No element when there are no clips."""

    def expand(self, batches):
        return (
            batches
            | "Prefixes" >> beam.FlatMap(lambda b: hash_prefixes(b["clips"]))
            | "PerFirstByte" >> beam.CombinePerKey(AddParts(_prefix_array, _extend))
            | "Repeated" >> beam.Map(repeated_prefixes)
            | "AllRepeated" >> beam.CombineGlobally(AddParts(_prefix_array, _extend)).without_defaults()
            | "Sorted" >> beam.Map(_sorted)
        )


def _copies(batch: dict, cutoffs, corpus_tables: dict, gate, repeated: np.ndarray | None):
    """(audio hash as its 32 bytes, (input index, row, id, passes every other rule, batch key)) of each clip
    of a measured batch whose hash prefix is in `repeated` (`RepeatedHashes`; None: a run without clips):
    its place in input order and the filter's verdict without the duplicates. Compact: one crosses the
    shuffle per candidate copy."""
    if repeated is None or not len(repeated):
        return
    clips = [c for c in read_clips(batch) if c.get("audio_hash")]
    prefixes = np.array([hash_prefix(c["audio_hash"]) for c in clips], dtype=np.uint64)
    key = _batch_key(batch)
    for c, candidate in zip(clips, np.isin(prefixes, repeated)):
        if candidate:
            passes = cutoffs is not None and filter_rejection(c, cutoffs, corpus_tables, gate) is None
            yield bytes.fromhex(c["audio_hash"]), (c[INPUT], c["row"], c["id"], passes, key)


def _verdicts(item):
    """One hash's copies -> (batch key, (id, kept id)) of each duplicate (`quality_rules.duplicates_of`)."""
    _, members = item
    members = list(members)
    if len(members) > 1:
        where = {clip_id: key for _, _, clip_id, _, key in members}
        places = (((i, row), clip_id, passes) for i, row, clip_id, passes, _ in members)
        for clip_id, kept in quality_rules.duplicates_of(places):
            yield where[clip_id], (clip_id, kept)


def _with_verdicts(item):
    """A batch key's batch (several for b"") and its clips' verdicts -> each batch, with its verdicts
    under `batch_files.DUPLICATES` when it has any."""
    _, joined = item
    verdicts = dict(joined["verdicts"])
    for batch in joined["batch"]:
        yield dict(batch, **{DUPLICATES: verdicts}) if verdicts else batch


class DuplicateAudio(beam.PTransform):
    """Measured batches (`MeasureClips`'s `batches`) -> the same batches, each joined with the verdicts
    of its clips whose decoded audio (`audio_hash`) another kept copy has (`batch_files.DUPLICATES`, read by
    `batch_files.read_clips`): the copies of one hash are grouped with a GroupByKey (no worker holds every
    hash; only the clips whose hash prefix another clip shares, `RepeatedHashes`, cross it), and of those that pass every other rule (`filter_rule.filter_rejection` with the cut-offs, the
    corpus tables and the quality gate, side inputs) the first by input order is kept: an earlier
    --input, else an earlier row of the same input (each clip's `merge.INPUT` and `row`). The verdicts
    reach their batch by a keyed join, so no worker holds them all."""

    def __init__(self, cutoffs, corpus_tables, gate, repeated):
        super().__init__()
        self.cutoffs, self.tables, self.gate, self.repeated = cutoffs, corpus_tables, gate, repeated

    def expand(self, batches):
        S = beam.pvalue
        sides = (S.AsSingleton(self.cutoffs), S.AsSingleton(self.tables), S.AsSingleton(self.gate))
        verdicts = (
            batches
            | "ByHash" >> beam.FlatMap(_copies, *sides, S.AsSingleton(self.repeated, default_value=None))
            | "Group" >> beam.GroupByKey()
            | "Verdicts" >> beam.FlatMap(_verdicts)
        )
        keyed = batches | "KeyBatches" >> beam.Map(lambda b: (_batch_key(b), b))
        return (
            {"batch": keyed, "verdicts": verdicts}
            | "JoinVerdicts" >> beam.CoGroupByKey()
            | "WithVerdicts" >> beam.FlatMap(_with_verdicts)
        )
