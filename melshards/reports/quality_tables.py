"""The quality figures of `melshards stats`: each measure's percentiles over the clips measured (before the
filter), the clips each quality rule dropped, and what other bounds would drop, from stats.json's exact
histograms (docs/stats.md, Quality).

`quality_report` gathers the figures into the dict `build_report` returns (None for a stats.json written
before the quality measures); the `*_rows` functions make (header, rows) tables of it, rendered as text
here or as HTML by `melshards.reports.html_report`.

What-if of an absolute bound: the clips measured whose value breaks it, from the measure's histogram
(`melshards.shards_schema.stats.count_beyond`): exact for a bound on the measure's grid, else a range.
Each rule is counted on its own, over every clip measured: the filter applies the length cut-offs and
the earlier rules first, so a clip another rule drops is counted here too, and the run's own count
(`dropped`) can be lower than the row of its own bound.

The quality family, one module each: the measures (`melshards.preprocess.clip.quality`), the rules
(`melshards.preprocess.stats.quality_rules`), the statistics for stats.json
(`melshards.preprocess.stats.quality_stats`), their Beam transforms (`melshards.preprocess.stats.quality_stage`)
and the tables of `melshards stats` (`melshards.reports.quality_tables`).
"""

from __future__ import annotations

import dataclasses
import textwrap

from melshards.reports.stats_json_tables import Table, pct
from melshards.reports.whatif import int_hist
from melshards.shards_schema.stats import FILTER_REASONS, QUALITY_REASONS, count_beyond

SHOWN_PERCENTILES = ("p0", "p5", "p50", "p95", "p100")
# the columns of the quality per speaker or language: (measure, percentile, header)
SPEAKER_MEASURES = (
    ("speaking_rate", "p50", "rate p50"),
    ("snr_db", "p50", "snr p50"),
    ("longest_pause_s", "p95", "pause p95"),
    ("bandwidth_hz", "p50", "bandwidth p50"),
)


@dataclasses.dataclass(frozen=True)
class Bound:
    """An absolute quality rule: its measure, the config key of its bound, whether it drops values above
    (else below) the bound, the alternatives the what-if shows, and the factor from the config's value to
    the measure's units (narrowband: a share of Nyquist, so sample_rate / 2)."""

    reason: str
    measure: str
    key: str
    above: bool
    alternatives: tuple[float, ...]
    of_nyquist: bool = False


BOUNDS = (
    Bound("clipped", "clipped_fraction", "max_clipped_fraction", True, (0.0001, 0.0005, 0.001, 0.005, 0.01)),
    Bound("narrowband", "bandwidth_hz", "min_bandwidth_share", False, (0.3, 0.4, 0.5, 0.6, 0.7, 0.8), True),
    Bound("noisy", "snr_db", "min_snr_db", False, (5.0, 10.0, 15.0, 20.0, 25.0, 30.0)),
    Bound("long_pause", "longest_pause_s", "max_pause_s", True, (0.5, 0.75, 1.0, 1.5, 2.0)),
    Bound("transcript_mismatch", "cer", "max_cer", True, (0.1, 0.2, 0.3, 0.5, 0.8)),
    Bound("asr_repeat", "asr_repeat", "max_asr_repeat", True, (2.0, 3.0, 4.0, 6.0)),
    Bound("foreign_script", "foreign_script_fraction", "max_foreign_script_fraction", True, (0.05, 0.1, 0.2, 0.5)),
)
RULE_OF = {b.measure: b for b in BOUNDS}


def bound_rows(q: dict, b: Bound) -> list[dict]:
    """The what-if rows of one absolute rule: its alternatives and the job's bound (`is_job`), each with
    the clips measured it would drop as (least, most) and their share of the clips with a value."""
    figures, grid = q["global"].get(b.measure), q["measures"].get(b.measure)
    if figures is None or grid is None or figures.get("histogram") is None:
        return []
    factor = q["sample_rate"] / 2 if b.of_nyquist else 1.0
    job = q["rules"].get(b.key)
    hist = int_hist(figures["histogram"])
    out = []
    for setting in sorted(set(b.alternatives) | ({float(job)} if job is not None else set())):
        least, most = count_beyond(hist, grid["scale"], grid["side"], setting * factor, b.above)
        out.append(
            {
                "setting": setting,
                "bound": round(setting * factor, 6),
                "least": least,
                "most": most,
                "of": figures["count"],
                "is_job": job is not None and setting == float(job),
            }
        )
    return out


