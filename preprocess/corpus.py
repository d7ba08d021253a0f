"""Stage 1, Read: one or more corpora (`--input`, each in any layout of `melshards.preprocess.sources`)
-> batches of row dicts {id, text, speaker, language, gender, audio, row}.

Building the pipeline opens no corpus file (`detect_corpus` only checks paths; the rows are read
inside the pipeline), so a Dataflow graph builds offline. The layouts' readers are pure functions
(`layouts`, `manifests`), the merging of several inputs too (`merge`); `ReadCorpus` is the Beam
wrapper around them.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import apache_beam as beam

from melshards.preprocess.merge import input_name, merge_inputs, unique_names
from melshards.preprocess.rows import CorpusError
from melshards.preprocess.sources import Corpus, check_rows_file, detect_corpus, read_input

# What the rest of the job takes from here: the read stage, and the corpus it is given.
__all__ = ["INPUTS", "INPUT_ROWS", "REJECTED", "Corpus", "CorpusError", "ReadCorpus", "batch_rows", "check_rows_file",
           "detect_corpus"]

REJECTED = "rejected"
INPUT_ROWS = "input_rows"
INPUTS = "inputs"
NS = "melshards"
MAX_BATCH_ROWS = 32


def batch_rows(n: int) -> int:
    """Rows per element: up to MAX_BATCH_ROWS, but at least ~16 elements when there are rows enough.

    Beam's per-element cost (coding, the local runner relaying every element through its launcher)
    is paid per batch instead of per clip; 16 elements or more keep every worker busy.
    """
    return max(1, min(MAX_BATCH_ROWS, -(-n // 16)))


def batches(rows: list[dict], size: int) -> list[list[dict]]:
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def named(corpora: Sequence[Corpus]) -> tuple[Corpus, ...]:
    """The inputs, each with a name of its own (`melshards.preprocess.merge.unique_names`)."""
    names = unique_names([c.name or input_name(c.input or c.root) for c in corpora])
    return tuple(dataclasses.replace(c, name=n) for c, n in zip(corpora, names))


def input_summary(corpus: Corpus, rows: int, prefixed_speakers: int, prefixed_ids: int) -> dict:
    """One input as stats.json's `inputs` lists it."""
    return {"input": corpus.input or corpus.root, "name": corpus.name, "format": corpus.kind, "rows": rows,
            "language": corpus.language, "prefixed_speakers": prefixed_speakers, "prefixed_ids": prefixed_ids}


class _ReadRows(beam.DoFn):
    """Every input's rows -> batches of unique rows; the rows rejected while reading (malformed,
    duplicate id, ambiguous or missing audio, missing text or language) -> `rejected`; the number of
    input rows -> `input_rows`, the inputs' summaries -> `inputs` (one element each)."""

    def __init__(self, corpora: tuple[Corpus, ...]):
        self.corpora = corpora

    def process(self, _):
        read = [read_input(c) for c in self.corpora]
        merged = merge_inputs([(c.name, r.rows, r.rejected) for c, r in zip(self.corpora, read)])
        total = sum(r.input_rows for r in read)
        beam.metrics.Metrics.counter(NS, "input_rows").inc(total)
        yield beam.pvalue.TaggedOutput(INPUT_ROWS, total)
        yield beam.pvalue.TaggedOutput(INPUTS, [input_summary(c, r.input_rows, m.prefixed_speakers, m.prefixed_ids)
                                                for c, r, m in zip(self.corpora, read, merged)])
        for m in merged:
            for r in m.rejected:
                beam.metrics.Metrics.counter(NS, r["reason"]).inc()
                yield beam.pvalue.TaggedOutput(REJECTED, r)
        rows = [r for m in merged for r in m.rows]
        # Always at least one (maybe empty) batch: every later statistic then has an input.
        for batch in batches(rows, batch_rows(len(rows))) or [[]]:
            yield batch


class ReadCorpus(beam.PTransform):
    """One corpus or several -> {"batches": batches of unique rows, spread over the workers;
    "rejected": the rows rejected while reading; "input_rows": the number of input rows; "inputs":
    one list of each input's summary (`input_summary`)}.

    The rows are read by one worker (the rows files and transcripts are small next to the audio):
    duplicates and the labels several inputs share are found there without a shuffle. The Reshuffle
    then spreads the batches, which carry the work, over every worker.
    """

    def __init__(self, corpora: Corpus | Sequence[Corpus]):
        super().__init__()
        self.corpora = named([corpora] if isinstance(corpora, Corpus) else corpora)

    def expand(self, pbegin):
        read = (pbegin
                | "Once" >> beam.Create([None])
                | "ReadRows" >> beam.ParDo(_ReadRows(self.corpora)).with_outputs(REJECTED, INPUT_ROWS, INPUTS,
                                                                                 main="rows"))
        spread = read.rows | "Spread" >> beam.Reshuffle()
        return {"batches": spread, REJECTED: read[REJECTED], INPUT_ROWS: read[INPUT_ROWS], INPUTS: read[INPUTS]}
