"""`run_job`: check an invocation of the preprocessing job, then run it (`melshards preprocess` calls it).

Everything that can be wrong with the invocation (options, config, input, output) is checked before
the pipeline is built, so a bad call fails at once with a message, before any clip is read.
A corpus whose every row is rejected is only known after the job: `EmptyRunError`, in one line.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from typing import IO

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions, TestOptions

from melshards.preprocess.clip import cache, extractor_plugins
from melshards.preprocess.config import ConfigError, load_config
from melshards.preprocess.inputs.progress import ProgressReporter, count_rows
from melshards.preprocess.inputs.read_stage import (
    Corpus,
    CorpusError,
    check_distinct_inputs,
    check_named_columns,
    check_rows_file,
    detect_corpus,
)
from melshards.preprocess.job.pipeline import build_pipeline
from melshards.preprocess.options import OptionsError, is_local, pipeline_options
from melshards.preprocess.out_dir.lock import is_local_path
from melshards.preprocess.out_dir.shards import make_temp_dir
from melshards.preprocess.out_dir.staging import (
    RUN_FILE,
    OutputError,
    OutputRun,
    close_run,
    exception_chain,
    is_disk_full,
    open_run,
    tree_bytes,
)
from melshards.preprocess.workers import (
    JobStoppedError,
    WorkerDiedError,
    apply_workers,
    run_in_job_process,
)
from melshards.shards_schema import REJECTED_FILE, SCHEMA_FILE, STATS_FILE

log = logging.getLogger("melshards.preprocess")

# What `melshards preprocess` imports from here: the errors of every check it reports, and run_job.
__all__ = [
    "DiskFullError",
    "EmptyRunError",
    "JobFailedError",
    "OptionsError",
    "OutputError",
    "OutputGoneError",
    "failure_line",
    "quiet_beam_logging",
    "run_job",
    "where_raised",
]


class EmptyRunError(RuntimeError):
    """The job ran but the corpus gave nothing to train on (every row rejected)."""


class DiskFullError(RuntimeError):
    """The job ran out of space; the message says where and about how much the run needed."""


class OutputGoneError(RuntimeError):
    """The run's staging dir or lock was removed while the job ran (`rm -rf OUT`): the job was stopped."""


def quiet_beam_logging() -> None:
    """Keep the console to the job's own lines: Beam's per-transform chatter, the local runner's
    servers, and the worker processes' start-up lines (relayed by local_job_service: INFO and a
    WARN per worker about semi_persistent_directory) go; workers' errors still show."""
    for noisy in (
        "apache_beam.typehints",
        "apache_beam.runners.worker",
        "apache_beam.io.filebasedsink",
        "apache_beam.runners.portability",
    ):
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
    return (
        f"all {c['input_rows']} input rows were rejected ({reasons}); no shards were written and the "
        f"output directory is as it was. Each row's reason is in {FileSystems.join(stage, REJECTED_FILE)} "
        "(removed by the next run into this directory)."
    )


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


def disk_full_message(exc: BaseException, run: OutputRun, done: int, total: int | None) -> str:
    """Which path is full and about how much the run needed: what it had staged, scaled by the rows
    done (the shards and the temp files of the measured mels grow with the rows)."""
    found = re.search(r"No space left on device: '([^']+)'", "".join(str(e) for e in exception_chain(exc)))
    path = found.group(1) if found else run.stage
    staged = tree_bytes(run.stage)
    need = staged * total / done if total and done else None
    free = _free_bytes(os.path.dirname(path)) if is_local_path(path) else None
    needed = (
        f"the run had written {_size(staged)} for {done} of {total} rows, so it needs about {_size(need)} free there"
        if need
        else f"the run had written {_size(staged)} when it failed"
    )
    return (
        f"no space left on the device of {path}{f' ({_size(free)} free)' if free is not None else ''}: "
        f"{needed}; free some space or choose another --output. Its temporary files were removed and "
        f"{run.out_dir} is as it was."
    )


