"""Stage 1, Read: one or more corpora (`--input`, each in any layout of `melshards.preprocess.sources`)
-> batches of row dicts {id, text, speaker, language, gender, audio, row}, each in a stash file.

Building the pipeline opens no corpus file (`detect_corpus` only checks paths; the rows are read
inside the pipeline), so a Dataflow graph builds offline. The layouts' readers are pure functions
(`layouts`, `manifests`) that yield rows as they read; what reading must remember (the ids seen,
LJSpeech's audio files, the rows until every input is read and the shared labels are known) waits
in a sqlite file on the reading worker's local disk (`spill`), not in its memory. `ReadCorpus` is
the Beam wrapper around them.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence

import apache_beam as beam

from melshards.preprocess.merge import MergedInputs, input_name, unique_names
from melshards.preprocess.rows import CorpusError
from melshards.preprocess.sources import (
    Corpus,
    check_distinct_inputs,
    check_named_columns,
    check_rows_file,
    detect_corpus,
    input_items,
    unused_columns,
)
from melshards.preprocess.spill import Spill
from melshards.preprocess.stash import stash_rows

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


MAX_ROW_GROUP_BATCH = 256  # rows: a parquet row group up to this size is one batch (Hugging Face writes 100)


def _row_group(item: dict) -> tuple | None:
    """The parquet row group a row's audio is in, or None (`melshards.preprocess.containers`)."""
    loc = item.get("locator")
    return (item["audio"], loc["row_group"]) if loc and "row_group" in loc else None


def batches(items: Iterable[dict], size: int) -> Iterator[list[dict]]:
    """Consecutive lists of `size` items (the last one shorter); but rows of a parquet file go one row
    group to a batch (at most MAX_ROW_GROUP_BATCH rows): the worker that measures it reads the row
    group's audio once, not once for each batch that holds some of its rows."""
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


def named(corpora: Sequence[Corpus]) -> tuple[Corpus, ...]:
    """The inputs, each with a name of its own (`melshards.preprocess.merge.unique_names`)."""
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


class _ReadRows(beam.DoFn):
    """Every input's rows -> references to batches of unique rows (`stash.stash_rows`); the rows
    rejected while reading (malformed, duplicate id, ambiguous or missing audio, missing text or
    language) -> `rejected`; the number of input rows -> `input_rows`, the inputs' summaries ->
    `inputs` (one element each)."""

    def __init__(self, corpora: tuple[Corpus, ...], stash_dir: str):
        self.corpora, self.stash_dir = corpora, stash_dir

    def process(self, _):
        with (
            tempfile.TemporaryDirectory(prefix="melshards-read-") as tmp,
            Spill(os.path.join(tmp, "rows.sqlite")) as spill,
        ):
            folded: list[dict] = [{} for _ in self.corpora]
            merged = MergedInputs([(c.name, input_items(c, spill, f)) for c, f in zip(self.corpora, folded)], spill)
            total = sum(merged.input_rows)
            count(INPUT_ROWS, total)
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
            yield from stash_rows(self.stash_dir, rows)


class ReadCorpus(beam.PTransform):
    """One corpus or several -> {"batches": references to batches of unique rows in `stash_dir`
    (`stash.load_rows` reads one), spread over the workers; "rejected": the rows rejected while
    reading; "input_rows": the number of input rows; "inputs": one list of each input's summary
    (`input_summary`)}.

    The rows are read by one worker (the rows files and transcripts are small next to the audio):
    duplicates and the labels several inputs share are found there without a shuffle, in a sqlite
    file on its disk. The Reshuffle then spreads the batches, which carry the work, over every worker.
    """

    def __init__(self, corpora: Corpus | Sequence[Corpus], stash_dir: str):
        super().__init__()
        self.corpora = named([corpora] if isinstance(corpora, Corpus) else corpora)
        self.stash_dir = stash_dir

    def expand(self, pbegin):
        read = (
            pbegin
            | "Once" >> beam.Create([None])
            | "ReadRows"
            >> beam.ParDo(_ReadRows(self.corpora, self.stash_dir)).with_outputs(
                REJECTED, INPUT_ROWS, INPUTS, main="rows"
            )
        )
        spread = read.rows | "Spread" >> beam.Reshuffle()
        return {"batches": spread, REJECTED: read[REJECTED], INPUT_ROWS: read[INPUT_ROWS], INPUTS: read[INPUTS]}