def quality_report(stats: dict) -> dict | None:
    """The quality figures of a stats.json (None without its `quality` section): per measure its unit,
    clips with and without a value, mean, percentiles, its rule and the clips that rule dropped in the
    run; the what-if rows of each absolute rule; the speaking-rate rule's outliers per k. None too when
    no clip was measured (every row rejected)."""
    q = stats.get("quality")
    if not q or not q["measures"]:  # before the quality measures, or no clip measured
        return None
    per_reason = stats["counts"]["per_reason"]
    measures = []
    for m, grid in q["measures"].items():
        f = q["global"].get(m, {"count": 0, "not_measured": 0, "mean": None, "percentiles": {}})
        rule = RULE_OF.get(m)
        reason = rule.reason if rule else ("speaking_rate_outlier" if m == "speaking_rate" else None)
        setting = q["rules"].get(rule.key) if rule else (q["rules"].get("rate_iqr_k") if reason else None)
        measures.append(
            {
                "measure": m,
                "unit": grid["unit"],
                "count": f["count"],
                "not_measured": f["not_measured"],
                "mean": f["mean"],
                "percentiles": f["percentiles"],
                "rule": reason,
                "setting": setting,
                "dropped": per_reason.get(reason, 0) if reason else None,
            }
        )
    return {
        "measures": measures,
        "dropped": {r: per_reason.get(r, 0) for r in QUALITY_REASONS},
        "what_if": [{"rule": b.reason, "measure": b.measure, "rows": bound_rows(q, b)} for b in BOUNDS],
        "rate_what_if": [
            dict(r, is_job=q["rules"].get("rate_iqr_k") is not None and r["k"] == float(q["rules"]["rate_iqr_k"]))
            for r in q.get("rate_what_if", [])
        ],
        "rate_min_clips": q["rules"].get("rate_min_clips"),
        "rate_iqr_k": q["rules"].get("rate_iqr_k"),
        "rate_unjudged": q.get("rate_unjudged", []),
    }


def number(v: float | None) -> str:
    """A measure's value: 4 significant digits, whole numbers from 1000 up (Hz)."""
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def setting_label(m: dict) -> str:
    if m["rule"] is None:
        return "-"
    if m["setting"] is None:
        return "off"
    if m["rule"] == "speaking_rate_outlier":
        return f"k={m['setting']:g}"
    if m["rule"] == "narrowband":
        return f"< {m['setting']:g} Nyquist"
    return f"{'<' if m['rule'] == 'noisy' else '>'} {m['setting']:g}"


def measure_rows(report: dict) -> Table:
    """Per measure: unit, clips with a value and without (n/a), percentiles and mean, its rule's setting
    and the clips the rule dropped in the run."""
    q = report["quality"]
    header = ["measure", "unit", "clips", "n/a", *SHOWN_PERCENTILES, "mean", "rule", "bound", "dropped"]
    rows = [
        [
            m["measure"],
            m["unit"],
            str(m["count"]),
            str(m["not_measured"]),
            *(number(m["percentiles"].get(p)) for p in SHOWN_PERCENTILES),
            number(m["mean"]),
            m["rule"] or "-",
            setting_label(m),
            "-" if m["dropped"] is None else str(m["dropped"]),
        ]
        for m in q["measures"]
    ]
    return header, rows


def drops(least: int, most: int) -> str:
    return str(least) if least == most else f"{least}..{most}"


def bound_whatif_rows(report: dict) -> Table:
    """One row per absolute rule and bound: the clips measured with a value it would drop, and their share."""
    rows = []
    for w in report["quality"]["what_if"]:
        if not any(r["of"] for r in w["rows"]):  # no clip has the measure (cer without asr_text)
            continue
        for i, r in enumerate(w["rows"]):
            setting = f"{r['setting']:g}" + (f" ({r['bound']:.0f} Hz)" if w["rule"] == "narrowband" else "")
            rows.append(
                [
                    w["rule"] if i == 0 else "",
                    w["measure"] if i == 0 else "",
                    setting + (" *" if r["is_job"] else ""),
                    drops(r["least"], r["most"]),
                    pct(r["most"] / r["of"] if r["of"] else None),
                    str(r["of"]),
                ]
            )
    return ["rule", "measure", "bound", "drops", "drops %", "of clips"], rows


def rate_whatif_rows(report: dict) -> Table:
    q = report["quality"]
    rows = [[f"{r['k']:g}" + (" *" if r["is_job"] else ""), drops(r["least"], r["most"])] for r in q["rate_what_if"]]
    return ["k", "outside Q1 - k*IQR .. Q3 + k*IQR"], rows