def find_corpora(
    input_paths: Sequence[str],
    format: str | None,
    language: str | None,
    check_remote: bool,
    columns: Sequence[str] = (),
) -> list[Corpus]:
    """Every --input's corpus (its layout recognised, or forced by `format`), each rows file's first
    line checked (a remote one only if `check_remote`); a bad path fails naming it, before any work.
    `columns`: `--column FIELD=NAME` values (`sources.parse_columns`)."""
    if not input_paths:
        raise CorpusError("no --input given; give one or more corpora (--input PATH, repeated)")
    corpora = [detect_corpus(path, format, language, columns) for path in input_paths]
    check_distinct_inputs(corpora)
    check_named_columns(corpora)
    for corpus in corpora:
        if check_remote or is_local_path(corpus.rows_path or corpus.root):
            check_rows_file(corpus)
    return corpora


def check_alignments_dir(path: str) -> None:
    """CorpusError at once when the alignments directory is missing (local or gs://)."""
    local = is_local_path(path)
    if (
        os.path.isdir(path)
        if local
        else FileSystems.exists(path.rstrip("/") + "/")
        or bool(FileSystems.match([path.rstrip("/") + "/*"], limits=[1])[0].metadata_list)
    ):
        return
    raise CorpusError(
        f"--alignments {path}: no such directory; give the directory Montreal Forced Aligner wrote "
        "its TextGrids into (DIR/ID.TextGrid or DIR/SPEAKER/ID.TextGrid)"
    )


def _inside(path: str, directory: str) -> bool:
    norm = lambda x: os.path.abspath(x) if is_local_path(x) else x.rstrip("/")
    p, d = norm(path), norm(directory)
    return p == d or p.startswith(d.rstrip("/") + "/")


def check_cache_apart(cache_dir: str, out_dir: str) -> None:
    """OutputError at once for a cache inside the output directory (or holding it): replacing a run
    there would take the cache with it, or the cache's files would mix with a run's."""
    if _inside(cache_dir, out_dir) or _inside(out_dir, cache_dir):
        raise OutputError(
            f"--cache {cache_dir} is inside --output {out_dir} (or holds it); give the cache a "
            "directory of its own, e.g. beside the output: --cache "
            f"{posixpath.dirname(out_dir.rstrip('/')) or '.'}/melshards-cache"
        )


