"""The preprocessing job: corpus -> log-mel once -> percentile statistics -> filter -> pad -> shards.

One composite PTransform per stage, each with a labelled expand(); global statistics reach later
stages as side inputs. `build(p, ...)` wires the stages; `melshards.preprocess.run.run_job` checks an
invocation and runs them. The per-clip and per-batch work are pure functions in the modules beside
this one (clips, bucketing, encode, shards, report); the two side channels outside Beam's model have their
own modules (stash: the measured batches across the statistics barrier; progress: the local progress line).
"""

from __future__ import annotations

import logging
from collections import Counter

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from melshards.preprocess import bucketing, cache, feature_stats, tables
from melshards.preprocess.clips import (
    ClipRejected,
    analyse_audio,
    as_rejection,
    featurize_span,
    filter_rejection,
    prepare_texts,
)
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.corpus import INPUT_ROWS, INPUTS, REJECTED, Corpus, ReadCorpus
from melshards.preprocess.encode import encode_clip
from melshards.preprocess.progress import ProgressFile, progress_dir
from melshards.preprocess.report import WriteReport
from melshards.preprocess.shards import AssembleShards, RollingFiles
from melshards.preprocess.stash import load_clips, load_features, load_rows, stash_batch, stash_dir
from melshards.preprocess.workers import worker_setup
from melshards.shards_schema import Vocabulary
from melshards.shards_schema.stats import LENGTH_KEYS, Cutoffs, Moments, compute_cutoffs, merge_histograms

log = logging.getLogger("melshards.preprocess")
NS = "melshards"


def _count(name: str, n: int = 1) -> None:
    Metrics.counter(NS, name).inc(n)


# -- stages 2-3: per clip, a batch at a time ---------------------------------------------------
class _Cached:
    """One batch's view of the feature cache: each row's key, the entries it finds (each cache file read
    once), and what the batch computes, written back as one file (`melshards.preprocess.cache`)."""

    def __init__(self, cache_dir: str | None, index: cache.CacheIndex | None, settings: str):
        self.dir, self.index, self.settings = cache_dir, index, settings
        self.loaded: dict[str, dict] = {}
        self.new: list = []
        self.used: set[str] = set()
        self.counts: Counter[str] = Counter()

    def key(self, row: dict) -> str | None:
        return cache.clip_key(row.get("audio"), self.settings) if self.dir else None

    def find(self, key: str | None):
        """(span, arrays, moments, entries file) of a cached clip, or None (not cached, or its file is
        damaged)."""
        where = self.index.get(key) if key else None  # type: ignore[union-attr]  # a key only with a cache, whose index is given
        if where is None:
            return None
        if where not in self.loaded:
            try:
                self.loaded[where] = cache.read_batch(where)
            except cache.CacheDamaged as e:
                log.warning("feature cache: %s; its clips are computed again", e)
                self.loaded[where] = {}
                self.counts["damaged_files"] += 1
        if not self.loaded[where]:
            self.counts["damaged"] += 1  # computed again, and written to a new file
            return None
        found = self.loaded[where].get(key)
        if found is None:
            return None
        self.used.add(where)
        return (*found, where)

    def keep(self, key: str | None, span: dict, arrays: dict, moments: Moments) -> bool:
        """Add a computed clip to the batch's new entries; False when it has no key (not cached)."""
        if key:
            self.new.append((key, span, arrays, moments))
        return bool(key)

    def flush(self) -> str | None:
        """Write the new entries as one cache file; its path (None when there were none)."""
        if not self.new:
            return None
        path = cache.write_batch(self.dir, self.new)  # type: ignore[arg-type]  # new entries have keys: only with a cache dir
        self.used.add(path)
        return path


STASHED = "stashed"


