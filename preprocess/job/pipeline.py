"""The preprocessing job: corpus -> log-mel once -> percentile statistics -> filter -> pad -> shards.

One composite PTransform per stage, each with a labelled expand(), in a module of its own:

- `read_stage.ReadCorpus` (stage 1): every input read, deduplicated and batched into temp files;
- `measure_stage.MeasureClips` (stages 2-3): each clip decoded once, its text, lengths and features;
- `global_stats` (stage 4): length histograms -> cut-offs, the corpus tables, the mel statistics;
- `quality_stage` (stage 4): the quality gate (`SpeakingRateBounds`), the quality histograms; then each
  measured batch joined with its duplicate verdicts (`DuplicateAudio`);
- `choose_buckets.ChooseBuckets` (stage 6a): the length buckets from the clips the filter keeps;
- `other_clip_references.AttachReferences` (a run with other_clip references): each kept clip's reference slice;
- `filter_and_write.FilterAndWrite` (stages 5-6): filter, pad, encode, write temp files;
- `shards.AssembleShards` (stage 8): the shards;
- `report.WriteReport` (stage 9): rejected.jsonl, stats.json, schema.json.

Global statistics reach later stages as side inputs. `build_pipeline(p, ...)` wires the stages;
`melshards.preprocess.job.run.run_job` checks an invocation and runs them. The per-clip and per-batch work
are pure functions in the modules the stages call (clips, filter_rule, bucketing, encode, tables, feature_stats);
what the stages hand on outside Beam's model goes through the run's temp files, one module with
one retry argument (`melshards.preprocess.out_dir.temp_files`: the batches of rows and of measured
clips, the container files' scans, the rejected rows' shards, the local progress line's counts).
"""

from __future__ import annotations

import apache_beam as beam

from melshards.preprocess.clip.measure_stage import MEASURED, MeasureClips, cache_summary, merge_cache_summaries
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.inputs.read_stage import INPUT_ROWS, INPUTS, REJECTED, Corpus, ReadCorpus
from melshards.preprocess.out_dir.shards import AssembleShards
from melshards.preprocess.out_dir.temp_files import temp_dir
from melshards.preprocess.stats.choose_buckets import ChooseBuckets
from melshards.preprocess.stats.global_stats import CorpusTables, LengthHistograms, MelStatistics, cutoffs_from
from melshards.preprocess.stats.quality_stage import (
    DuplicateAudio,
    QualityHistograms,
    RepeatedHashes,
    SpeakingRateBounds,
)
from melshards.preprocess.write.filter_and_write import FEATURE_STATS, MOMENTS, WRITTEN, FilterAndWrite
from melshards.preprocess.write.other_clip_references import AttachReferences
from melshards.preprocess.write.report import WriteReport, mel_params


def build_pipeline(
    p: beam.Pipeline,
    corpus: Corpus | list[Corpus],
    out_dir: str,
    cfg: PreprocessConfig,
    progress: bool = False,
    cache_dir: str | None = None,
):
    """Wire every stage; returns the PCollection holding the schema.json path once it is written.

    Elements are batches of rows/clips (read_stage.batch_rows): the per-element cost of a runner is
    paid per batch. progress: workers also write their row counts under the output's temp dir (for
    a local run's progress line; on Dataflow the counters show it).
    """
    temp, progress_dir = temp_dir(out_dir), temp_dir(out_dir) if progress else None
    read = p | "Read" >> ReadCorpus(corpus, temp, progress_dir)
    measured = read["batches"] | "Measure" >> MeasureClips(cfg, temp, progress_dir, cache_dir)
    cache_used = (
        measured.clips
        | "CacheUse" >> beam.Map(lambda b: cache_summary([b]))
        | "SumCacheUse" >> beam.CombineGlobally(merge_cache_summaries).without_defaults()
    )
    before = measured.clips | "StatsBefore" >> LengthHistograms()
    corpus_tables = measured.clips | "CorpusTables" >> CorpusTables(cfg)
    cutoffs = before | "Cutoffs" >> beam.Map(cutoffs_from, beam.pvalue.AsSingleton(corpus_tables), cfg)
    gate = measured.clips | "QualityGate" >> SpeakingRateBounds(cfg)
    quality_hists = measured.clips | "QualityHistograms" >> QualityHistograms(cfg)
    batches = measured[MEASURED]
    if cfg.quality_rules.duplicates:  # each batch joined with its clips' duplicate verdicts
        repeated = measured.clips | "RepeatedHashes" >> RepeatedHashes()
        batches = batches | "DuplicateAudio" >> DuplicateAudio(cutoffs, corpus_tables, gate, repeated)
    chosen = batches | "ChooseBuckets" >> ChooseBuckets(cutoffs, corpus_tables, gate, cfg)
    to_write = batches
    if cfg.reference.source == "other_clip":
        pad_value = mel_params(cfg.mel).pad_value
        to_write = to_write | "References" >> AttachReferences(cutoffs, corpus_tables, gate, cfg, pad_value)
    ran = cache_used | "Extractors" >> beam.Map(lambda u: u["extractors"]) if cfg.extractors else None
    written = to_write | "FilterAndWrite" >> FilterAndWrite(cutoffs, chosen, corpus_tables, gate, out_dir, cfg, ran)
    moments = written[MOMENTS] | "MelStats" >> MelStatistics(cfg.mel.n_mels)
    shards = written["parts"] | "Shards" >> AssembleShards(out_dir, cfg.write.target_shard_mb)
    rejected = (read[REJECTED], measured[REJECTED], written[REJECTED]) | "AllRejected" >> beam.Flatten()
    return {
        "input_rows": read[INPUT_ROWS],
        "before": before,
        "cutoffs": cutoffs,
        "plan": chosen,  # WriteReport's name
        "inputs": read[INPUTS],
        "rejected": rejected,
        "shards": shards,
        "moments": moments,
        "tables": corpus_tables,
        "written": written[WRITTEN],
        "feature_stats": written[FEATURE_STATS],
        "cache": cache_used,
        "quality": quality_hists,
    } | "Report" >> WriteReport(out_dir, cfg, cache_dir)
