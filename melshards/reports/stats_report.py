"""Load a finished preprocessing run's stats.json and gather every figure `melshards stats` shows.

`build_report` returns one plain dict (the `--json` output); the terminal tables, the HTML report
and the comparison are all rendered from it, so they cannot disagree.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable

from apache_beam.io.filesystems import FileSystems

from melshards.shards_schema.shards import dir_of
from melshards.reports.whatif import DEFAULT_WHAT_IF, WhatIf, batch_bytes, int_hist, what_if_table
from melshards.shards_schema.stats import FILTER_REASONS
from melshards.shards_schema import REJECTED_FILE, SCHEMA_FILE, SCHEMA_VERSION, STATS_FILE, Schema, SchemaError

EXAMPLES_PER_REASON = 3


class StatsError(ValueError):
    """The path holds no usable stats.json."""


# -- the shape of stats.json as `melshards stats` reads it (preprocess/report.py build_stats writes it) --------
INT, NUMBER = "an integer", "a number"


@dataclasses.dataclass(frozen=True)
class MapOf:
    """A JSON object with any keys (integer strings when int_keys), every value of the one shape."""
    value: Any
    int_keys: bool = False


@dataclasses.dataclass(frozen=True)
class Nullable:
    """May be null or absent: a run that rejected every row has no cut-offs, padding or filter figures."""
    shape: Any


_LENGTHS = {key: {"count": INT, "mean": Nullable(NUMBER), "percentiles": MapOf(NUMBER)}
            for key in ("text_len", "mel_frames", "duration_s")}
_HISTOGRAMS = MapOf(MapOf(INT, int_keys=True))
_CUTOFFS = {"min_duration_ms": INT, "min_mel_frames": INT, "max_mel_frames": INT, "max_text_len": INT}
_PADDING = {"max_text_len": INT, "max_mel_frames": INT, "multiple": INT,
            "mel_padding_fraction": NUMBER, "text_padding_fraction": NUMBER}
STATS_SHAPE = {
    "counts": {"input_rows": INT, "in_shards": INT, "filtered": INT, "rejected": INT,
               "per_split": MapOf(INT), "per_reason": MapOf(INT)},
    "before_filter": _LENGTHS,
    "after_filter": _LENGTHS,
    "histograms": {"before_filter": _HISTOGRAMS, "after_filter": _HISTOGRAMS},
    "filter": Nullable({}),  # the preprocess config's filter section; only MEASURED_SHAPE's fields are read
    "cutoffs": Nullable(_CUTOFFS),
    "padding": Nullable(_PADDING),
}
# Once any clip was measured there are cut-offs, and the what-if table needs all of these.
MEASURED_SHAPE = {
    "histograms": {"before_filter": {key: _HISTOGRAMS.value for key in ("text_len", "mel_frames", "duration_ms")}},
    "filter": {"mel_frames_upper_percentile": NUMBER, "text_len_upper_percentile": NUMBER,
               "min_duration_s": NUMBER, "mel_frames_lower_percentile": NUMBER},
    "padding": _PADDING,
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
    return "a list" if isinstance(value, list) else "an object"


def _field(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def shape_problem(value, shape, where: str = "") -> str | None:
    """The first place where value is not of the shape, as "FIELD is X, not Y" (FIELD dotted), or None."""
    if isinstance(shape, Nullable):
        return None if value is None else shape_problem(value, shape.shape, where)
    if shape in (INT, NUMBER):
        ok = isinstance(value, int) if shape == INT else isinstance(value, (int, float))
        return None if ok and not isinstance(value, bool) else f"{where} is {_describe(value)}, not {shape}"
    if not isinstance(value, dict):
        return f"{where} is {_describe(value)}, not an object"
    if isinstance(shape, MapOf):
        bad = next((k for k in value if not k.lstrip("-").isdigit()), None) if shape.int_keys else None
        if bad is not None:
            return f"{where} has the key {bad!r}, not an integer length"
        fields = [(key, item, shape.value) for key, item in value.items()]
    else:
        missing = next((k for k, s in shape.items() if k not in value and not isinstance(s, Nullable)), None)
        if missing is not None:
            return f"{_field(where, missing)} is missing"
        fields = [(key, value.get(key), s) for key, s in shape.items()]
    for key, item, item_shape in fields:
        problem = shape_problem(item, item_shape, _field(where, key))
        if problem:
            return problem
    return None


def counts_problem(counts: dict) -> str | None:
    """The first count of stats.json's `counts` that is negative or does not add up, or None.

    As preprocess/report.py build_stats writes them: input_rows = in_shards + filtered + rejected,
    per_split sums to in_shards, and per_reason's filter reasons sum to filtered, the others to rejected.
    """
    fields = [(f"counts.{k}", counts[k]) for k in ("input_rows", "in_shards", "filtered", "rejected")]
    fields += [(f"counts.{group}.{k}", v) for group in ("per_split", "per_reason") for k, v in counts[group].items()]
    negative = next(((name, v) for name, v in fields if v < 0), None)
    if negative:
        return f"{negative[0]} is {negative[1]}, a negative count"
    parts = counts["in_shards"] + counts["filtered"] + counts["rejected"]
    if counts["input_rows"] != parts:
        return (f"counts.input_rows is {counts['input_rows']}, but in_shards + filtered + rejected "
                f"({counts['in_shards']} + {counts['filtered']} + {counts['rejected']}) is {parts}")
    split_sum = sum(counts["per_split"].values())
    if split_sum != counts["in_shards"]:
        return f"counts.per_split sums to {split_sum}, but counts.in_shards is {counts['in_shards']}"
    for key, of_kind in (("filtered", True), ("rejected", False)):
        total = sum(v for r, v in counts["per_reason"].items() if (r in FILTER_REASONS) == of_kind)
        if total != counts[key]:
            return f"counts.per_reason's {key} reasons sum to {total}, but counts.{key} is {counts[key]}"
    return None


def stats_problem(stats: dict) -> str | None:
    """Why stats.json cannot be reported as it is (its first field of the wrong type or missing, or a
    count that is negative or does not add up), or None."""
    problem = shape_problem(stats, STATS_SHAPE)
    if problem is None and stats.get("cutoffs") is not None:
        problem = shape_problem(stats, MEASURED_SHAPE)
    return problem or counts_problem(stats["counts"])


@dataclasses.dataclass(frozen=True)
class Run:
    stats_path: str
    stats: dict
    n_mels: int | None  # from schema.json beside stats.json, or --n-mels
    rejected_path: str | None


def stats_path_of(path: str) -> str:
    """A run directory or its stats.json, local or gs://."""
    path = path.rstrip("/") if len(path) > 1 else path
    return path if path.endswith(".json") else FileSystems.join(path, STATS_FILE)


