"""Stages 2-3, Measure: batches of rows -> measured clips for the statistics, each batch written to
temp files for the stages after them.

Each clip is decoded, resampled and trimmed once, here, and its text, lengths, log-mel and the
features the config asks for are computed from it (`melshards.preprocess.clip.clips.featurize_span`), or
read from the feature cache when the run has one (`melshards.preprocess.clip.cache`). The clips and their
arrays cross the statistics barrier in temp files (`melshards.preprocess.out_dir.batch_files`), not in the runner.
"""

from __future__ import annotations

import logging
from collections import Counter

import apache_beam as beam
from apache_beam.metrics import Metrics

from melshards.preprocess.clip import cache, extractor_plugins
from melshards.preprocess.clip.clips import SAMPLES, ClipRejected, as_rejection, featurize_span, prepare_texts
from melshards.preprocess.clip.features import clip_summary
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.inputs import packed_clips
from melshards.preprocess.inputs.progress import batch_measured
from melshards.preprocess.inputs.read_stage import NS, REJECTED, count
from melshards.preprocess.inputs.rows import reject
from melshards.preprocess.out_dir.batch_files import read_rows, write_measured
from melshards.preprocess.workers import worker_setup
from melshards.shards_schema.stats import Moments

log = logging.getLogger("melshards.preprocess")


_DAMAGED = object()  # a part in a damaged entries file


class _Cached:
    """One batch's view of the feature cache: each row's part keys, the parts it finds (each cache file
    read once), and the parts the batch computes, written back as one file (`melshards.preprocess.clip.cache`)."""

    def __init__(self, cache_dir: str | None, index: cache.CacheIndex | None, parts: tuple[cache.Part, ...]):
        self.dir, self.index, self.parts = cache_dir, index, parts
        self.loaded: dict[str, dict] = {}
        self.new: list = []
        self.used: set[str] = set()
        self.counts: Counter[str] = Counter()
        self.computed: Counter[str] = Counter()  # clips per part computed

    def keys(self, row: dict) -> dict[str, str] | None:
        """{part name: key} of a row's clip; None without a cache, or for a file that cannot be listed."""
        identity = cache.file_identity(row.get("audio"), row.get("locator")) if self.dir else None
        return None if identity is None else {p.name: cache.part_key(identity, p.settings) for p in self.parts}

    def _entry(self, key: str):
        """(span, arrays, moments, entries file) of a cached part, None (not cached) or `_DAMAGED` (its
        file does not read back)."""
        where = self.index.get(key)  # type: ignore[union-attr]  # a key only with a cache, whose index is given
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
            return _DAMAGED
        found = self.loaded[where].get(key)
        if found is None:
            return None
        self.used.add(where)
        return (*found, where)

    def find(self, keys: dict[str, str] | None) -> dict[str, tuple]:
        """{part name: (span, arrays, moments, entries file)} of the parts of a clip the cache holds."""
        found, damaged = {}, False
        for name, key in (keys or {}).items():
            entry = self._entry(key)
            damaged |= entry is _DAMAGED
            if entry is not None and entry is not _DAMAGED:
                found[name] = entry
        if damaged:
            self.counts["damaged"] += 1  # computed again, and written to a new file
        return found

    def keep(self, keys: dict[str, str], parts: list[cache.Part], span: dict, arrays: dict, moments: Moments) -> None:
        """Add the parts `parts` of a computed clip to the batch's new entries."""
        for part in parts:
            self.new.append((keys[part.name], *part.entry(span, arrays, moments)))
            self.computed[part.name] += 1

    def flush(self) -> str | None:
        """Write the new entries as one cache file; its path (None when there were none)."""
        if not self.new:
            return None
        path = cache.write_batch(self.dir, self.new)  # type: ignore[arg-type]  # new entries have keys: only with a cache dir
        self.used.add(path)
        return path


def known_parts(found: dict[str, tuple]) -> tuple[dict, dict] | None:
    """The span and arrays of the cached parts of a clip (`_Cached.find`), as `featurize_span` takes
    them; None when it has none."""
    if not found:
        return None
    span: dict = {"quality": {}}
    arrays: dict = {}
    for part_span, part_arrays, _, _ in found.values():
        span["quality"].update(part_span.get("quality", {}))
        span.update({k: v for k, v in part_span.items() if k != "quality"})
        arrays.update(part_arrays)
    return span, arrays


