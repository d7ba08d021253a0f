"""Stage 6a, ChooseBuckets: the measured batches and the cut-offs -> the length buckets, one element
read by the writer as a side input.

Each batch contributes the length histograms of the clips the filter keeps (`kept_summary`); the
summed summary goes to `melshards.preprocess.stats.bucketing.choose_from_summary`, the pure rule.
"""

from __future__ import annotations

from collections import Counter

import apache_beam as beam

from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.out_dir.batch_files import read_clips
from melshards.preprocess.stats import bucketing, tables
from melshards.preprocess.stats.filter_rule import filter_rejection
from melshards.preprocess.stats.global_stats import length_histograms, merge_lengths
from melshards.preprocess.stats.quality_rules import QualityGate
from melshards.shards_schema.stats import Cutoffs, merge_histograms


def kept_summary(
    clips: list[dict], cutoffs: Cutoffs | None, corpus_tables: dict, salt: str, gate: QualityGate | None = None
) -> dict:
    """One batch's share of what the buckets and the after-filter report need: the three length
    histograms of its kept clips, the mel-frame histogram of its kept training clips, and the
    text lengths of its kept clips per mel-frame count (each bucket's text length follows from it
    once the bounds are known)."""
    kept = [c for c in clips if filter_rejection(c, cutoffs, corpus_tables, gate) is None] if cutoffs else []
    return {
        "after": length_histograms(kept),
        "train": Counter(c["mel_frames"] for c in kept if tables.split_of(c, corpus_tables, salt) == "train"),
        "text_by_frames": Counter((c["mel_frames"], c["text_len"]) for c in kept),
    }


def kept_summary_of(
    batch: dict, cutoffs: Cutoffs | None, corpus_tables: dict, salt: str, gate: QualityGate | None = None
) -> dict:
    """`kept_summary` of a measured batch (`batch_files.write_measured`'s reference)."""
    return kept_summary(read_clips(batch), cutoffs, corpus_tables, salt, gate)


class _KeptSummaryFn(beam.CombineFn):
    def create_accumulator(self):
        return {"after": length_histograms(()), "train": Counter(), "text_by_frames": Counter()}

    def add_input(self, acc, summary):
        return self.merge_accumulators([acc, summary])

    def merge_accumulators(self, accs):
        accs = list(accs)
        return {
            "after": merge_lengths(a["after"] for a in accs),
            "train": merge_histograms(a["train"] for a in accs),
            "text_by_frames": merge_histograms(a["text_by_frames"] for a in accs),
        }

    def extract_output(self, acc):
        return acc


class ChooseBuckets(beam.PTransform):
    """Measured batches (`MeasureClips`'s `batches`) + cut-offs -> one element,
    `bucketing.choose_from_summary`'s dict.

    Reads the measured clips with the filter's own rule (`filter_rule.filter_rejection`), not the filter's output:
    the bounds are then ready before any mel is read back, so the filter, padding and writing run
    in one pass over the measured batches' clips files.
    """

    def __init__(self, cutoffs, corpus_tables, gate, cfg: PreprocessConfig):
        super().__init__()
        self.cutoffs, self.tables, self.gate, self.cfg = cutoffs, corpus_tables, gate, cfg

    def expand(self, batches):
        S = beam.pvalue
        return (
            batches
            | "Kept"
            >> beam.Map(
                kept_summary_of,
                S.AsSingleton(self.cutoffs),
                S.AsSingleton(self.tables),
                self.cfg.split.salt,
                S.AsSingleton(self.gate),
            )
            | "Summary" >> beam.CombineGlobally(_KeptSummaryFn()).without_defaults()  # >= 1 batch
            | "Bounds" >> beam.Map(bucketing.choose_from_summary, self.cfg.pad)
        )
