"""`melshards preprocess`: the command over `melshards.preprocess.job.run.run_job`, and the summary it prints.

Beam is imported when the command runs, not when `melshards --help` lists it.
"""

from __future__ import annotations

import gc
import time

import click

from melshards.commands import run_command, setup_logging
from melshards.preprocess.inputs.layouts import FORMATS
from melshards.reports.stats_json_tables import (
    bucket_table,
    input_lines,
    mostly_dropped_lines,
    percentile_table,
    quality_loss_lines,
    rate_unjudged_lines,
)
from melshards.shards_schema import REJECTED_FILE, SCHEMA_FILE, STATS_FILE


class DataError(click.ClickException):
    """The job ran but the corpus gave nothing to train on: exit 2, no usage text (the call was right)."""

    exit_code = 2


class DiskFull(click.ClickException):
    """The disk filled up during the job: exit 1, one line (where, how much), temp files removed."""

    exit_code = 1


class OutputGone(click.ClickException):
    """The run's staging dir or lock was removed while the job ran: exit 2, one line, nothing re-created."""

    exit_code = 2


class WorkerDied(click.ClickException):
    """A local worker process crashed or was killed: exit 1, one line, temp files removed."""

    exit_code = 1


class Failed(click.ClickException):
    """The job (or the command) failed for a reason it cannot name: exit 1, the error and its cause in
    one line (after what the job printed, for the job), temp files removed."""

    exit_code = 1


def run(argv: list[str] | None = None) -> int:
    """Entry point for tests; returns the process exit code."""
    return run_command(preprocess_command, argv, "melshards preprocess")


def feature_lines(stats: dict) -> list[str]:
    """What the records hold besides text and mel, and the global pitch and energy statistics."""
    if not stats.get("features"):
        return []
    out = [f"records also hold: {', '.join(stats['features'])}"]
    for name, m in stats.get("feature_stats", {}).items():
        if m["frames"]:
            unit = " Hz" if name == "pitch" else ""
            over = "voiced training frames" if name == "pitch" else "training frames"
            out.append(f"  {name:<8}mean {m['mean']:.2f}{unit}, std {m['std']:.2f}{unit} over {m['frames']} {over}")
    return out


def reference_lines(stats: dict) -> list[str]:
    """An other_clip run's records whose reference is not another clip of their split (stats.json
    `references`): validation records cut from a training clip, and records cut from themselves."""
    r = stats.get("references")
    if not r:
        return []
    own, total = r["own_clip"], sum(r["own_clip"].values())
    per_split = ", ".join(f"{split} {n}" for split, n in own.items())
    return [
        f"references: {r['val_from_train']} val record(s) cut from a training clip of their speaker (no other "
        f"val clip); {total} cut from their own clip ({per_split}: their speaker has no other clip to take)"
    ]


def print_summary(stats: dict, out_dir: str, seconds: float) -> None:
    c = stats["counts"]
    warning = mostly_dropped_lines(stats)  # first and loudest: speakers or languages mostly dropped
    if warning:
        click.echo("\n" + "\n".join(warning))
    click.echo(
        f"\n{c['input_rows']} input rows in {seconds:.1f}s: {c['in_shards']} in shards "
        f"(train {c['per_split']['train']}, val {c['per_split']['val']}), {c['filtered']} filtered, "
        f"{c['rejected']} rejected"
    )
    for reason, n in c["per_reason"].items():
        click.echo(f"  {reason:<26}{n:>6}")
    for line in quality_loss_lines(stats) + rate_unjudged_lines(stats):
        click.echo(line)
    for line in input_lines(stats.get("inputs") or []):
        click.echo(line)
    click.echo("\n" + percentile_table(stats))
    pad = stats["padding"]
    click.echo(
        f"\n{len(stats['buckets']['buckets'])} length bucket(s), up to text {pad['max_text_len']} symbols, mel "
        f"{pad['max_mel_frames']} frames; padding is {100 * pad['mel_padding_fraction']:.1f}% of mel frames, "
        f"{100 * pad['text_padding_fraction']:.1f}% of text ids\n" + bucket_table(stats)
    )
    if stats.get("cache"):
        k = stats["cache"]
        click.echo(
            f"feature cache {k['dir']}: {k['hits']} clips read from it, {k['computed']} computed and added"
            + (f", {k['damaged_files']} damaged file(s) recomputed" if k["damaged_files"] else "")
        )
    for line in feature_lines(stats) + reference_lines(stats):
        click.echo(line)
    written = [SCHEMA_FILE, STATS_FILE, REJECTED_FILE] + [f"{s}-*" for s in ("train", "val") if c["per_split"][s]]
    click.echo(f"wrote {out_dir}/{{{', '.join(written)}}}")
    if not c["per_split"]["val"]:
        click.echo("no val shard: no clip fell in the validation split (config split.val_fraction)")


