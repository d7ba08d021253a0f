"""Stage 1, Read: one or more corpora (`--input`, each in any layout of `melshards.preprocess.inputs.sources`)
-> batches of row dicts {id, text, speaker, language, gender, audio, row}, each in a temp file.

Building the pipeline opens no corpus file (`detect_corpus` only checks paths; the rows are read
inside the pipeline), so a Dataflow graph builds offline. A container input's files (parquet, tars)
are listed, spread over the workers and scanned one file to a worker (`Layout.scan`: a parquet
footer and the columns the fields name, a tar's headers and `.json` members; no audio), each scan
into a temp file of its own. The layouts' readers are pure functions (`layouts`,
`manifests`, `containers`) that yield rows as they read (a container input's from its files'
scans); what reading must remember (the ids seen, LJSpeech's audio files, the rows until every
input is read and the shared labels are known) waits in a sqlite file on the reading worker's local
disk (`working_set`), not in its memory. `ReadCorpus` is the Beam wrapper around them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pickle
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.inputs.merge import MergedInputs, input_name, unique_names
from melshards.preprocess.inputs.progress import write_total
from melshards.preprocess.inputs.rows import CorpusError
from melshards.preprocess.inputs.sources import (
    LAYOUTS,
    Corpus,
    check_distinct_inputs,
    check_named_columns,
    check_rows_file,
    detect_corpus,
    input_items,
    unused_columns,
)
from melshards.preprocess.inputs.working_set import WorkingSet
from melshards.preprocess.out_dir import temp_files
from melshards.preprocess.out_dir.batch_files import write_rows

# What the rest of the job takes from here: the read stage, and the corpus it is given.
__all__ = [
    "INPUTS",
    "INPUT_ROWS",
    "NS",
    "REJECTED",
    "Corpus",
    "CorpusError",
    "ReadCorpus",
    "batch_rows",
    "check_distinct_inputs",
    "check_named_columns",
    "check_rows_file",
    "count",
    "detect_corpus",
]

REJECTED = "rejected"
INPUT_ROWS = "input_rows"
INPUTS = "inputs"
NS = "melshards"  # the job's Beam counters
MAX_BATCH_ROWS = 32


def count(name: str, n: int = 1) -> None:
    """Add `n` to the job's counter `name` (Beam Metrics, namespace NS): a rejection reason, rows measured, ..."""
    beam.metrics.Metrics.counter(NS, name).inc(n)


