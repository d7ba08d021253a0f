"""Stages 5-6, FilterAndWrite: each measured batch filtered, its kept clips padded to their bucket's
shapes, encoded and written to temp TFRecord files, in one pass over the measured batches' files.

Clips outside the cut-offs are dropped (never truncated) by the filter's one rule
(`melshards.preprocess.stats.filter_rule.filter_rejection`); padding and encoding are
`melshards.preprocess.write.encode.encode_clip`; the temp files roll at the target shard size
(`melshards.preprocess.out_dir.shards.RollingFiles`) and `AssembleShards` makes the shards from them.
"""

from __future__ import annotations

import functools
from collections import Counter

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from melshards.preprocess.clip import cache, extractor_plugins
from melshards.preprocess.clip.clips import SAMPLES, analyse_audio
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.inputs.read_stage import REJECTED, count
from melshards.preprocess.inputs.rows import reject
from melshards.preprocess.out_dir.batch_files import read_clips, read_features
from melshards.preprocess.out_dir.shards import RollingFiles
from melshards.preprocess.stats import feature_stats, tables
from melshards.preprocess.stats.filter_rule import filter_rejection
from melshards.preprocess.stats.global_stats import AddParts
from melshards.preprocess.workers import worker_setup
from melshards.preprocess.write.encode import encode_clip
from melshards.shards_schema import Vocabulary
from melshards.shards_schema.extracted import outputs_of
from melshards.shards_schema.stats import Moments, merge_histograms

# FilterAndWrite's outputs besides "parts" and "rejected"
MOMENTS = "moments"
WRITTEN = "written"
FEATURE_STATS = "feature_stats"


def sum_counters(counters) -> Counter:
    return merge_histograms(counters)


def written_counts(clips) -> Counter:
    """What a batch put in the shards, for the speaker and language tables: clips and milliseconds per
    ("speaker", name), ("language", code) and ("split", speaker, split); with a clip's "bucket", its
    records per ("bucket", index, split, "speaker" | "language", name) (schema.json `Bucket.groups`); in
    a run with other_clip references, the records per ("reference", `reference_kind`, split)."""
    out: Counter[tuple] = Counter()
    for c in clips:
        for key in (("speaker", c["speaker"]), ("language", c["language"])):
            out[key + ("clips",)] += 1
            out[key + ("ms",)] += c["duration_ms"]
            if "bucket" in c:
                out[("bucket", c["bucket"], c["split"]) + key] += 1
        out[("split", c["speaker"], c["split"])] += 1
        if c.get("reference_kind"):
            out[("reference", c["reference_kind"], c["split"])] += 1
    return out


def reference_kind(clip: dict, ref_id: str, corpus_tables: dict, salt: str) -> str | None:
    """What written_counts counts of a kept clip's reference: "own_clip" (a slice of itself),
    "val_from_train" (a validation clip's reference cut from a training clip of its speaker), or None
    (another clip of its split). The reference is a clip of the same speaker, whose split `split_of` gives."""
    if ref_id == clip["id"]:
        return "own_clip"
    if tables.split_of({"id": ref_id, "speaker": clip["speaker"]}, corpus_tables, salt) != clip["split"]:
        return "val_from_train"
    return None


def dropped_counts(dropped) -> Counter:
    """The clips a batch's filter dropped, per ("dropped", "speaker" | "language", name, reason): the
    speaker and language rows' `per_reason` in stats.json. `dropped`: (clip, reason) pairs."""
    out: Counter[tuple] = Counter()
    for clip, reason in dropped:
        out[("dropped", "speaker", clip["speaker"], reason)] += 1
        out[("dropped", "language", clip["language"], reason)] += 1
    return out


