"""Plain-text tables over stats.json (shared by the preprocess summary and `melshards stats`).

Each table is built as (header, rows) of strings by a `*_rows` function, so the same figures can
be rendered as text (`render`) or as HTML (`melshards.report_html`).
"""
from __future__ import annotations

from shards_schema.stats import FILTER_REASONS, REPORT_PERCENTILES, pkey

COLUMNS = (("text_len", "text symbols"), ("mel_frames", "mel frames"), ("duration_s", "seconds"))

Table = tuple[list[str], list[list[str]]]


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if isinstance(v, float) and not float(v).is_integer() else f"{int(v)}"


def pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def percentile_rows(stats: dict) -> Table:
    """Rows p0..p100 and mean, columns text/mel/seconds before and after filtering."""
    header = ["pct"] + [f"{label} {when}" for _, label in COLUMNS for when in ("before", "after")]
    rows = []
    for q in REPORT_PERCENTILES:
        row = [pkey(q)]
        for key, _ in COLUMNS:
            for part in ("before_filter", "after_filter"):
                row.append(_fmt(stats[part][key]["percentiles"].get(pkey(q))))
        rows.append(row)
    row = ["mean"]
    for key, _ in COLUMNS:
        for part in ("before_filter", "after_filter"):
            row.append(_fmt(stats[part][key]["mean"]))
    rows.append(row)
    return header, rows


def percentile_table(stats: dict) -> str:
    return render(*percentile_rows(stats))


def counts_rows(stats: dict) -> Table:
    """Input rows, clips in shards per split, filtered and rejected clips per reason, with shares of the input."""
    c = stats["counts"]
    total = c["input_rows"]

    def row(label: str, n: int) -> list[str]:
        return [label, str(n), pct(n / total if total else None)]

    rows = [row("input rows", total), row("in shards", c["in_shards"])]
    rows += [row(f"  {split}", n) for split, n in c["per_split"].items()]
    for kind, key in (("filtered", "filtered"), ("rejected", "rejected")):
        rows.append(row(kind, c[key]))
        rows += [row(f"  {r}", n) for r, n in c["per_reason"].items() if (r in FILTER_REASONS) == (kind == "filtered")]
    return ["clips", "count", "of input"], rows


def counts_table(stats: dict) -> str:
    return render(*counts_rows(stats), left=1)


def padding_rows(stats: dict) -> Table:
    """Cut-offs, padded lengths and how much of each padded tensor is padding (over the clips in shards)."""
    cut, pad = stats.get("cutoffs"), stats.get("padding")
    header = ["length", "kept range", "padded to", "padding", "useful"]
    if not cut or not pad:
        return header, []
    mel_pad, text_pad = pad["mel_padding_fraction"], pad["text_padding_fraction"]
    return header, [
        ["mel frames", f"{cut['min_mel_frames']}..{cut['max_mel_frames']}", str(pad["max_mel_frames"]),
         pct(mel_pad), pct(1 - mel_pad)],
        ["text symbols", f"..{cut['max_text_len']}", str(pad["max_text_len"]), pct(text_pad), pct(1 - text_pad)],
        ["seconds", f"{cut['min_duration_ms'] / 1000:.2f}..", "-", "-", "-"],
    ]


def padding_table(stats: dict) -> str:
    return render(*padding_rows(stats), left=1)


def render(header: list[str], rows: list[list[str]], left: int = 0) -> str:
    """Aligned columns; the first `left` columns are left-aligned (labels), the rest right-aligned."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i < left else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])