def load_run(path: str, n_mels: int | None = None) -> Run:
    stats_path = stats_path_of(path)
    if not FileSystems.exists(stats_path):
        raise StatsError(
            f"{stats_path} does not exist: pass the --output directory of a finished `melshards preprocess` "
            f"run or its {STATS_FILE} (the job writes {STATS_FILE} when it ends).")
    with FileSystems.open(stats_path) as f:
        text = f.read().decode("utf-8")
    try:
        stats = json.loads(text)
    except json.JSONDecodeError as e:
        raise StatsError(f"{stats_path} is not valid JSON ({e}); re-run `melshards preprocess`.") from e
    if not isinstance(stats, dict):
        raise StatsError(f"{stats_path} is not a melshards stats.json (not a JSON object); "
                         "pass the stats.json `melshards preprocess` wrote.")
    missing = [k for k in ("counts", "before_filter", "after_filter", "histograms") if k not in stats]
    if missing:
        raise StatsError(f"{stats_path} is not a melshards stats.json (no {', '.join(missing)}); "
                         "pass the stats.json `melshards preprocess` wrote.")
    version = str(stats.get("schema_version", ""))
    if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise StatsError(f"{stats_path} has version {version or '(none)'}, this melshards reads "
                         f"{SCHEMA_VERSION.split('.')[0]}.x; re-run `melshards preprocess` with this version.")
    problem = stats_problem(stats)
    if problem:
        raise StatsError(f"{stats_path} is damaged or was not written by `melshards preprocess`: {problem}; "
                         "re-run `melshards preprocess` to write it again.")
    run_dir = dir_of(stats_path)
    if n_mels is None:
        schema_path = FileSystems.join(run_dir, SCHEMA_FILE)
        if FileSystems.exists(schema_path):
            try:
                with FileSystems.open(schema_path) as f:  # Beam's IO: `stats` must not import TensorFlow
                    n_mels = Schema.from_json(f.read().decode("utf-8"), where=schema_path).n_mels
            except SchemaError as e:
                raise StatsError(f"{e} (needed for n_mels; pass --n-mels to skip reading it)") from e
    rejected = FileSystems.join(run_dir, REJECTED_FILE)
    return Run(stats_path, stats, n_mels, rejected if FileSystems.exists(rejected) else None)


