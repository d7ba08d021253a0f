"""The tables of `melshards stats --by speaker|language`: speakers, languages, and both per run side by side.

Like `melshards.reports.stats_json_tables`, each is (header, rows) of strings, rendered as text here or as HTML
by `melshards.reports.html_report`. They read the `speakers` and `languages` figures of the dict
`melshards.reports.stats_report.build_report` returns.
"""

from __future__ import annotations

from melshards.reports.quality_tables import group_quality_rows, has_quality
from melshards.reports.stats_json_tables import COLUMNS, Table, render
from melshards.reports.stats_json_tables import _fmt as number
from melshards.reports.stats_report import VIEWS
from melshards.shards_schema import SPLITS
from melshards.shards_schema.stats import QUALITY_REASONS

TOP = 50  # speakers (or compared rows) in a table; --json lists all
NAMES_SHOWN = 5  # names listed in a summary line before "..."


def hours(h: float) -> str:
    return f"{h:.3f}"


def _names(names: list[str]) -> str:
    more = f", ... ({len(names) - NAMES_SHOWN} more)" if len(names) > NAMES_SHOWN else ""
    return ", ".join(names[:NAMES_SHOWN]) + more


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def corpus_line(report: dict) -> str:
    """The default report's one line on speakers and languages: "2 speakers, 2 languages (en-GB, en-US)"."""
    s, codes = report["speakers"]["summary"], report["languages"]["codes"]
    dropped = f" (+{s['dropped']} dropped)" if s["dropped"] else ""
    return f"{_plural(s['speakers'], 'speaker')}{dropped}, {_plural(len(codes), 'language')}" + (
        f" ({_names(codes)})" if codes else ""
    )


# -- --by speaker --------------------------------------------------------------------------------------
def speaker_rows(report: dict, top: int = TOP) -> Table:
    """The `top` speakers with the most hours (dropped ones last, marked), then the total over all speakers."""
    v = report["speakers"]
    pitch = any("pitch" in r for r in v["rows"])  # runs with features.pitch: voiced f0 percentiles
    header = [
        "id",
        "name",
        "gender",
        "clips",
        "hours",
        *SPLITS,
        "measured",
        *([f"f0 {q} Hz" for q in PITCH_PERCENTILES] if pitch else []),
    ]
    rows = [
        [
            "dropped" if r["dropped"] else str(r["id"]),
            r["name"],
            r["gender"] or "-",
            str(r["clips"]),
            hours(r["hours"]),
            *(str(r["per_split"].get(k, 0)) for k in SPLITS),
            str(r["measured"]),
            *(_f0(r, q) for q in (PITCH_PERCENTILES if pitch else ())),
        ]
        for r in v["rows"][:top]
    ]
    t = v["total"]
    rows.append(
        [
            "total",
            "",
            "",
            str(t["clips"]),
            hours(t["hours"]),
            *(str(t["per_split"][k]) for k in SPLITS),
            str(t["measured"]),
            *([""] * len(PITCH_PERCENTILES) if pitch else []),
        ]
    )
    return header, rows


PITCH_PERCENTILES = ("p5", "p50", "p95")


def _f0(row: dict, q: str) -> str:
    value = row.get("pitch", {}).get("percentiles", {}).get(q)
    return "-" if value is None else f"{value:g}"


def speaker_notes(report: dict, top: int = TOP) -> list[str]:
    """What the table leaves out, the summary line, and the held-out speakers."""
    v = report["speakers"]
    s, left = v["summary"], len(v["rows"]) - top
    out = [f"{left} more speaker(s) with fewer hours not shown; --json lists all {len(v['rows'])}"] if left > 0 else []
    if s["dropped"]:
        out.append(
            f"dropped: {_plural(s['dropped'], 'speaker')} with fewer measured clips than "
            "filter.min_speaker_clips, not in the shards"
        )
    h = s["hours_per_speaker"]
    spread = (
        f"hours per speaker: median {hours(h['median'])}, min {hours(h['min'])}, max {hours(h['max'])}"
        if h
        else "no hours"
    )
    without = s["without_val"]
    out.append(
        f"{_plural(s['speakers'], 'speaker')}; {spread}; {len(without)} without a validation clip"
        + (f" ({_names(without)})" if without else "")
    )
    held_out = [n for n in s["val_speakers"] if n not in s["val_speakers_not_found"]]
    if held_out:
        out.append(f"held out for validation (split.val_speakers): {_names(held_out)}")
    if s["val_speakers_not_found"]:
        out.append(
            f"split.val_speakers not in the corpus: {_names(s['val_speakers_not_found'])}; fix the names in the config"
        )
    return out


def speaker_table(report: dict, top: int = TOP) -> str:
    if not report["speakers"]["rows"]:
        return "no speakers: no clip was measured (every row was rejected)"
    return render(*speaker_rows(report, top), left=2) + "".join(f"\n{n}" for n in speaker_notes(report, top))


# -- --by language -------------------------------------------------------------------------------------
def frontend_label(x: dict) -> str:
    return f"{x['text_frontend']['name']} v{x['text_frontend']['version']}"


