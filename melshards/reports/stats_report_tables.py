"""The tables only `melshards stats` shows: what-if, rejection reasons with examples, two runs side by side.

Like `melshards.reports.stats_json_tables`, each is (header, rows) of strings, rendered as text here or as HTML by
`melshards.reports.html_report`. They read the dict `melshards.reports.stats_report.build_report` returns.
"""

from __future__ import annotations

import textwrap

from melshards.reports.stats_json_tables import COLUMNS, Table, pct, render
from melshards.shards_schema.stats import FILTER_REASONS, pkey

MIB = 2**20


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MIB:.1f}"


def q_label(mel_q: float, text_q: float) -> str:
    return pkey(mel_q) if mel_q == text_q else f"{pkey(mel_q)}/{pkey(text_q)}"


def whatif_rows(report: dict) -> Table:
    header = [
        "upper pct",
        "mel cut",
        "mel pad",
        "text cut",
        "text pad",
        "kept",
        "kept %",
        "text>cut",
        "mel waste",
        "text waste",
        f"batch {report['batch_size']} MiB",
    ]
    rows = []
    for w in report["what_if"]:
        rows.append(
            [
                q_label(w["mel_q"], w["text_q"]) + (" *" if w["is_job"] else ""),
                str(w["mel_cut"]),
                str(w["padded_mel_frames"]),
                str(w["text_cut"]),
                str(w["padded_text_len"]),
                f"{w['kept']}/{w['clips']}",
                pct(w["kept_fraction"]),
                str(w["text_over_cut"]),
                pct(w["mel_padding_fraction"]),
                pct(w["text_padding_fraction"]),
                mib(w["batch_bytes"]),
            ]
        )
    return header, rows


def whatif_notes(report: dict) -> list[str]:
    """What the what-if columns count; printed under the table and in the HTML report."""
    cut, c = report["cutoffs"], report["counts"]
    n_mels = report["n_mels"]
    job = next(w for w in report["what_if"] if w["is_job"])
    mels = f"{n_mels} bins" if n_mels else "n_mels (unknown: no schema.json, pass --n-mels)"
    return [
        "Varies the upper cut-offs of mel frames and text length together at the percentile shown; keeps the "
        f"job's lower cut-offs (min {cut['min_duration_ms'] / 1000:.2f} s, min {cut['min_mel_frames']} mel frames).",
        "cut = the percentile of the before-filter histogram (an observed length); pad = cut rounded up to "
        f"a multiple of {report['padding']['multiple']}.",
        "kept = clips passing min duration and both mel-frame cut-offs (exact); text>cut = clips whose text is "
        "longer than the text cut, the most the text cut-off can drop on top of that.",
        "mel waste = padding share of the padded mel frames over the kept clips; text waste = padding share of "
        "the padded text ids over the clips whose text fits the cut (the Padding table counts the clips in the "
        "shards instead, so its text figure can differ slightly).",
        f"batch = {report['batch_size']} x (mel pad x {mels} x 4 B float32 + text pad x 4 B int32): the decoded "
        "input tensors of one batch, not the model's activations.",
        f"* the job's setting: after all filters {c['in_shards']} clips are in the shards "
        f"({job['kept'] - c['in_shards']} of the {job['kept']} frame-kept clips failed the text cut-off).",
    ]


def whatif_table(report: dict) -> str:
    if not report["what_if"]:
        return "no what-if: no clip was measured (every row was rejected), so stats.json has no cut-offs"
    header, rows = whatif_rows(report)
    notes = "\n".join(
        textwrap.fill(n, width=110, initial_indent="  ", subsequent_indent="    ") for n in whatif_notes(report)
    )
    return render(header, rows, left=1) + "\n" + notes


def reasons_rows(report: dict) -> Table:
    """Filter and rejection reasons, most frequent first, with example ids from rejected.jsonl."""
    rows = [
        [
            r["reason"],
            r["kind"],
            str(r["count"]),
            ", ".join(e["id"] for e in r["examples"]) or "-",
            r["examples"][0]["detail"] if r["examples"] else "-",
        ]
        for r in report["reasons"]
    ]
    return ["reason", "kind", "clips", "example ids", "first example's detail"], rows


