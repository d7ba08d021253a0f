"""Plain-text tables over stats.json (shared by the preprocess summary and `melshards stats`)."""
from __future__ import annotations

from preprocess.stats import REPORT_PERCENTILES, pkey

COLUMNS = (("text_len", "text symbols"), ("mel_frames", "mel frames"), ("duration_s", "seconds"))


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if isinstance(v, float) and not float(v).is_integer() else f"{int(v)}"


def percentile_table(stats: dict) -> str:
    """Rows p0..p100, columns text/mel/seconds before and after filtering."""
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
    return render(header, rows)


def render(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])