def run_job(
    input_paths: Sequence[str],
    out_dir: str,
    *,
    config_path: str | None = None,
    buckets: str | None = None,
    overwrite: bool = False,
    workers: int | None = None,
    beam_args: Sequence[str] = (),
    own_options: Sequence[str] = (),
    echo: Callable[[str], None] = print,
    format: str | None = None,
    language: str | None = None,
    alignments: str | None = None,
    cache_dir: str | None = None,
    columns: Sequence[str] = (),
) -> dict | None:
    """Check the invocation, run the job to completion, and return the stats.json it wrote.

    `input_paths`: one corpus or several, merged into one run (see docs/corpora.md); `format` forces
    their layout, `language` is the language of rows whose corpus does not say; `alignments` a directory
    of Montreal Forced Aligner TextGrids (overrides the config's alignments.dir); `cache_dir` the feature
    cache (`melshards.preprocess.clip.cache`), outside `out_dir`; `columns` `--column FIELD=NAME` values
    (a field read from a column of another name: docs/corpora.md).

    The job writes into a staging dir of its own beside any earlier run in out_dir (see
    `melshards.preprocess.out_dir.staging`) and is moved into place only once it has finished; a failure or an
    interrupt removes the staging dir and leaves out_dir as it was.

    Returns None for a dry run (the graph was built, not submitted). Raises ConfigError,
    CorpusError, OutputError or OptionsError (all ValueError) before any work when the call is
    wrong, and ConfigError or CorpusError too when the job fails on a bad input (`input_error`: an
    extractor that cannot be built, a file that does not read); EmptyRunError when every row was
    rejected, DiskFullError when the disk filled up, WorkerDiedError when a local worker process
    crashed or was killed, JobFailedError when the job failed otherwise.
    `echo` receives the progress lines.
    """
    cfg = load_config(config_path, buckets, alignments)
    options = pipeline_options(list(beam_args), list(own_options))
    # the command's own reads and writes (finding the inputs, the lock, publishing) go through the
    # job's options too (--impersonate_service_account and the rest Beam's GcsIO reads from them)
    FileSystems.set_options(options)
    dry_run = options.view_as(TestOptions).dry_run
    extractor_plugins.check_entries(cfg.extractors, importable=is_local(options))
    if cfg.alignments.dir and (not dry_run or is_local_path(cfg.alignments.dir)):
        check_alignments_dir(cfg.alignments.dir)
    if cache_dir:
        check_cache_apart(cache_dir, out_dir)
        if not dry_run:
            cache.check_writable(cache_dir)
    # Local rows files are checked always; remote ones only for a real run, so a Dataflow dry run
    # (--dry_run=True --no_auth) still builds its graph offline.
    corpora = find_corpora(
        [input_paths] if isinstance(input_paths, str) else list(input_paths),
        format,
        language,
        check_remote=not dry_run,
        columns=columns,
    )
    local = is_local(options) and not dry_run
    rows = count_rows(corpora) if local else None
    apply_workers(options, list(beam_args), workers, rows)
    if dry_run:
        p = beam.Pipeline(options=options)
        build_pipeline(p, corpora, out_dir, cfg, cache_dir=cache_dir)
        p.run()
        return None
    run = open_run(out_dir, overwrite, echo=echo)
    log.info(
        "corpus %s, output %s (staged in %s), runner %s",
        ", ".join(f"{c.input} ({c.kind})" for c in corpora),
        out_dir,
        run.stage,
        options.view_as(StandardOptions).runner,
    )
    reporter = ProgressReporter(run.stage, echo) if local else None
    lease = None
    try:
        if cache_dir:  # `melshards cache prune` removes no entries while the run holds the cache
            lease = cache.Lease(cache_dir, posixpath.basename(run.stage.rstrip("/")).lstrip(".")).start()
        make_temp_dir(run.stage)  # the workers make no directory: a staging dir removed stays removed
        with tempfile.TemporaryFile() as job_log:  # shown when the job ends, unless told in one line below
            try:
                _run_pipeline(options, corpora, run, cfg, reporter, cache_dir, job_log)
                show_log(job_log)
                return _finish(run)
            except Exception as e:
                done, total = (reporter.rows_done(), reporter.read_total()) if reporter else (0, None)
                told = one_line_error(e, run, out_dir, cache_dir, done, total)
                if told is None:
                    show_log(job_log)
                    raise
                if isinstance(told, JobFailedError) or (isinstance(e, WorkerDiedError) and not e.by_signal):
                    show_log(job_log)  # an error of its own: what the job printed is the diagnosis
                close_run(run, ok=False)
                raise told from e
    finally:  # failed or interrupted (KeyboardInterrupt): the staging dir goes, the lock too. After a
        close_run(run, ok=False)  # publish or an abort this does nothing: OutputRun.abort is idempotent
        if lease:
            lease.release()


def show_log(job_log: IO[bytes]) -> None:
    """What the job process and its workers printed and logged (`run_in_job_process`), onto stderr, once:
    the log is emptied."""
    job_log.seek(0)
    text = job_log.read().decode("utf-8", "replace")
    job_log.seek(0)
    job_log.truncate()
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()