# -- two runs side by side ---------------------------------------------------------------------------
def _figures(report: dict) -> list[tuple[str, float | int | None, str]]:
    """(label, value, kind) for every compared figure; kind picks the format of value and difference."""
    c, cut, pad = report["counts"], report["cutoffs"] or {}, report["padding"] or {}
    out = [("input rows", c["input_rows"], "int"), ("in shards", c["in_shards"], "int")]
    out += [(f"  {s}", n, "int") for s, n in c["per_split"].items()]
    out += [("filtered", c["filtered"], "int"), ("rejected", c["rejected"], "int")]
    out += [
        ("hours before filter", report["hours"]["before_filter"], "float"),
        ("hours in shards", report["hours"]["after_filter"], "float"),
    ]
    out += [
        ("min seconds", cut["min_duration_ms"] / 1000 if cut else None, "float"),
        ("min mel frames", cut.get("min_mel_frames"), "int"),
    ]
    out += [
        ("max mel frames", cut.get("max_mel_frames"), "int"),
        ("max text len", cut.get("max_text_len"), "int"),
        ("padded mel frames", pad.get("max_mel_frames"), "int"),
        ("padded text len", pad.get("max_text_len"), "int"),
        ("mel padding", pad.get("mel_padding_fraction"), "pct"),
        ("text padding", pad.get("text_padding_fraction"), "pct"),
        (f"batch {report['batch_size']} MiB", pad.get("batch_bytes"), "mib"),
    ]
    for part, when in (("before_filter", "before"), ("after_filter", "after")):
        for key, label in COLUMNS:
            for q in ("p50", "p95", "p100"):
                out.append((f"{label} {q} {when}", report[part][key]["percentiles"].get(q), "float"))
    return out


def _format(v, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "pct":
        return pct(v)
    if kind == "mib":
        return mib(v)
    return f"{v:g}" if kind == "float" else str(v)


def _delta(a, b, kind: str) -> str:
    if a is None or b is None:
        return "-"
    d = b - a
    if kind == "pct":
        return f"{100 * d:+.1f} pp"
    if kind == "mib":
        return f"{d / MIB:+.1f}"
    return f"{d:+g}" if kind == "float" else f"{d:+d}"


def compare_rows(a: dict, b: dict) -> Table:
    fa = {label: (v, kind) for label, v, kind in _figures(a)}
    fb = {label: (v, kind) for label, v, kind in _figures(b)}
    rows = [
        [label, _format(v, kind), _format(fb[label][0], kind), _delta(v, fb[label][0], kind)]
        for label, (v, kind) in fa.items()
    ]
    reasons = sorted(
        set(a["counts"]["per_reason"]) | set(b["counts"]["per_reason"]), key=lambda r: (r not in FILTER_REASONS, r)
    )
    for r in reasons:
        va, vb = a["counts"]["per_reason"].get(r, 0), b["counts"]["per_reason"].get(r, 0)
        rows.append([f"reason {r}", str(va), str(vb), f"{vb - va:+d}"])
    return ["figure", "A", "B", "B-A"], rows + quality_compare_rows(a, b)


COMPARED_PERCENTILES = ("p5", "p50", "p95")


def quality_compare_rows(a: dict, b: dict) -> list[list[str]]:
    """Per quality measure either run has: its clips with a value and p5, p50, p95 in A and B (before the
    filter); `-` where a run has no figure (a stats.json from before the quality measures)."""
    qa, qb = ({m["measure"]: m for m in (r.get("quality") or {}).get("measures", [])} for r in (a, b))
    rows = []
    for m in dict.fromkeys([*qa, *qb]):
        x, y = qa.get(m, {}), qb.get(m, {})
        rows.append(
            [
                f"quality {m} clips",
                _format(x.get("count"), "int"),
                _format(y.get("count"), "int"),
                _delta(x.get("count"), y.get("count"), "int"),
            ]
        )
        for q in COMPARED_PERCENTILES:
            va, vb = x.get("percentiles", {}).get(q), y.get("percentiles", {}).get(q)
            rows.append([f"quality {m} {q}", _format(va, "float"), _format(vb, "float"), _delta(va, vb, "float")])
    return rows


def compare_table(a: dict, b: dict) -> str:
    return f"A = {a['source']}\nB = {b['source']}\n" + render(*compare_rows(a, b), left=1)
