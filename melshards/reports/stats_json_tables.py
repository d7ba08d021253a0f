"""Plain-text tables over stats.json (shared by the preprocess summary and `melshards stats`).

Each table is built as (header, rows) of strings by a `*_rows` function, so the same figures can
be rendered as text (`render`) or as HTML (`melshards.reports.html_report`).
"""

from __future__ import annotations

from melshards.shards_schema.stats import FILTER_REASONS, REPORT_PERCENTILES, pkey

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
        [
            "mel frames",
            f"{cut['min_mel_frames']}..{cut['max_mel_frames']}",
            str(pad["max_mel_frames"]),
            pct(mel_pad),
            pct(1 - mel_pad),
        ],
        ["text symbols", f"..{cut['max_text_len']}", str(pad["max_text_len"]), pct(text_pad), pct(1 - text_pad)],
        ["seconds", f"{cut['min_duration_ms'] / 1000:.2f}..", "-", "-", "-"],
    ]


def padding_table(stats: dict) -> str:
    return render(*padding_rows(stats), left=1)


def bucket_rows(stats: dict) -> Table:
    """Per length bucket: its shapes, records per split and the padding of each padded tensor; then all."""
    b = stats.get("buckets")
    header = ["bucket", "mel frames", "text symbols", "train", "val", "mel padding", "text padding"]
    if not b:
        return header, []
    rows = [
        [
            f"b{r['index']:02d}",
            str(r["max_mel_frames"]),
            str(r["max_text_len"]),
            str(r["records"]["train"]),
            str(r["records"]["val"]),
            pct(r["mel_padding_fraction"]),
            pct(r["text_padding_fraction"]),
        ]
        for r in b["buckets"]
    ]
    rows.append(
        [
            "all",
            "-",
            "-",
            str(sum(r["records"]["train"] for r in b["buckets"])),
            str(sum(r["records"]["val"] for r in b["buckets"])),
            pct(b["mel_padding_fraction"]),
            pct(b["text_padding_fraction"]),
        ]
    )
    return header, rows


def bucket_notes(stats: dict) -> list[str]:
    """How the buckets were chosen, and the merges the minimum records forced."""
    b = stats.get("buckets")
    if not b:
        return []
    plan = b["plan"]
    out = []
    if plan:
        out.append(
            f"pad.buckets {plan['k_requested']}: {plan['k_used']} bucket(s), bounds chosen to minimise the "
            f"padded mel frames of the training clips, each bucket holding >= {b['min_bucket_records']} "
            f"training records (pad.min_bucket_records)."
        )
    for m in b["merges"]:
        out.append(
            f"merged: a bucket up to {m['bound']} frames would hold {m['records']} < {m['min_records']} "
            f"training records; its clips are padded to {m['into']}."
        )
    if plan and plan["merges"]:
        out.append(
            f"the minimum costs padding: {pct(plan['padding_fraction'])} of training mel frames, "
            f"{pct(plan['unconstrained_padding_fraction'])} without it."
        )
    if plan and not plan["min_records_met"]:
        out.append("all training clips together hold fewer than pad.min_bucket_records: one bucket.")
    if b["raised_last_bound"]:
        r = b["raised_last_bound"]
        out.append(f"the last bound was raised from {r['from']} to {r['to']} frames to fit a longer validation clip.")
    return out


def bucket_whatif_rows(stats: dict) -> Table:
    """Padding and compiled shapes of the optimal buckets for K = 1, 2, 4, 8, 16 (training clips)."""
    b = stats.get("buckets")
    header = ["K", "buckets used", "compiles", "mel padding"]  # a compile per bucket used
    if not b:
        return header, []
    plan = b["plan"] or {}
    job = next(
        (
            w["k"]
            for w in b["what_if"]
            if (w["buckets_used"], w["padding_fraction"]) == (plan.get("k_used"), plan.get("padding_fraction"))
        ),
        None,
    )
    rows = [
        [
            str(w["k"]) + (" *" if w["k"] == job else ""),
            "-" if w["buckets_used"] is None else str(w["buckets_used"]),
            "-" if w["buckets_used"] is None else str(w["buckets_used"]),
            pct(w["padding_fraction"]),
        ]
        for w in b["what_if"]
    ]
    return header, rows


def bucket_table(stats: dict) -> str:
    notes = "".join(f"\n  {n}" for n in bucket_notes(stats))
    return render(*bucket_rows(stats), left=1) + notes


def bucket_whatif_table(stats: dict) -> str:
    return (
        render(*bucket_whatif_rows(stats), left=1) + "\n  over the training clips, each bucket holding >= "
        f"{stats['buckets']['min_bucket_records']} records; compiles = shapes the trainer compiles; "
        "* the job's buckets"
    )


