"""stats.json, declared once: the pydantic model the job validates what it writes against
(`melshards.preprocess.write.report.build_stats`) and `melshards stats` validates what it reads against
(`melshards.reports.stats_report.load_run`), before either trusts a figure.

Numbers are strict (a string "56" or a boolean is not a count). The counts must add up:
input_rows = in_shards + filtered + rejected, per_split sums to in_shards, and per_reason's filter
reasons sum to filtered, the others to rejected. A run that measured any clip (cut-offs present) also
has the filter settings, the padding, the three before-filter histograms the what-if tables need, and
the speaker and language tables with the validation split; a run that rejected every row has none of
them (or empty tables). The tables add up too: the speakers' clips sum to in_shards and their per_split
to counts.per_split, the languages' clips sum to in_shards, and ids run 0..N-1 in order (speakers
dropped by filter.min_speaker_clips, id null, last). The quality figures (`quality`, and the speaker and
language rows' `quality`, `per_reason`, `rate_outliers`; absent from runs made before them) add up too:
a histogram sums to its count, a speaker's measures count its clips measured, the speakers' clips
dropped per filter reason sum to counts.per_reason, and every measure has its grid in quality.measures;
a language left unjudged by the rate bounds has fewer rated clips than the rule needs, and each
speaker or language listed as mostly dropped lost more than half its measured clips, per_reason summing
to them.

`stats_problem` turns the first validation error into one sentence naming the field's dotted path
("counts.input_rows is a string ('56'), not an integer"). Only pydantic is imported here.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from melshards.shards_schema.stats import FILTER_REASONS, LENGTH_KEYS, MEASURE_SIDES, QUALITY_REASONS

Count = Annotated[StrictInt, Field(ge=0)]  # a negative count is "a negative count", not a type error
Number = StrictFloat  # an int is a number too; a bool or a string is not
IntKey = Annotated[str, StringConstraints(pattern=r"^-?[0-9]+$")]  # JSON keys of a length histogram
Histogram = dict[IntKey, StrictInt]  # length (as a string) -> clips of that length

PROBLEM = "stats_json_problem"  # the error type of the checks below the field types
INT_OR_STR = "int_or_str_type"


def _problem(text: str) -> PydanticCustomError:
    return PydanticCustomError(PROBLEM, "{problem}", {"problem": text})


def _int_or_str(value: Any) -> int | str:
    """One error for a value that is neither (a pydantic Union would name each member in the path)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise PydanticCustomError(INT_OR_STR, "not an integer or a string")
    return value


IntOrStr = Annotated[Any, PlainValidator(_int_or_str)]
RULE_VALUE = "rule_value_type"


def _rule_value(value: Any) -> float | bool | None:
    """A quality rule's setting: a number, a boolean (`duplicates`) or null (the rule off)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise PydanticCustomError(RULE_VALUE, "not a number, a boolean or null")


RuleValue = Annotated[Any, PlainValidator(_rule_value)]


class _Section(BaseModel):
    """Fields not declared here are ignored when read (a later minor version may add some)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class Counts(_Section):
    input_rows: Count
    in_shards: Count
    filtered: Count
    rejected: Count
    per_split: dict[str, Count]
    per_reason: dict[str, Count]

    @model_validator(mode="after")
    def _add_up(self) -> Counts:
        parts = self.in_shards + self.filtered + self.rejected
        if self.input_rows != parts:
            raise _problem(
                f"counts.input_rows is {self.input_rows}, but in_shards + filtered + rejected "
                f"({self.in_shards} + {self.filtered} + {self.rejected}) is {parts}"
            )
        split_sum = sum(self.per_split.values())
        if split_sum != self.in_shards:
            raise _problem(f"counts.per_split sums to {split_sum}, but counts.in_shards is {self.in_shards}")
        for key, of_kind in (("filtered", True), ("rejected", False)):
            total = sum(v for r, v in self.per_reason.items() if (r in FILTER_REASONS) == of_kind)
            if total != getattr(self, key):
                raise _problem(
                    f"counts.per_reason's {key} reasons sum to {total}, but counts.{key} is {getattr(self, key)}"
                )
        return self


class Lengths(_Section):
    """One length's summary (`melshards.shards_schema.stats.summarize`); mean is null with no clips."""

    count: Count
    mean: Number | None = None
    percentiles: dict[str, Number]  # pkey(q) -> value


class LengthSummaries(_Section):
    text_len: Lengths
    mel_frames: Lengths
    duration_s: Lengths