MEASURED = "batches"


@beam.typehints.with_output_types(dict)  # declared: inferring it would import librosa into the launcher
class _MeasureFn(beam.DoFn):
    """A list of references to batches of rows (`read_stage.together`: one batch, or the batches of one
    parquet row group, measured in order) -> for each batch, {"clips": [clip with its front end's
    text, lengths, the mel's moments], "cache": {hits, computed, damaged_files}, "cache_files": [...]}
    for the statistics and its files' reference (`batch_files.write_measured`) -> `batches`; bad clips ->
    `rejected`. What the batches' audio was read from (`packed_clips.release_held`) is let go once all
    are measured.

    Each clip is decoded, resampled and trimmed once, here, and its features computed from it, or
    read from the feature cache when the run has one (`index`: a `cache.CacheIndex`, a side input). The
    clips and their features cross the statistics barrier in temp files, not in the runner. A bundle
    run again (a runner's retry) writes the same temp, cache and progress files: each is named by
    the ids or cache keys it holds (`melshards.preprocess.out_dir.temp_files`).
    """

    def __init__(
        self, cfg: PreprocessConfig, temp_dir: str, progress_dir: str | None = None, cache_dir: str | None = None
    ):
        self.cfg, self.temp_dir, self.progress_dir, self.cache_dir = cfg, temp_dir, progress_dir, cache_dir

    def setup(self):
        worker_setup()
        # loaded once per worker; their records are part of their cache parts' keys
        self.extractors = extractor_plugins.for_run(self.cfg) if self.cfg.extractors else None
        self.records = self.extractors.records() if self.extractors else []
        self.vectors = self.extractors.vectors() if self.extractors else ()
        self.parts = cache.run_parts(self.cfg, self.records)  # the worker's libraries compute the features

    def process(self, refs, index=None):
        try:
            for batch in refs:
                yield from self._measure(batch, index)
        finally:
            packed_clips.release_held()  # the tars, row group streams and recordings the batches were read from

    def _measure(self, batch, index):
        rows = read_rows(batch)
        clips, arrays, written = [], [], []
        cached = _Cached(self.cache_dir, index, self.parts)
        measured = []
        for row, text in zip(rows, prepare_texts(rows, self.cfg)):
            count("rows_measured")  # with the per-reason counters, the job's progress on Dataflow
            keys = cached.keys(row)
            found = cached.find(keys)
            missing = [p for p in self.parts if p.name not in found]
            try:
                clip, features, span = featurize_span(
                    row, self.cfg, text, analysed=known_parts(found), parts=[p.name for p in missing]
                )
            except ClipRejected as e:
                count(e.reason)
                yield beam.pvalue.TaggedOutput(REJECTED, as_rejection(row["id"], e))
                continue
            measured.append((row, (keys, found, missing), clip, features, span))
        if self.extractors:
            measured, failed = extract(self.extractors, measured, self.cfg)
            for rejection in failed:
                count(rejection["reason"])
                yield beam.pvalue.TaggedOutput(REJECTED, rejection)
        for _row, (keys, found, missing), clip, features, span in measured:
            # A clip in the cache, found or added, is written without what the cache holds: the
            # writer reads that from the cache file, so a run with a cache writes each array once.
            uncached = {k: v for k, v in features.items() if k == "durations"}
            # from the float32 mel, before it is stored as float16
            moments = found[cache.MEL][2] if cache.MEL in found else Moments.of(features["mel"])
            if keys is None:
                uncached = features
            else:
                cached.keep(keys, missing, span, features, moments)
                where = {name: [entry[3], keys[name]] for name, entry in found.items()}
                written.append((clip, keys, where, missing))  # the new parts' file is named once the batch is complete
            cached.counts["hits" if not missing else "computed"] += 1
            Metrics.distribution(NS, "mel_frames").update(clip["mel_frames"])
            clip["moments"] = moments
            clip["feature_summary"] = clip_summary(features, self.vectors)
            clips.append(clip)
            arrays.append(uncached)
        path = cached.flush()
        for clip, keys, where, missing in written:
            where.update({p.name: [path, keys[p.name]] for p in missing})
            clip["cached"] = where[cache.MEL]  # the mel's (what other_clip references read)
            clip["cached_parts"] = [where[p.name] for p in self.parts if p.arrays and p.name != cache.MEL]
        for name, n in cached.counts.items():
            count(f"cache_{name}", n)
        if self.progress_dir and rows:
            batch_measured(self.progress_dir, [r["id"] for r in rows])
        count("clips_measured", len(clips))
        yield beam.pvalue.TaggedOutput(MEASURED, write_measured(self.temp_dir, clips, arrays))
        yield {
            "clips": clips,
            "cache": cached.counts,
            "cache_parts": cached.computed,
            "cache_files": sorted(cached.used),
            "extractors": self.records,
        }


