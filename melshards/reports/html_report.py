"""`melshards stats --html`: one self-contained HTML file (plots embedded as base64 PNG, inline CSS).

Self-contained so it can be attached to an issue or mailed: no external script, style sheet or image.
Figures are built with `matplotlib.figure.Figure` (no pyplot), which renders with Agg and needs no display.
"""

from __future__ import annotations

import base64
import html
import io

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from melshards.reports.by_tables import (
    TOP,
    by_quality_rows,
    by_quality_title,
    compare_by_rows,
    corpus_line,
    language_length_rows,
    language_rows,
    speaker_notes,
    speaker_rows,
)
from melshards.reports.quality_tables import (
    RULE_OF,
    bound_whatif_rows,
    measure_rows,
    quality_notes,
    rate_notes,
    rate_whatif_rows,
)
from melshards.reports.stats_json_tables import (
    Table,
    bucket_notes,
    bucket_rows,
    bucket_whatif_rows,
    counts_rows,
    padding_rows,
    pct,
    percentile_rows,
)
from melshards.reports.stats_report_tables import compare_rows, q_label, reasons_rows, whatif_notes, whatif_rows
from melshards.reports.whatif import int_hist
from melshards.shards_schema.ownership import HTML_MARK

BEFORE, AFTER, CUT, PAD, LOW, BOUND = "#b8b8b8", "#3a6ea5", "#c0392b", "#c0392b", "#e67e22", "#27ae60"
RANGE_MARGIN = 1.15  # the x-axis reaches this far past the longest clip in shards (or the last mark)
PANELS = (
    ("text_len", "text length (symbols)", 1.0),
    ("mel_frames", "mel frames", 1.0),
    ("duration_ms", "duration (seconds)", 0.001),
)
CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { padding: 0.2em 0.7em; border-bottom: 1px solid #eee; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
td.text { text-align: left; font-family: monospace; font-size: 0.9em; }
p.note { color: #555; font-size: 0.9em; margin: 0.2em 0; } img { max-width: 100%; }
code { background: #f4f4f4; padding: 0 0.2em; }
"""


def _marks(key: str, report: dict) -> list[tuple[float, str | None, str, str]]:
    """(x, label, colour, linestyle) of the cut-offs and padded lengths drawn on a panel."""
    cut, pad = report["cutoffs"], report["padding"]
    if not cut or not pad:
        return []
    if key == "text_len":
        return [
            (cut["max_text_len"], f"cut-off {cut['max_text_len']}", CUT, "-"),
            (pad["max_text_len"], f"padded to {pad['max_text_len']}", PAD, "--"),
        ]
    if key == "mel_frames":
        bounds = [b["max_mel_frames"] for b in (report.get("buckets") or {}).get("buckets", [])][:-1]
        return [
            (cut["min_mel_frames"], f"min {cut['min_mel_frames']}", LOW, "-"),
            (cut["max_mel_frames"], f"cut-off {cut['max_mel_frames']}", CUT, "-"),
            (pad["max_mel_frames"], f"padded to {pad['max_mel_frames']}", PAD, "--"),
        ] + [
            (b, f"bucket bounds {', '.join(map(str, bounds))}" if i == 0 else None, BOUND, ":")
            for i, b in enumerate(bounds)
        ]
    return [(cut["min_duration_ms"] / 1000, f"min {cut['min_duration_ms'] / 1000:g} s", LOW, "-")]


def shown_range(before: dict, after: dict, marks: list[float]) -> tuple[int, int, int]:
    """(lo, hi, clips beyond hi) of a panel's x-axis, in histogram units.

    A few very long clips (100 s outliers) would stretch a linear axis until every kept clip sits in
    one bar; the axis ends a margin past the longest kept clip and the drawn marks, and the clips
    beyond are counted in the legend instead.
    """
    lo, top = min(before), max(before)
    reach = max([max(after) if after else lo, *marks])
    hi = min(top, int(reach * RANGE_MARGIN) + 1) if reach > lo else top
    return lo, hi, sum(c for v, c in before.items() if v > hi)


def _filled_hist(
    ax: Axes, values: list[float], bins: list[float] | int, weights: list[int], colour: str, label: str | None = None
) -> None:
    """A weighted histogram drawn as one filled outline (`stairs`): the bars `ax.hist` draws, without one
    Rectangle artist per bar to lay out and render (most of a report's plotting time went there)."""
    counts, edges = np.histogram(values, bins=bins, weights=weights)
    ax.stairs(counts, edges, fill=True, color=colour, label=label)


def histogram_figure(report: dict, histograms: dict) -> Figure:
    """The three length distributions before (grey) and after (blue) filtering, cut-offs and padding marked."""
    fig = Figure(figsize=(13, 3.6), dpi=100, layout="constrained")
    axes = fig.subplots(1, 3)
    lo: float
    hi: float
    for ax, (key, title, scale) in zip(axes, PANELS):
        before = int_hist(histograms.get("before_filter", {}).get(key, {}))
        after = int_hist(histograms.get("after_filter", {}).get(key, {}))
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("clips", fontsize=9)
        ax.tick_params(labelsize=8)
        if not before:
            ax.text(0.5, 0.5, "no clips", ha="center", va="center", transform=ax.transAxes)
            continue
        marks = _marks(key, report)
        lo, hi, beyond = shown_range(before, after, [x / scale for x, *_ in marks])
        lo, hi = lo * scale, hi * scale
        bins = [lo + (hi - lo) * i / 40 for i in range(41)] if hi > lo else 1
        for hist, colour, label in (
            (before, BEFORE, f"before filter ({sum(before.values())})"),
            (after, AFTER, f"after filter ({sum(after.values())})"),
        ):
            shown = {v: c for v, c in hist.items() if v * scale <= hi}
            if shown:
                _filled_hist(ax, [v * scale for v in shown], bins, list(shown.values()), colour, label)
        if beyond:
            ax.plot([], [], " ", label=f"{beyond} longer clip(s) beyond {hi:.4g}, not drawn")
        for x, mark_label, colour, style in marks:
            ax.axvline(x, color=colour, linestyle=style, linewidth=1.2 if style != ":" else 1.0, label=mark_label)
        # "best" cannot see the bars of a filled outline (one patch over the whole panel)
        ax.legend(fontsize=7, frameon=False, loc="upper right")
    return fig


def whatif_figure(report: dict) -> Figure:
    """Clips kept and mel padding against the padded mel length, one point per what-if row."""
    fig = Figure(figsize=(6.5, 3.4), dpi=100, layout="constrained")
    ax = fig.subplots()
    rows = report["what_if"]
    x = [w["padded_mel_frames"] for w in rows]
    ax.plot(x, [100 * w["kept_fraction"] for w in rows], "o-", color=AFTER, label="clips kept %")
    ax.plot(x, [100 * w["mel_padding_fraction"] for w in rows], "s--", color=CUT, label="mel padding %")
    # Several percentiles often give the same length (small corpora, long tails): one label per point.
    labels: dict[tuple[int, float], list[str]] = {}
    for w in rows:
        labels.setdefault((w["padded_mel_frames"], w["kept_fraction"]), []).append(
            q_label(w["mel_q"], w["text_q"]) + ("*" if w["is_job"] else "")
        )
    for (frames, kept), names in labels.items():
        text = names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"
        ax.annotate(text, (frames, 100 * kept), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    ax.set_xlabel("padded mel frames (upper cut-off at the percentile shown)", fontsize=9)
    ax.set_ylabel("%", fontsize=9)
    ax.set_ylim(0, 105)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    return fig


def quality_figure(report: dict, quality: dict) -> Figure:
    """One panel per quality measure with values: its exact histogram over the clips measured (before the
    filter), drawn in 40 bars over its range, and the run's bound of its rule (solid red) where it is on."""
    measures = [
        m
        for m in report["quality"]["measures"]
        if m["count"] and quality["global"].get(m["measure"], {}).get("histogram")
    ]
    cols = 4
    rows = max(1, -(-len(measures) // cols))
    fig = Figure(figsize=(13, 2.6 * rows), dpi=100, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[len(measures) :]:
        ax.set_visible(False)
    for ax, m in zip(axes, measures):
        name = m["measure"]
        scale = quality["measures"][name]["scale"]
        hist = int_hist(quality["global"][name]["histogram"])
        values = [k / scale for k in hist]
        bound = quality_bound(m, quality)
        lo, hi = (
            min(values + ([bound] if bound is not None else [])),
            max(values + ([bound] if bound is not None else [])),
        )
        bins = [lo + (hi - lo) * i / 40 for i in range(41)] if hi > lo else 1
        _filled_hist(ax, values, bins, list(hist.values()), BEFORE)
        if bound is not None:
            ax.axvline(bound, color=CUT, linewidth=1.2, label=f"{m['rule']} bound {bound:g}")
            ax.legend(fontsize=7, frameon=False)
        ax.set_title(f"{name} ({m['unit']})", fontsize=9)
        ax.set_ylabel("clips", fontsize=8)
        ax.tick_params(labelsize=7)
    return fig


def quality_bound(m: dict, quality: dict) -> float | None:
    """The run's bound of a measure's absolute rule in the measure's units, or None (no rule, or off)."""
    rule = RULE_OF.get(m["measure"])
    if rule is None or m["setting"] is None:
        return None
    return float(m["setting"]) * (quality["sample_rate"] / 2 if rule.of_nyquist else 1.0)


def quality_section(report: dict, quality: dict) -> list[str]:
    """The quality measures: the plot, the measure table, the what-if tables and their notes."""
    q = report["quality"]
    parts = [
        "<h2>Quality measures</h2>",
        _img(quality_figure(report, quality), "histograms of the quality measures"),
        _notes(["Grey: every clip measured (before filtering); red: the run's bound of the measure's rule."]),
        _table(measure_rows(report)),
        _notes(quality_notes(report)),
        "<h2>What if the quality bounds were different</h2>",
        _table(bound_whatif_rows(report)),
        _notes(["Each rule alone, over the clips measured with a value; * the run's bound."]),
    ]
    if q["rate_what_if"]:
        parts += [
            "<h3>The speaking-rate rule at other k</h3>",
            _table(rate_whatif_rows(report)),
            _notes(rate_notes(report)),
        ]
    return parts


def hours_figure(rows: list[dict], label_key: str, top: int = TOP) -> Figure:
    """Horizontal bars: hours in the shards of the first `top` rows (speakers, most hours first), top down;
    the title says how many rows are left out."""
    shown = rows[:top]
    fig = Figure(figsize=(8, 0.8 + 0.22 * max(len(shown), 1)), dpi=100, layout="constrained")
    ax = fig.subplots()
    ax.barh(range(len(shown)), [r["hours"] for r in shown], color=AFTER)
    ax.set_yticks(range(len(shown)), [str(r[label_key]) for r in shown], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("hours in the shards", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    if len(rows) > top:
        ax.set_title(f"the {top} with the most hours; {len(rows) - top} more not drawn", fontsize=9)
    return fig


def rate_spread_figure(rows: list[dict], top: int = TOP) -> Figure:
    """Per speaker (the first `top` rows, top down): its speaking rate's p25..p75 as a bar, p5..p95 as a
    line and p50 as a tick, over its clips measured; the per-speaker rate rule judges each clip against
    its own speaker's quartiles."""
    shown = [r for r in rows if "speaking_rate" in (r.get("quality") or {})][:top]
    fig = Figure(figsize=(8, 0.8 + 0.22 * max(len(shown), 1)), dpi=100, layout="constrained")
    ax = fig.subplots()
    for i, r in enumerate(shown):
        p = r["quality"]["speaking_rate"]["percentiles"]
        if not p:
            continue
        ax.plot([p["p5"], p["p95"]], [i, i], color=BEFORE, linewidth=1)
        ax.barh(i, p["p75"] - p["p25"], left=p["p25"], height=0.6, color=AFTER)
        ax.plot([p["p50"]], [i], "|", color=CUT, markersize=9)
    ax.set_yticks(range(len(shown)), [str(r["name"]) for r in shown], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speaking rate, symbols/s (bar p25..p75, line p5..p95, tick p50; clips measured)", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    return fig


def by_section(report: dict, by: str) -> list[str]:
    """`--by speaker`: the bar chart of hours per speaker (top `TOP`), the table and its notes;
    `--by language`: the language table and the lengths per language; then the quality per speaker or
    language where stats.json has it."""
    table = by_quality_rows(report, by)
    quality = [] if table is None else [f"<h3>{html.escape(by_quality_title(report, by))}</h3>", _table(table)]
    rows = report["speakers"]["rows"] if by == "speaker" and table is not None else []
    if any("speaking_rate" in (r.get("quality") or {}) for r in rows):
        quality.append(_img(rate_spread_figure(rows), f"speaking rate per speaker, top {TOP}"))
    return by_view(report, by) + quality


def by_view(report: dict, by: str) -> list[str]:
    if by == "speaker":
        v = report["speakers"]
        if not v["rows"]:
            return ["<h2>Speakers</h2>", _notes(["No speakers: no clip was measured."])]
        kept = [r for r in v["rows"] if not r["dropped"]]
        return [
            "<h2>Speakers</h2>",
            _img(hours_figure(kept, "name"), f"hours per speaker, top {TOP}"),
            _table(speaker_rows(report)),
            _notes(speaker_notes(report)),
        ]
    if not report["languages"]["rows"]:
        return ["<h2>Languages</h2>", _notes(["No languages: no clip was measured, or every speaker was dropped."])]
    return [
        "<h2>Languages</h2>",
        _table(language_rows(report)),
        "<h3>Lengths before filtering, per language</h3>",
        _table(language_length_rows(report)),
    ]


def png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _img(fig: Figure, alt: str) -> str:
    data = base64.b64encode(png_bytes(fig)).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(table: Table, text_cols: tuple[int, ...] = ()) -> str:
    header, rows = table
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=text' if i in text_cols else ''}>{html.escape(str(c))}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _notes(lines: list[str]) -> str:
    return "".join(f'<p class="note">{html.escape(line)}</p>' for line in lines)


def render_html(
    report: dict, histograms: dict, other: dict | None = None, by: str | None = None, quality: dict | None = None
) -> str:
    """The whole report as one HTML document; `other` adds the comparison with a second run, `by`
    ("speaker" or "language") the section of that view (compared too, with `other`); `quality` (stats.json's
    section) the quality measures' plots and tables."""
    c, pad = report["counts"], report["padding"]
    e = html.escape
    parts = [
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8>{HTML_MARK}",  # what --html may write over
        f"<title>melshards stats: {e(report['source'])}</title><style>{CSS}</style></head><body>",
        "<h1>melshards stats</h1>",
        f"<p><code>{e(report['source'])}</code>: {c['input_rows']} input rows, {c['in_shards']} in shards "
        f"(" + ", ".join(f"{s} {n}" for s, n in c["per_split"].items()) + f"), {c['filtered']} filtered, "
        f"{c['rejected']} rejected; {report['hours']['after_filter']:.2f} h of audio in shards; "
        f"{e(corpus_line(report))}.</p>",
        *(by_section(report, by) if by else []),
        "<h2>Length distributions</h2>",
        _img(histogram_figure(report, histograms), "histograms of text length, mel frames and duration"),
        _notes(
            [
                "Grey: every clip measured (before filtering); blue: clips in the shards. Solid lines: "
                "cut-offs; dashed: padded lengths (the largest bucket); dotted green: the other bucket bounds. "
                "The x-axis ends past the longest clip in shards; longer clips are counted in the legend."
            ]
        ),
    ]
    if pad:
        parts += [
            "<h2>Padding</h2>",
            _table(padding_rows(report)),
            _notes(
                [
                    f"padding = share of the padded tensor that is padding, over the clips in the shards "
                    f"(useful = 1 - padding). Mel padding {pct(pad['mel_padding_fraction'])}, text "
                    f"padding {pct(pad['text_padding_fraction'])}."
                ]
            ),
        ]
    if report.get("buckets"):
        parts += [
            "<h2>Length buckets</h2>",
            _table(bucket_rows(report)),
            _notes(bucket_notes(report)),
            "<h2>What if the number of buckets were different</h2>",
            _table(bucket_whatif_rows(report)),
            _notes(
                [
                    "Optimal bounds for at most K buckets over the training clips (each bucket holding at "
                    f"least {report['buckets']['min_bucket_records']} records); compiles = static shapes "
                    "the trainer compiles. * the job's buckets."
                ]
            ),
        ]
    if report["what_if"]:
        parts += [
            "<h2>What if the upper cut-off were different</h2>",
            _table(whatif_rows(report)),
            _notes(whatif_notes(report)),
            _img(whatif_figure(report), "clips kept and padding per cut-off"),
        ]
    if quality and report.get("quality") is not None:
        parts += quality_section(report, quality)
    parts += [
        "<h2>Percentiles</h2>",
        _table(percentile_rows(report)),
        "<h2>Counts</h2>",
        _table(counts_rows(report)),
        "<h2>Filter and rejection reasons</h2>",
        _table(reasons_rows(report), text_cols=(3, 4)),
        _notes([f"Example ids and details from {report['rejected_file'] or 'rejected.jsonl (not found)'}."]),
    ]
    if other is not None:
        parts += [
            "<h2>Comparison</h2>",
            _notes([f"A = {report['source']}", f"B = {other['source']}"]),
            _table(compare_rows(report, other)),
        ]
        if by:
            table, left = compare_by_rows(report, other, by)
            parts += [
                f"<h3>Per {by}</h3>",
                _table(table),
                _notes(
                    ["Largest change in hours first; - = not in that run."]
                    + ([f"{left} more with smaller changes not shown."] if left else [])
                ),
            ]
    parts.append("</body></html>\n")
    return "\n".join(parts)
