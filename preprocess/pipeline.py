"""The preprocessing job: corpus -> log-mel once -> percentile statistics -> filter -> pad -> shards.

One composite PTransform per stage, each with a labelled expand(); global statistics reach later
stages as side inputs. `build(p, ...)` wires the stages; `melshards.preprocess.run.run_job` checks an invocation and runs them.
"""
from __future__ import annotations

import atexit
import functools
import gc
import hashlib
import logging
import time
import uuid
from collections import Counter

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from melshards.preprocess import bucketing as B
from melshards.preprocess import clips as C
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.corpus import INPUT_ROWS, REJECTED, Corpus, ReadCorpus
from melshards.preprocess.report import WriteReport, mel_params
from melshards.preprocess.shards import TEMP_DIR, AssembleShards, RollingFiles
from melshards.shards_schema.stats import LENGTH_KEYS, Cutoffs, Moments, compute_cutoffs, merge_histograms
from melshards.shards_schema import Schema, Vocabulary
from melshards.shards_schema.records import encode_example

log = logging.getLogger("melshards.preprocess")
NS = "melshards"


def _count(name: str, n: int = 1) -> None:
    Metrics.counter(NS, name).inc(n)


@functools.cache  # once per process
def _freeze_heap_at_exit() -> None:
    atexit.register(gc.freeze)


def _worker_setup() -> None:
    """In each worker (DoFn.setup): one BLAS thread, and no walk of the heap at exit.

    A worker's interpreter spends ~0.45 s at exit in its last garbage collections over librosa,
    numba and Beam (measured), and the local runner stops its workers one after the other. The
    hook runs only when the process ends, so a long-lived (Dataflow) worker is unaffected.
    """
    _one_blas_thread()
    _freeze_heap_at_exit()


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

    def add(self, rows: int) -> None:
        self.rows += rows
        if time.monotonic() - self.written_at >= _PROGRESS_EVERY_S:
            self.flush()

    def flush(self) -> None:
        tmp = self.path + ".writing"  # then renamed: the reader never sees a half-written count
        with FileSystems.create(tmp) as f:
            f.write(str(self.rows).encode())
        FileSystems.rename([tmp], [self.path])
        self.written_at = time.monotonic()


# -- stages 2-3: per clip, a batch at a time ---------------------------------------------------
@beam.typehints.with_output_types(dict)  # declared: inferring it would import librosa into the launcher
class _MeasureFn(beam.DoFn):
    """Batch of rows -> {"clips": [clip with text, lengths, split, the mel's moments, its place in the
    stash], "stash": path}; bad clips -> `rejected`.

    Each clip is decoded, resampled and trimmed once, here, and its mel computed from it. The mels
    cross the statistics barrier in one temp file per batch (float16, unpadded, concatenated).
    """

    def __init__(self, cfg: PreprocessConfig, stash_dir: str, progress_dir: str | None = None):
        self.cfg, self.stash_dir, self.progress_dir = cfg, stash_dir, progress_dir

    def setup(self):
        _worker_setup()
        self.vocab = Vocabulary()
        self.progress = _ProgressFile(self.progress_dir) if self.progress_dir else None

    def finish_bundle(self):
        if self.progress:
            self.progress.flush()

    def process(self, rows):
        clips, mels = [], []
        for row in rows:
            _count("rows_measured")  # with the per-reason counters, the job's progress on Dataflow
            try:
                clip = C.featurize(row, self.cfg, self.vocab)
            except C.ClipRejected as e:
                _count(e.reason)
                yield beam.pvalue.TaggedOutput(REJECTED, C.as_rejection(row["id"], e))
                continue
            Metrics.distribution(NS, "mel_frames").update(clip["mel_frames"])
            mel = clip.pop("mel")
            clip["split"] = split_of(clip["id"], self.cfg.split.val_fraction, self.cfg.split.salt)
            clip["moments"] = Moments.of(mel)  # from the float32 mel, before it is stored as float16
            clips.append(clip)
            mels.append(mel)
        if self.progress:
            self.progress.add(len(rows))
        Metrics.counter(NS, "clips_measured").inc(len(clips))
        stash = C.stash_mels(self.stash_dir, [c["id"] for c in clips], mels) if clips else None
        yield {"clips": clips, "stash": stash}


