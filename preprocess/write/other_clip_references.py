"""other_clip references (config `reference: source: other_clip`; same_clip references are cut at read time
by `melshards.train.references`): each kept clip gets a slice of another kept clip
of the same speaker, chosen deterministically from `reference.seed`, for zero-shot voice models: one of
its split, or for a validation clip that is its speaker's only one, one of the speaker's training clips
(`choose_references` says the rule).

Two joins, so no worker ever holds a speaker's mels:

1. ids and lengths: every kept clip's (id, mel frames, split, measured batch) grouped by speaker; the pure
   `choose_references` picks each clip's reference clip and slice start, in O(n log n) per speaker;
2. the slices: the requests keyed by the reference clip's measured batch are co-grouped with the measured
   batches; each batch's mels are read once and cut (`cut_reference`), and the slices, keyed by the
   requesting clip's batch, are co-grouped with the batches again for `FilterAndWrite`, which encodes
   them into the records (`reference_id`, `reference_mel`, `reference_len`).

The choice is exact at any corpus size (a group holds ids and lengths, a few dozen bytes per clip)
and the same on a re-run over the same clips.
"""

from __future__ import annotations

import hashlib
import io

import apache_beam as beam
import numpy as np

from melshards.preprocess.clip import cache
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.inputs.read_stage import count
from melshards.preprocess.out_dir import temp_files
from melshards.preprocess.out_dir.batch_files import read_clips
from melshards.preprocess.stats import tables
from melshards.preprocess.stats.filter_rule import filter_rejection
from melshards.preprocess.workers import worker_setup
from melshards.preprocess.write.filter_and_write import analyse_again

OWN_CLIP = "own_clip"  # written_counts' key of the records whose reference is their own clip
NO_REFERENCE = "no_reference_clip"  # the rejection of a clip with no other clip to take (single_clip: reject)
VAL_FROM_TRAIN = "val_from_train"  # written_counts' key of the validation records cut from a training clip


