"""Stages 2-3, Measure: batches of rows -> measured clips for the statistics, each batch stashed for
the stages after them.

Each clip is decoded, resampled and trimmed once, here, and its text, lengths, log-mel and the
features the config asks for are computed from it (`melshards.preprocess.clips.featurize_span`), or
read from the feature cache when the run has one (`melshards.preprocess.cache`). The clips and their
arrays cross the statistics barrier in the stash (`melshards.preprocess.stash`), not in the runner.
"""

from __future__ import annotations

import logging
from collections import Counter

import apache_beam as beam
from apache_beam.metrics import Metrics

from melshards.preprocess import cache, containers, extractors, feature_stats
from melshards.preprocess.clips import SAMPLES, ClipRejected, as_rejection, featurize_span, prepare_texts
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.corpus import NS, REJECTED, count
from melshards.preprocess.progress import ProgressFile
from melshards.preprocess.rows import reject
from melshards.preprocess.stash import load_rows, stash_batch
from melshards.preprocess.workers import worker_setup
from melshards.shards_schema.stats import Moments

log = logging.getLogger("melshards.preprocess")


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
        return cache.clip_key(row.get("audio"), self.settings, row.get("locator")) if self.dir else None

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
        # loaded once per worker; their fingerprints are part of the cache key
        self.extractors = extractors.for_run(self.cfg) if self.cfg.extractors else None
        self.records = self.extractors.records() if self.extractors else []
        self.vectors = self.extractors.vectors() if self.extractors else ()
        self.settings = cache.settings_key(self.cfg, self.records)  # the worker's libraries compute the features
        self.progress = ProgressFile(self.progress_dir) if self.progress_dir else None

    def finish_bundle(self):
        if self.progress:
            self.progress.flush()

    def process(self, batch, index=None):
        rows = load_rows(batch)
        clips, arrays, written = [], [], []
        cached = _Cached(self.cache_dir, index, self.settings)
        measured = []
        for row, text in zip(rows, prepare_texts(rows, self.cfg)):
            count("rows_measured")  # with the per-reason counters, the job's progress on Dataflow
            key = cached.key(row)
            hit = cached.find(key)
            try:
                clip, features, span = featurize_span(row, self.cfg, text, analysed=hit and hit[:2])
            except ClipRejected as e:
                count(e.reason)
                yield beam.pvalue.TaggedOutput(REJECTED, as_rejection(row["id"], e))
                continue
            measured.append((row, key, hit, clip, features, span))
        if self.extractors:
            measured, failed = extract(self.extractors, measured, self.cfg)
            for rejection in failed:
                count(rejection["reason"])
                yield beam.pvalue.TaggedOutput(REJECTED, rejection)
        for _row, key, hit, clip, features, span in measured:
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
            clip["feature_summary"] = feature_stats.clip_summary(features, self.vectors)
            clips.append(clip)
            arrays.append(stashed)
        containers.release_held()  # the parquet row group the batch's rows were read from
        path = cached.flush()
        for clip, key in written:
            clip["cached"] = [path, key]
        for name, n in cached.counts.items():
            count(f"cache_{name}", n)
        if self.progress:
            self.progress.add(len(rows))
        count("clips_measured", len(clips))
        yield beam.pvalue.TaggedOutput(STASHED, stash_batch(self.stash_dir, clips, arrays))
        yield {"clips": clips, "cache": cached.counts, "cache_files": sorted(cached.used), "extractors": self.records}


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


def cache_summary(batches) -> dict:
    """The measured batches' cache counts summed, the cache files they read or wrote, and the extractors
    they ran (`extractors.same_records`: every worker's must be the same)."""
    counts: Counter[str] = Counter()
    files: set[str] = set()
    records: list = []
    for b in batches:
        counts.update(b.get("cache", {}))
        files.update(b.get("cache_files", ()))
        records = extractors.same_records(records, b.get("extractors", []))
    return {"counts": counts, "files": files, "extractors": records}


def merge_cache_summaries(parts) -> dict:
    return cache_summary(
        {"cache": p["counts"], "cache_files": p["files"], "extractors": p.get("extractors", [])} for p in parts
    )


def extract(runner: extractors.Extractors, measured: list, cfg: PreprocessConfig) -> tuple[list, list[dict]]:
    """Measured clips (row, key, hit, clip, features, span) -> (those with their extractor outputs in
    `features`, the rejections of the clips an extractor failed on). A clip found in the cache has its
    outputs already; the others' kept samples (`clips.SAMPLES`) go to the extractors in batches and
    leave `features`."""
    todo = [m for m in measured if m[2] is None]
    samples = [m[4].pop(SAMPLES) for m in todo]
    for m in measured:
        m[4].pop(SAMPLES, None)
    results = runner.apply(samples, [m[3]["mel_frames"] for m in todo], cfg.audio.sample_rate, cfg.mel.hop_length)
    failed = {id(m): r for m, r in zip(todo, results) if isinstance(r, str)}
    for m, r in zip(todo, results):
        if not isinstance(r, str):
            m[4].update(r)
    kept = [m for m in measured if id(m) not in failed]
    rejected = [reject(m[0]["id"], extractors.FAILED, failed[id(m)]) for m in measured if id(m) in failed]
    return kept, rejected
