"""Statistics of the per-frame features (pitch, energy): exact mean and standard deviation, global, per
speaker and per language, and each speaker's pitch percentiles. Pure functions on plain values; the
writer (`filter_and_write.FilterAndWrite`) sums one batch's share, a CombineFn merges the batches.

- **Which frames.** Pitch over voiced frames only (f0 > 0: an unvoiced 0 is not a low pitch); energy
  over every valid frame. Padding never counts (the clips are unpadded here).
- **Which clips.** The kept clips of the training split, as for the mel statistics: normalisation
  must not see validation data. A group with no training clips (a speaker held out whole in
  `split.val_speakers`, or its language) is described by its validation clips instead, so every
  speaker and language of the schema has statistics to normalise with.
- **Exact and mergeable.** Moments merge with Chan et al.'s formula (`shards_schema.stats.Moments`),
  in float64, in any order. Pitch percentiles come from a histogram of f0 rounded to the nearest Hz:
  exact on those values, and its size is the number of distinct Hz, not of frames.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from melshards.shards_schema.stats import Moments, summarize

STAT_FEATURES = ("pitch", "energy")


VECTOR = "vector:"  # a summary's key prefix for an extractor's vector output (its sum, for the centroids)


def clip_summary(arrays: dict, vectors: tuple[str, ...] = ()) -> dict:
    """One clip's unpadded features -> {feature: Moments (dim 1)} and `pitch_hz` (Hz -> voiced frames);
    each of the extractors' `vectors` as Moments of one observation (`VECTOR` + name)."""
    out: dict = {}
    for name in vectors:
        if name in arrays:
            out[VECTOR + name] = Moments.of(np.asarray(arrays[name], np.float64)[None, :])
    if "pitch" in arrays:
        f0 = np.asarray(arrays["pitch"], np.float64)
        voiced = f0[f0 > 0]
        out["pitch"] = Moments.of(voiced[:, None]) if voiced.size else Moments.empty(1)
        out["pitch_hz"] = Counter(np.rint(voiced).astype(np.int64).tolist())
    if "energy" in arrays:
        out["energy"] = Moments.of(np.asarray(arrays["energy"], np.float64)[:, None])
    return out


def _merge_into(acc: dict, summary: dict) -> None:
    for name in STAT_FEATURES:
        if name in summary:
            acc[name] = acc.get(name, Moments.empty(1)).merge(summary[name])
    if "pitch_hz" in summary:
        acc.setdefault("pitch_hz", Counter()).update(summary["pitch_hz"])
    for name, m in summary.items():
        if name.startswith(VECTOR):
            acc[name] = acc[name].merge(m) if name in acc else m


def group_keys(clip: dict, split: str) -> tuple[tuple, ...]:
    """The groups a clip's frames count in: the corpus, its speaker and its language, each per split."""
    return (("global", "", split), ("speaker", clip["speaker"], split), ("language", clip["language"], split))


def batch_stats(clips_and_summaries) -> dict:
    """[(kept clip with its split, clip_summary)] -> {group key: merged summary}."""
    out: dict = {}
    for clip, summary in clips_and_summaries:
        if summary:
            for key in group_keys(clip, clip["split"]):
                _merge_into(out.setdefault(key, {}), summary)
    return out


def merge(parts) -> dict:
    """Several `batch_stats` results -> one (a new dict; the parts are not changed)."""
    out: dict = {}
    for part in parts:
        for key, summary in part.items():
            _merge_into(out.setdefault(key, {}), summary)
    return out


def moments_record(m: Moments) -> dict:
    """{mean, std, frames} of a 1-dim Moments; mean and std None without frames."""
    if m.n == 0:
        return {"mean": None, "std": None, "frames": 0}
    return {"mean": round(float(m.mean[0]), 6), "std": round(float(m.std()[0]), 6), "frames": int(m.n)}


def _record(summary: dict, features: tuple[str, ...]) -> dict:
    return {name: moments_record(summary.get(name, Moments.empty(1))) for name in features}


def _of_group(acc: dict, kind: str, name: str) -> dict:
    """A group's summary: its training clips', or its validation clips' where it has no training frames."""
    train = acc.get((kind, name, "train"), {})
    if any(train.get(f, Moments.empty(1)).n for f in STAT_FEATURES):
        return train
    return acc.get((kind, name, "val"), {})


def centroids(acc: dict, speaker: str) -> dict[str, list[float]]:
    """A speaker's centroid of each vector output: the mean of its training clips' vectors, or of its
    validation clips' where it has no training clip (a held-out speaker), rounded to 6 decimals."""
    train, val = acc.get(("speaker", speaker, "train"), {}), acc.get(("speaker", speaker, "val"), {})
    names = sorted({k for k in (*train, *val) if k.startswith(VECTOR)})
    out = {}
    for key in names:
        m = train[key] if key in train else val[key]
        out[key[len(VECTOR) :]] = [round(float(x), 6) for x in m.mean]
    return out


def finish(acc: dict, features: tuple[str, ...]) -> dict:
    """The merged groups -> {"global": {feature: {mean, std, frames}}, "speakers": {name: ...},
    "languages": {code: ...}, "pitch_percentiles": {speaker: summarize(Hz histogram)}, "centroids":
    {speaker: {vector output: mean}}} for the `features` (of STAT_FEATURES) the run computes."""
    features = tuple(f for f in STAT_FEATURES if f in features)
    names = {kind: sorted({key[1] for key in acc if key[0] == kind}) for kind in ("speaker", "language")}
    out = {
        "global": _record(acc.get(("global", "", "train"), {}), features),
        "speakers": {n: _record(_of_group(acc, "speaker", n), features) for n in names["speaker"]},
        "languages": {n: _record(_of_group(acc, "language", n), features) for n in names["language"]},
        "pitch_percentiles": {},
    }
    out["centroids"] = {n: centroids(acc, n) for n in names["speaker"]}
    if "pitch" in features:
        out["pitch_percentiles"] = {
            n: summarize(_of_group(acc, "speaker", n).get("pitch_hz", {})) for n in names["speaker"]
        }
    return out
