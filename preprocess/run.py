"""`melshards preprocess` / `python -m preprocess`: validate the invocation, then run the job.

Everything that can be wrong with the invocation (config, input, output) is checked before the
pipeline is built, so a bad call fails in a second with a message, not after minutes of work.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time

import apache_beam as beam
import click
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TestOptions

from melshards.cli import run_command
from preprocess.config import load_config
from preprocess.corpus import CorpusError, detect_corpus
from preprocess.pipeline import build
from preprocess.shards import SHARD_SUFFIX, remove_temp_dir
from shards_schema import REJECTED_FILE, SCHEMA_FILE, STATS_FILE
from shards_schema.config import ConfigError

log = logging.getLogger("melshards.preprocess")

# Beam 2.77's DirectRunner first tries to download the Prism runner (no network here, and a slow
# start everywhere); the in-process FnApiRunner runs this job and honours --direct_num_workers
# and --direct_running_mode.
DEFAULT_RUNNER = "FnApiRunner"


class OutputError(ValueError):
    pass


def _outputs(out_dir: str) -> list[str]:
    patterns = [FileSystems.join(out_dir, n) for n in (SCHEMA_FILE, STATS_FILE, REJECTED_FILE)]
    patterns += [FileSystems.join(out_dir, f"{s}-*{SHARD_SUFFIX}") for s in ("train", "val")]
    return [m.path for r in FileSystems.match(patterns) for m in r.metadata_list]


def prepare_output(out_dir: str, overwrite: bool) -> None:
    """Refuse to clobber a finished run; clear a finished run (with --overwrite) or an unfinished one."""
    finished = FileSystems.exists(FileSystems.join(out_dir, SCHEMA_FILE))
    if finished and not overwrite:
        raise OutputError(f"--output {out_dir} already holds a finished run ({SCHEMA_FILE} exists); "
                          "pass --overwrite to replace it, or choose another directory")
    stale = _outputs(out_dir)
    if stale:
        log.info("removing %d files of the %s run in %s", len(stale), "previous" if finished else "unfinished",
                 out_dir)
        FileSystems.delete(stale)
    remove_temp_dir(out_dir)


def pipeline_options(beam_args: list[str]) -> PipelineOptions:
    options = PipelineOptions(beam_args)
    std = options.view_as(StandardOptions)
    if std.runner is None:
        std.runner = DEFAULT_RUNNER
    return options


def run(argv: list[str] | None = None) -> int:
    """Entry point for tests and `python -m preprocess`; returns the process exit code."""
    return run_command(preprocess_command, argv, "melshards preprocess")


def print_summary(out_dir: str, seconds: float) -> None:
    with FileSystems.open(FileSystems.join(out_dir, STATS_FILE)) as f:
        stats = json.loads(f.read())
    c = stats["counts"]
    click.echo(f"\n{c['input_rows']} input rows in {seconds:.1f}s: {c['in_shards']} in shards "
               f"(train {c['per_split']['train']}, val {c['per_split']['val']}), {c['filtered']} filtered, "
               f"{c['rejected']} rejected")
    for reason, n in c["per_reason"].items():
        click.echo(f"  {reason:<26}{n:>6}")
    from melshards.tables import percentile_table
    click.echo("\n" + percentile_table(stats))
    pad = stats["padding"]
    from melshards.tables import bucket_table
    click.echo(f"\n{len(stats['buckets']['buckets'])} length bucket(s), up to text {pad['max_text_len']} symbols, mel "
               f"{pad['max_mel_frames']} frames; padding is {100 * pad['mel_padding_fraction']:.1f}% of mel frames, "
               f"{100 * pad['text_padding_fraction']:.1f}% of text ids\n" + bucket_table(stats))
    click.echo(f"wrote {out_dir}/{{{SCHEMA_FILE}, {STATS_FILE}, {REJECTED_FILE}, train-*, val-*}}")


@click.command("preprocess", context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                               "help_option_names": ["-h", "--help"]})
@click.option("--input", "input_path", required=True,
              help="LJSpeech directory (metadata.csv + wavs/) or a .csv/.tsv/.jsonl manifest; local or gs://.")
@click.option("--output", "out_dir", required=True, help="Output directory for shards and reports; local or gs://.")
@click.option("--config", "config_path", default=None, help="YAML config (see configs/ljspeech.yaml).")
@click.option("--overwrite", is_flag=True, help="Replace a finished run in --output.")
@click.option("--buckets", default=None, metavar="K|auto", help="Length buckets: overrides pad.buckets.")
@click.pass_context
def preprocess_command(ctx: click.Context, input_path: str, out_dir: str, config_path: str | None,
                       overwrite: bool, buckets: str | None) -> None:
    """Corpus -> log-mel -> percentile statistics -> filter -> pad -> TFRecord shards.

    Options not listed here go to Beam, e.g. --runner DataflowRunner --project P --region R
    --temp_location gs://B/tmp --setup_file ./setup.py, or --direct_num_workers 2
    --direct_running_mode multi_processing.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("apache_beam.typehints", "apache_beam.runners.worker", "apache_beam.io.filebasedsink"):
        logging.getLogger(noisy).setLevel(logging.WARNING)  # per-transform chatter, not progress
    try:
        cfg = load_config(config_path, buckets)
        corpus = detect_corpus(input_path)
        options = pipeline_options(list(ctx.args))
        prepare_output(out_dir, overwrite)
    except (ConfigError, CorpusError, OutputError) as e:
        raise click.UsageError(str(e)) from e
    except ValueError as e:  # PipelineOptions rejects malformed Beam flags with ValueError
        raise click.UsageError(f"bad Beam option: {e}") from e
    log.info("corpus %s (%s), output %s, runner %s", corpus.rows_path, corpus.kind, out_dir,
             options.view_as(StandardOptions).runner)
    start = time.perf_counter()
    p = beam.Pipeline(options=options)
    build(p, corpus, out_dir, cfg)
    result = p.run()
    result.wait_until_finish()
    if options.view_as(TestOptions).dry_run:
        click.echo("dry run: the job graph was built and not submitted")
        return
    print_summary(out_dir, time.perf_counter() - start)


def main() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TF's C++ start-up banner, in workers too
    sys.exit(run())
