"""Stage 4, the global statistics: what the later stages read as side inputs, each one element.

- `LengthHistograms`: exact value->count histograms of the measured clips' three lengths (before
  the filter), from which `cutoffs_from` gives the filter's cut-offs;
- `CorpusTables`: the speaker and language tables, the vocabulary and the validation split
  (`melshards.preprocess.stats.tables`), summed per speaker where that speaker's key lands;
- `MelStatistics`: per-bin mean/std of the mel for normalisation, merged from the writer's
  per-batch moments.

The quality gate, the quality measures' histograms and the duplicate verdicts are made beside these, in
`melshards.preprocess.stats.quality_stage`.

Every combine is exact and merges in any order (Counter sums, `tables.add_part`, `Moments.merge`). What
grows with the speakers is summed per key (`beam.CombinePerKey`, whose partial sums Beam makes in the
workers that produce the parts), so the one worker that sums a whole run's figures holds a fixed size per
speaker, never a value per clip (docs/performance.md lists every combine and side input with its size).
"""

from __future__ import annotations

from collections import Counter

import apache_beam as beam

from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.stats import tables
from melshards.shards_schema.stats import LENGTH_KEYS, Cutoffs, Moments, compute_cutoffs, merge_histograms


def length_histograms(clips) -> dict[str, Counter]:
    """Exact value->count histograms of the three lengths of `clips`."""
    return {k: Counter(c[k] for c in clips) for k in LENGTH_KEYS}


def merge_lengths(hists) -> dict[str, Counter]:
    hists = list(hists)
    return {k: merge_histograms(h[k] for h in hists) for k in LENGTH_KEYS}


class _HistogramsFn(beam.CombineFn):
    """Batches of clips -> exact value->count histograms of the three lengths; merges are Counter sums."""

    def create_accumulator(self):
        return length_histograms(())

    def add_input(self, acc, batch):
        return merge_lengths([acc, length_histograms(batch["clips"])])

    def merge_accumulators(self, accs):
        return merge_lengths(accs)

    def extract_output(self, acc):
        return {k: dict(v) for k, v in acc.items()}


class LengthHistograms(beam.PTransform):
    """Batches of clips -> one dict of histograms. The read always emits a batch (maybe empty), so the
    combine needs no default value (which would cost the local runner two more stages)."""

    def expand(self, batches):
        return batches | "Histograms" >> beam.CombineGlobally(_HistogramsFn()).without_defaults()


class AddParts(beam.CombineFn):
    """Parts -> their sum: `add(acc, part)` adds a part into an accumulator (`empty()`, of the parts' shape)
    in place and returns it, never changing the part; accumulators merge into the first the same way."""

    def __init__(self, empty, add):
        self.empty, self.add = empty, add

    def create_accumulator(self):
        return self.empty()

    def add_input(self, acc, part):
        return self.add(acc, part)

    def merge_accumulators(self, accs):
        accs = iter(accs)
        out = next(accs, None)
        out = self.empty() if out is None else out
        for acc in accs:
            out = self.add(out, acc)
        return out

    def extract_output(self, acc):
        return acc


class _MomentsFn(beam.CombineFn):
    def __init__(self, n_mels: int):
        self.n_mels = n_mels

    def create_accumulator(self):
        return Moments.empty(self.n_mels)

    def add_input(self, acc, moments):
        return acc.merge(moments)

    def merge_accumulators(self, accs):
        out = Moments.empty(self.n_mels)
        for a in accs:
            out = out.merge(a)
        return out

    def extract_output(self, acc):
        return acc


class MelStatistics(beam.PTransform):
    """Per-bin mean/std over the valid frames of the training split's kept clips (for normalisation),
    merged from the per-batch moments the writer emits."""

    def __init__(self, n_mels: int):
        super().__init__()
        self.n_mels = n_mels

    def expand(self, moments):  # one Moments per batch, so never empty: no default needed
        return moments | "Moments" >> beam.CombineGlobally(_MomentsFn(self.n_mels)).without_defaults()


class CorpusTables(beam.PTransform):
    """Batches of clips -> one dict (`melshards.preprocess.stats.tables`): the speaker and language tables,
    the corpus's vocabulary, each speaker's validation clips, per-language length histograms. Each
    speaker's part is summed where its key lands and reduced there to its row (`tables.finish_part`)."""

    def __init__(self, cfg: PreprocessConfig):
        super().__init__()
        self.cfg = cfg

    def expand(self, batches):
        cfg = self.cfg
        return (  # every batch gives the corpus's part: never empty, no default needed
            batches
            | "Parts"
            >> beam.FlatMap(lambda b: tables.summarize_clips(b["clips"], cfg.split.salt, cfg.text_unit).items())
            | "SumPerKey" >> beam.CombinePerKey(AddParts(dict, tables.add_part))
            | "Rows" >> beam.Map(tables.finish_part, cfg)
            | "AllRows" >> beam.CombineGlobally(AddParts(dict, tables.add_rows)).without_defaults()
            | "Tables" >> beam.Map(tables.finish_tables, cfg)
        )


def cutoffs_from(hists: dict, corpus_tables: dict, cfg: PreprocessConfig) -> Cutoffs | None:
    """The filter's cut-offs from the before-filter histograms; text lengths per language."""
    if not hists["mel_frames"]:
        return None
    f = cfg.filter
    text = {code: h["text_len"] for code, h in corpus_tables["language_lengths"].items()}
    return compute_cutoffs(
        hists,
        f.min_duration_s,
        f.mel_frames_lower_percentile,
        f.mel_frames_upper_percentile,
        f.text_len_upper_percentile,
        cfg.pad.multiple,
        text,
    )
