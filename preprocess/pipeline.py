"""The preprocessing job: corpus -> log-mel once -> percentile statistics -> filter -> pad -> shards.

One composite PTransform per stage, each with a labelled expand(); global statistics reach later
stages as side inputs. `build(p, ...)` wires the stages; `preprocess.run.run_job` checks an invocation and runs them.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections import Counter

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from preprocess import bucketing as B
from preprocess import clips as C
from preprocess.config import PreprocessConfig
from preprocess.corpus import REJECTED, Corpus, DropDuplicateIds, ReadCorpus
from preprocess.report import WriteReport, mel_params
from preprocess.shards import TEMP_DIR, WriteShards
from shards_schema.stats import LENGTH_KEYS, Cutoffs, Moments, compute_cutoffs, merge_histograms
from shards_schema import REJECTED_FILE, Schema, Vocabulary
from shards_schema.records import encode_example

log = logging.getLogger("melshards.preprocess")
NS = "melshards"


def _count(name: str) -> None:
    Metrics.counter(NS, name).inc()


def _one_blas_thread() -> None:
    """Runners start one worker process per core; BLAS threads per worker then oversubscribe the
    cores and spin (measured: 52.3 -> 41.6 CPU s for 500 clips on 2 workers with 1 thread each)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)


PROGRESS_PREFIX = "progress-"
_PROGRESS_EVERY_S = 2.0


class _ProgressFile:
    """This worker's count of measured rows, rewritten every few seconds into a small file that the
    local CLI sums for its progress line: the local runner reports Metrics only once the job is over."""

    def __init__(self, directory: str):
        self.path = FileSystems.join(directory, f"{PROGRESS_PREFIX}{uuid.uuid4().hex}.txt")
        self.rows, self.written_at = 0, 0.0

    def add(self) -> None:
        self.rows += 1
        if time.monotonic() - self.written_at >= _PROGRESS_EVERY_S:
            self.flush()

    def flush(self) -> None:
        tmp = self.path + ".writing"  # then renamed: the reader never sees a half-written count
        with FileSystems.create(tmp) as f:
            f.write(str(self.rows).encode())
        FileSystems.rename([tmp], [self.path])
        self.written_at = time.monotonic()


# -- stages 2-3: per clip ----------------------------------------------------------------------
@beam.typehints.with_output_types(dict)  # declared: inferring it would import librosa into the launcher
class _MeasureFn(beam.DoFn):
    """Row -> clip with text, lengths, split, the mel's moments and the mel (or where it is stashed).

    The clip is decoded, resampled and trimmed once, here; the mel computed from it crosses the
    statistics barrier either in the element (stash_dir None) or as a temp file in stash_dir.
    """

    def __init__(self, cfg: PreprocessConfig, stash_dir: str | None = None, progress_dir: str | None = None):
        self.cfg, self.stash_dir, self.progress_dir = cfg, stash_dir, progress_dir

    def setup(self):
        _one_blas_thread()
        self.vocab = Vocabulary()
        self.progress = _ProgressFile(self.progress_dir) if self.progress_dir else None

    def finish_bundle(self):
        if self.progress:
            self.progress.flush()

    def process(self, row):
        _count("rows_measured")  # with the per-reason counters, the job's progress on Dataflow
        if self.progress:
            self.progress.add()
        try:
            clip = C.featurize(row, self.cfg, self.vocab)
        except C.ClipRejected as e:
            _count(e.reason)
            yield beam.pvalue.TaggedOutput(REJECTED, C.as_rejection(row["id"], e))
            return
        _count("clips_measured")
        Metrics.distribution(NS, "mel_frames").update(clip["mel_frames"])
        mel = clip.pop("mel")
        clip["split"] = split_of(clip["id"], self.cfg.split.val_fraction, self.cfg.split.salt)
        clip["moments"] = Moments.of(mel)  # from the float32 mel, before it is stored as float16
        if self.stash_dir is None:
            clip["mel"] = mel.astype(np.float16)
        else:
            clip["mel_path"] = C.stash_mel(self.stash_dir, clip["id"], mel)
        yield clip


