"""Statistics of the per-frame features (pitch, energy): exact mean and standard deviation, global, per
speaker and per language, and each speaker's pitch percentiles. Pure functions on plain values; the
writer (`filter_and_write.FilterAndWrite`) gives one batch's share per group (`batch_stats`, from each
clip's summary, `melshards.preprocess.clip.features.clip_summary`), the shares
of a group are summed where its key lands (`add_group`) and reduced there to what stats.json and
schema.json keep of it (`finish_group`: a fixed size per speaker, however many frames it has), and the
reductions gathered (`add_finished`).

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

from melshards.preprocess.clip.features import VECTOR
from melshards.shards_schema.stats import Moments, summarize

STAT_FEATURES = ("pitch", "energy")


def _merge_into(acc: dict, summary: dict) -> None:
    for name in STAT_FEATURES:
        if name in summary:
            acc[name] = acc.get(name, Moments.empty(1)).merge(summary[name])
    if "pitch_hz" in summary:
        acc.setdefault("pitch_hz", Counter()).update(summary["pitch_hz"])
    for name, m in summary.items():
        if name.startswith(VECTOR):
            acc[name] = acc[name].merge(m) if name in acc else m


def group_keys(clip: dict) -> tuple[tuple, ...]:
    """The groups a clip's frames count in: the corpus, its speaker and its language."""
    return (("global", ""), ("speaker", clip["speaker"]), ("language", clip["language"]))


def batch_stats(clips_and_summaries) -> dict:
    """[(kept clip with its split, clip_summary)] -> {(kind, name): {split: merged summary}}."""
    out: dict = {}
    for clip, summary in clips_and_summaries:
        if summary:
            for key in group_keys(clip):
                _merge_into(out.setdefault(key, {}).setdefault(clip["split"], {}), summary)
    return out


def add_group(acc: dict, part: dict) -> dict:
    """One group's {split: summary} added into `acc`, in place (the part is not changed); returns `acc`."""
    for split, summary in part.items():
        _merge_into(acc.setdefault(split, {}), summary)
    return acc


def merge(parts) -> dict:
    """Several `batch_stats` results -> one (a new dict; the parts are not changed)."""
    out: dict = {}
    for part in parts:
        for key, group in part.items():
            add_group(out.setdefault(key, {}), group)
    return out


def moments_record(m: Moments) -> dict:
    """{mean, std, frames} of a 1-dim Moments; mean and std None without frames."""
    if m.n == 0:
        return {"mean": None, "std": None, "frames": 0}
    return {"mean": round(float(m.mean[0]), 6), "std": round(float(m.std()[0]), 6), "frames": int(m.n)}


def _record(summary: dict, features: tuple[str, ...]) -> dict:
    return {name: moments_record(summary.get(name, Moments.empty(1))) for name in features}


def _of_group(group: dict) -> dict:
    """A group's summary: its training clips', or its validation clips' where it has no training frames."""
    train = group.get("train", {})
    if any(train.get(f, Moments.empty(1)).n for f in STAT_FEATURES):
        return train
    return group.get("val", {})


def centroids(group: dict) -> dict[str, list[float]]:
    """A speaker's centroid of each vector output: the mean of its training clips' vectors, or of its
    validation clips' where it has no training clip (a held-out speaker), rounded to 6 decimals."""
    train, val = group.get("train", {}), group.get("val", {})
    names = sorted({k for k in (*train, *val) if k.startswith(VECTOR)})
    out = {}
    for key in names:
        m = train[key] if key in train else val[key]
        out[key[len(VECTOR) :]] = [round(float(x), 6) for x in m.mean]
    return out


def empty_finished(features: tuple[str, ...]) -> dict:
    """`finish` of no group: {"global": {feature: {mean, std, frames}}, "speakers": {name: ...},
    "languages": {code: ...}, "pitch_percentiles": {speaker: summarize(Hz histogram)}, "centroids":
    {speaker: {vector output: mean}}}, each empty (the global records without frames)."""
    features = tuple(f for f in STAT_FEATURES if f in features)
    return {"global": _record({}, features), "speakers": {}, "languages": {}, "pitch_percentiles": {}, "centroids": {}}


def finish_group(item: tuple[tuple, dict], features: tuple[str, ...]) -> dict:
    """A group's summed {split: summary} -> its share of `empty_finished`'s dict, for the `features` (of
    STAT_FEATURES) the run computes: the corpus's training clips' records; a language's records; a
    speaker's records, centroids and (with pitch) pitch percentiles."""
    (kind, name), group = item
    features = tuple(f for f in STAT_FEATURES if f in features)
    out: dict = {}
    if kind == "global":
        out["global"] = _record(group.get("train", {}), features)
    elif kind == "language":
        out["languages"] = {name: _record(_of_group(group), features)}
    else:
        out["speakers"] = {name: _record(_of_group(group), features)}
        out["centroids"] = {name: centroids(group)}
        if "pitch" in features:
            out["pitch_percentiles"] = {name: summarize(_of_group(group).get("pitch_hz", {}))}
    return out


def add_finished(acc: dict, part: dict) -> dict:
    """A share of `empty_finished`'s dict (`finish_group`) added into `acc`, in place; returns `acc`."""
    for field, found in part.items():
        if field == "global":
            acc["global"] = found
        else:
            acc[field].update(found)
    return acc


def finish(acc: dict, features: tuple[str, ...]) -> dict:
    """The merged groups (`merge`) -> `empty_finished`'s dict with every group's `finish_group`, names in
    order."""
    out = empty_finished(features)
    for item in sorted(acc.items()):
        add_finished(out, finish_group(item, features))
    return out