def batch_rows(n: int) -> int:
    """Rows per element: up to MAX_BATCH_ROWS, but at least ~16 elements when there are rows enough.

    Beam's per-element cost (coding, the local runner relaying every element through its launcher)
    is paid per batch instead of per clip; 16 elements or more keep every worker busy.
    """
    return max(1, min(MAX_BATCH_ROWS, -(-n // 16)))


# rows: a parquet row group up to this size is one batch (Hugging Face writes 100); a larger one, batches
# of this size that one worker measures together (`together`)
MAX_ROW_GROUP_BATCH = 256


def named(corpora: Sequence[Corpus]) -> tuple[Corpus, ...]:
    """The inputs, each with a name of its own (`melshards.preprocess.inputs.merge.unique_names`)."""
    names = unique_names([c.name or input_name(c.input or c.root) for c in corpora])
    return tuple(dataclasses.replace(c, name=n) for c, n in zip(corpora, names))


def input_summary(
    corpus: Corpus,
    rows: int,
    prefixed_speakers: int,
    prefixed_ids: int,
    folded: dict | None = None,
    unused: Sequence[str] = (),
) -> dict:
    """One input as stats.json's `inputs` lists it; `language_codes_folded` (only where some were):
    each language code as written in it -> the code the run names that language by
    (`rows.complete_rows`), where they differ; `unused_columns` (only where some are): the columns of
    its table (a manifest's, a parquet file's, a WebDataset `.json`'s keys) that no field is read from."""
    return {
        "input": corpus.input or corpus.root,
        "name": corpus.name,
        "format": corpus.kind,
        "rows": rows,
        "language": corpus.language,
        "prefixed_speakers": prefixed_speakers,
        "prefixed_ids": prefixed_ids,
        **({"language_codes_folded": dict(sorted(folded.items()))} if folded else {}),
        **({"unused_columns": list(unused)} if unused else {}),
    }


SCAN_CHUNK = 1024  # records: a scan is written and read back this many records at a time


def write_scan(temp_dir: str, path: str, records: Iterable) -> str:
    """Write a container file's scan (`Layout.scan`'s records, SCAN_CHUNK at a time) into a temp file
    named by the container file's path; its path."""
    out = FileSystems.join(temp_dir, temp_files.content_name("scan", [path], ".pkl"))
    with temp_files.writing(out) as f:
        chunk: list = []
        for record in records:
            chunk.append(record)
            if len(chunk) == SCAN_CHUNK:
                pickle.dump(chunk, f, protocol=pickle.HIGHEST_PROTOCOL)
                chunk = []
        if chunk:
            pickle.dump(chunk, f, protocol=pickle.HIGHEST_PROTOCOL)
    return out


def read_scan(scan_path: str) -> Iterator:
    """The records of a scan `write_scan` wrote, in order, a chunk held at a time."""
    with FileSystems.open(scan_path) as f:
        while True:
            try:
                chunk = pickle.load(f)  # our own temp file, written by this run
            except EOFError:
                return
            yield from chunk


class _ListFiles(beam.DoFn):
    """Every container input's files -> (input index, file index, path), one element each."""

    def __init__(self, corpora: tuple[Corpus, ...]):
        self.corpora = corpora

    def process(self, _):
        for i, corpus in enumerate(self.corpora):
            layout = LAYOUTS[corpus.kind]
            if layout.files is not None:
                for j, path in enumerate(layout.files(corpus)):
                    yield i, j, path


class _ScanFile(beam.DoFn):
    """(input index, file index, path) -> the same with where its scan is written (`write_scan`); a
    file that cannot be read fails the job with its CorpusError (`containers`)."""

    def __init__(self, corpora: tuple[Corpus, ...], temp_dir: str):
        self.corpora, self.temp_dir = corpora, temp_dir

    def process(self, element):
        i, j, path = element
        corpus = self.corpora[i]
        scan = LAYOUTS[corpus.kind].scan
        assert scan is not None  # only a layout with files lists them (_ListFiles)
        yield i, j, path, write_scan(self.temp_dir, path, scan(corpus, path))


def _row_group(item: dict) -> tuple | None:
    """The parquet row group a row's audio is in, or None (`melshards.preprocess.inputs.packed_clips`)."""
    loc = item.get("locator")
    return (item["audio"], loc["row_group"]) if loc and "row_group" in loc else None


def batches(items: Iterable[dict], size: int) -> Iterator[list[dict]]:
    """Consecutive lists of `size` items (the last one shorter); but rows of a parquet file go one row
    group to a batch, or to several of MAX_ROW_GROUP_BATCH rows for a larger group (`together`)."""
    batch: list[dict] = []
    group = None
    for item in items:
        g = _row_group(item)
        if batch and (g != group or len(batch) >= (size if g is None else MAX_ROW_GROUP_BATCH)):
            yield batch
            batch = []
        batch.append(item)
        group = g
    if batch:
        yield batch


def together(temp_dir: str, rows: Iterable[list[dict]]) -> Iterator[list[dict]]:
    """Batches of rows -> lists of their references (`batch_files.write_rows`), one list to an element: a
    batch alone, but the batches of one parquet row group together, measured in order by one worker,
    which reads the group's audio column once, streaming it (`packed_clips.clip_bytes`), not once per
    batch."""
    groups: deque = deque()  # each batch's row group, as write_rows takes the batches

    def noted() -> Iterator[list[dict]]:
        for batch in rows:
            groups.append(_row_group(batch[0]) if batch else None)
            yield batch

    element: list[dict] = []
    group = None
    for ref in write_rows(temp_dir, noted()):
        g = groups.popleft()
        if element and (g is None or g != group):
            yield element
            element = []
        element.append(ref)
        group = g
    if element:
        yield element


class _ReadRows(beam.DoFn):
    """Every input's rows -> lists of references to batches of unique rows (`together`); the rows
    rejected while reading (malformed, duplicate id, ambiguous or missing audio, missing text or
    language) -> `rejected`; the number of input rows -> `input_rows` (and, with `progress_dir`, to the
    progress line: `progress.write_total`), the inputs' summaries -> `inputs` (one element each).
    `scans`: the container files' scans (`_ScanFile`'s elements)."""

    def __init__(self, corpora: tuple[Corpus, ...], temp_dir: str, progress_dir: str | None = None):
        self.corpora, self.temp_dir, self.progress_dir = corpora, temp_dir, progress_dir

    def process(self, _, scans=None):
        scanned: list[list[tuple[int, str, str]]] = [[] for _ in self.corpora]
        for i, j, path, scan_path in scans or ():
            scanned[i].append((j, path, scan_path))
        # without `scans` (a call outside the pipeline), each file is scanned as it is read
        per_input = [
            None if scans is None else [(p, functools.partial(read_scan, s)) for _, p, s in sorted(b)] for b in scanned
        ]
        with (
            tempfile.TemporaryDirectory(prefix="melshards-read-") as tmp,
            WorkingSet(os.path.join(tmp, "rows.sqlite")) as working_set,
        ):
            folded: list[dict] = [{} for _ in self.corpora]
            merged = MergedInputs(
                [(c.name, input_items(c, working_set, f, s)) for c, f, s in zip(self.corpora, folded, per_input)],
                working_set,
            )
            total = sum(merged.input_rows)
            count(INPUT_ROWS, total)
            if self.progress_dir:
                write_total(self.progress_dir, total)
            yield beam.pvalue.TaggedOutput(INPUT_ROWS, total)
            yield beam.pvalue.TaggedOutput(
                INPUTS,
                [
                    input_summary(c, rows, speakers, ids, f, unused_columns(c))
                    for c, rows, speakers, ids, f in zip(
                        self.corpora, merged.input_rows, merged.prefixed_speakers, merged.prefixed_ids, folded
                    )
                ],
            )
            for item in merged.rejections():
                count(item["reason"])
                yield beam.pvalue.TaggedOutput(REJECTED, item)
            # Always at least one (maybe empty) batch: every later statistic then has an input.
            rows = batches(merged.rows(), batch_rows(merged.row_count)) if merged.row_count else [[]]
            yield from together(self.temp_dir, rows)


class ReadCorpus(beam.PTransform):
    """One corpus or several -> {"batches": lists of references to batches of unique rows in
    `temp_dir` (`batch_files.read_rows` reads one; a list holds one batch, or the batches of one parquet
    row group: `together`), spread over the workers; "rejected": the rows rejected while reading;
    "input_rows": the number of input rows; "inputs": one list of each input's summary
    (`input_summary`)}. With `progress_dir`, the number of input rows is written there for the
    local progress line.

    The container inputs' files are scanned first, spread over the workers one file to an element
    (`_ScanFile`). The rows are then read by one worker, from the rows files, listings and scans
    (small next to the audio): duplicates and the labels several inputs share are found there
    without a shuffle, in a sqlite file on its disk. The Reshuffle then spreads the batches, which
    carry the work, over every worker.
    """

    def __init__(self, corpora: Corpus | Sequence[Corpus], temp_dir: str, progress_dir: str | None = None):
        super().__init__()
        self.corpora = named([corpora] if isinstance(corpora, Corpus) else corpora)
        self.temp_dir, self.progress_dir = temp_dir, progress_dir

    def expand(self, pbegin):
        scans = (
            pbegin
            | "Inputs" >> beam.Create([None])
            | "ListFiles" >> beam.ParDo(_ListFiles(self.corpora))
            | "SpreadFiles" >> beam.Reshuffle()
            | "ScanFiles" >> beam.ParDo(_ScanFile(self.corpora, self.temp_dir))
        )
        read = (
            pbegin
            | "Once" >> beam.Create([None])
            | "ReadRows"
            >> beam.ParDo(
                _ReadRows(self.corpora, self.temp_dir, self.progress_dir), scans=beam.pvalue.AsList(scans)
            ).with_outputs(REJECTED, INPUT_ROWS, INPUTS, main="rows")
        )
        spread = read.rows | "Spread" >> beam.Reshuffle()
        return {"batches": spread, REJECTED: read[REJECTED], INPUT_ROWS: read[INPUT_ROWS], INPUTS: read[INPUTS]}
