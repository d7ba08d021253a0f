"""Load a finished preprocessing run's stats.json and gather every figure `melshards stats` shows.

`build_report` returns one plain dict (the `--json` output); the terminal tables, the HTML report
and the comparison are all rendered from it, so they cannot disagree.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Iterable

from apache_beam.io.filesystems import FileSystems

from melshards.reports.quality_tables import quality_report
from melshards.reports.whatif import DEFAULT_WHAT_IF, WhatIf, batch_bytes, int_hist, what_if_table
from melshards.shards_schema import REJECTED_FILE, SCHEMA_FILE, SCHEMA_VERSION, SPLITS, STATS_FILE, Schema, SchemaError
from melshards.shards_schema.shards import dir_of
from melshards.shards_schema.stats import FILTER_REASONS
from melshards.shards_schema.stats_model import stats_problem  # stats.json, declared once

EXAMPLES_PER_REASON = 3
LENGTHS = ("text_len", "mel_frames", "duration_s")  # the before-filter summaries of a language
SPREAD = (("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("max", "p100"))  # label -> percentile key
VIEWS = {"speaker": "speakers", "language": "languages"}  # --by -> the report's key


class StatsError(ValueError):
    """The path holds no usable stats.json."""


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
            f"run or its {STATS_FILE} (the job writes {STATS_FILE} when it ends)."
        )
    with FileSystems.open(stats_path) as f:
        text = f.read().decode("utf-8")
    try:
        stats = json.loads(text)
    except json.JSONDecodeError as e:
        raise StatsError(f"{stats_path} is not valid JSON ({e}); re-run `melshards preprocess`.") from e
    if not isinstance(stats, dict):
        raise StatsError(
            f"{stats_path} is not a melshards stats.json (not a JSON object); "
            "pass the stats.json `melshards preprocess` wrote."
        )
    missing = [k for k in ("counts", "before_filter", "after_filter", "histograms") if k not in stats]
    if missing:
        raise StatsError(
            f"{stats_path} is not a melshards stats.json (no {', '.join(missing)}); "
            "pass the stats.json `melshards preprocess` wrote."
        )
    version = str(stats.get("schema_version", ""))
    if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise StatsError(
            f"{stats_path} has version {version or '(none)'}, this melshards reads "
            f"{SCHEMA_VERSION.split('.')[0]}.x; re-run `melshards preprocess` with this version."
        )
    problem = stats_problem(stats)
    if problem:
        raise StatsError(
            f"{stats_path} is damaged or was not written by `melshards preprocess`: {problem}; "
            "re-run `melshards preprocess` to write it again."
        )
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
        bucket = found.get(row.get("reason", ""))
        if bucket is not None and len(bucket) < examples:
            bucket.append({"id": row.get("id", "?"), "detail": row.get("detail", "")})
            wanted -= 1
            if wanted <= 0:  # rejected.jsonl can be long; stop once every reason has its examples
                break
    ordered = sorted(per_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    return [
        {
            "reason": r,
            "kind": "filtered" if r in FILTER_REASONS else "rejected",
            "count": n,
            "examples": found.get(r, []),
        }
        for r, n in ordered
    ]


def audio_hours(hist: dict) -> float:
    """Hours of audio in a duration_ms histogram."""
    return round(sum(v * c for v, c in int_hist(hist).items()) / 3.6e6, 4)


def speaker_figures(speakers: list[dict], split: dict | None) -> dict:
    """`--by speaker`: every speaker of stats.json, most hours first (dropped speakers, id null, last),
    the totals over all of them, and a summary of the kept ones (the speakers with ids)."""
    rows = [
        dict(s, dropped=s["id"] is None)
        for s in sorted(speakers, key=lambda s: (s["id"] is None, -s["hours"], s["name"]))
    ]
    kept = [s for s in rows if not s["dropped"]]
    hours = sorted(s["hours"] for s in kept)
    split = split or {}
    return {
        "summary": {
            "speakers": len(kept),
            "dropped": len(rows) - len(kept),
            "hours_per_speaker": (
                {"median": round(statistics.median(hours), 4), "min": hours[0], "max": hours[-1]} if hours else None
            ),
            "without_val": [s["name"] for s in kept if not s["per_split"].get("val")],
            "val_speakers": list(split.get("val_speakers", [])),
            "val_speakers_not_found": list(split.get("val_speakers_not_found", [])),
        },
        "total": {
            "clips": sum(s["clips"] for s in rows),
            "hours": round(sum(s["hours"] for s in rows), 4),
            "per_split": {k: sum(s["per_split"].get(k, 0) for s in rows) for k in SPLITS},
            "measured": sum(s["measured"] for s in rows),
        },
        "rows": rows,
    }


def length_spread(summary: dict) -> dict:
    """p50, p90, p99 and max (p100) of one length summary of stats.json, and its clips."""
    return {"count": summary["count"], **{label: summary["percentiles"].get(q) for label, q in SPREAD}}


def measure_summaries(quality: dict) -> dict:
    """A language's quality figures without their histograms (stats.json keeps those)."""
    return {m: {k: v for k, v in f.items() if k != "histogram"} for m, f in quality.items()}


def language_figures(languages: list[dict]) -> dict:
    """`--by language`: every language in id order, its front end, clips and hours in the shards, its
    text-length cut-off and the spread of its lengths before the filter."""
    return {
        "codes": [x["code"] for x in languages],
        "rows": [
            {
                "id": x["id"],
                "code": x["code"],
                "text_frontend": x["text_frontend"],
                "clips": x["clips"],
                "hours": x["hours"],
                "measured": x["before_filter"]["text_len"]["count"],
                "max_text_len": x.get("max_text_len"),
                "before_filter": {k: length_spread(x["before_filter"][k]) for k in LENGTHS},
                **({"per_reason": x["per_reason"]} if x.get("per_reason") is not None else {}),
                **({"quality": measure_summaries(x["quality"])} if x.get("quality") else {}),
            }
            for x in languages
        ],
    }


def view(report: dict, by: str) -> dict:
    """The figures of one `--by` view (its `--json` output)."""
    return {"source": report["source"], VIEWS[by]: report[VIEWS[by]]}


def build_report(
    run: Run, batch_size: int, qs: tuple[float, ...] = DEFAULT_WHAT_IF, examples: int = EXAMPLES_PER_REASON
) -> dict:
    s = run.stats
    c = s["counts"]
    rows = read_jsonl(run.rejected_path) if run.rejected_path else ()
    hists = s["histograms"]
    padding = dict(s["padding"]) if s.get("padding") else None
    if padding is not None:
        padding["batch_bytes"] = (
            None
            if run.n_mels is None
            else batch_bytes(batch_size, padding["max_mel_frames"], run.n_mels, padding["max_text_len"])
        )
    table: list[WhatIf] = what_if_table(s, qs, batch_size, run.n_mels)
    return {
        "source": run.stats_path,
        "counts": {k: c[k] for k in ("input_rows", "in_shards", "filtered", "rejected", "per_split", "per_reason")},
        "hours": {
            "before_filter": audio_hours(hists.get("before_filter", {}).get("duration_ms", {})),
            "after_filter": audio_hours(hists.get("after_filter", {}).get("duration_ms", {})),
        },
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
        "speakers": speaker_figures(s.get("speakers") or [], s.get("split")),
        "languages": language_figures(s.get("languages") or []),
        "inputs": s.get("inputs") or [],
        "quality": quality_report(s),
        "mostly_dropped": s.get("mostly_dropped") or [],
    }