class MeasureClips(beam.PTransform):
    """Rows -> clips with normalised text, ids, lengths and mel; bad clips -> `rejected`."""

    def __init__(self, cfg: PreprocessConfig, stash_dir: str | None = None, progress_dir: str | None = None):
        super().__init__()
        self.cfg, self.stash_dir, self.progress_dir = cfg, stash_dir, progress_dir

    def expand(self, rows):
        return rows | "Measure" >> beam.ParDo(_MeasureFn(self.cfg, self.stash_dir, self.progress_dir)).with_outputs(
            REJECTED, main="clips")


# -- stage 4: statistics -----------------------------------------------------------------------
class _HistogramsFn(beam.CombineFn):
    """Exact value->count histograms of the three lengths; merges are Counter sums."""

    def create_accumulator(self):
        return {k: Counter() for k in LENGTH_KEYS}

    def add_input(self, acc, clip):
        for k in LENGTH_KEYS:
            acc[k][clip[k]] += 1
        return acc

    def merge_accumulators(self, accs):
        out = self.create_accumulator()
        for a in accs:
            for k in LENGTH_KEYS:
                out[k].update(a[k])
        return out

    def extract_output(self, acc):
        return {k: dict(v) for k, v in acc.items()}


class LengthHistograms(beam.PTransform):
    def expand(self, clips):
        return clips | "Histograms" >> beam.CombineGlobally(_HistogramsFn())


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
    """Per-bin mean/std over the valid frames of the training split (for normalisation)."""

    def __init__(self, n_mels: int):
        super().__init__()
        self.n_mels = n_mels

    def expand(self, clips):
        return (clips
                | "TrainOnly" >> beam.Filter(lambda c: c["split"] == "train")
                | "Mel" >> beam.Map(lambda c: c["moments"])
                | "Moments" >> beam.CombineGlobally(_MomentsFn(self.n_mels)))


def cutoffs_from(hists: dict, cfg: PreprocessConfig) -> Cutoffs | None:
    if not hists["mel_frames"]:
        return None
    f = cfg.filter
    return compute_cutoffs(hists, f.min_duration_s, f.mel_frames_lower_percentile,
                           f.mel_frames_upper_percentile, f.text_len_upper_percentile, cfg.pad.multiple)


# -- stage 5: filter ---------------------------------------------------------------------------
def _filter(clip: dict, cutoffs: Cutoffs):
    reason = cutoffs.reason(clip["text_len"], clip["mel_frames"], clip["duration_ms"])
    if reason is None:
        yield clip
        return
    _count(reason)
    detail = (f"text_len={clip['text_len']} mel_frames={clip['mel_frames']} duration_ms={clip['duration_ms']}; "
              f"kept: duration_ms>={cutoffs.min_duration_ms}, "
              f"{cutoffs.min_mel_frames}<=mel_frames<={cutoffs.max_mel_frames}, text_len<={cutoffs.max_text_len}")
    yield beam.pvalue.TaggedOutput(REJECTED, {"id": clip["id"], "reason": reason, "detail": detail})


class FilterByPercentiles(beam.PTransform):
    """Drop (never truncate) clips outside the percentile cut-offs, which arrive as a side input."""

    def __init__(self, cutoffs):
        super().__init__()
        self.cutoffs = cutoffs

    def expand(self, clips):
        return clips | "Filter" >> beam.FlatMap(_filter, beam.pvalue.AsSingleton(self.cutoffs)).with_outputs(
            REJECTED, main="kept")


# -- stage 3 (mel) + 7 (split) ---------------------------------------------------------------
def split_of(clip_id: str, val_fraction: float, salt: str) -> str:
    """Deterministic: the same id lands in the same split on every run and every worker."""
    h = hashlib.sha256(f"{salt}:{clip_id}".encode("utf-8")).digest()
    return "val" if int.from_bytes(h[:8], "big") / 2.0 ** 64 < val_fraction else "train"