@beam.typehints.with_output_types(dict)  # declared: inferring it would import librosa into the launcher
class _MeasureFn(beam.DoFn):
    """A batch of rows (`stash.stash_rows`' reference) -> {"clips": [clip with its front end's text,
    lengths, the mel's moments], "cache": {hits, computed, damaged_files}, "cache_files": [...]} for
    the statistics; the batch's stash reference (`stash.stash_batch`) -> `stashed`; bad clips ->
    `rejected`.

    Each clip is decoded, resampled and trimmed once, here, and its features computed from it, or
    read from the feature cache when the run has one (`index`: a `cache.CacheIndex`, a side input). The
    clips and their features cross the statistics barrier in the stash, not in the runner.
    """

    def __init__(
        self, cfg: PreprocessConfig, stash_dir: str, progress_dir: str | None = None, cache_dir: str | None = None
    ):
        self.cfg, self.stash_dir, self.progress_dir, self.cache_dir = cfg, stash_dir, progress_dir, cache_dir

    def setup(self):
        worker_setup()
        self.settings = cache.settings_key(self.cfg)  # the worker's libraries compute the features
        self.progress = ProgressFile(self.progress_dir) if self.progress_dir else None

    def finish_bundle(self):
        if self.progress:
            self.progress.flush()

    def process(self, batch, index=None):
        rows = load_rows(batch)
        clips, arrays, written = [], [], []
        cached = _Cached(self.cache_dir, index, self.settings)
        for row, text in zip(rows, prepare_texts(rows, self.cfg)):
            _count("rows_measured")  # with the per-reason counters, the job's progress on Dataflow
            key = cached.key(row)
            hit = cached.find(key)
            try:
                clip, features, span = featurize_span(row, self.cfg, text, analysed=hit and hit[:2])
            except ClipRejected as e:
                _count(e.reason)
                yield beam.pvalue.TaggedOutput(REJECTED, as_rejection(row["id"], e))
                continue
            # A clip in the cache, found or added, is stashed without what the cache holds: the
            # writer reads that from the cache file, so a run with a cache writes each array once.
            stashed = {k: v for k, v in features.items() if k == "durations"}
            if hit is None:  # from the float32 mel, before it is stored as float16
                moments = Moments.of(features["mel"])
                if cached.keep(key, span, {k: v for k, v in features.items() if k != "durations"}, moments):
                    written.append((clip, key))  # its cache file is named once the batch is complete
                else:
                    stashed = features
            else:
                moments = hit[2]
                clip["cached"] = [hit[3], key]
            cached.counts["hits" if hit is not None else "computed"] += 1
            Metrics.distribution(NS, "mel_frames").update(clip["mel_frames"])
            clip["moments"] = moments
            clip["feature_summary"] = feature_stats.clip_summary(features)
            clips.append(clip)
            arrays.append(stashed)
        path = cached.flush()
        for clip, key in written:
            clip["cached"] = [path, key]
        for name, n in cached.counts.items():
            _count(f"cache_{name}", n)
        if self.progress:
            self.progress.add(len(rows))
        Metrics.counter(NS, "clips_measured").inc(len(clips))
        yield beam.pvalue.TaggedOutput(STASHED, stash_batch(self.stash_dir, clips, arrays))
        yield {"clips": clips, "cache": cached.counts, "cache_files": sorted(cached.used)}


class MeasureClips(beam.PTransform):
    """Batches of rows (`stash.stash_rows`' references) -> {"clips": batches of clips with normalised
    text and lengths, for the statistics; "stashed": each batch's stash reference, for the stages
    after the statistics; "rejected": bad clips}. With `cache_dir`, each clip's audio features are
    looked up in the feature cache first (its index, `cache.read_index`, read by one worker into a
    side input) and what is computed is added.

    Only the statistics' combiners read `clips`: the runner fuses their partial combines into this
    stage, so the clips never wait in the runner; what waits for the cut-offs is `stashed`, a few
    hundred bytes per batch."""

    def __init__(
        self, cfg: PreprocessConfig, stash_dir: str, progress_dir: str | None = None, cache_dir: str | None = None
    ):
        super().__init__()
        self.cfg, self.stash_dir, self.progress_dir, self.cache_dir = cfg, stash_dir, progress_dir, cache_dir

    def expand(self, batches):
        fn = _MeasureFn(self.cfg, self.stash_dir, self.progress_dir, self.cache_dir)
        if not self.cache_dir:
            return batches | "Measure" >> beam.ParDo(fn).with_outputs(REJECTED, STASHED, main="clips")
        index = (
            batches.pipeline | "CacheDir" >> beam.Create([self.cache_dir]) | "ReadIndex" >> beam.Map(cache.read_index)
        )
        return batches | "Measure" >> beam.ParDo(fn, index=beam.pvalue.AsSingleton(index)).with_outputs(
            REJECTED, STASHED, main="clips"
        )