def read_jsonl(path: str) -> Iterable[dict]:
    with FileSystems.open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise StatsError(f"{path} line {n} is not JSON ({e}); re-run `melshards preprocess`.") from e


def top_reasons(per_reason: dict, rows: Iterable[dict], examples: int = EXAMPLES_PER_REASON) -> list[dict]:
    """Reasons by count (most first), each with the first `examples` ids and details from rejected.jsonl."""
    found: dict[str, list[dict]] = {r: [] for r in per_reason}
    wanted = sum(min(examples, n) for n in per_reason.values())
    for row in rows:
        bucket = found.get(row.get("reason"))
        if bucket is not None and len(bucket) < examples:
            bucket.append({"id": row.get("id", "?"), "detail": row.get("detail", "")})
            wanted -= 1
            if wanted <= 0:  # rejected.jsonl can be long; stop once every reason has its examples
                break
    ordered = sorted(per_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    return [{"reason": r, "kind": "filtered" if r in FILTER_REASONS else "rejected", "count": n,
             "examples": found.get(r, [])} for r, n in ordered]


def audio_hours(hist: dict) -> float:
    """Hours of audio in a duration_ms histogram."""
    return round(sum(v * c for v, c in int_hist(hist).items()) / 3.6e6, 4)


def build_report(run: Run, batch_size: int, qs: tuple[float, ...] = DEFAULT_WHAT_IF,
                 examples: int = EXAMPLES_PER_REASON) -> dict:
    s = run.stats
    c = s["counts"]
    rows = read_jsonl(run.rejected_path) if run.rejected_path else ()
    hists = s["histograms"]
    padding = dict(s["padding"]) if s.get("padding") else None
    if padding is not None:
        padding["batch_bytes"] = (None if run.n_mels is None else
                                  batch_bytes(batch_size, padding["max_mel_frames"], run.n_mels,
                                              padding["max_text_len"]))
    table: list[WhatIf] = what_if_table(s, qs, batch_size, run.n_mels)
    return {
        "source": run.stats_path,
        "counts": {k: c[k] for k in ("input_rows", "in_shards", "filtered", "rejected", "per_split", "per_reason")},
        "hours": {"before_filter": audio_hours(hists.get("before_filter", {}).get("duration_ms", {})),
                  "after_filter": audio_hours(hists.get("after_filter", {}).get("duration_ms", {}))},
        "before_filter": s["before_filter"],
        "after_filter": s["after_filter"],
        "filter": s.get("filter"),
        "cutoffs": s.get("cutoffs"),
        "padding": padding,
        "buckets": s.get("buckets"),
        "batch_size": batch_size,
        "n_mels": run.n_mels,
        "what_if": [w.to_dict() for w in table],
        "reasons": top_reasons(c["per_reason"], rows, examples),
        "rejected_file": run.rejected_path,
    }