class Histograms(_Section):
    """Exact value -> count histograms per length key (LENGTH_KEYS), before and after the filter."""

    before_filter: dict[str, Histogram]
    after_filter: dict[str, Histogram]


class FilterSettings(_Section):
    """The preprocess config's `filter` section as the run used it (required once a clip was measured)."""

    min_duration_s: Number | None = None
    mel_frames_lower_percentile: Number | None = None
    mel_frames_upper_percentile: Number | None = None
    text_len_upper_percentile: Number | None = None


class CutoffsSection(_Section):
    """stats.json `cutoffs`, a `melshards.shards_schema.stats.Cutoffs` as written: the filter bounds
    (inclusive) and padded lengths."""

    min_duration_ms: StrictInt
    min_mel_frames: StrictInt
    max_mel_frames: StrictInt
    max_text_len: StrictInt
    padded_mel_frames: StrictInt | None = None
    padded_text_len: StrictInt | None = None
    max_text_len_by_language: dict[str, StrictInt] = {}


class Padding(_Section):
    """The shards as written: the largest bucket's shapes, padding shares over all buckets."""

    max_text_len: StrictInt
    max_mel_frames: StrictInt
    multiple: StrictInt
    mel_padding_fraction: Number
    text_padding_fraction: Number


class BucketRow(_Section):
    index: StrictInt
    max_mel_frames: StrictInt
    max_text_len: StrictInt
    records: dict[str, Count]  # split -> records
    shards: Count
    mel_padding_fraction: Number
    text_padding_fraction: Number


class PlanBucket(_Section):
    """`melshards.shards_schema.buckets.BucketFill.to_dict`."""

    bound: StrictInt
    records: Count
    valid_frames: Count
    padded_frames: Count
    padding_fraction: Number


class MergeEntry(_Section):
    """An entry of stats.json's bucket merges (`buckets.merges`, `buckets.plan.merges`),
    `melshards.shards_schema.buckets.Merge.to_dict`: a bucket too small, padded up `into` a bound."""

    bound: StrictInt
    records: Count
    min_records: StrictInt
    into: StrictInt


class BucketPlan(_Section):
    """`melshards.shards_schema.buckets.BucketChoice.to_dict`: how the bounds were chosen."""

    k_requested: IntOrStr  # K or "auto"
    k_used: StrictInt
    max_buckets: StrictInt
    target_padding: Number
    multiple: StrictInt
    bounds: list[StrictInt]
    buckets: list[PlanBucket]
    padding_fraction: Number
    unconstrained_padding_fraction: Number
    merges: list[MergeEntry]
    min_records_met: StrictBool


class WhatIfK(_Section):
    """One row of `melshards.shards_schema.buckets.padding_by_k`: null when no K buckets can be filled."""

    k: StrictInt
    buckets_used: StrictInt | None
    padding_fraction: Number | None


class Buckets(_Section):
    """`melshards.preprocess.stats.bucketing.bucket_stats`: the length buckets of the shards."""

    buckets: list[BucketRow]
    mel_padding_fraction: Number
    text_padding_fraction: Number
    min_bucket_records: StrictInt
    plan: BucketPlan | None
    merges: list[MergeEntry]
    raised_last_bound: Any = None
    what_if: list[WhatIfK]


class FeatureMoments(_Section):
    """`melshards.preprocess.stats.feature_stats.moments_record`: mean and std of a per-frame feature over
    `frames` frames (both null without frames)."""

    mean: Number | None = None
    std: Number | None = None
    frames: Count


class PitchPercentiles(_Section):
    """A speaker's voiced f0 (Hz, to the nearest Hz): `melshards.shards_schema.stats.summarize`."""

    count: Count
    mean: Number | None = None
    percentiles: dict[str, Number]


class MeasureFigures(_Section):
    """One quality measure over one group's clips measured, before the filter
    (`melshards.preprocess.stats.quality_stats.figures`): clips with a value (`count`) and without (NaN:
    `not_measured`), mean and percentiles in the measure's units, and (corpus and languages) the exact
    histogram: key (value x scale, on the measure's side) -> clips, summing to `count`."""

    count: Count
    not_measured: Count
    mean: Number | None = None
    percentiles: dict[str, Number]
    histogram: Histogram | None = None

    @model_validator(mode="after")
    def _adds_up(self) -> MeasureFigures:
        if self.histogram is not None and sum(self.histogram.values()) != self.count:
            raise _problem(f"a quality histogram sums to {sum(self.histogram.values())}, but its count is {self.count}")
        return self