def render(header: list[str], rows: list[list[str]], left: int = 0) -> str:
    """Aligned columns; the first `left` columns are left-aligned (labels), the rest right-aligned."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells):
        return "  ".join(
            str(c).ljust(w) if i < left else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def input_lines(inputs: list[dict]) -> list[str]:
    """One line per --input (stats.json's `inputs`): name, layout, rows, default language, the
    labels prefixed with its name because another input has them too, and the language codes folded
    into one spelling."""
    lines = []
    for i in inputs:
        prefixed = [
            f"{n} {what}"
            for n, what in ((i["prefixed_speakers"], "speaker label(s)"), (i["prefixed_ids"], "id(s)"))
            if n
        ]
        lines.append(
            f"input {i['name']} ({i['format']}, {i['input']}): {i['rows']} input row"
            f"{'s' * (i['rows'] != 1)}, default language {i['language'] or 'none'}"
            + (
                f"; {' and '.join(prefixed)} prefixed with '{i['name']}/': other inputs have them too"
                if prefixed
                else ""
            )
            + (f"; columns not read: {', '.join(i['unused_columns'])}" if i.get("unused_columns") else "")
            + (
                "; language codes folded (BCP 47 ignores case): "
                + ", ".join(f"{written!r} -> {code!r}" for written, code in i["language_codes_folded"].items())
                if i.get("language_codes_folded")
                else ""
            )
        )
    return lines


LOSS_SHARE = 0.10  # a speaker "loses many" to the quality rules: at least this share of its measured clips
LOSS_SPEAKERS = 10  # the most such speakers the summary names (the largest shares first)


def quality_loss_lines(stats: dict, share: float = LOSS_SHARE, most: int = LOSS_SPEAKERS) -> list[str]:
    """What the quality rules dropped (stats.json `quality_dropped_by_speaker`): their total, then
    each speaker that lost at least `share` of its measured clips to them (at most `most`, the largest
    shares first, then the most clips, then by name), with its clips per rule. No lines for a run without
    the field (made before it was counted) or without a quality drop."""
    by_speaker = stats.get("quality_dropped_by_speaker") or {}
    total = sum(sum(rules.values()) for rules in by_speaker.values())
    if not total:
        return []
    measured = {s["name"]: s["measured"] for s in stats.get("speakers") or []}
    losing = []
    for name, rules in by_speaker.items():
        lost = sum(rules.values())
        of = measured.get(name, 0)
        if of and lost / of >= share:
            losing.append((-lost / of, -lost, name))
    all_measured = sum(measured.values())
    head = f"quality rules dropped {total} clip{'s' * (total != 1)}" + (
        f" of {all_measured} measured ({pct(total / all_measured)})" if all_measured else ""
    )
    if not losing:
        return [f"{head}; no speaker lost {pct(share, 0)} or more of its clips to them"]
    lines = [f"{head}; speakers losing {pct(share, 0)} or more of their clips to them:"]
    shown = [name for *_, name in sorted(losing)[:most]]
    width = max(len(name) for name in shown)
    for name in shown:
        rules, of = by_speaker[name], measured[name]
        lost = sum(rules.values())
        lines.append(
            f"  {name:<{width}}  {lost} of {of} ({pct(lost / of)}): "
            + ", ".join(f"{rule} {n}" for rule, n in rules.items())
        )
    if len(losing) > most:
        lines.append(f"  ... and {len(losing) - most} more (stats.json quality_dropped_by_speaker)")
    return lines


MOSTLY_DROPPED_SHOWN = 10  # the most speakers and languages the summary names as mostly dropped


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def mostly_dropped_lines(stats: dict, most: int = MOSTLY_DROPPED_SHOWN) -> list[str]:
    """The speakers and languages the filter dropped most of the measured clips of (stats.json
    `mostly_dropped`, languages first, the largest share first): a warning naming how many, then one
    line each (at most `most`) with its clips dropped per reason. No lines when there are none (or the
    run was made before they were recorded)."""
    found = stats.get("mostly_dropped") or []
    if not found:
        return []
    kinds = [_plural(sum(x["kind"] == kind for x in found), kind) for kind in ("language", "speaker")]
    named = " and ".join(k for k in kinds if not k.startswith("0 "))
    lines = [
        f"WARNING: the filter dropped most of the clips of {named} (stats.json mostly_dropped); listen to some "
        "of their rejected.jsonl rows before training without them:"
    ]
    shown = found[:most]
    width = max(len(f"{x['kind']} {x['name']}") for x in shown)
    for x in shown:
        label = f"{x['kind']} {x['name']}"
        reasons = ", ".join(f"{r} {n}" for r, n in x["per_reason"].items())
        lines.append(
            f"  {label:<{width}}  {x['dropped']} of {x['measured']} ({pct(x['dropped'] / x['measured'])}): {reasons}"
        )
    if len(found) > most:
        lines.append(f"  ... and {len(found) - most} more (stats.json mostly_dropped)")
    return lines


def rate_unjudged_lines(stats: dict) -> list[str]:
    """The languages the speaking-rate rule's bounds did not judge (stats.json `quality.rate_unjudged`):
    why, then each with its front end, rated clips and speakers. No lines when every rated clip was
    judged."""
    q = stats.get("quality") or {}
    unjudged = q.get("rate_unjudged") or []
    if not unjudged:
        return []
    least = q.get("rules", {}).get("rate_min_clips")
    lines = [
        f"speaking-rate rule: {_plural(len(unjudged), 'language')} with fewer than {least} rated clips "
        "(quality_rules.rate_min_clips) judged by no bounds, only by the ceiling on symbols per second "
        "(other languages' rates are no measure of theirs):"
    ]
    for x in unjudged:
        lines.append(
            f"  {x['language']} ({x['frontend']} front end): {_plural(x['rated'], 'rated clip')}; "
            f"speakers {', '.join(x['speakers'])}"
        )
    return lines