class MeasureClips(beam.PTransform):
    """Lists of references to batches of rows (`read_stage.together`) -> {"clips": batches of clips with normalised
    text and lengths, for the statistics; "batches": each batch's reference to its files, for the stages
    after the statistics; "rejected": bad clips}. With `cache_dir`, each clip's audio features are
    looked up in the feature cache first (its index, `cache.read_index`, read by one worker into a
    side input) and what is computed is added.

    Only the statistics' combiners read `clips`: the runner fuses their partial combines into this
    stage, so the clips never wait in the runner; what waits for the cut-offs is `batches`, a few
    hundred bytes per batch."""

    def __init__(
        self, cfg: PreprocessConfig, temp_dir: str, progress_dir: str | None = None, cache_dir: str | None = None
    ):
        super().__init__()
        self.cfg, self.temp_dir, self.progress_dir, self.cache_dir = cfg, temp_dir, progress_dir, cache_dir

    def expand(self, batches):
        fn = _MeasureFn(self.cfg, self.temp_dir, self.progress_dir, self.cache_dir)
        if not self.cache_dir:
            return batches | "Measure" >> beam.ParDo(fn).with_outputs(REJECTED, MEASURED, main="clips")
        index = (
            batches.pipeline | "CacheDir" >> beam.Create([self.cache_dir]) | "ReadIndex" >> beam.Map(cache.read_index)
        )
        return batches | "Measure" >> beam.ParDo(fn, index=beam.pvalue.AsSingleton(index)).with_outputs(
            REJECTED, MEASURED, main="clips"
        )


def cache_summary(batches) -> dict:
    """The measured batches' cache counts summed (`parts`: the clips each part was computed for), the
    cache files they read or wrote, and the extractors they ran (`extractor_plugins.same_records`: every
    worker's must be the same)."""
    counts: Counter[str] = Counter()
    parts: Counter[str] = Counter()
    files: set[str] = set()
    records: list = []
    for b in batches:
        counts.update(b.get("cache", {}))
        parts.update(b.get("cache_parts", {}))
        files.update(b.get("cache_files", ()))
        records = extractor_plugins.same_records(records, b.get("extractors", []))
    return {"counts": counts, "parts": parts, "files": files, "extractors": records}


def merge_cache_summaries(parts) -> dict:
    return cache_summary(
        {
            "cache": p["counts"],
            "cache_parts": p.get("parts", {}),
            "cache_files": p["files"],
            "extractors": p.get("extractors", []),
        }
        for p in parts
    )


def extract(runner: extractor_plugins.Extractors, measured: list, cfg: PreprocessConfig) -> tuple[list, list[dict]]:
    """Measured clips (row, (keys, found, missing parts), clip, features, span) -> (those with their
    extractor outputs in `features`, the rejections of the clips an extractor failed on). The
    extractors whose parts a clip lacks run on its kept samples (`clips.SAMPLES`), in batches; the
    samples leave `features`; a clip found in the cache has the others' outputs already."""
    todo = [m for m in measured if SAMPLES in m[3]]
    samples = [m[3].pop(SAMPLES) for m in todo]
    wanted = [{p.extractor for p in m[1][2] if p.extractor is not None} for m in todo]
    results = runner.apply(
        samples, [m[2]["mel_frames"] for m in todo], cfg.audio.sample_rate, cfg.mel.hop_length, wanted
    )
    failed = {id(m): r for m, r in zip(todo, results) if isinstance(r, str)}
    for m, r in zip(todo, results):
        if not isinstance(r, str):
            m[3].update(r)
    kept = [m for m in measured if id(m) not in failed]
    rejected = [reject(m[0]["id"], extractor_plugins.FAILED, failed[id(m)]) for m in measured if id(m) in failed]
    return kept, rejected
