"""The local run's progress line, from temp files the workers write (`melshards.preprocess.out_dir.temp_files`).

The local runner hands out Beam Metrics only once the job is over, so each Measure worker marks each
batch it has measured with an empty temp file, named by the batch's ids and its rows
(`batch_measured`), and the command sums the rows in the names (`ProgressReporter`) for a line every
few seconds: a batch measured twice is one file, counted once. The total is the input rows the read
stage found (`write_total`: from the rows files, listings, parquet footers and tar headers it reads
anyway, no second pass over the corpus). On Dataflow the job's counters show the same progress and
no files are written.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.inputs.sources import Corpus, count_input_rows
from melshards.preprocess.out_dir import temp_files

PROGRESS = "progress"
PROGRESS_SUFFIX = ".txt"
TOTAL_FILE = "input-rows.txt"


def batch_measured(directory: str, ids: list[str]) -> None:
    """In a worker: the batch of rows `ids` is measured, as the empty file `progress-<sha1 of the
    ids>-<rows>.txt` that `ProgressReporter` counts."""
    temp_files.write(
        FileSystems.join(directory, temp_files.content_name(PROGRESS, ids, f"-{len(ids)}{PROGRESS_SUFFIX}")), b""
    )


def rows_in(name: str) -> int:
    """The rows a progress file's name (`batch_measured`) counts; 0 for another name."""
    rows = name[: -len(PROGRESS_SUFFIX)].rpartition("-")[2] if name.endswith(PROGRESS_SUFFIX) else ""
    return int(rows) if rows.isdigit() else 0


def write_total(directory: str, rows: int) -> None:
    """In the read stage: the input rows it found, the progress line's total."""
    temp_files.write(FileSystems.join(directory, TOTAL_FILE), str(rows).encode())


def count_rows(corpora: Sequence[Corpus]) -> int:
    """The input rows of every corpus, known before the job (`sources.count_input_rows`: a table's
    non-empty lines less its header, the utterances a VCTK or LibriTTS listing holds, the parquet
    footers' rows, an estimate for tars): the local worker count is chosen from it."""
    return sum(count_input_rows(c) for c in corpora)


class ProgressReporter(threading.Thread):
    """In the command: prints rows done of total, clips/s and ETA every `every` seconds while a local
    job runs, from the workers' progress files under `out_dir`'s temp dir (`batch_measured`) and the
    read stage's total (`write_total`); "reading the inputs" until the read stage has written it."""

    def __init__(self, out_dir: str, echo: Callable[[str], None], every: float = 5.0):
        super().__init__(daemon=True)
        self.echo = echo
        self.pattern = FileSystems.join(temp_files.temp_dir(out_dir), f"{PROGRESS}-*{PROGRESS_SUFFIX}")
        self.total_path = FileSystems.join(temp_files.temp_dir(out_dir), TOTAL_FILE)
        self.total: int | None = None
        self.every = every
        self.stopped = threading.Event()

    def read_total(self) -> int | None:
        """The input rows the read stage found, once it has written them (kept once read)."""
        if self.total is None:
            try:
                with FileSystems.open(self.total_path) as f:
                    self.total = int(f.read())
            except (OSError, ValueError):  # not written yet
                pass
        return self.total

    def rows_done(self) -> int:
        return sum(rows_in(m.path.rsplit("/", 1)[-1]) for m in FileSystems.match([self.pattern])[0].metadata_list)

    def line(self, done: int, rate: float | None) -> str:
        if self.total is None:
            return "progress: reading the inputs"
        pct = 100 * done / self.total if self.total else 100.0
        if not rate:
            return f"progress: {done}/{self.total} rows ({pct:.0f}%), starting"
        eta = max(self.total - done, 0) / rate
        return f"progress: {done}/{self.total} rows ({pct:.0f}%), {rate:.1f} clips/s, ETA {eta:.0f}s"

    def run(self):
        first, done = None, 0  # first: (time, rows) when workers first reported; rates exclude start-up
        while not self.stopped.wait(self.every):
            self.read_total()
            done, now = max(done, self.rows_done()), time.monotonic()  # the report stage deletes the files
            if first is None and done:
                first = (now, done)
            rate = (done - first[1]) / (now - first[0]) if first and now > first[0] else None
            self.echo(self.line(min(done, self.total or 0), rate))

    def stop(self):
        self.stopped.set()
        self.join()