# -- stage 4: statistics -----------------------------------------------------------------------
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


class _TablesFn(beam.CombineFn):
    """Batches of clips -> `tables.finish_tables`: speakers, languages, vocabulary, validation split."""

    def __init__(self, cfg: PreprocessConfig):
        self.cfg = cfg

    def create_accumulator(self):
        return tables.empty()

    def add_input(self, acc, batch):
        return tables.merge([acc, tables.summarize_clips(batch["clips"], self.cfg.split.salt, self.cfg.text_unit)])

    def merge_accumulators(self, accs):
        return tables.merge(accs)

    def extract_output(self, acc):
        return tables.finish_tables(acc, self.cfg)


def sum_counters(counters) -> Counter:
    return merge_histograms(counters)


class CorpusTables(beam.PTransform):
    """Batches of clips -> one dict (`melshards.preprocess.tables`): the speaker and language tables,
    the corpus's vocabulary, each speaker's validation clips, per-language length histograms."""

    def __init__(self, cfg: PreprocessConfig):
        super().__init__()
        self.cfg = cfg

    def expand(self, batches):  # the read always emits a batch: no default needed
        return batches | "Tables" >> beam.CombineGlobally(_TablesFn(self.cfg)).without_defaults()


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


# -- stage 6a: length buckets ----------------------------------------------------------------
def kept_summary(clips: list[dict], cutoffs: Cutoffs | None, corpus_tables: dict, salt: str) -> dict:
    """One batch's share of what the buckets and the after-filter report need: the three length
    histograms of its kept clips, the mel-frame histogram of its kept training clips, and the
    text lengths of its kept clips per mel-frame count (each bucket's text length follows from it
    once the bounds are known)."""
    kept = [c for c in clips if filter_rejection(c, cutoffs, corpus_tables) is None] if cutoffs else []
    return {
        "after": length_histograms(kept),
        "train": Counter(c["mel_frames"] for c in kept if tables.split_of(c, corpus_tables, salt) == "train"),
        "text_by_frames": Counter((c["mel_frames"], c["text_len"]) for c in kept),
    }


def stashed_kept_summary(batch: dict, cutoffs: Cutoffs | None, corpus_tables: dict, salt: str) -> dict:
    """`kept_summary` of a stashed batch (`stash.stash_batch`'s reference)."""
    return kept_summary(load_clips(batch), cutoffs, corpus_tables, salt)


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
    """Stashed batches (`MeasureClips`'s `stashed`) + cut-offs -> one element,
    `bucketing.choose_from_summary`'s dict.

    Reads the measured clips with the filter's own rule (`clips.filter_rejection`), not the filter's output:
    the bounds are then ready before any mel is read back, so the filter, padding and writing run
    in one pass over the stashed mels.
    """

    def __init__(self, cutoffs, corpus_tables, cfg: PreprocessConfig):
        super().__init__()
        self.cutoffs, self.tables, self.cfg = cutoffs, corpus_tables, cfg

    def expand(self, batches):
        S = beam.pvalue
        return (
            batches
            | "Kept"
            >> beam.Map(
                stashed_kept_summary, S.AsSingleton(self.cutoffs), S.AsSingleton(self.tables), self.cfg.split.salt
            )
            | "Summary" >> beam.CombineGlobally(_KeptSummaryFn()).without_defaults()  # >= 1 batch
            | "Bounds" >> beam.Map(bucketing.choose_from_summary, self.cfg.pad)
        )


# -- stages 5-6: filter, pad + encode, write ---------------------------------------------------
MOMENTS = "moments"
WRITTEN = "written"
FEATURE_STATS = "feature_stats"


