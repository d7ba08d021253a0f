"""`run_job`: check an invocation of the preprocessing job, then run it (`melshards preprocess` calls it).

Everything that can be wrong with the invocation (options, config, input, output) is checked before
the pipeline is built, so a bad call fails in a second with a message, not after minutes of work.
A corpus whose every row is rejected is only known after the job: `EmptyRunError`, in one line.
"""
from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import re
import threading
import time
from typing import Callable, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions, TestOptions

from melshards.preprocess.config import load_config
from melshards.preprocess.corpus import Corpus, check_rows_file, detect_corpus
from melshards.preprocess.pipeline import PROGRESS_PREFIX, build
from melshards.preprocess.output import OutputError, Run, close_run, exception_chain, is_disk_full, open_run, tree_bytes
from melshards.preprocess.shards import TEMP_DIR
from melshards.shards_schema import REJECTED_FILE, SCHEMA_FILE, STATS_FILE

log = logging.getLogger("melshards.preprocess")

# Beam 2.77's DirectRunner first tries to download the Prism runner (no network here, and a slow
# start everywhere); the in-process FnApiRunner runs this job and honours --direct_num_workers
# and --direct_running_mode.
DEFAULT_RUNNER = "FnApiRunner"


class OptionsError(ValueError):
    pass


class EmptyRunError(RuntimeError):
    """The job ran but the corpus gave nothing to train on (every row rejected)."""


class DiskFullError(RuntimeError):
    """The job ran out of space; the message says where and about how much the run needed."""


def _beam_parser() -> argparse.ArgumentParser:
    """Beam's own parser of every registered PipelineOptions class (handed out by its public hook)."""
    parsers = []
    PipelineOptions([]).get_all_options(add_extra_args_fn=parsers.append)
    parser = parsers[0]
    parser.exit_on_error = False  # ArgumentError instead of printing usage and exiting
    return parser


def check_beam_args(beam_args: list[str], own_options: list[str]) -> None:
    """Refuse options that neither melshards nor Beam knows (Beam would only log a warning and run
    with its defaults), suggesting the closest known name."""
    parser = _beam_parser()
    try:
        _, unknown = parser.parse_known_args(beam_args)
    except argparse.ArgumentError as e:
        raise OptionsError(f"bad Beam option: {e}") from e
    if not unknown:
        return
    flag = next((a for a in unknown if a.startswith("-")), None)
    if flag is None:
        raise OptionsError(f"unexpected argument {unknown[0]!r}: preprocess takes only options (see --help)")
    name = flag.split("=", 1)[0]
    beam_names = ["--" + dest for dest in PipelineOptions([]).get_all_options()]

    def is_flag(candidate: str) -> bool:  # an option's dest is not always one of its flags
        try:
            return candidate in own_options or not parser.parse_known_args([candidate])[1]
        except argparse.ArgumentError:  # known, but wants a value
            return True

    close = [c for c in difflib.get_close_matches(name, own_options + beam_names, n=5) if is_flag(c)]
    hint = f"; did you mean {close[0]}?" if close else "; see --help, and Beam's pipeline options"
    raise OptionsError(f"unknown option {name}: neither melshards nor Beam knows it{hint}")


def pipeline_options(beam_args: list[str], own_options: list[str] = ()) -> PipelineOptions:
    check_beam_args(beam_args, list(own_options))
    options = PipelineOptions(beam_args)
    std = options.view_as(StandardOptions)
    if std.runner is None:
        std.runner = DEFAULT_RUNNER
    return options


LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner")


def is_local(options: PipelineOptions) -> bool:
    runner = options.view_as(StandardOptions).runner
    return (runner if isinstance(runner, str) else type(runner).__name__) in LOCAL_RUNNERS


def all_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


ROWS_PER_WORKER = 1000