def language_rows(report: dict) -> Table:
    """Per language (id order): its front end, clips and hours in the shards, clips measured, text cut-off."""
    rows = [
        [
            x["code"],
            str(x["id"]),
            frontend_label(x),
            str(x["clips"]),
            hours(x["hours"]),
            str(x["measured"]),
            number(x["max_text_len"]),
        ]
        for x in report["languages"]["rows"]
    ]
    return ["code", "id", "front end", "clips", "hours", "measured", "text cut-off"], rows


def language_length_rows(report: dict) -> Table:
    """Per language and length: p50, p90, p99 and max before the filter (the language's code on its first row)."""
    rows = []
    for x in report["languages"]["rows"]:
        for i, (key, label) in enumerate(COLUMNS):
            spread = x["before_filter"][key]
            rows.append(
                [x["code"] if i == 0 else "", label, *(number(spread[q]) for q in ("p50", "p90", "p99", "max"))]
            )
    return ["code", "length", "p50", "p90", "p99", "max"], rows


def language_table(report: dict) -> str:
    if not report["languages"]["rows"]:
        return "no languages: no clip was measured (every row was rejected), or every speaker was dropped"
    return "\n".join(
        [
            render(*language_rows(report), left=3),
            "",
            "Lengths before filtering, per language",
            render(*language_length_rows(report), left=2),
        ]
    )


QUALITY_TITLE = (
    "Quality per {what} (percentiles of its clips measured, before the filter; then the clips the filter "
    "dropped, per reason{rate})"
)


def by_quality_rows(report: dict, by: str, top: int = TOP) -> Table | None:
    """The quality table of a `--by` view (the same rows as its first table, the top `top` speakers), or
    None for a stats.json without quality figures."""
    rows = report[VIEWS[by]]["rows"][:top]
    if not has_quality(rows):
        return None
    k = (report.get("quality") or {}).get("rate_iqr_k")
    return group_quality_rows(rows, "name" if by == "speaker" else "code", k)


def by_quality_title(report: dict, by: str) -> str:
    k = (report.get("quality") or {}).get("rate_iqr_k")
    rate = f"; rate out = clips outside the speaking-rate bounds at k={k:g}" if by == "speaker" and k else ""
    return QUALITY_TITLE.format(what=by, rate=rate)


def by_table(report: dict, by: str) -> str:
    """The terminal output of `--by`."""
    if by == "speaker":
        parts = [f"stats of {report['source']}", "", "Speakers (most hours in the shards first)", speaker_table(report)]
    else:
        parts = [
            f"stats of {report['source']}",
            "",
            "Languages (clips and hours in the shards)",
            language_table(report),
        ]
    table = by_quality_rows(report, by)
    if table is not None:
        parts += ["", by_quality_title(report, by), render(*table, left=1)]
    return "\n".join(parts)


# -- two runs, per speaker or language ---------------------------------------------------------------
def compare_by_rows(a: dict, b: dict, by: str, top: int = TOP) -> tuple[Table, int]:
    """Clips and hours per speaker (by name) or language (by code) in runs A and B, the largest change in
    hours first; and how many more rows there are than the `top` shown."""
    key = "name" if by == "speaker" else "code"
    ra = {r[key]: r for r in a[VIEWS[by]]["rows"]}
    rb = {r[key]: r for r in b[VIEWS[by]]["rows"]}
    names = list(dict.fromkeys([*ra, *rb]))

    def figures(name: str) -> tuple[int, int, float, float]:
        x, y = ra.get(name, {}), rb.get(name, {})
        return x.get("clips", 0), y.get("clips", 0), x.get("hours", 0.0), y.get("hours", 0.0)

    names.sort(key=lambda n: (-abs(figures(n)[3] - figures(n)[2]), -abs(figures(n)[1] - figures(n)[0]), n))
    drops = any(r.get("per_reason") is not None for r in (*ra.values(), *rb.values()))
    rows = []
    for n in names[:top]:
        ca, cb, ha, hb = figures(n)
        rows.append(
            [
                n,
                str(ca) if n in ra else "-",
                str(cb) if n in rb else "-",
                f"{cb - ca:+d}",
                hours(ha) if n in ra else "-",
                hours(hb) if n in rb else "-",
                f"{hb - ha:+.3f}",
                *((quality_dropped(ra.get(n)), quality_dropped(rb.get(n))) if drops else ()),
            ]
        )
    header = ["speaker" if by == "speaker" else "language", "clips A", "clips B", "B-A", "hours A", "hours B", "B-A"]
    return (header + (["quality drops A", "quality drops B"] if drops else []), rows), max(0, len(names) - top)


def quality_dropped(row: dict | None) -> str:
    """The clips the quality rules dropped from a speaker or language (its `per_reason`), or - (not in
    the run, or a stats.json without the counts)."""
    if row is None or row.get("per_reason") is None:
        return "-"
    return str(sum(n for r, n in row["per_reason"].items() if r in QUALITY_REASONS))


def compare_by_table(a: dict, b: dict, by: str, top: int = TOP) -> str:
    (header, rows), left = compare_by_rows(a, b, by, top)
    more = f"\n{left} more with smaller changes not shown; --json lists all" if left else ""
    what = "speaker" if by == "speaker" else "language"
    drops = "; quality drops = clips the quality rules dropped" if "quality drops A" in header else ""
    return (
        f"A = {a['source']}\nB = {b['source']}\nClips and hours per {what} (largest change in hours first; "
        f"- = not in that run{drops})\n" + render(header, rows, left=1) + more
    )
