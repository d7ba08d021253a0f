"""Stage 6a, choosing the length buckets: pure functions the job's Beam steps wrap.

The bounds come from the after-filter mel-frame histogram of the training split (the records that
fill training batches, so `pad.min_bucket_records` = the batch size is a guarantee about them) by
the exact DP in `melshards.shards_schema.buckets`. Validation records use the same bounds; the last bound is
raised, when needed, to fit the longest validation clip. Each bucket's text length is the longest
text among its clips (every split), rounded up (`melshards.shards_schema.buckets.text_bound`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from melshards.preprocess.config import PadConfig
from melshards.shards_schema.buckets import (
    BucketChoice,
    bucket_index,
    choose_buckets,
    fill_buckets,
    padding_by_k,
    text_bound,
)
from melshards.shards_schema.stats import padding_fraction, round_up


def choose(train_hist: Mapping[int, int], longest: int, pad: PadConfig) -> dict[str, Any] | None:
    """The job's buckets: {"bounds", "plan" (`BucketChoice.to_dict()`, stats.json's `buckets.plan`),
    "raised_last_bound"}; None without clips.

    `train_hist`: mel frames -> training clips kept; `longest`: the longest kept clip of any split.
    Without training clips there is one bucket, fitted to the longest clip.
    """
    if longest <= 0:
        return None
    choice: BucketChoice | None = None
    if train_hist:
        choice = choose_buckets(
            dict(train_hist), pad.buckets, pad.max_buckets, pad.target_padding, pad.multiple, pad.min_bucket_records
        )
        bounds = list(choice.bounds)
    else:
        bounds = [round_up(longest, pad.multiple)]
    raised = None
    if longest > bounds[-1]:  # a validation clip is longer than every training clip
        raised = {"from": bounds[-1], "to": round_up(longest, pad.multiple)}
        bounds[-1] = raised["to"]
    return {"bounds": tuple(bounds), "plan": choice.to_dict() if choice else None, "raised_last_bound": raised}


def choose_from_summary(summary: dict, pad: PadConfig) -> dict:
    """The summed kept-clip summary (`choose_buckets.kept_summary`) -> {"buckets": `choose`'s dict (None
    without clips), "text": {bucket: text-length histogram}, "after": after-filter histograms,
    "train_hist": kept training clips' mel frames}: everything the writer and the report need, as one
    side input."""
    after = {k: dict(v) for k, v in summary["after"].items()}
    longest = max(after["mel_frames"], default=0)
    buckets = choose(dict(summary["train"]), longest, pad)
    text: dict[int, Counter] = {}
    for (frames, text_len), n in summary["text_by_frames"].items() if buckets else ():
        text.setdefault(bucket_index(frames, buckets["bounds"]), Counter())[text_len] += n  # type: ignore[index]  # the loop runs only with buckets
    return {
        "buckets": buckets,
        "text": {b: dict(h) for b, h in text.items()},
        "after": after,
        "train_hist": dict(summary["train"]),
    }


def bucket_of(clip: dict, buckets: dict) -> int:
    return bucket_index(clip["mel_frames"], buckets["bounds"])


def text_len_of(text_hists: Mapping[int, Mapping[int, int]], bucket: int, multiple: int) -> int:
    """A bucket's padded text length; a bucket no clip reached gets the smallest (`multiple`)."""
    hist = text_hists.get(bucket)
    return text_bound(max(hist) if hist else 0, multiple)


def text_bounds(text_hists: Mapping[int, Mapping[int, int]], n_buckets: int, multiple: int) -> dict[int, int]:
    return {b: text_len_of(text_hists, b, multiple) for b in range(n_buckets)}


def _padding(hist: Mapping[int, int], bound: int) -> tuple[int, int]:
    """(valid, padded) entries of the clips in `hist` padded to `bound`."""
    return sum(v * c for v, c in hist.items()), sum(hist.values()) * bound


def bucket_stats(
    buckets: dict,
    kept_mel: Mapping[int, int],
    text_hists: Mapping[int, Mapping[int, int]],
    shards: list[dict],
    pad: PadConfig,
    train_hist: Mapping[int, int],
) -> dict[str, Any]:
    """stats.json "buckets": per bucket its shapes, records per split, shards and padding; overall
    padding; the bucket choice (`plan`) with its merges; the padding over K (`what_if`, from the
    training histogram)."""
    bounds = buckets["bounds"]
    texts = text_bounds(text_hists, len(bounds), pad.multiple)
    mel_parts = fill_buckets(bounds, kept_mel) if kept_mel else ()
    rows, mel_vp, text_vp = [], [0, 0], [0, 0]
    for i, bound in enumerate(bounds):
        mine = [s for s in shards if s["bucket"] == i]
        tv, tp = _padding(text_hists.get(i, {}), texts[i])
        mv, mp = (mel_parts[i].valid_frames, mel_parts[i].padded_frames) if mel_parts else (0, 0)
        mel_vp = [mel_vp[0] + mv, mel_vp[1] + mp]
        text_vp = [text_vp[0] + tv, text_vp[1] + tp]
        rows.append(
            {
                "index": i,
                "max_mel_frames": bound,
                "max_text_len": texts[i],
                "records": {s: sum(x["records"] for x in mine if x["split"] == s) for s in ("train", "val")},
                "shards": len(mine),
                "mel_padding_fraction": _fraction(mv, mp),
                "text_padding_fraction": _fraction(tv, tp),
            }
        )
    return {
        "buckets": rows,
        "mel_padding_fraction": _fraction(*mel_vp),
        "text_padding_fraction": _fraction(*text_vp),
        "min_bucket_records": pad.min_bucket_records,
        "plan": buckets["plan"],
        "merges": buckets["plan"]["merges"] if buckets["plan"] else [],
        "raised_last_bound": buckets["raised_last_bound"],
        "what_if": list(padding_by_k(dict(train_hist), pad.multiple, pad.min_bucket_records)) if train_hist else [],
    }


def _fraction(valid: int, padded: int) -> float:
    return round(padding_fraction(valid, padded), 6)