class MeasureGrid(_Section):
    """How a measure's values are counted (`melshards.shards_schema.stats.measure_key`)."""

    unit: StrictStr
    scale: Annotated[Number, Field(gt=0)]  # keys per unit
    side: Literal[MEASURE_SIDES]  # type: ignore[valid-type]


class RateOutliers(_Section):
    """Clips outside the speaking-rate rule's bounds at k, as (least, most): equal but for clips within
    half a histogram key of a bound."""

    k: Number
    least: Count
    most: Count

    @model_validator(mode="after")
    def _ordered(self) -> RateOutliers:
        if self.least > self.most:
            raise _problem(f"rate outliers at k={self.k}: least {self.least} is more than most {self.most}")
        return self


class RateUnjudged(_Section):
    """A language the speaking-rate bounds do not judge (`melshards.preprocess.stats.quality_stats
    .rate_unjudged`): fewer rated clips than `quality.rules.rate_min_clips`; only the rule's ceiling
    applies to its clips."""

    language: StrictStr
    frontend: StrictStr  # its text front end
    rated: Count  # its clips with a speaking rate
    speakers: list[StrictStr]  # the speakers with rated clips in it


class Quality(_Section):
    """stats.json `quality` (`melshards.preprocess.stats.quality_stats.QualityFigures.section`): the quality
    measures over the clips measured, before the filter, with the rules as the run had them."""

    measures: dict[str, MeasureGrid]
    rules: dict[str, RuleValue]  # the config's quality_rules section
    sample_rate: StrictInt
    per_measure: dict[str, MeasureFigures] = Field(alias="global")
    rate_what_if: list[RateOutliers] = []
    rate_unjudged: list[RateUnjudged] = []  # absent from runs made before it was recorded

    @model_validator(mode="after")
    def _unjudged_are_small(self) -> Quality:
        least = self.rules.get("rate_min_clips")
        for x in self.rate_unjudged:
            if isinstance(least, int) and x.rated >= least:
                raise _problem(
                    f"quality.rate_unjudged has {x.language} with {x.rated} rated clips, but "
                    f"quality.rules.rate_min_clips is {least}: it was judged"
                )
        return self


class MostlyDropped(_Section):
    """A speaker or language the filter dropped most clips of (`melshards.preprocess.write.report.mostly_dropped`):
    its clips measured, those dropped, and per reason (its row's `per_reason`)."""

    kind: Literal["speaker", "language"]
    name: StrictStr
    measured: Count
    dropped: Count
    per_reason: dict[str, Count]

    @model_validator(mode="after")
    def _adds_up(self) -> MostlyDropped:
        if sum(self.per_reason.values()) != self.dropped:
            raise _problem(
                f"mostly_dropped {self.kind} {self.name}: per_reason sums to {sum(self.per_reason.values())}, "
                f"but dropped is {self.dropped}"
            )
        if not self.measured >= self.dropped > self.measured / 2:
            raise _problem(
                f"mostly_dropped {self.kind} {self.name}: {self.dropped} dropped of {self.measured} measured "
                "is not most of them"
            )
        return self


class SpeakerRow(_Section):
    """`melshards.preprocess.write.report.speaker_stats`: one speaker; id null when filter.min_speaker_clips
    dropped it (then it has no clips in the shards)."""

    id: Count | None
    name: StrictStr
    clips: Count  # in the shards
    hours: Number  # in the shards
    gender: Literal["F", "M", ""]
    measured: Count  # clips measured (before the filter)
    per_split: dict[str, Count]  # split -> clips in the shards
    stats: dict[str, FeatureMoments] = {}  # pitch, energy: as in schema.json (runs with those features)
    pitch: PitchPercentiles | None = None  # runs with pitch
    per_reason: dict[str, Count] | None = None  # its clips the filter dropped, per reason (absent from older runs)
    quality: dict[str, MeasureFigures] | None = None  # runs with quality measures: percentiles, no histogram
    rate_outliers: list[RateOutliers] = []


class TextFrontend(_Section):
    """`melshards.shards_schema.text.frontend_record`: the front end that made a language's text."""

    name: StrictStr
    version: IntOrStr