class _LoadMelFn(beam.DoFn):
    def __init__(self, n_mels: int):
        self.n_mels = n_mels

    def process(self, clip):
        if "mel_path" in clip:
            clip = dict(clip, mel=C.load_mel(clip["mel_path"], clip["mel_frames"], self.n_mels))
        _count("mels_loaded")
        yield clip


class ComputeMel(beam.PTransform):
    """Kept clips -> clips holding their mel (float16, unpadded), read back if it was stashed."""

    def __init__(self, cfg: PreprocessConfig):
        super().__init__()
        self.cfg = cfg

    def expand(self, clips):
        return clips | "LoadMel" >> beam.ParDo(_LoadMelFn(self.cfg.mel.n_mels)).with_outputs(main="clips")


# -- stage 6a: length buckets ----------------------------------------------------------------
class _BucketInputsFn(beam.CombineFn):
    """Kept clips -> (mel-frame histogram of the training split, longest kept clip of any split)."""

    def create_accumulator(self):
        return Counter(), 0

    def add_input(self, acc, split_frames):
        split, frames = split_frames
        if split == "train":
            acc[0][frames] += 1
        return acc[0], max(acc[1], frames)

    def merge_accumulators(self, accs):
        accs = list(accs)
        return merge_histograms(a[0] for a in accs), max((a[1] for a in accs), default=0)

    def extract_output(self, acc):
        return dict(acc[0]), acc[1]


class _HistogramFn(beam.CombineFn):
    """value -> count; per key, a bucket's text lengths."""

    def create_accumulator(self):
        return Counter()

    def add_input(self, acc, value):
        acc[value] += 1
        return acc

    def merge_accumulators(self, accs):
        return merge_histograms(accs)

    def extract_output(self, acc):
        return dict(acc)


class ChooseBuckets(beam.PTransform):
    """Measured clips + cut-offs -> {"buckets": bounds and plan, "text": (bucket, text-length histogram)}.

    Reads the measured clips (with the filter's own rule, `bucketing.kept`), not the filter's output:
    the bounds are then ready before any mel is computed, and the runner need not hold every clip's
    mel until they are (a side input derived from the filter's output would force that).
    """

    def __init__(self, cutoffs, cfg: PreprocessConfig):
        super().__init__()
        self.cutoffs, self.cfg = cutoffs, cfg

    def expand(self, clips):
        cfg, cutoffs = self.cfg, beam.pvalue.AsSingleton(self.cutoffs)
        kept = clips | "Kept" >> beam.Filter(B.kept, cutoffs)
        inputs = (kept
                  | "SplitFrames" >> beam.Map(lambda c: (split_of(c["id"], cfg.split.val_fraction, cfg.split.salt),
                                                          c["mel_frames"]))
                  | "TrainHistogram" >> beam.CombineGlobally(_BucketInputsFn()))
        buckets = inputs | "Bounds" >> beam.Map(lambda x: B.choose(x[0], x[1], cfg.pad))
        text = (kept
                | "ByBucket" >> beam.Map(lambda c, b: (B.bucket_of(c, b), c["text_len"]),
                                         beam.pvalue.AsSingleton(buckets))
                | "TextPerBucket" >> beam.CombinePerKey(_HistogramFn()))
        return {"buckets": buckets, "text": text, "train_hist": inputs | "TrainOnly" >> beam.Map(lambda x: x[0])}


# -- stage 6: pad + encode ---------------------------------------------------------------------
def pad_to(x: np.ndarray, length: int, value) -> np.ndarray:
    """Pad axis 0 to `length` with `value`; longer input is a bug (the filter guarantees it fits)."""
    if len(x) > length:
        raise ValueError(f"cannot pad {len(x)} to {length}: the filter should have dropped this clip")
    pad = [(0, length - len(x))] + [(0, 0)] * (x.ndim - 1)
    return np.pad(x, pad, constant_values=value)