class MeasureClips(beam.PTransform):
    """Batches of rows -> batches of clips with normalised text, ids, lengths and stashed mels;
    bad clips -> `rejected`."""

    def __init__(self, cfg: PreprocessConfig, stash_dir: str, progress_dir: str | None = None):
        super().__init__()
        self.cfg, self.stash_dir, self.progress_dir = cfg, stash_dir, progress_dir

    def expand(self, batches):
        return batches | "Measure" >> beam.ParDo(_MeasureFn(self.cfg, self.stash_dir, self.progress_dir)).with_outputs(
            REJECTED, main="clips")


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


def cutoffs_from(hists: dict, cfg: PreprocessConfig) -> Cutoffs | None:
    if not hists["mel_frames"]:
        return None
    f = cfg.filter
    return compute_cutoffs(hists, f.min_duration_s, f.mel_frames_lower_percentile,
                           f.mel_frames_upper_percentile, f.text_len_upper_percentile, cfg.pad.multiple)


# -- stage 5: filter ---------------------------------------------------------------------------
def filter_reason(clip: dict, cutoffs: Cutoffs | None) -> dict | None:
    """None if the percentile filter keeps the clip, else its rejected.jsonl entry (never truncated)."""
    reason = cutoffs.reason(clip["text_len"], clip["mel_frames"], clip["duration_ms"])
    if reason is None:
        return None
    detail = (f"text_len={clip['text_len']} mel_frames={clip['mel_frames']} duration_ms={clip['duration_ms']}; "
              f"kept: duration_ms>={cutoffs.min_duration_ms}, "
              f"{cutoffs.min_mel_frames}<=mel_frames<={cutoffs.max_mel_frames}, text_len<={cutoffs.max_text_len}")
    return {"id": clip["id"], "reason": reason, "detail": detail}


# -- stage 3 (mel) + 7 (split) ---------------------------------------------------------------
def split_of(clip_id: str, val_fraction: float, salt: str) -> str:
    """Deterministic: the same id lands in the same split on every run and every worker."""
    h = hashlib.sha256(f"{salt}:{clip_id}".encode("utf-8")).digest()
    return "val" if int.from_bytes(h[:8], "big") / 2.0 ** 64 < val_fraction else "train"


# -- stage 6a: length buckets ----------------------------------------------------------------
def kept_summary(batch: dict, cutoffs: Cutoffs | None) -> dict:
    """One batch's share of what the buckets and the after-filter report need: the three length
    histograms of its kept clips, the mel-frame histogram of its kept training clips, and the
    text lengths of its kept clips per mel-frame count (each bucket's text length follows from it
    once the bounds are known)."""
    kept = [c for c in batch["clips"] if B.kept(c, cutoffs)]
    return {"after": length_histograms(kept),
            "train": Counter(c["mel_frames"] for c in kept if c["split"] == "train"),
            "text_by_frames": Counter((c["mel_frames"], c["text_len"]) for c in kept)}


class _KeptSummaryFn(beam.CombineFn):
    def create_accumulator(self):
        return {"after": length_histograms(()), "train": Counter(), "text_by_frames": Counter()}

    def add_input(self, acc, summary):
        return self.merge_accumulators([acc, summary])

    def merge_accumulators(self, accs):
        accs = list(accs)
        return {"after": merge_lengths(a["after"] for a in accs),
                "train": merge_histograms(a["train"] for a in accs),
                "text_by_frames": merge_histograms(a["text_by_frames"] for a in accs)}

    def extract_output(self, acc):
        return acc