class LanguageRow(_Section):
    """`melshards.preprocess.write.report.language_stats`: one language, its lengths before the filter and its
    text-length cut-off (null when no clip was measured)."""

    id: Count
    code: StrictStr
    clips: Count
    hours: Number
    text_frontend: TextFrontend
    before_filter: LengthSummaries
    max_text_len: StrictInt | None = None
    stats: dict[str, FeatureMoments] = {}
    per_reason: dict[str, Count] | None = None  # its clips the filter dropped, per reason
    quality: dict[str, MeasureFigures] | None = None  # runs with quality measures: with the exact histograms


class Split(_Section):
    """The config's `split` section as the run used it, and the held-out speakers it did not find."""

    val_fraction: Number
    val_speakers: list[StrictStr]
    val_speakers_not_found: list[StrictStr]


class InputSummary(_Section):
    """One --input of the run (`melshards.preprocess.inputs.read_stage.input_summary`): its layout, its input rows,
    the language of its rows that give none, how many of its speaker labels and ids were prefixed
    with its name because another input has them too, and the language codes its rows spelt otherwise
    than their canonical BCP 47 form (as written -> as used)."""

    input: StrictStr
    name: StrictStr
    format: StrictStr
    rows: Count
    language: StrictStr | None = None
    prefixed_speakers: Count
    prefixed_ids: Count
    language_codes_folded: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    unused_columns: list[StrictStr] = Field(default_factory=list)  # columns of its table no field is read from


def _ids_problem(table: str, ids: list[int | None]) -> str | None:
    """Ids must run 0..N-1 in table order, the rows with id null (dropped speakers) after them."""
    for i, got in enumerate(ids):
        kept = sum(x is not None for x in ids[:i])
        if got is not None and kept < i:
            return (
                f"{table}.{i}.id is {got}, after a dropped speaker (id null) at {table}.{ids.index(None)}: "
                "dropped speakers come last"
            )
        if got is not None and got != i:
            return f"{table}.{i}.id is {got}, but ids run 0..N-1 in table order, so it should be {i}"
    return None


def _first_repeat(values: list[str]) -> tuple[int, str] | None:
    seen: set[str] = set()
    for i, v in enumerate(values):
        if v in seen:
            return i, v
        seen.add(v)
    return None


def speakers_problem(speakers: list[SpeakerRow], counts: Counts) -> str | None:
    """The speaker table against the counts: ids, unique names, dropped speakers without clips, and
    clips per speaker and per split adding up to the clips in the shards."""
    problem = _ids_problem("speakers", [s.id for s in speakers])
    if problem:
        return problem
    repeat = _first_repeat([s.name for s in speakers])
    if repeat:
        return f"speakers.{repeat[0]}.name is {repeat[1]!r}, a speaker listed twice"
    for i, s in enumerate(speakers):
        if s.id is None and s.clips:
            return f"speakers.{i}.clips is {s.clips}, but speaker {s.name!r} was dropped (id null): it has no clips"
        if sum(s.per_split.values()) != s.clips:
            return f"speakers.{i}.per_split sums to {sum(s.per_split.values())}, but speakers.{i}.clips is {s.clips}"
    total = sum(s.clips for s in speakers)
    if total != counts.in_shards:
        return f"speakers' clips sum to {total}, but counts.in_shards is {counts.in_shards}"
    for split in sorted(set(counts.per_split) | {k for s in speakers for k in s.per_split}):
        n = sum(s.per_split.get(split, 0) for s in speakers)
        if n != counts.per_split.get(split, 0):
            return (
                f"speakers' per_split.{split} sums to {n}, but counts.per_split.{split} is "
                f"{counts.per_split.get(split, 0)}"
            )
    return None


def quality_problem(stats: StatsFile) -> str | None:
    """The quality figures against the rest: each speaker's measures count its clips measured (with a
    value or without), the speakers' clips dropped per filter reason sum to counts.per_reason, and every
    measure a table holds has its grid in quality.measures."""
    speakers, languages = stats.speakers or [], stats.languages or []
    if speakers and all(s.per_reason is not None for s in speakers):
        for reason in FILTER_REASONS:
            total = sum((s.per_reason or {}).get(reason, 0) for s in speakers)
            if total != stats.counts.per_reason.get(reason, 0):
                return (
                    f"speakers' per_reason.{reason} sums to {total}, but counts.per_reason.{reason} is "
                    f"{stats.counts.per_reason.get(reason, 0)}"
                )
    for i, s in enumerate(speakers):
        for m, f in (s.quality or {}).items():
            if f.count + f.not_measured != s.measured:
                return (
                    f"speakers.{i}.quality.{m} counts {f.count} + {f.not_measured} not measured clips, but "
                    f"speakers.{i}.measured is {s.measured}"
                )
    grids = set(stats.quality.measures) if stats.quality else set()
    tables = [("quality.global", stats.quality.per_measure if stats.quality else {})]
    tables += [(f"speakers.{i}.quality", s.quality or {}) for i, s in enumerate(speakers)]
    tables += [(f"languages.{i}.quality", x.quality or {}) for i, x in enumerate(languages)]
    for where, table in tables:
        unknown = sorted(set(table) - grids)
        if unknown:
            return f"{where}.{unknown[0]} has no grid in quality.measures"
    return None


