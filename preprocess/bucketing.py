"""Stage 6a, choosing the length buckets: pure functions the job's Beam steps wrap.

The bounds come from the after-filter mel-frame histogram of the training split (the records that
fill training batches, so `pad.min_bucket_records` = the batch size is a guarantee about them) by
the exact DP in `melshards.shards_schema.buckets`. Validation records use the same bounds; the last bound is
raised, when needed, to fit the longest validation clip. Each bucket's text length is the longest
text among its clips (every split), rounded up (`melshards.shards_schema.buckets.text_bound`).
"""
from __future__ import annotations

from typing import Any, Mapping

from melshards.preprocess.config import PadConfig
from melshards.shards_schema.buckets import BucketPlan, bucket_index, choose_buckets, describe, text_bound, what_if
from melshards.shards_schema.stats import Cutoffs, round_up


def kept(clip: dict, cutoffs: Cutoffs | None) -> bool:
    """Whether the percentile filter keeps the clip (the filter's own rule, `Cutoffs.reason`)."""
    return cutoffs is not None and cutoffs.reason(clip["text_len"], clip["mel_frames"], clip["duration_ms"]) is None


def choose(train_hist: Mapping[int, int], longest: int, pad: PadConfig) -> dict[str, Any] | None:
    """The job's buckets: {"bounds", "plan" (stats.json figures), "raised_last_bound"}; None without clips.

    `train_hist`: mel frames -> training clips kept; `longest`: the longest kept clip of any split.
    Without training clips there is one bucket, fitted to the longest clip.
    """
    if longest <= 0:
        return None
    plan: BucketPlan | None = None
    if train_hist:
        plan = choose_buckets(dict(train_hist), pad.buckets, pad.max_buckets, pad.target_padding, pad.multiple,
                              pad.min_bucket_records)
        bounds = list(plan.bounds)
    else:
        bounds = [round_up(longest, pad.multiple)]
    raised = None
    if longest > bounds[-1]:  # a validation clip is longer than every training clip
        raised = {"from": bounds[-1], "to": round_up(longest, pad.multiple)}
        bounds[-1] = raised["to"]
    return {"bounds": tuple(bounds), "plan": plan.to_dict() if plan else None, "raised_last_bound": raised}


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


def bucket_stats(buckets: dict, kept_mel: Mapping[int, int], text_hists: Mapping[int, Mapping[int, int]],
                 shards: list[dict], pad: PadConfig, train_hist: Mapping[int, int]) -> dict[str, Any]:
    """stats.json "buckets": per bucket its shapes, records per split, shards and padding; overall
    padding; the plan with its merges; the what-if over K (from the training histogram)."""
    bounds = buckets["bounds"]
    texts = text_bounds(text_hists, len(bounds), pad.multiple)
    mel_parts = describe(bounds, kept_mel) if kept_mel else ()
    rows, mel_vp, text_vp = [], [0, 0], [0, 0]
    for i, bound in enumerate(bounds):
        mine = [s for s in shards if s["bucket"] == i]
        tv, tp = _padding(text_hists.get(i, {}), texts[i])
        mv, mp = (mel_parts[i].valid_frames, mel_parts[i].padded_frames) if mel_parts else (0, 0)
        mel_vp = [mel_vp[0] + mv, mel_vp[1] + mp]
        text_vp = [text_vp[0] + tv, text_vp[1] + tp]
        rows.append({
            "index": i, "max_mel_frames": bound, "max_text_len": texts[i],
            "records": {s: sum(x["records"] for x in mine if x["split"] == s) for s in ("train", "val")},
            "shards": len(mine),
            "mel_padding_fraction": _fraction(mv, mp), "text_padding_fraction": _fraction(tv, tp),
        })
    return {
        "buckets": rows,
        "mel_padding_fraction": _fraction(*mel_vp), "text_padding_fraction": _fraction(*text_vp),
        "min_bucket_records": pad.min_bucket_records,
        "plan": buckets["plan"],
        "merges": buckets["plan"]["merges"] if buckets["plan"] else [],
        "raised_last_bound": buckets["raised_last_bound"],
        "what_if": list(what_if(dict(train_hist), pad.multiple, pad.min_bucket_records)) if train_hist else [],
    }


def _fraction(valid: int, padded: int) -> float:
    return round(1.0 - valid / padded, 6) if padded else 0.0