def plan_buckets(summary: dict, pad) -> dict:
    """The summed kept-clip summary -> {"buckets": bounds and plan (None without clips), "text":
    {bucket: text-length histogram}, "after": after-filter histograms, "train_hist": kept training
    clips' mel frames}: everything the writer and the report need, as one side input."""
    after = {k: dict(v) for k, v in summary["after"].items()}
    longest = max(after["mel_frames"], default=0)
    buckets = B.choose(dict(summary["train"]), longest, pad)
    text: dict[int, Counter] = {}
    for (frames, text_len), n in (summary["text_by_frames"].items() if buckets else ()):
        text.setdefault(B.bucket_index(frames, buckets["bounds"]), Counter())[text_len] += n
    return {"buckets": buckets, "text": {b: dict(h) for b, h in text.items()}, "after": after,
            "train_hist": dict(summary["train"])}


class ChooseBuckets(beam.PTransform):
    """Measured batches + cut-offs -> one element, `plan_buckets`' dict.

    Reads the measured clips with the filter's own rule (`bucketing.kept`), not the filter's output:
    the bounds are then ready before any mel is read back, so the filter, padding and writing run
    in one pass over the stashed mels.
    """

    def __init__(self, cutoffs, cfg: PreprocessConfig):
        super().__init__()
        self.cutoffs, self.cfg = cutoffs, cfg

    def expand(self, batches):
        return (batches
                | "Kept" >> beam.Map(kept_summary, beam.pvalue.AsSingleton(self.cutoffs))
                | "Summary" >> beam.CombineGlobally(_KeptSummaryFn()).without_defaults()  # >= 1 batch
                | "Bounds" >> beam.Map(plan_buckets, self.cfg.pad))


# -- stage 6: pad + encode ---------------------------------------------------------------------
def pad_to(x: np.ndarray, length: int, value) -> np.ndarray:
    """Pad axis 0 to `length` with `value`; longer input is a bug (the filter guarantees it fits)."""
    if len(x) > length:
        raise ValueError(f"cannot pad {len(x)} to {length}: the filter should have dropped this clip")
    pad = [(0, length - len(x))] + [(0, 0)] * (x.ndim - 1)
    return np.pad(x, pad, constant_values=value)


def encode_clip(clip: dict, mel: np.ndarray, buckets: dict, text_hists: dict,
                cfg: PreprocessConfig) -> tuple[str, int, bytes]:
    """Clip and its unpadded mel -> (split, bucket, Example bytes) padded to its bucket's shapes."""
    b = B.bucket_of(clip, buckets)
    mel_frames = buckets["bounds"][b]
    text_len = B.text_len_of(text_hists, b, cfg.pad.multiple)
    features = Schema.feature_table(text_len, mel_frames, cfg.mel.n_mels)
    values = {
        "id": clip["id"], "speaker": clip["speaker"], "text": clip["text"],
        "text_ids": pad_to(np.asarray(clip["text_ids"], np.int32), text_len, 0),
        "text_len": clip["text_len"],
        "mel": pad_to(mel, mel_frames, mel_params(cfg.mel).pad_value),
        "mel_len": mel.shape[0],
    }
    return clip["split"], b, encode_example(features, values)


MOMENTS = "moments"