def languages_problem(languages: list[LanguageRow], counts: Counts, cutoffs: CutoffsSection | None) -> str | None:
    """The language table against the counts and the cut-offs: ids, unique codes, clips adding up to
    the clips in the shards, and each language's text-length cut-off as the cut-offs give it."""
    problem = _ids_problem("languages", [x.id for x in languages])
    if problem:
        return problem
    repeat = _first_repeat([x.code for x in languages])
    if repeat:
        return f"languages.{repeat[0]}.code is {repeat[1]!r}, a language listed twice"
    total = sum(x.clips for x in languages)
    if total != counts.in_shards:
        return f"languages' clips sum to {total}, but counts.in_shards is {counts.in_shards}"
    if cutoffs is None:
        return None
    for i, x in enumerate(languages):
        limit = cutoffs.max_text_len_by_language.get(x.code, cutoffs.max_text_len)
        where = (
            f"cutoffs.max_text_len_by_language.{x.code}"
            if x.code in cutoffs.max_text_len_by_language
            else "cutoffs.max_text_len"
        )
        if x.max_text_len is None:
            return f"languages.{i}.max_text_len is null, but {where} is {limit}"
        if x.max_text_len != limit:
            return f"languages.{i}.max_text_len is {x.max_text_len}, but {where} is {limit}"
    return None


class References(_Section):
    """An other_clip run's records whose reference is not another clip of their split
    (`melshards.preprocess.write.report.reference_counts`)."""

    own_clip: dict[StrictStr, Count]  # split -> records cut from themselves (no other clip to take)
    val_from_train: Count  # validation records cut from a training clip of their speaker (no other val clip)


class StatsFile(_Section):
    """stats.json. `filter`, `cutoffs`, `padding` and `buckets` are null or absent when no clip was measured;
    so may `speakers`, `languages` and `split` be (or the tables empty)."""

    schema_version: StrictStr
    counts: Counts
    before_filter: LengthSummaries
    after_filter: LengthSummaries
    histograms: Histograms
    filter: FilterSettings | None = None
    cutoffs: CutoffsSection | None = None
    padding: Padding | None = None
    buckets: Buckets | None = None
    speakers: list[SpeakerRow] | None = None
    languages: list[LanguageRow] | None = None
    split: Split | None = None
    inputs: list[InputSummary] | None = None  # absent from runs made before several inputs were read
    features: list[StrictStr] = []  # the optional features the records hold (schema.OPTIONAL_FEATURES)
    cache: dict[str, Any] | None = (
        None  # runs with --cache: {dir, hits, computed, damaged, damaged_files, parts_computed, files_used}
    )
    feature_stats: dict[str, FeatureMoments] = {}  # global pitch and energy statistics (training split)
    quality: Quality | None = None  # the quality measures' figures (absent from runs made before them)
    # speaker -> quality rule (QUALITY_REASONS) -> clips it dropped, speakers with a drop only; absent
    # from runs made before it was counted (`melshards.preprocess.write.report.quality_dropped_by_speaker`)
    quality_dropped_by_speaker: dict[StrictStr, dict[StrictStr, Count]] | None = None
    # the speakers and languages the filter dropped most (over half) of the measured clips of; absent
    # from runs made before it was recorded (`melshards.preprocess.write.report.mostly_dropped`)
    mostly_dropped: list[MostlyDropped] | None = None
    references: References | None = None  # other_clip runs (absent from the others and runs made before it)

    @model_validator(mode="after")
    def _measured(self) -> StatsFile:
        """Once any clip was measured there are cut-offs, and the what-if tables need all of these."""
        if self.cutoffs is None:
            return self
        for key in LENGTH_KEYS:
            if key not in self.histograms.before_filter:
                raise _problem(f"histograms.before_filter.{key} is missing")
        # padding describes the shards: a run whose every measured clip was filtered out has none
        for key in ("filter", "padding") if self.counts.in_shards else ("filter",):
            if getattr(self, key) is None:
                raise _problem(f"{key} is null, not an object" if key in self.model_fields_set else f"{key} is missing")
            section = getattr(self, key)
            missing = next((f for f in type(section).model_fields if getattr(section, f) is None), None)
            if missing is not None:
                raise _problem(f"{key}.{missing} is missing")
        for key, kind in (("speakers", "a list"), ("languages", "a list"), ("split", "an object")):
            if getattr(self, key) is None:
                raise _problem(f"{key} is null, not {kind}" if key in self.model_fields_set else f"{key} is missing")
        by_language = self.cutoffs.max_text_len_by_language
        if by_language and max(by_language.values()) != self.cutoffs.max_text_len:
            raise _problem(
                f"cutoffs.max_text_len is {self.cutoffs.max_text_len}, but the largest of "
                f"cutoffs.max_text_len_by_language is {max(by_language.values())}"
            )
        return self

    @model_validator(mode="after")
    def _tables_add_up(self) -> StatsFile:
        """The speaker and language tables against the counts (and each other's ids), whenever present."""
        problem = (
            (self.speakers is not None and speakers_problem(self.speakers, self.counts))
            or (self.languages is not None and languages_problem(self.languages, self.counts, self.cutoffs))
            or quality_problem(self)
        )
        if problem:
            raise _problem(problem)
        return self

    @model_validator(mode="after")
    def _quality_drops_add_up(self) -> StatsFile:
        """Each quality rule's drops per speaker sum to its count in counts.per_reason."""
        problem = self.quality_dropped_by_speaker is not None and quality_drops_problem(
            self.quality_dropped_by_speaker, self.counts
        )
        if problem:
            raise _problem(problem)
        return self