def analyse_again(clip: dict, cfg: PreprocessConfig, runner: extractor_plugins.Extractors | None = None) -> dict:
    """The audio features of a measured clip whose cache entry could not be read back, computed again
    from its audio (the same computation, so the same arrays; the mel as float16, as the cache holds it),
    and the extractors' outputs (`runner`, in a run with extractors). IOError if the audio no longer
    gives the span Measure measured (the file changed during the run) or an extractor now fails on it."""
    span, arrays = analyse_audio(clip["audio"], cfg, locator=clip.get("locator"))
    if span["length"] != clip["num_samples"]:
        raise OSError(
            f"{clip['audio']} changed during the run ({span['length']} samples kept, measured "
            f"{clip['num_samples']}); run again"
        )
    samples = arrays.pop(SAMPLES, None)
    if runner is not None and samples is not None:
        (out,) = runner.apply([samples], [clip["mel_frames"]], cfg.audio.sample_rate, cfg.mel.hop_length)
        if isinstance(out, str):
            raise OSError(f"{clip['audio']}: an extractor failed on it during the run ({out}); run again")
        arrays.update(out)
    return dict(arrays, mel=arrays["mel"].astype("<f2"))


class _FilterAndWriteFn(beam.DoFn):
    """Measured batch -> kept clips padded, encoded and appended to temp TFRecord files (one per split
    and bucket, rolled at the target size); one dict per closed file at the end of the bundle.

    Dropped clips -> `rejected`; the training clips' mel moments, one per batch -> `moments`; what
    the batch wrote and dropped per speaker and language -> `written`. Each batch's clips and arrays are read back
    from its temp files once. A bundle run again on the same batches (a runner's retry, after a
    failure or not) writes the same files and gives the same outputs (`RollingFiles`).
    """

    def __init__(self, out_dir: str, target_bytes: int, cfg: PreprocessConfig):
        self.out_dir, self.target, self.cfg = out_dir, target_bytes, cfg

    def setup(self):
        worker_setup()
        # built only if a cache entry went missing during the run (`analyse_again`)
        self.extractors = extractor_plugins.for_run(self.cfg) if self.cfg.extractors else None

    def start_bundle(self):
        self.files = RollingFiles(self.out_dir, self.target)

    def process(self, element, cutoffs, chosen, corpus_tables, gate, ran=()):
        try:
            yield from self._filter_and_write(element, cutoffs, chosen, corpus_tables, gate, ran)
        except Exception:  # the runner retries the bundle, which writes its files again
            self.files.discard()
            raise

    def _filter_and_write(self, element, cutoffs, chosen, corpus_tables, gate, ran):
        # a run with other_clip references: (batch, {clip id: (reference id, slice, frames, start) | None})
        batch, references = element if isinstance(element, tuple) else (element, None)
        buckets, text = chosen["buckets"], chosen["text"]
        outputs = outputs_of(ran[0]) if ran else ()
        clips, kept, dropped = read_clips(batch), [], []
        for clip in clips:
            rejection = filter_rejection(clip, cutoffs, corpus_tables, gate)
            if rejection is None and references is not None and references[clip["id"]] is None:
                detail = "its speaker has no other clip it may take a reference from (reference.single_clip: reject)"
                rejection = reject(clip["id"], "no_reference_clip", detail)
            if rejection:
                count(rejection["reason"])
                dropped.append((clip, rejection["reason"]))
                yield beam.pvalue.TaggedOutput(REJECTED, rejection)
            else:
                kept.append(dict(clip, split=tables.split_of(clip, corpus_tables, self.cfg.split.salt)))
        moments = Moments.empty(self.cfg.mel.n_mels)
        arrays = read_features(batch) if kept else []
        by_id = dict(zip((c["id"] for c in clips), arrays))
        from_cache: dict[str, dict] = {}
        for clip in kept:  # a clip Measure read from the feature cache: its arrays are in the cache files
            if "cached" in clip:
                found = cache.read_entries([clip["cached"], *clip.get("cached_parts", ())], from_cache)
                if found is None:  # the file went (a prune, a user) or was damaged since Measure read it
                    count("cache_recomputed_in_writer")
                    found = analyse_again(clip, self.cfg, self.extractors)
                by_id[clip["id"]] = dict(found, **by_id[clip["id"]])
        vocab = Vocabulary(corpus_tables["vocabulary"], self.cfg.text_unit)
        for clip in kept if references is not None else ():
            ref_id, ref_mel, ref_len, start = references[clip["id"]]  # not None: a refused clip was rejected above
            by_id[clip["id"]] = dict(
                by_id[clip["id"]],
                reference_id=ref_id,
                reference_mel=ref_mel,
                reference_len=ref_len,
                reference_start=start,
            )
            clip["reference_kind"] = reference_kind(clip, ref_id, corpus_tables, self.cfg.split.salt)
        for clip in kept:
            split, bucket, data = encode_clip(
                clip, by_id[clip["id"]], buckets, text, corpus_tables, vocab, self.cfg, outputs
            )
            clip["bucket"] = bucket  # for written_counts
            yield from self.files.write(split, bucket, data)
            if split == "train":
                moments = moments.merge(clip["moments"])
        count("records_written", len(kept))
        yield beam.pvalue.TaggedOutput(MOMENTS, moments)
        yield beam.pvalue.TaggedOutput(WRITTEN, written_counts(kept) + dropped_counts(dropped))
        if self.cfg.features.pitch or self.cfg.features.energy or self.cfg.extractors:
            for group in feature_stats.batch_stats((c, c["feature_summary"]) for c in kept).items():
                yield beam.pvalue.TaggedOutput(FEATURE_STATS, group)

    def finish_bundle(self):
        for part in self.files.close_all():
            yield WindowedValue(part, 0, (GlobalWindow(),))


