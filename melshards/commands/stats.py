"""`melshards stats OUT_DIR_OR_STATS_JSON`: the percentile report of a preprocessing run, and what-ifs."""

from __future__ import annotations

import json

import click

from melshards.commands import check_output_file
from melshards.reports.whatif import DEFAULT_WHAT_IF


def parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        qs = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of percentiles, e.g. 90,95,99,100") from e
    bad = [q for q in qs if not 0 < q <= 100]
    if not qs or bad:
        raise click.BadParameter(f"percentiles must lie in (0, 100], got {text!r}")
    return qs


def terminal_report(report: dict) -> str:
    from melshards.reports.by_tables import corpus_line
    from melshards.reports.stats_json_tables import (
        bucket_table,
        bucket_whatif_table,
        counts_table,
        input_lines,
        mostly_dropped_lines,
        padding_table,
        percentile_table,
    )
    from melshards.reports.stats_report_tables import mib, whatif_table

    pad = report["padding"]
    parts = [
        f"stats of {report['source']}",
        *mostly_dropped_lines(report),
        corpus_line(report),
        *input_lines(report.get("inputs") or []),
        "",
        "Lengths before and after filtering (percentiles of the clips measured / in shards)",
        percentile_table(report),
        "",
        f"Clips ({report['hours']['after_filter']:.2f} h of audio in shards)",
        counts_table(report),
        "",
    ]
    if pad:
        batch = (
            f"one batch of {report['batch_size']}: {mib(pad['batch_bytes'])} MiB of decoded mel + text ids"
            if pad["batch_bytes"] is not None
            else "batch memory unknown: no schema.json, pass --n-mels"
        )
        parts += [
            "Padding at the chosen lengths (padding = share of the padded tensors that is padding, "
            "over the clips in shards; padded to = the largest bucket)",
            padding_table(report),
            batch,
            "",
        ]
    if report.get("buckets"):
        parts += [
            "Length buckets (one static shape each; padding over the clips in shards)",
            bucket_table(report),
            "",
            "What-if: other numbers of buckets K",
            bucket_whatif_table(report),
            "",
        ]
    parts += ["What-if: other upper cut-offs (one shape)", whatif_table(report)]
    if report.get("quality") is not None:
        from melshards.reports.quality_tables import quality_table

        parts += ["", "Quality measures (percentiles of the clips measured, before the filter)", quality_table(report)]
    return "\n".join(parts)


class _BeamFiles:
    """Beam's IO for the ownership check of a gs:// --html path: `stats` imports no TensorFlow."""

    def exists(self, path: str) -> bool:
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.exists(path)

    def isdir(self, path: str) -> bool:
        return False  # an object store has no directories to be in the way

    def open(self, path: str):
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def check_html_target(path: str) -> None:
    """Refuse (exit 2) an --html path that cannot be written, or that holds a file this command did not
    write (a run's schema.json, stats.json, a shard): only an earlier report is written over."""
    from melshards.shards_schema.ownership import HTML, NotOurs, check_may_write

    check_output_file("--html", path, "report.html")
    try:
        check_may_write("--html", path, HTML, fs=_BeamFiles())  # type: ignore[arg-type]  # no listdir: isdir is always False, so the check never lists
    except NotOurs as e:
        raise click.UsageError(str(e)) from e


def write_html(path: str, html: str) -> None:
    """The report to path, whole or not at all (`melshards.shards_schema.atomic.atomic_write`: written
    beside it, then renamed over it; a local file is on disk first): a write that fails or is
    interrupted leaves the previous report as it was and no partial page. A failure is exit 2 with the
    reason."""
    from apache_beam.io.filesystems import FileSystems

    from melshards.shards_schema.atomic import LOCAL, atomic_write

    data = html.encode("utf-8")
    check_html_target(path)  # again, as the report is written: a file may have been put there meanwhile
    local = "://" not in path
    try:
        with atomic_write(path, fs=LOCAL if local else FileSystems, sync=local) as f:
            f.write(data)
    except OSError as e:  # e.g. the disk filled up
        raise click.UsageError(f"--html {path}: cannot write it ({e}); pass a writable file path") from e


@click.command("stats", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path")
@click.option(
    "--batch-size",
    default=32,
    show_default=True,
    type=click.IntRange(min=1),
    help="Batch size for the batch-memory column.",
)
@click.option(
    "--what-if",
    "what_if",
    default=",".join(f"{q:g}" for q in DEFAULT_WHAT_IF),
    show_default=True,
    help="Upper percentiles for the what-if table (mel frames and text length together).",
)
@click.option(
    "--n-mels",
    type=click.IntRange(min=1),
    default=None,
    help="Mel bins for the batch memory; read from schema.json beside stats.json by default.",
)
@click.option("--html", "html_path", default=None, help="Write a self-contained HTML report (plots embedded).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON instead of tables.")
@click.option("--compare", "other_path", default=None, help="A second run (directory or stats.json) to compare.")
@click.option(
    "--by",
    type=click.Choice(["speaker", "language"]),
    default=None,
    help="Print the table of speakers (most hours first, the top 50; --json lists all) or of languages "
    "instead; --html adds its section, --compare compares clips and hours per speaker or language.",
)
def stats_command(
    path: str,
    batch_size: int,
    what_if: str,
    n_mels: int | None,
    html_path: str | None,
    as_json: bool,
    other_path: str | None,
    by: str | None,
) -> None:
    """Percentiles, counts, padding efficiency and what-if cut-offs of a `melshards preprocess` run;
    with --by, its speakers or languages.

    PATH is the run's output directory or its stats.json (local or gs://).
    """
    from melshards.reports.stats_report import StatsError, build_report, load_run, view
    from melshards.reports.stats_report_tables import compare_table

    qs = parse_percentiles(what_if)
    if html_path:  # before anything is printed
        check_html_target(html_path)
    try:
        run = load_run(path, n_mels)
        report = build_report(run, batch_size, qs)
        other = build_report(load_run(other_path, n_mels), batch_size, qs) if other_path else None
    except StatsError as e:  # the path holds no usable stats.json: a bad call
        raise click.UsageError(str(e)) from e
    if by is not None:
        from melshards.reports.by_tables import by_table, compare_by_table

        if as_json:
            shown = view(report, by) if other is None else {"a": view(report, by), "b": view(other, by)}
            click.echo(json.dumps(shown, indent=2))
        else:
            click.echo(by_table(report, by) if other is None else compare_by_table(report, other, by))
    elif as_json:
        click.echo(json.dumps(report if other is None else {"a": report, "b": other}, indent=2))
    elif other is not None:
        click.echo(compare_table(report, other))
    else:
        click.echo(terminal_report(report))
    if html_path:
        from melshards.reports.html_report import render_html

        write_html(html_path, render_html(report, run.stats["histograms"], other, by, run.stats.get("quality")))
        # stderr, so that `--json --html r.html > figures.json` stays valid JSON
        click.echo(f"wrote {html_path}", err=True)