def quality_drops_problem(by_speaker: dict[str, dict[str, int]], counts: Counts) -> str | None:
    """`quality_dropped_by_speaker` against the counts: only quality rules, and each rule's clips over
    the speakers adding up to counts.per_reason."""
    for speaker, rules in by_speaker.items():
        other = next((r for r in rules if r not in QUALITY_REASONS), None)
        if other is not None:
            return f"quality_dropped_by_speaker.{speaker} has {other!r}, not a quality rule"
    for reason in QUALITY_REASONS:
        n = sum(rules.get(reason, 0) for rules in by_speaker.values())
        if n != counts.per_reason.get(reason, 0):
            return (
                f"quality_dropped_by_speaker's {reason} sums to {n}, but counts.per_reason.{reason} is "
                f"{counts.per_reason.get(reason, 0)}"
            )
    return None


# -- one sentence per error, naming the field ------------------------------------------------------
_KINDS = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "a boolean",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    INT_OR_STR: "an integer or a string",
    RULE_VALUE: "a number, a boolean or null",
}


def _describe(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value[:40]!r})"
    return "a list" if isinstance(value, (list, tuple)) else "an object"


def error_text(error: ErrorDetails) -> str:
    """One pydantic error (ValidationError.errors() item) as "FIELD is X, not Y", FIELD dotted."""
    loc = [str(part) for part in error["loc"]]
    if error["type"] == PROBLEM:
        return error["ctx"]["problem"]
    if loc and loc[-1] == "[key]":  # a dict key that failed its own type: loc is (..., key, "[key]")
        return f"{'.'.join(loc[:-2])} has the key {loc[-2]!r}, not an integer length"
    where = ".".join(loc) or "stats.json"
    if error["type"] == "missing":
        return f"{where} is missing"
    if error["type"] == "greater_than_equal":
        return f"{where} is {error['input']}, a negative count"
    if error["type"] == "literal_error":
        return f"{where} is {_describe(error['input'])}, not {error['ctx']['expected']}"
    if error["type"] in _KINDS:
        return f"{where} is {_describe(error['input'])}, not {_KINDS[error['type']]}"
    return f"{where}: {error['msg']}"


def stats_problem(stats: Any) -> str | None:
    """Why `stats` (stats.json, parsed) is not what the job writes, as one sentence naming the first
    field of the wrong type, missing, or a count that is negative or does not add up; or None."""
    try:
        StatsFile.model_validate(stats)
    except ValidationError as e:
        return error_text(e.errors()[0])
    return None