def encode_clip(clip: dict, buckets: dict, text_hists: dict, cfg: PreprocessConfig) -> tuple[str, int, str, bytes]:
    """Clip -> (split, bucket, id, Example bytes) padded to its bucket's shapes."""
    b = B.bucket_of(clip, buckets)
    mel_frames = buckets["bounds"][b]
    text_len = B.text_len_of(text_hists, b, cfg.pad.multiple)
    features = Schema.feature_table(text_len, mel_frames, cfg.mel.n_mels)
    pad_value = mel_params(cfg.mel).pad_value
    values = {
        "id": clip["id"], "speaker": clip["speaker"], "text": clip["text"],
        "text_ids": pad_to(np.asarray(clip["text_ids"], np.int32), text_len, 0),
        "text_len": clip["text_len"],
        "mel": pad_to(clip["mel"], mel_frames, pad_value),
        "mel_len": clip["mel"].shape[0],
    }
    return clip["split"], b, clip["id"], encode_example(features, values)


class PadAndEncode(beam.PTransform):
    """Each clip padded to its bucket's shapes; buckets and text histograms arrive as side inputs."""

    def __init__(self, buckets, text, cfg: PreprocessConfig):
        super().__init__()
        self.buckets, self.text, self.cfg = buckets, text, cfg

    def expand(self, clips):
        return clips | "Encode" >> beam.Map(encode_clip, beam.pvalue.AsSingleton(self.buckets),
                                            beam.pvalue.AsDict(self.text), self.cfg)


def mel_stash_dir(out_dir: str) -> str | None:
    """Where mels wait for the cut-offs: the output's temp dir, emptied by the report stage."""
    return FileSystems.join(out_dir, TEMP_DIR)


# -- the job -----------------------------------------------------------------------------------
def build(p: beam.Pipeline, corpus: Corpus, out_dir: str, cfg: PreprocessConfig, progress: bool = False):
    """Wire every stage; returns the PCollection holding the schema.json path once it is written.

    progress: workers also write their row counts under the output's temp dir (for a local run's
    progress line; on Dataflow the counters show it).
    """
    read = p | "Read" >> ReadCorpus(corpus)
    unique = read["rows"] | "Dedupe" >> DropDuplicateIds()
    measured = unique.rows | "Measure" >> MeasureClips(
        cfg, mel_stash_dir(out_dir), FileSystems.join(out_dir, TEMP_DIR) if progress else None)
    before = measured.clips | "StatsBefore" >> LengthHistograms()
    cutoffs = before | "Cutoffs" >> beam.Map(cutoffs_from, cfg)
    filtered = measured.clips | "FilterByPercentiles" >> FilterByPercentiles(cutoffs)
    after = filtered.kept | "StatsAfter" >> LengthHistograms()
    chosen = measured.clips | "ChooseBuckets" >> ChooseBuckets(cutoffs, cfg)
    featurized = filtered.kept | "ComputeMel" >> ComputeMel(cfg)
    moments = featurized.clips | "MelStats" >> MelStatistics(cfg.mel.n_mels)
    shards = (featurized.clips
              | "PadAndEncode" >> PadAndEncode(chosen["buckets"], chosen["text"], cfg)
              | "WriteShards" >> WriteShards(out_dir, cfg.write.target_shard_mb))

    rejected = ((read[REJECTED], unique[REJECTED], measured[REJECTED], filtered[REJECTED])
                | "AllRejected" >> beam.Flatten())
    rejected_files = (rejected
                      | "ToJson" >> beam.Map(lambda r: json.dumps(r, sort_keys=True))
                      | "WriteRejected" >> beam.io.WriteToText(
                          beam.io.filesystems.FileSystems.join(out_dir, REJECTED_FILE),
                          shard_name_template="", num_shards=1))
    reasons = (rejected | "Reason" >> beam.Map(lambda r: r["reason"])
               | "CountReasons" >> beam.combiners.Count.PerElement())
    input_rows = ((read["rows"], read[REJECTED]) | "AllRows" >> beam.Flatten()
                  | "CountRows" >> beam.combiners.Count.Globally())
    return {"input_rows": input_rows, "before": before, "after": after, "cutoffs": cutoffs,
            "reasons": reasons, "shards": shards, "moments": moments, "buckets": chosen["buckets"],
            "text": chosen["text"], "train_hist": chosen["train_hist"],
            "rejected_files": rejected_files} | "Report" >> WriteReport(out_dir, cfg)