def _draw(seed: int, clip_id: str, what: str, n: int) -> int:
    """A uniform integer in [0, n) from the seed and the clip id (sha256: the same in every process)."""
    digest = hashlib.sha256(f"{seed}:{what}:{clip_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % n


class _Pool:
    """The clips one split of a speaker offers as references, sorted by id: those of at least
    `min_frames` frames, and all of them. `draw` leaves the asking clip out by index arithmetic (no copy
    of the list per clip), so a pool of n clips answers n draws in O(n log n) in all."""

    def __init__(self, clips: list[tuple[str, int]], min_frames: int):
        self.all = sorted(clips)
        self.long = [c for c in self.all if c[1] >= min_frames]
        self.at_all = {c[0]: i for i, c in enumerate(self.all)}
        self.at_long = {c[0]: i for i, c in enumerate(self.long)}

    def draw(self, seed: int, clip_id: str) -> tuple[str, int] | None:
        """A clip drawn uniformly from the long ones other than `clip_id` (from all the others when no
        other is that long); None when the pool holds no other clip."""
        for clips, at in ((self.long, self.at_long), (self.all, self.at_all)):
            mine = at.get(clip_id)
            n = len(clips) - (mine is not None)
            if n:
                k = _draw(seed, clip_id, "clip", n)
                return clips[k if mine is None or k < mine else k + 1]
        return None


def choose_references(
    clips: list[tuple[str, int, str]], seed: int, min_frames: int, frames: int, single_clip: str = OWN_CLIP
) -> dict[str, tuple[str, int] | None]:
    """One speaker's kept clips, (id, mel frames, split) in any order, ids unique -> {id: (reference id,
    first frame of the slice)}.

    A clip's reference is another clip of its split; a validation clip that is its speaker's only one
    takes one of the speaker's training clips (conditioning only: no validation audio reaches training);
    a clip with neither gets its own (None with single_clip "reject"). A training clip never takes a
    validation clip. Within those, the reference is drawn uniformly from the clips of at least
    `min_frames` frames (from all of them when none is that long); the slice start uniformly from
    [0, max(0, its frames - frames)]. Both draws depend only on the seed, the clip's id and the
    speaker's ids, lengths and splits. O(n log n) in the speaker's clips."""
    by_split: dict[str, list[tuple[str, int]]] = {}
    for clip_id, n, split in clips:
        by_split.setdefault(split, []).append((clip_id, n))
    pools = {split: _Pool(members, min_frames) for split, members in by_split.items()}
    training = pools.get("train")
    out: dict[str, tuple[str, int] | None] = {}
    for split, pool in sorted(pools.items()):
        for clip_id, n in pool.all:
            ref = pool.draw(seed, clip_id)
            if ref is None and split == "val" and training is not None:
                ref = training.draw(seed, clip_id)
            if ref is None:
                if single_clip != OWN_CLIP:
                    out[clip_id] = None
                    continue
                ref = (clip_id, n)
            ref_id, ref_frames = ref
            out[clip_id] = (ref_id, _draw(seed, clip_id, "start", max(0, ref_frames - frames) + 1))
    return out


def cut_reference(mel: np.ndarray, start: int, frames: int, pad_value: float) -> tuple[np.ndarray, int]:
    """`frames` frames of `mel` from `start` as float16, padded with `pad_value` past its end; (slice, valid
    frames)."""
    part = mel[start : start + frames]
    out = np.full((frames, mel.shape[1]), pad_value, np.float16)
    out[: len(part)] = part
    return out, len(part)


def reference_of_wav(path: str, schema) -> tuple[np.ndarray, int]:
    """A WAV's reference as a model reading references gets it at synthesis (`melshards synthesize
    --reference`): the project's one log-mel (`clips.analyse_audio`) through the run's front end as
    schema.json records it (`report.front_end`: the rate, the trim, the loudness target, the mel), its
    first `reference_mel` frames as float16, padded; (reference [frames, n_mels], valid frames).
    ClipRejected when the audio is unreadable or silent."""
    from melshards.preprocess.clip.clips import analyse_audio
    from melshards.preprocess.write.report import front_end

    _, arrays = analyse_audio(path, front_end(schema), parts=(cache.MEL,))
    return cut_reference(arrays["mel"].astype("<f2"), 0, schema.reference_frames, schema.mel.pad_value)


def batch_key(batch: dict) -> str:
    """A measured batch's key in the joins: its clips file (one per batch of clips)."""
    return batch["clips"]


def _kept_lengths(batch: dict, cutoffs, corpus_tables: dict, gate, salt: str):
    """(speaker, (id, mel frames, split, batch key)) of each clip of a batch the filter keeps."""
    for clip in read_clips(batch):
        if filter_rejection(clip, cutoffs, corpus_tables, gate) is None:
            split = tables.split_of(clip, corpus_tables, salt)
            yield clip["speaker"], (clip["id"], clip["mel_frames"], split, batch_key(batch))


def _choose(group, cfg: PreprocessConfig):
    """A speaker's group -> (the reference clip's batch, (reference id, start, clip id, clip's batch))
    per clip; (the clip's batch, (None, 0, clip id, clip's batch)) for a refused one."""
    _, members = group
    members = list(members)
    where = {clip_id: key for clip_id, _, _, key in members}
    r = cfg.reference
    min_frames = int(np.ceil(r.min_seconds * cfg.audio.sample_rate / cfg.mel.hop_length))
    chosen = choose_references([m[:3] for m in members], r.seed, min_frames, r.frames, r.single_clip)
    for clip_id, choice in chosen.items():
        if choice is None:
            yield where[clip_id], (None, 0, clip_id, where[clip_id])
        else:
            yield where[choice[0]], (choice[0], choice[1], clip_id, where[clip_id])


def batch_mels(batch: dict, ids: set[str], cfg: PreprocessConfig) -> dict[str, np.ndarray]:
    """The stored (float16) mels of the clips `ids` of a measured batch: from its features file (only the
    mel arrays are read) or the feature cache file the clip names."""
    clips = read_clips(batch)
    out: dict[str, np.ndarray] = {}
    wanted = [(i, c) for i, c in enumerate(clips) if c["id"] in ids]
    in_files = [(i, c) for i, c in wanted if "cached" not in c]
    if in_files:
        with np.load(io.BytesIO(temp_files.read(batch["features"]))) as npz:
            for i, c in in_files:
                out[c["id"]] = npz[f"{i}/mel"]
    from_cache: dict[str, dict] = {}
    for _, c in wanted:
        if "cached" in c:
            where, key = c["cached"]
            found = cache.read_entry(where, key, from_cache)
            if found is None:
                count("cache_recomputed_for_reference")
                found = analyse_again(c, cfg)
            out[c["id"]] = found["mel"].astype("<f2")
    return out


class _CutFn(beam.DoFn):
    """(batch key, {"batch": [batch], "wanted": [requests]}) -> (requesting clip's batch key, (clip id,
    reference id, slice, valid frames, start)) per request; each batch's mels read once."""

    def __init__(self, cfg: PreprocessConfig, pad_value: float):
        self.cfg, self.pad_value = cfg, pad_value

    def setup(self):
        worker_setup()

    def process(self, element):
        _, joined = element
        wanted = list(joined["wanted"])
        if not wanted:
            return
        refused = [w for w in wanted if w[0] is None]
        for _, _, clip_id, key in refused:
            yield key, (clip_id, None, None, 0, 0)
        asked = [w for w in wanted if w[0] is not None]
        if not asked:
            return
        (batch,) = joined["batch"]
        mels = batch_mels(batch, {w[0] for w in asked}, self.cfg)
        for ref_id, start, clip_id, key in asked:
            part, n = cut_reference(mels[ref_id], start, self.cfg.reference.frames, self.pad_value)
            yield key, (clip_id, ref_id, part, n, start)


class AttachReferences(beam.PTransform):
    """Measured batches -> (batch, {clip id: (reference id, slice, valid frames, start) or None when refused}) for
    `FilterAndWrite`; the cut-offs and corpus tables arrive as side inputs (the filter's kept clips)."""

    def __init__(self, cutoffs, corpus_tables, gate, cfg: PreprocessConfig, pad_value: float):
        super().__init__()
        self.cutoffs, self.tables, self.gate, self.cfg, self.pad_value = cutoffs, corpus_tables, gate, cfg, pad_value

    def expand(self, batches):
        S = beam.pvalue
        keyed = batches | "KeyBatches" >> beam.FlatMap(lambda b: [(batch_key(b), b)] if b["clips"] else [])
        wanted = (
            batches
            | "KeptLengths"
            >> beam.FlatMap(
                _kept_lengths,
                S.AsSingleton(self.cutoffs),
                S.AsSingleton(self.tables),
                S.AsSingleton(self.gate),
                self.cfg.split.salt,
            )
            | "BySpeaker" >> beam.GroupByKey()
            | "Choose" >> beam.FlatMap(_choose, self.cfg)
        )
        slices = (
            {"batch": keyed, "wanted": wanted}
            | "JoinReferenceBatches" >> beam.CoGroupByKey()
            | "Cut" >> beam.ParDo(_CutFn(self.cfg, self.pad_value))
        )
        return (
            {"batch": keyed, "refs": slices}
            | "JoinSlices" >> beam.CoGroupByKey()
            | "WithReferences"
            >> beam.Map(
                lambda kv: (kv[1]["batch"][0], {r[0]: (None if r[1] is None else r[1:]) for r in kv[1]["refs"]})
            )
        )