class FilterAndWrite(beam.PTransform):
    """Drop (never truncate) clips outside the percentile cut-offs, pad the rest to their bucket's
    shapes and write them; the cut-offs, the quality gate (`quality_stage.SpeakingRateBounds`), the chosen buckets (`ChooseBuckets`) and the corpus tables
    (`CorpusTables`) arrive as side inputs.

    Returns {"parts": temp files written, "rejected": dropped clips, "moments": mel moments of each
    batch's kept training clips (one per batch, maybe empty), "written": the clips and milliseconds
    written per speaker and language (`written_counts`) and the clips the filter dropped per speaker
    and language and reason (`dropped_counts`), summed, "feature_stats": the pitch and energy
    statistics (`feature_stats.empty_finished`'s dict; no element when no group has a frame)}.
    """

    def __init__(self, cutoffs, chosen, corpus_tables, gate, out_dir: str, cfg: PreprocessConfig, ran=None):
        super().__init__()
        self.cutoffs, self.chosen, self.tables, self.out_dir, self.cfg = cutoffs, chosen, corpus_tables, out_dir, cfg
        self.gate = gate
        self.ran = ran  # the extractors' records the measure stage ran (`measure_stage.cache_summary`'s "extractors")

    def expand(self, batches):
        S = beam.pvalue
        out = batches | "FilterPadWrite" >> beam.ParDo(
            _FilterAndWriteFn(self.out_dir, int(self.cfg.write.target_shard_mb * 1e6), self.cfg),
            S.AsSingleton(self.cutoffs),
            S.AsSingleton(self.chosen),
            S.AsSingleton(self.tables),
            S.AsSingleton(self.gate),
            **({"ran": S.AsList(self.ran)} if self.ran is not None else {}),
        ).with_outputs(REJECTED, MOMENTS, WRITTEN, FEATURE_STATS, main="parts")
        written = out[WRITTEN] | "SumWritten" >> beam.CombineGlobally(sum_counters).without_defaults()
        features = self.cfg.optional_features
        stats = (  # each group summed where its key lands and reduced there; none: the report's empty_finished
            out[FEATURE_STATS]
            | "FeatureStats" >> beam.CombinePerKey(AddParts(dict, feature_stats.add_group))
            | "FinishGroups" >> beam.Map(feature_stats.finish_group, features)
            | "AllGroups"
            >> beam.CombineGlobally(
                AddParts(functools.partial(feature_stats.empty_finished, features), feature_stats.add_finished)
            ).without_defaults()
        )
        return {
            "parts": out.parts,
            REJECTED: out[REJECTED],
            MOMENTS: out[MOMENTS],
            WRITTEN: written,
            FEATURE_STATS: stats,
        }