def default_workers(rows: int | None) -> int:
    """Every core, but one worker per ROWS_PER_WORKER rows at most.

    A worker process costs ~2 s to start and stop (Beam's harness, librosa's import), paid back
    by about 1,000 clips of work shared (measured on 2 cores: 56 clips 3.3 s with one worker,
    5.2 s with two; 1,000 clips 8.8 s and 9.5 s). rows None (a remote corpus not counted): every core.
    """
    cores = all_cores()
    return cores if rows is None else max(1, min(cores, -(-rows // ROWS_PER_WORKER)))


def apply_workers(options: PipelineOptions, beam_args: list[str], workers: int | None,
                  rows: int | None = None) -> None:
    """--workers N (default: `default_workers(rows)`) -> the local runner's worker count and mode.

    N > 1 runs N worker processes (multi_processing); 1 runs in this process. Beam's own
    --direct_num_workers / --direct_running_mode, when given, win.
    """
    if not is_local(options):
        if workers is not None:
            raise OptionsError("--workers sets the local runner's processes; for Dataflow use --num_workers "
                               "/ --max_num_workers")
        return
    given = {a.split("=")[0] for a in beam_args if a.startswith("--direct_")}
    direct = options.view_as(DirectOptions)
    if workers is not None and workers < 1:
        raise OptionsError(f"--workers must be at least 1, got {workers}")
    n = workers or default_workers(rows)
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

    def __init__(self, out_dir: str, total: int, echo: Callable[[str], None], every: float = 5.0):
        super().__init__(daemon=True)
        self.echo = echo
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
            self.echo(self.line(min(done, self.total), rate))

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


def _read_stats(out_dir: str) -> dict:
    with FileSystems.open(FileSystems.join(out_dir, STATS_FILE)) as f:
        return json.loads(f.read())


def empty_run_message(stage: str) -> str:
    """After a run that wrote no schema.json (every row rejected): one line counting the reasons and
    naming the rejected.jsonl kept in the staging dir (each row's reason: what fixes the corpus)."""
    if not FileSystems.exists(FileSystems.join(stage, STATS_FILE)):
        return f"the job finished without writing {SCHEMA_FILE} or {STATS_FILE}"
    c = _read_stats(stage)["counts"]
    reasons = ", ".join(f"{n} {reason}" for reason, n in c["per_reason"].items())
    return (f"all {c['input_rows']} input rows were rejected ({reasons}); no shards were written and the "
            f"output directory is as it was. Each row's reason is in {FileSystems.join(stage, REJECTED_FILE)} "
            "(removed by the next run into this directory).")


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _free_bytes(path: str) -> int | None:
    try:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
    except OSError:
        return None


def disk_full_message(exc: BaseException, run: Run, done: int, total: int | None) -> str:
    """Which path is full and about how much the run needed: what it had staged, scaled by the rows
    done (the shards and the mel stash grow with the rows)."""
    found = re.search(r"No space left on device: '([^']+)'", "".join(str(e) for e in exception_chain(exc)))
    path = found.group(1) if found else run.stage
    staged = tree_bytes(run.stage)
    need = staged * total / done if total and done else None
    where = os.path.dirname(path) if "://" not in path else path
    free = _free_bytes(where) if "://" not in path else None
    needed = (f"the run had written {_size(staged)} for {done} of {total} rows, so it needs about "
              f"{_size(need)} free there" if need else f"the run had written {_size(staged)} when it failed")
    return (f"no space left on the device of {path}{f' ({_size(free)} free)' if free is not None else ''}: "
            f"{needed}; free some space or choose another --output. Its temporary files were removed and "
            f"{run.out_dir} is as it was.")


def run_job(input_path: str, out_dir: str, *, config_path: str | None = None, buckets: str | None = None,
            overwrite: bool = False, workers: int | None = None, beam_args: Sequence[str] = (),
            own_options: Sequence[str] = (), echo: Callable[[str], None] = print) -> dict | None:
    """Check the invocation, run the job to completion, and return the stats.json it wrote.

    The job writes into a staging dir of its own beside any earlier run in out_dir (see
    `melshards.preprocess.output`) and is moved into place only once it has finished; a failure or an
    interrupt removes the staging dir and leaves out_dir as it was.

    Returns None for a dry run (the graph was built, not submitted). Raises ConfigError,
    CorpusError, OutputError or OptionsError (all ValueError) before any work when the call is
    wrong, EmptyRunError when every row was rejected, DiskFullError when the disk filled up.
    `echo` receives the progress lines.
    """
    cfg = load_config(config_path, buckets)
    options = pipeline_options(list(beam_args), list(own_options))
    dry_run = options.view_as(TestOptions).dry_run
    corpus = detect_corpus(input_path)
    # Local files are checked always; remote ones only for a real run, so a Dataflow dry run
    # (--dry_run=True --no_auth) still builds its graph offline.
    if not (dry_run and "://" in corpus.rows_path):
        check_rows_file(corpus)
    local = is_local(options) and not dry_run
    rows = count_rows(corpus) if local else None
    apply_workers(options, list(beam_args), workers, rows)
    if dry_run:
        p = beam.Pipeline(options=options)
        build(p, corpus, out_dir, cfg)
        p.run()
        return None
    run = open_run(out_dir, overwrite, echo=echo)
    log.info("corpus %s (%s), output %s (staged in %s), runner %s", corpus.rows_path, corpus.kind, out_dir,
             run.stage, options.view_as(StandardOptions).runner)
    reporter = ProgressReporter(run.stage, rows, echo) if local else None
    closed = False
    try:
        p = beam.Pipeline(options=options)
        build(p, corpus, run.stage, cfg, progress=local)
        if reporter:
            reporter.start()
        try:
            p.run().wait_until_finish()
        finally:
            if reporter:
                reporter.stop()
        if not FileSystems.exists(FileSystems.join(run.stage, SCHEMA_FILE)):
            message = empty_run_message(run.stage)
            close_run(run, ok=False, keep=(REJECTED_FILE,))
            closed = True
            raise EmptyRunError(message)
        stats = _read_stats(run.stage)
        close_run(run, ok=True)
        closed = True
    except Exception as e:
        if is_disk_full(e) and not closed:
            message = disk_full_message(e, run, reporter.rows_done() if reporter else 0, rows)
            close_run(run, ok=False)
            closed = True
            raise DiskFullError(message) from e
        raise
    finally:
        if not closed:  # failed, or interrupted (KeyboardInterrupt): the staging dir goes, the lock too
            close_run(run, ok=False)
    return stats
