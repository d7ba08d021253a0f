"""`melshards preprocess` / `python -m preprocess`: validate the invocation, then run the job.

Everything that can be wrong with the invocation (config, input, output) is checked before the
pipeline is built, so a bad call fails in a second with a message, not after minutes of work.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

import apache_beam as beam
import click
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions, TestOptions

from melshards.cli import run_command
from preprocess.config import load_config
from preprocess.corpus import Corpus, CorpusError, detect_corpus
from preprocess.pipeline import PROGRESS_PREFIX, build
from preprocess.shards import SHARD_SUFFIX, TEMP_DIR, remove_temp_dir
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


LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner")


def is_local(options: PipelineOptions) -> bool:
    runner = options.view_as(StandardOptions).runner
    return (runner if isinstance(runner, str) else type(runner).__name__) in LOCAL_RUNNERS


def is_dry_run(options: PipelineOptions) -> bool:
    return bool(options.view_as(TestOptions).dry_run)


def all_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def apply_workers(options: PipelineOptions, beam_args: list[str], workers: int | None) -> None:
    """--workers N (default: every core) -> the local runner's worker count and mode.

    N > 1 runs N worker processes (multi_processing); 1 runs in this process. Beam's own
    --direct_num_workers / --direct_running_mode, when given, win.
    """
    if not is_local(options):
        if workers is not None:
            raise click.UsageError("--workers sets the local runner's processes; for Dataflow use --num_workers "
                              "/ --max_num_workers")
        return
    given = {a.split("=")[0] for a in beam_args if a.startswith("--direct_")}
    direct = options.view_as(DirectOptions)
    n = workers or all_cores()
    if workers is not None and workers < 1:
        raise click.UsageError(f"--workers must be at least 1, got {workers}")
    if "--direct_num_workers" not in given:
        direct.direct_num_workers = n
    if "--direct_running_mode" not in given:
        direct.direct_running_mode = "multi_processing" if direct.direct_num_workers > 1 else "in_memory"


def count_rows(corpus: Corpus) -> int:
    """Rows in the corpus file (non-empty lines, less a manifest's CSV/TSV header): the progress total."""
    with FileSystems.open(corpus.rows_path) as f:
        n = sum(1 for line in f if line.strip())
    header = corpus.kind == "manifest" and corpus.rows_path.lower().endswith((".csv", ".tsv"))
    return n - 1 if header else n


class ProgressReporter(threading.Thread):
    """Prints rows done of total, clips/s and ETA every `every` seconds while a local job runs.

    The counts come from the files the Measure workers rewrite under the output's temp dir
    (pipeline._ProgressFile): the local runner's Metrics are only available after the job.
    """

    def __init__(self, out_dir: str, total: int, every: float = 5.0):
        super().__init__(daemon=True)
        self.pattern = FileSystems.join(out_dir, TEMP_DIR, f"{PROGRESS_PREFIX}*.txt")
        self.total, self.every = total, every
        self.stopped = threading.Event()

    def rows_done(self) -> int:
        n = 0
        for m in FileSystems.match([self.pattern])[0].metadata_list:
            try:
                with FileSystems.open(m.path) as f:
                    n += int(f.read() or 0)
            except (OSError, ValueError):  # being rewritten right now: counted at the next tick
                pass
        return n

    def line(self, done: int, rate: float | None) -> str:
        pct = 100 * done / self.total if self.total else 100.0
        if not rate:
            return f"progress: {done}/{self.total} rows ({pct:.0f}%), starting"
        eta = max(self.total - done, 0) / rate
        return f"progress: {done}/{self.total} rows ({pct:.0f}%), {rate:.1f} clips/s, ETA {eta:.0f}s"

    def run(self):
        first, done = None, 0  # first: (time, rows) when workers first reported; rates exclude start-up
        while not self.stopped.wait(self.every):
            done, now = max(done, self.rows_done()), time.monotonic()  # the report stage deletes the files
            if first is None and done:
                first = (now, done)
            rate = (done - first[1]) / (now - first[0]) if first and now > first[0] else None
            click.echo(self.line(min(done, self.total), rate))

    def stop(self):
        self.stopped.set()
        self.join()


def quiet_beam_logging() -> None:
    """Keep the console to the job's own lines: Beam's per-transform chatter, the local runner's
    servers, and the worker processes' start-up lines (relayed by local_job_service: INFO and a
    WARN per worker about semi_persistent_directory) go; workers' errors still show."""
    for noisy in ("apache_beam.typehints", "apache_beam.runners.worker", "apache_beam.io.filebasedsink",
                  "apache_beam.runners.portability"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("apache_beam.runners.portability.local_job_service").setLevel(logging.ERROR)


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
    click.echo(f"\npadded to text {pad['max_text_len']} symbols, mel {pad['max_mel_frames']} frames; "
               f"padding is {100 * pad['mel_padding_fraction']:.1f}% of mel frames, "
               f"{100 * pad['text_padding_fraction']:.1f}% of text ids")
    click.echo(f"wrote {out_dir}/{{{SCHEMA_FILE}, {STATS_FILE}, {REJECTED_FILE}, train-*, val-*}}")


@click.command("preprocess", context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                               "help_option_names": ["-h", "--help"]})
@click.option("--input", "input_path", required=True,
              help="LJSpeech directory (metadata.csv + wavs/) or a .csv/.tsv/.jsonl manifest; local or gs://.")
@click.option("--output", "out_dir", required=True, help="Output directory for shards and reports; local or gs://.")
@click.option("--config", "config_path", default=None, help="YAML config (see configs/ljspeech.yaml).")
@click.option("--overwrite", is_flag=True, help="Replace a finished run in --output.")
@click.option("--workers", type=int, default=None,
              help="Local worker processes (default: every core); Beam's --direct_num_workers wins.")
@click.pass_context
def preprocess_command(ctx: click.Context, input_path: str, out_dir: str, config_path: str | None,
                       overwrite: bool, workers: int | None) -> None:
    """Corpus -> log-mel -> percentile statistics -> filter -> pad -> TFRecord shards.

    Options not listed here go to Beam, e.g. --runner DataflowRunner --project P --region R
    --temp_location gs://B/tmp --setup_file ./setup.py.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    quiet_beam_logging()
    try:
        cfg = load_config(config_path)
        corpus = detect_corpus(input_path)
        options = pipeline_options(list(ctx.args))
        apply_workers(options, list(ctx.args), workers)
        if not is_dry_run(options):  # a dry run writes nothing, and must not need the output's storage
            prepare_output(out_dir, overwrite)
    except (ConfigError, CorpusError, OutputError) as e:
        raise click.UsageError(str(e)) from e
    except ValueError as e:  # PipelineOptions rejects malformed Beam flags with ValueError
        raise click.UsageError(f"bad Beam option: {e}") from e
    log.info("corpus %s (%s), output %s, runner %s", corpus.rows_path, corpus.kind, out_dir,
             options.view_as(StandardOptions).runner)
    start = time.perf_counter()
    local = is_local(options) and not is_dry_run(options)
    p = beam.Pipeline(options=options)
    build(p, corpus, out_dir, cfg, progress=local)
    reporter = ProgressReporter(out_dir, count_rows(corpus)) if local else None
    if reporter:
        reporter.start()
    try:
        result = p.run()
        if is_dry_run(options):
            click.echo("dry run: the job graph was built and not submitted")
            return
        result.wait_until_finish()
    finally:
        if reporter:
            reporter.stop()
    print_summary(out_dir, time.perf_counter() - start)


def main() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TF's C++ start-up banner, in workers too
    sys.exit(run())