def quality_notes(report: dict) -> list[str]:
    """What the quality tables count; printed under them and in the HTML report."""
    q = report["quality"]
    dropped = {r: n for r, n in q["dropped"].items() if n}
    return [
        "Over the clips measured, before the filter (n/a: the measure does not apply, e.g. cer without an "
        "asr_text). Percentiles are exact on each measure's grid (stats.json quality.measures).",
        "dropped = the clips the rule dropped in this run (the length cut-offs and the rules before it in "
        "the filter's order come first); the what-if counts every clip measured whose value breaks the "
        "bound, so the * row can be higher.",
        "drops a..b: the bound is not on the measure's grid; a clips surely break it, b at most.",
        "quality rules dropped: " + (", ".join(f"{r} {n}" for r, n in dropped.items()) if dropped else "none"),
    ]


def rate_notes(report: dict) -> list[str]:
    """What the rate what-if counts, and the languages its bounds judge no clip of."""
    q = report["quality"]
    notes = [
        "Speaking-rate rule at other k: each speaker's clips outside its own bounds in the clip's language (a "
        f"speaker with fewer than {q['rate_min_clips']} rated clips there: its median times the language's "
        "within-speaker spread, or the language's when too few for a median; a language with fewer: none, "
        "never another language's); a..b: clips within 0.005 symbols/s of a bound. * the run's k."
    ]
    if q.get("rate_unjudged"):
        notes.append(
            "Not judged by the rate bounds (too few rated clips), only by the ceiling on symbols per second: "
            + "; ".join(
                f"{x['language']} ({x['frontend']}, {x['rated']} rated clips: {', '.join(x['speakers'])})"
                for x in q["rate_unjudged"]
            )
        )
    return notes


def quality_table(report: dict) -> str:
    """The default report's quality section."""
    from melshards.reports.stats_json_tables import render

    if report.get("quality") is None:
        return "no quality figures: this stats.json was written before melshards measured clip quality"
    parts = [render(*measure_rows(report), left=2), *map(wrapped, quality_notes(report))]
    parts += ["", "What-if: other quality bounds (each rule alone, over the clips measured; * the run's bound)"]
    parts.append(render(*bound_whatif_rows(report), left=2))
    if report["quality"]["rate_what_if"]:
        parts += ["", "What-if: the speaking-rate rule at other k", render(*rate_whatif_rows(report), left=0)]
        parts += [wrapped(n) for n in rate_notes(report)]
    return "\n".join(parts)


def wrapped(note: str) -> str:
    return textwrap.fill(note, width=110, initial_indent="  ", subsequent_indent="    ")


# -- per speaker and language ----------------------------------------------------------------------
def quality_columns(rows: list[dict]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """The measure columns (measure, percentile, header) the rows have, and the filter reasons any row dropped a
    clip for (quality reasons first)."""
    measures = [c for c in SPEAKER_MEASURES if any(c[0] in (r.get("quality") or {}) for r in rows)]
    reasons = sorted(
        {k for r in rows for k, n in (r.get("per_reason") or {}).items() if n},
        key=lambda k: (k not in QUALITY_REASONS, FILTER_REASONS.index(k) if k in FILTER_REASONS else 99, k),
    )
    return measures, reasons


def group_quality_rows(rows: list[dict], key: str, job_k: float | None) -> Table:
    """Per speaker (or language): the median speaking rate, SNR, p95 longest pause and median bandwidth
    of its clips measured, the clips the filter dropped per reason, and (speakers) the rate rule's
    outliers at the run's k."""
    measures, reasons = quality_columns(rows)
    rate = job_k is not None and any(r.get("rate_outliers") for r in rows)
    header = [key, *(label for _, _, label in measures), *reasons, *(["rate out"] if rate else [])]
    out = []
    for r in rows:
        q = r.get("quality") or {}
        cells = [str(r[key])]
        cells += [number(q.get(m, {}).get("percentiles", {}).get(p)) for m, p, _ in measures]
        cells += [str((r.get("per_reason") or {}).get(reason, 0)) for reason in reasons]
        if rate:
            found = next((x for x in r.get("rate_outliers", []) if x["k"] == job_k), None)
            cells.append("-" if found is None else drops(found["least"], found["most"]))
        out.append(cells)
    return header, out


def has_quality(rows: list[dict]) -> bool:
    return any(r.get("quality") or r.get("per_reason") for r in rows)