@click.command(
    "preprocess",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": ["-h", "--help"]},
)
@click.option(
    "--input",
    "input_paths",
    required=True,
    multiple=True,
    help="A corpus: LJSpeech, VCTK 0.92, LibriTTS(-R) or Common Voice as they ship, or a .csv/.tsv/.jsonl "
    "manifest; local or gs://. Repeat it to merge several corpora into one run.",
)
@click.option(
    "--format",
    "format_name",
    type=click.Choice(FORMATS),
    default=None,
    help="Read every --input as this layout instead of recognising it (see docs/corpora.md).",
)
@click.option(
    "--column",
    "columns",
    multiple=True,
    metavar="FIELD=COLUMN",
    help="Read FIELD (text, id, speaker, language, gender, audio, asr_text) from COLUMN of a manifest, a "
    "parquet file or a WebDataset .json (default: a manifest's column of the field's name; the names Hugging "
    "Face exports and Emilia use). Every input with columns must have COLUMN. Repeatable.",
)
@click.option(
    "--language",
    default=None,
    metavar="CODE",
    help="Language code (en, de, zh-CN) of rows whose corpus gives none: a manifest without a language "
    "column, an old Common Voice TSV, the LJSpeech layout (else en). A row's own language wins; "
    "VCTK and LibriTTS are en.",
)
@click.option("--output", "out_dir", required=True, help="Output directory for shards and reports; local or gs://.")
@click.option("--config", "config_path", default=None, help="YAML config (see configs/ljspeech.yaml).")
@click.option(
    "--overwrite", is_flag=True, help="Replace a finished run in --output, once the new run has finished beside it."
)
@click.option("--buckets", default=None, metavar="K|auto", help="Length buckets: overrides pad.buckets.")
@click.option(
    "--alignments",
    default=None,
    metavar="DIR",
    help="Montreal Forced Aligner TextGrids, one per clip (DIR/ID.TextGrid or DIR/SPEAKER/ID.TextGrid), "
    "local or gs://: text_ids become phones and records gain their durations in mel frames.",
)
@click.option(
    "--cache",
    "cache_dir",
    default=None,
    metavar="DIR",
    help="Feature cache, local or gs:// (outside --output): clips whose audio and settings are unchanged "
    "are read from it instead of decoded, and what is computed is added (docs/preprocess.md).",
)
@click.option(
    "--workers",
    type=int,
    default=None,
    help="Local worker processes (default: every core, at most one per 1,000 rows); Beam's --direct_num_workers wins.",
)
@click.pass_context
def preprocess_command(
    ctx: click.Context,
    input_paths: tuple[str, ...],
    format_name: str | None,
    columns: tuple[str, ...],
    language: str | None,
    out_dir: str,
    config_path: str | None,
    overwrite: bool,
    buckets: str | None,
    alignments: str | None,
    cache_dir: str | None,
    workers: int | None,
) -> None:
    """Corpus -> log-mel -> percentile statistics -> filter -> pad -> TFRecord shards.

    Options not listed here go to Beam, e.g. --runner DataflowRunner --project P --region R
    --temp_location gs://B/tmp --setup_file ./setup.py. An option neither knows is an error.
    """
    setup_logging()
    from melshards.commands.ctrl_c import StopOnCtrlC
    from melshards.preprocess.config import ConfigError
    from melshards.preprocess.inputs.read_stage import CorpusError
    from melshards.preprocess.job.run import (
        DiskFullError,
        EmptyRunError,
        JobFailedError,
        OptionsError,
        OutputError,
        OutputGoneError,
        WorkerDiedError,
        failure_line,
        quiet_beam_logging,
        run_job,
        where_raised,
    )

    quiet_beam_logging()
    # Beam and this CLI, loaded by now, live until the process ends: frozen, the collector stops
    # walking them on every full collection during the run, which librosa's import alone triggers
    # many times (docs/performance.md#preprocess-start-up).
    gc.freeze()
    start = time.perf_counter()
    try:
        with StopOnCtrlC(out_dir):
            stats = run_job(
                list(input_paths),
                out_dir,
                config_path=config_path,
                buckets=buckets,
                overwrite=overwrite,
                workers=workers,
                beam_args=list(ctx.args),
                format=format_name,
                columns=list(columns),
                language=language,
                alignments=alignments,
                cache_dir=cache_dir,
                own_options=[o for p in ctx.command.get_params(ctx) for o in p.opts + p.secondary_opts],
                echo=click.echo,
            )
    except (ConfigError, CorpusError, OutputError, OptionsError) as e:
        raise click.UsageError(str(e)) from e
    except EmptyRunError as e:
        raise DataError(str(e)) from e
    except DiskFullError as e:
        raise DiskFull(str(e)) from e
    except WorkerDiedError as e:
        raise WorkerDied(str(e)) from e
    except OutputGoneError as e:
        raise OutputGone(str(e)) from e
    except JobFailedError as e:
        raise Failed(str(e)) from e
    except (click.ClickException, click.exceptions.Exit):  # StopOnCtrlC's exit after a signal
        raise
    except Exception as e:  # noqa: BLE001 (an error no check names, e.g. a file system's: one line, where it was raised)
        raise Failed(f"preprocess failed: {failure_line(e)} ({where_raised(e)})") from e
    if stats is None:
        click.echo("dry run: the job graph was built and not submitted")
        return
    print_summary(stats, out_dir, time.perf_counter() - start)
