"""stats.json, declared once: the pydantic model the job validates what it writes against
(`melshards.preprocess.report.build_stats`) and `melshards stats` validates what it reads against
(`melshards.reports.stats_report.load_run`), before either trusts a figure.

Numbers are strict (a string "56" or a boolean is not a count). The counts must add up:
input_rows = in_shards + filtered + rejected, per_split sums to in_shards, and per_reason's filter
reasons sum to filtered, the others to rejected. A run that measured any clip (cut-offs present) also
has the filter settings, the padding, and the three before-filter histograms the what-if tables need;
a run that rejected every row has none of them.

`stats_problem` turns the first validation error into one sentence naming the field's dotted path
("counts.input_rows is a string ('56'), not an integer"). Only pydantic is imported here.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr,
                      StringConstraints, ValidationError, model_validator)
from pydantic_core import PydanticCustomError

from melshards.shards_schema.stats import FILTER_REASONS, LENGTH_KEYS

Count = Annotated[StrictInt, Field(ge=0)]  # a negative count is "a negative count", not a type error
Number = StrictFloat  # an int is a number too; a bool or a string is not
IntKey = Annotated[str, StringConstraints(pattern=r"^-?[0-9]+$")]  # JSON keys of a length histogram
Histogram = dict[IntKey, StrictInt]  # length (as a string) -> clips of that length

PROBLEM = "stats_json_problem"  # the error type of the checks below the field types


def _problem(text: str) -> PydanticCustomError:
    return PydanticCustomError(PROBLEM, "{problem}", {"problem": text})


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
    def _add_up(self) -> "Counts":
        parts = self.in_shards + self.filtered + self.rejected
        if self.input_rows != parts:
            raise _problem(f"counts.input_rows is {self.input_rows}, but in_shards + filtered + rejected "
                           f"({self.in_shards} + {self.filtered} + {self.rejected}) is {parts}")
        split_sum = sum(self.per_split.values())
        if split_sum != self.in_shards:
            raise _problem(f"counts.per_split sums to {split_sum}, but counts.in_shards is {self.in_shards}")
        for key, of_kind in (("filtered", True), ("rejected", False)):
            total = sum(v for r, v in self.per_reason.items() if (r in FILTER_REASONS) == of_kind)
            if total != getattr(self, key):
                raise _problem(f"counts.per_reason's {key} reasons sum to {total}, but counts.{key} is "
                               f"{getattr(self, key)}")
        return self


class Lengths(_Section):
    """One length's summary (`melshards.shards_schema.stats.summarize`); mean is null with no clips."""
    count: Count
    mean: Optional[Number] = None
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
    min_duration_s: Optional[Number] = None
    mel_frames_lower_percentile: Optional[Number] = None
    mel_frames_upper_percentile: Optional[Number] = None
    text_len_upper_percentile: Optional[Number] = None


class Cutoffs(_Section):
    """`melshards.shards_schema.stats.Cutoffs`: the filter bounds (inclusive) and padded lengths."""
    min_duration_ms: StrictInt
    min_mel_frames: StrictInt
    max_mel_frames: StrictInt
    max_text_len: StrictInt
    padded_mel_frames: Optional[StrictInt] = None
    padded_text_len: Optional[StrictInt] = None


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


class Merge(_Section):
    """`melshards.shards_schema.buckets.Merge.to_dict`: a bucket too small, padded up `into` a bound."""
    bound: StrictInt
    records: Count
    min_records: StrictInt
    into: StrictInt


class BucketPlan(_Section):
    """`melshards.shards_schema.buckets.BucketChoice.to_dict`: how the bounds were chosen."""
    k_requested: Union[StrictInt, StrictStr]  # K or "auto"
    k_used: StrictInt
    max_buckets: StrictInt
    target_padding: Number
    multiple: StrictInt
    bounds: list[StrictInt]
    buckets: list[PlanBucket]
    padding_fraction: Number
    unconstrained_padding_fraction: Number
    merges: list[Merge]
    min_records_met: StrictBool


class WhatIfK(_Section):
    """One row of `melshards.shards_schema.buckets.padding_by_k`: null when no K buckets can be filled."""
    k: StrictInt
    buckets_used: Optional[StrictInt]
    padding_fraction: Optional[Number]


class Buckets(_Section):
    """`melshards.preprocess.bucketing.bucket_stats`: the length buckets of the shards."""
    buckets: list[BucketRow]
    mel_padding_fraction: Number
    text_padding_fraction: Number
    min_bucket_records: StrictInt
    plan: Optional[BucketPlan]
    merges: list[Merge]
    raised_last_bound: Any = None
    what_if: list[WhatIfK]


class InputSummary(_Section):
    """One --input of the run (`melshards.preprocess.corpus.input_summary`): its layout, its input rows,
    the language of its rows that give none, and how many of its speaker labels and ids were prefixed
    with its name because another input has them too."""
    input: StrictStr
    name: StrictStr
    format: StrictStr
    rows: Count
    language: Optional[StrictStr] = None
    prefixed_speakers: Count
    prefixed_ids: Count


class StatsFile(_Section):
    """stats.json. `filter`, `cutoffs`, `padding` and `buckets` are null or absent when no clip was measured."""
    schema_version: StrictStr
    counts: Counts
    before_filter: LengthSummaries
    after_filter: LengthSummaries
    histograms: Histograms
    filter: Optional[FilterSettings] = None
    cutoffs: Optional[Cutoffs] = None
    padding: Optional[Padding] = None
    buckets: Optional[Buckets] = None
    inputs: Optional[list[InputSummary]] = None  # absent from runs made before several inputs were read

    @model_validator(mode="after")
    def _measured(self) -> "StatsFile":
        """Once any clip was measured there are cut-offs, and the what-if tables need all of these."""
        if self.cutoffs is None:
            return self
        for key in LENGTH_KEYS:
            if key not in self.histograms.before_filter:
                raise _problem(f"histograms.before_filter.{key} is missing")
        for key in ("filter", "padding"):
            if getattr(self, key) is None:
                raise _problem(f"{key} is null, not an object" if key in self.model_fields_set
                               else f"{key} is missing")
            section = getattr(self, key)
            missing = next((f for f in type(section).model_fields if getattr(section, f) is None), None)
            if missing is not None:
                raise _problem(f"{key}.{missing} is missing")
        return self


# -- one sentence per error, naming the field ------------------------------------------------------
_KINDS = {"int_type": "an integer", "float_type": "a number", "string_type": "a string",
          "bool_type": "a boolean", "list_type": "a list", "dict_type": "an object", "model_type": "an object",
          "model_attributes_type": "an object"}


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


def error_text(error: dict) -> str:
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