class _FilterAndWriteFn(beam.DoFn):
    """Batch of clips -> kept clips padded, encoded and appended to temp TFRecord files (one per split
    and bucket, rolled at the target size); one dict per closed file at the end of the bundle.

    Dropped clips -> `rejected`; the training clips' mel moments, one per batch -> `moments`. Each
    batch's mels are read back from its stash file once.
    """

    def __init__(self, out_dir: str, target_bytes: int, cfg: PreprocessConfig):
        self.out_dir, self.target, self.cfg = out_dir, target_bytes, cfg

    def setup(self):
        _worker_setup()

    def start_bundle(self):
        self.files = RollingFiles(self.out_dir, self.target)

    def process(self, batch, cutoffs, plan):
        buckets, text = plan["buckets"], plan["text"]
        kept = []
        for clip in batch["clips"]:
            rejection = filter_reason(clip, cutoffs)
            if rejection:
                _count(rejection["reason"])
                yield beam.pvalue.TaggedOutput(REJECTED, rejection)
            else:
                kept.append(clip)
        moments = Moments.empty(self.cfg.mel.n_mels)
        mels = C.load_mels(batch["stash"], [c["mel_frames"] for c in batch["clips"]],
                           self.cfg.mel.n_mels) if kept else []
        by_id = dict(zip((c["id"] for c in batch["clips"]), mels))
        for clip in kept:
            split, bucket, data = encode_clip(clip, by_id[clip["id"]], buckets, text, self.cfg)
            yield from self.files.write(split, bucket, data)
            if split == "train":
                moments = moments.merge(clip["moments"])
        _count("records_written", len(kept))
        yield beam.pvalue.TaggedOutput(MOMENTS, moments)

    def finish_bundle(self):
        for part in self.files.close_all():
            yield WindowedValue(part, 0, [GlobalWindow()])


class FilterAndWrite(beam.PTransform):
    """Drop (never truncate) clips outside the percentile cut-offs, pad the rest to their bucket's
    shapes and write them; the cut-offs and the buckets (`plan_buckets`) arrive as side inputs.

    Returns {"parts": temp files written, "rejected": dropped clips, "moments": mel moments of each
    batch's kept training clips (one per batch, maybe empty)}.
    """

    def __init__(self, cutoffs, plan, out_dir: str, cfg: PreprocessConfig):
        super().__init__()
        self.cutoffs, self.plan, self.out_dir, self.cfg = cutoffs, plan, out_dir, cfg

    def expand(self, batches):
        S = beam.pvalue
        return batches | "FilterPadWrite" >> beam.ParDo(
            _FilterAndWriteFn(self.out_dir, int(self.cfg.write.target_shard_mb * 1e6), self.cfg),
            S.AsSingleton(self.cutoffs), S.AsSingleton(self.plan)).with_outputs(REJECTED, MOMENTS, main="parts")


def mel_stash_dir(out_dir: str) -> str:
    """Where mels wait for the cut-offs: the output's temp dir, emptied by the report stage."""
    return FileSystems.join(out_dir, TEMP_DIR)


# -- the job -----------------------------------------------------------------------------------
def build(p: beam.Pipeline, corpus: Corpus, out_dir: str, cfg: PreprocessConfig, progress: bool = False):
    """Wire every stage; returns the PCollection holding the schema.json path once it is written.

    Elements are batches of rows/clips (corpus.batch_rows): the per-element cost of a runner is
    paid per batch. progress: workers also write their row counts under the output's temp dir (for
    a local run's progress line; on Dataflow the counters show it).
    """
    read = p | "Read" >> ReadCorpus(corpus)
    measured = read["batches"] | "Measure" >> MeasureClips(
        cfg, mel_stash_dir(out_dir), FileSystems.join(out_dir, TEMP_DIR) if progress else None)
    before = measured.clips | "StatsBefore" >> LengthHistograms()
    cutoffs = before | "Cutoffs" >> beam.Map(cutoffs_from, cfg)
    plan = measured.clips | "ChooseBuckets" >> ChooseBuckets(cutoffs, cfg)
    written = measured.clips | "FilterAndWrite" >> FilterAndWrite(cutoffs, plan, out_dir, cfg)
    moments = written[MOMENTS] | "MelStats" >> MelStatistics(cfg.mel.n_mels)
    shards = written.parts | "Shards" >> AssembleShards(out_dir, cfg.write.target_shard_mb)
    rejected = ((read[REJECTED], measured[REJECTED], written[REJECTED]) | "AllRejected" >> beam.Flatten())
    return {"input_rows": read[INPUT_ROWS], "before": before, "cutoffs": cutoffs, "plan": plan,
            "rejected": rejected, "shards": shards, "moments": moments} | "Report" >> WriteReport(out_dir, cfg)