def written_counts(clips) -> Counter:
    """What a batch put in the shards, for the speaker and language tables: clips and milliseconds per
    ("speaker", name), ("language", code) and ("split", speaker, split); with a clip's "bucket", its
    records per ("bucket", index, split, "speaker" | "language", name) (schema.json `Bucket.groups`)."""
    out: Counter[tuple] = Counter()
    for c in clips:
        for key in (("speaker", c["speaker"]), ("language", c["language"])):
            out[key + ("clips",)] += 1
            out[key + ("ms",)] += c["duration_ms"]
            if "bucket" in c:
                out[("bucket", c["bucket"], c["split"]) + key] += 1
        out[("split", c["speaker"], c["split"])] += 1
    return out


def analyse_again(clip: dict, cfg: PreprocessConfig) -> dict:
    """The audio features of a measured clip whose cache entry could not be read back, computed again
    from its audio (the same computation, so the same arrays; the mel as float16, as the cache holds it).
    IOError if the audio no longer gives the span Measure measured (the file changed during the run)."""
    span, arrays = analyse_audio(clip["audio"], cfg)
    if span["length"] != clip["num_samples"]:
        raise OSError(
            f"{clip['audio']} changed during the run ({span['length']} samples kept, measured "
            f"{clip['num_samples']}); run again"
        )
    return dict(arrays, mel=arrays["mel"].astype("<f2"))


class _FilterAndWriteFn(beam.DoFn):
    """Stashed batch -> kept clips padded, encoded and appended to temp TFRecord files (one per split
    and bucket, rolled at the target size); one dict per closed file at the end of the bundle.

    Dropped clips -> `rejected`; the training clips' mel moments, one per batch -> `moments`; what
    the batch wrote per speaker and language -> `written`. Each batch's clips and arrays are read back
    from its stash files once.
    """

    def __init__(self, out_dir: str, target_bytes: int, cfg: PreprocessConfig):
        self.out_dir, self.target, self.cfg = out_dir, target_bytes, cfg

    def setup(self):
        worker_setup()

    def start_bundle(self):
        self.files = RollingFiles(self.out_dir, self.target)

    def process(self, batch, cutoffs, chosen, corpus_tables):
        buckets, text = chosen["buckets"], chosen["text"]
        clips, kept = load_clips(batch), []
        for clip in clips:
            rejection = filter_rejection(clip, cutoffs, corpus_tables)
            if rejection:
                _count(rejection["reason"])
                yield beam.pvalue.TaggedOutput(REJECTED, rejection)
            else:
                kept.append(dict(clip, split=tables.split_of(clip, corpus_tables, self.cfg.split.salt)))
        moments = Moments.empty(self.cfg.mel.n_mels)
        arrays = load_features(batch) if kept else []
        by_id = dict(zip((c["id"] for c in clips), arrays))
        from_cache: dict[str, dict] = {}
        for clip in kept:  # a clip Measure read from the feature cache: its arrays are in the cache file
            if "cached" in clip:
                where, key = clip["cached"]
                found = cache.read_entry(where, key, from_cache)
                if found is None:  # the file went (a prune, a user) or was damaged since Measure read it
                    _count("cache_recomputed_in_writer")
                    found = analyse_again(clip, self.cfg)
                by_id[clip["id"]] = dict(found, **by_id[clip["id"]])
        vocab = Vocabulary(corpus_tables["vocabulary"], self.cfg.text_unit)
        for clip in kept:
            split, bucket, data = encode_clip(clip, by_id[clip["id"]], buckets, text, corpus_tables, vocab, self.cfg)
            clip["bucket"] = bucket  # for written_counts
            yield from self.files.write(split, bucket, data)
            if split == "train":
                moments = moments.merge(clip["moments"])
        _count("records_written", len(kept))
        yield beam.pvalue.TaggedOutput(MOMENTS, moments)
        yield beam.pvalue.TaggedOutput(WRITTEN, written_counts(kept))
        if self.cfg.features.pitch or self.cfg.features.energy:
            yield beam.pvalue.TaggedOutput(
                FEATURE_STATS, feature_stats.batch_stats((c, c["feature_summary"]) for c in kept)
            )

    def finish_bundle(self):
        for part in self.files.close_all():
            yield WindowedValue(part, 0, (GlobalWindow(),))