def removed_during_run(run: OutputRun) -> str | None:
    """What of the run's hold on its output directory was removed while the job ran (its staging dir's
    run.json, or its lock: `rm -rf OUT`), or None. Nothing once the run was published or closed."""
    if run.published or run.closed:
        return None
    if not FileSystems.exists(FileSystems.join(run.stage, RUN_FILE)):
        return f"the run's staging dir {run.stage}"
    if not run.lock.still_held():
        return f"the run's lock {run.lock.path}"
    return None


def gone_message(what: str, out_dir: str) -> str:
    return (
        f"{what} was removed while the job ran: the job was stopped, nothing was published, and nothing of "
        f"the run is left in {out_dir}; leave the directory to a run while it runs, and run again"
    )


def watch_output(run: OutputRun, every: float | None = None) -> Callable[[], str | None]:
    """For the job process's watch (`run_in_job_process`' stop_when): every `every` seconds (1 locally, 30 on
    gs://), why the job must stop (`gone_message`), or None."""
    every = every if every is not None else 1.0 if is_local_path(run.stage) else 30.0
    last = [time.monotonic()]

    def check() -> str | None:
        if time.monotonic() - last[0] < every:
            return None
        last[0] = time.monotonic()
        try:
            gone = removed_during_run(run)
        except Exception:  # a transient error reading the lock (gs://): asked again at the next check
            return None
        return gone_message(gone, run.out_dir) if gone else None

    return check


# The errors the job's own code raises for a bad corpus or config (an extractor that cannot be built,
# a file that does not read): wherever the job ran, the command says them as themselves, in one line.
# Most specific first (an ExtractorError is a ConfigError).
# the subclass first: an extractor that failed on too many clips is told as that
INPUT_ERRORS: tuple[type[Exception], ...] = (
    extractor_plugins.ExtractorFailing,
    extractor_plugins.ExtractorError,
    CorpusError,
    ConfigError,
)


def _without_step(message: str) -> str:
    """A worker's error message without the step Beam appends when it re-raises it."""
    return re.sub(r"\s*\[while running '[^']*'\]\s*$", "", message.strip())


def input_error(e: BaseException) -> Exception | None:
    """The bad-input error (`INPUT_ERRORS`) the job failed with, rebuilt with its own message, or None.
    A local job in this process's child raises it (its causes kept, `run_in_job_process`); Beam's
    worker processes and remote runners send back its traceback as text, whose line
    `package.module.ErrorName: message` names it."""
    chain = list(exception_chain(e))
    for error in chain:
        for cls in INPUT_ERRORS:
            if isinstance(error, cls):
                return cls(_without_step(str(error)))
    for error in chain:
        for cls in INPUT_ERRORS:
            said = re.findall(rf"^{re.escape(f'{cls.__module__}.{cls.__qualname__}')}: (.+)$", str(error), re.M)
            if said:
                return cls(_without_step(said[-1]))
    return None


def _last_line(e: BaseException) -> str:
    """`ErrorName: message` of an error; of one whose message is a worker's traceback, its last line."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if len(lines) > 1:
        return lines[-1]
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def failure_line(e: BaseException) -> str:
    """The job's error in one line, with its first cause where that says something more."""
    chain = [_last_line(x) for x in exception_chain(e)]
    first, root = chain[0], chain[-1]
    return first if _without_step(root) in first else f"{first} (caused by {root})"


def where_raised(e: BaseException) -> str:
    """`at FILE:LINE in FUNCTION`: where the deepest error of the chain that has a traceback was raised."""
    frames = [tb for x in exception_chain(e) if (tb := traceback.extract_tb(x.__traceback__))]
    if not frames:
        return "raised with no traceback"
    last = frames[-1][-1]
    return f"at {last.filename}:{last.lineno} in {last.name}"


class JobFailedError(RuntimeError):
    """The job failed for a reason the command cannot name (what the job printed says it)."""