class FilterAndWrite(beam.PTransform):
    """Drop (never truncate) clips outside the percentile cut-offs, pad the rest to their bucket's
    shapes and write them; the cut-offs, the chosen buckets (`ChooseBuckets`) and the corpus tables
    (`CorpusTables`) arrive as side inputs.

    Returns {"parts": temp files written, "rejected": dropped clips, "moments": mel moments of each
    batch's kept training clips (one per batch, maybe empty), "written": the clips and milliseconds
    written per speaker and language (`written_counts`, summed), "feature_stats": the pitch and energy
    statistics per group (`feature_stats.batch_stats`, merged; empty when the run computes neither)}.
    """

    def __init__(self, cutoffs, chosen, corpus_tables, out_dir: str, cfg: PreprocessConfig):
        super().__init__()
        self.cutoffs, self.chosen, self.tables, self.out_dir, self.cfg = cutoffs, chosen, corpus_tables, out_dir, cfg

    def expand(self, batches):
        S = beam.pvalue
        out = batches | "FilterPadWrite" >> beam.ParDo(
            _FilterAndWriteFn(self.out_dir, int(self.cfg.write.target_shard_mb * 1e6), self.cfg),
            S.AsSingleton(self.cutoffs),
            S.AsSingleton(self.chosen),
            S.AsSingleton(self.tables),
        ).with_outputs(REJECTED, MOMENTS, WRITTEN, FEATURE_STATS, main="parts")
        written = out[WRITTEN] | "SumWritten" >> beam.CombineGlobally(sum_counters).without_defaults()
        stats = out[FEATURE_STATS] | "FeatureStats" >> beam.CombineGlobally(feature_stats.merge).without_defaults()
        return {
            "parts": out.parts,
            REJECTED: out[REJECTED],
            MOMENTS: out[MOMENTS],
            WRITTEN: written,
            FEATURE_STATS: stats,
        }


# -- the job -----------------------------------------------------------------------------------
def cache_summary(batches) -> dict:
    """The measured batches' cache counts summed, and the cache files they read or wrote."""
    counts: Counter[str] = Counter()
    files: set[str] = set()
    for b in batches:
        counts.update(b.get("cache", {}))
        files.update(b.get("cache_files", ()))
    return {"counts": counts, "files": files}


def merge_cache_summaries(parts) -> dict:
    return cache_summary({"cache": p["counts"], "cache_files": p["files"]} for p in parts)


def build(
    p: beam.Pipeline,
    corpus: Corpus | list[Corpus],
    out_dir: str,
    cfg: PreprocessConfig,
    progress: bool = False,
    cache_dir: str | None = None,
):
    """Wire every stage; returns the PCollection holding the schema.json path once it is written.

    Elements are batches of rows/clips (corpus.batch_rows): the per-element cost of a runner is
    paid per batch. progress: workers also write their row counts under the output's temp dir (for
    a local run's progress line; on Dataflow the counters show it).
    """
    read = p | "Read" >> ReadCorpus(corpus, stash_dir(out_dir))
    measured = read["batches"] | "Measure" >> MeasureClips(
        cfg, stash_dir(out_dir), progress_dir(out_dir) if progress else None, cache_dir
    )
    cache_used = (
        measured.clips
        | "CacheUse" >> beam.Map(lambda b: cache_summary([b]))
        | "SumCacheUse" >> beam.CombineGlobally(merge_cache_summaries).without_defaults()
    )
    before = measured.clips | "StatsBefore" >> LengthHistograms()
    corpus_tables = measured.clips | "CorpusTables" >> CorpusTables(cfg)
    cutoffs = before | "Cutoffs" >> beam.Map(cutoffs_from, beam.pvalue.AsSingleton(corpus_tables), cfg)
    chosen = measured[STASHED] | "ChooseBuckets" >> ChooseBuckets(cutoffs, corpus_tables, cfg)
    written = measured[STASHED] | "FilterAndWrite" >> FilterAndWrite(cutoffs, chosen, corpus_tables, out_dir, cfg)
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
    } | "Report" >> WriteReport(out_dir, cfg, cache_dir)