def told_in_one_line(e: BaseException, run: OutputRun) -> bool:
    """Whether the command knows the cause of the job's failure and says it in one line (`one_line_error`):
    a worker that died, the staging dir or lock removed during the run, a full disk. An OutputError (a
    refusal at publish) is its own one line and is passed on as it is."""
    if isinstance(e, OutputError):
        return False
    if isinstance(e, (WorkerDiedError, JobStoppedError, OutputGoneError)):
        return True
    try:
        if removed_during_run(run):
            return True
    except Exception:  # unknown, as the failure is
        return False
    return is_disk_full(e) and not (run.published or run.closed)


def one_line_error(
    e: Exception, run: OutputRun, out_dir: str, cache_dir: str | None, done: int, total: int | None
) -> Exception | None:
    """What a failed job is told as, in one line: the cause where the command knows it
    (`told_in_one_line`), or the bad input it failed on (`input_error`); then neither the cause's
    traceback nor what the workers logged or printed about it is shown. Any other failure is a
    JobFailedError saying the error and its cause (what the job printed, its traceback, is shown).
    None for a refusal after the job (OutputError at publish, EmptyRunError): it is its own line."""
    if isinstance(e, (OutputError, EmptyRunError)):
        return None
    if not told_in_one_line(e, run):
        said = input_error(e)
        if said is not None:
            return said
        return JobFailedError(
            f"the job failed: {failure_line(e)}; the run's temporary files were removed and {out_dir} is as it "
            "was (what the job printed is above)"
        )
    if isinstance(e, WorkerDiedError):
        again = (
            f"a re-run computes only the clips not yet in --cache {cache_dir}"
            if cache_dir
            else "run it again (with --cache DIR, a re-run computes only the clips not yet cached)"
        )
        return WorkerDiedError(
            f"{e}; the run's temporary files were removed and {out_dir} is as it was: {again}", e.code
        )
    if isinstance(e, OutputGoneError):
        return e
    if isinstance(e, JobStoppedError):
        return OutputGoneError(str(e))
    gone = removed_during_run(run)
    if gone:
        return OutputGoneError(gone_message(gone, out_dir))
    return DiskFullError(disk_full_message(e, run, done, total))


def _submit(p: beam.Pipeline) -> None:
    """Run the job to its end (in the job process)."""
    p.run().wait_until_finish()


def _run_pipeline(
    options: PipelineOptions,
    corpora: list[Corpus],
    run: OutputRun,
    cfg,
    reporter: ProgressReporter | None,
    cache_dir: str | None,
    job_log: IO[bytes],
) -> None:
    """Build the job writing into the run's staging dir and run it to the end, with the progress line:
    a local job in a job process (`run_in_job_process`, its output into `job_log`), a remote one here."""
    p = beam.Pipeline(options=options)
    build_pipeline(p, corpora, run.stage, cfg, progress=reporter is not None, cache_dir=cache_dir)
    if reporter:
        reporter.start()
    local_processes = is_local(options) and options.view_as(DirectOptions).direct_running_mode == "multi_processing"
    try:
        if is_local(options):
            run_in_job_process(
                lambda: _submit(p),
                job_log,
                watch_children=local_processes,  # a worker that dies would leave the local runner waiting for ever
                stop_when=watch_output(run) if local_processes else lambda: None,
            )
        else:  # a remote job: its runner's lines (the job's id, its state) go to the console as they come
            _submit(p)
    finally:
        if reporter:
            reporter.stop()


def _finish(run: OutputRun) -> dict:
    """Publish a run that wrote schema.json and return its stats; a run that did not (every row
    rejected) keeps only its rejected.jsonl in the staging dir and is an EmptyRunError."""
    if not FileSystems.exists(FileSystems.join(run.stage, SCHEMA_FILE)):
        gone = removed_during_run(run)
        if gone:
            raise OutputGoneError(gone_message(gone, run.out_dir))
        message = empty_run_message(run.stage)
        close_run(run, ok=False, keep=(REJECTED_FILE,))
        raise EmptyRunError(message)
    stats = _read_stats(run.stage)
    close_run(run, ok=True)
    return stats
