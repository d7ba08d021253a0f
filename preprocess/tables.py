"""The corpus tables: speakers, languages, the vocabulary and the validation split, from the measured clips.

One pass over the measured clips (a CombineFn in `global_stats.CorpusTables`) gathers per speaker its clips'
split hashes, gender and languages, per language the histograms of the three lengths, and the set of
text symbols. `finish_tables` turns that into the one side input the later stages read:

- speakers with at least `filter.min_speaker_clips` measured clips, with ids in name order (the others'
  clips are dropped as `speaker_too_few_clips`);
- languages of those speakers' clips, ids in code order;
- the vocabulary: pad, eos, then every symbol the front ends produced, sorted (deterministic);
- per speaker, the split-hash threshold of its validation clips: the round(val_fraction * n) clips of
  smallest hash (stable across runs; a speaker of >= 0.5 / val_fraction clips has some in val), or
  all of them for a speaker in `split.val_speakers`.

Pure functions on plain dicts, unit-tested for exact values; the CombineFn is a thin wrapper.
"""

from __future__ import annotations

import array
import hashlib
import math
from collections import Counter

from melshards.preprocess.config import PreprocessConfig
from melshards.shards_schema.stats import LENGTH_KEYS
from melshards.shards_schema.vocab import Vocabulary, tokens


def split_hash(clip_id: str, salt: str) -> float:
    """A clip's place in [0, 1): the same on every run and every worker."""
    h = hashlib.sha256(f"{salt}:{clip_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0**64


def empty() -> dict:
    return {"speakers": {}, "languages": {}, "symbols": set()}


def _speaker_entry() -> dict:
    # the split hashes as a packed array: 8 bytes a clip, the one thing the tables keep per clip
    return {"hashes": array.array("d"), "gender": "", "languages": Counter()}


def summarize_clips(clips, salt: str, unit: str = "character") -> dict:
    """One batch of measured clips -> its share of the tables (merge with `merge`); `unit`: what a
    symbol of the clips' text is (`PreprocessConfig.text_unit`)."""
    out = empty()
    for c in clips:
        s = out["speakers"].setdefault(c["speaker"], _speaker_entry())
        s["hashes"].append(split_hash(c["id"], salt))
        s["gender"] = s["gender"] or c.get("gender", "")
        s["languages"][c["language"]] += 1
        lang = out["languages"].setdefault(c["language"], {k: Counter() for k in LENGTH_KEYS})
        for k in LENGTH_KEYS:
            lang[k][c[k]] += 1
        out["symbols"].update(tokens(c["text"], unit))
    return out


def merge(parts) -> dict:
    """The parts' sum, added into the first (an accumulator grows in place: adding a batch costs
    the batch, not the corpus so far)."""
    parts = list(parts)
    out = parts[0] if parts else empty()
    for p in parts[1:]:
        for name, s in p["speakers"].items():
            o = out["speakers"].setdefault(name, _speaker_entry())
            o["hashes"].extend(s["hashes"])
            o["gender"] = o["gender"] or s["gender"]
            o["languages"].update(s["languages"])
        for code, hists in p["languages"].items():
            o = out["languages"].setdefault(code, {k: Counter() for k in LENGTH_KEYS})
            for k in LENGTH_KEYS:
                o[k].update(hists[k])
        out["symbols"] |= p["symbols"]
    return out


def val_count(n: int, val_fraction: float) -> int:
    """Validation clips of a speaker with n clips: round(val_fraction * n), halves up."""
    return int(math.floor(val_fraction * n + 0.5))


def finish_tables(acc: dict, cfg: PreprocessConfig) -> dict:
    """The merged summary -> the tables the filter, the writer and the report read (a plain dict)."""
    kept = sorted(name for name, s in acc["speakers"].items() if len(s["hashes"]) >= cfg.filter.min_speaker_clips)
    held_out = set(cfg.split.val_speakers)
    speakers = {}
    for i, name in enumerate(kept):
        s = acc["speakers"][name]
        hashes = sorted(s["hashes"])
        k = len(hashes) if name in held_out else val_count(len(hashes), cfg.split.val_fraction)
        speakers[name] = {
            "id": i,
            "gender": s["gender"],
            "measured": len(hashes),
            "val_below": hashes[k - 1] if k else -1.0,
        }  # a clip is val iff its hash <= this
    languages = sorted({code for name in kept for code in acc["speakers"][name]["languages"]})
    return {
        "speakers": speakers,
        "dropped_speakers": {name: len(s["hashes"]) for name, s in acc["speakers"].items() if name not in speakers},
        "languages": {code: {"id": i, "text_frontend": cfg.frontend_for(code)} for i, code in enumerate(languages)},
        "language_lengths": {code: {k: dict(h) for k, h in hists.items()} for code, hists in acc["languages"].items()},
        "vocabulary": list(Vocabulary.from_symbols(acc["symbols"], cfg.text_unit).symbols),
        "missing_val_speakers": sorted(held_out - set(kept)),
        "min_speaker_clips": cfg.filter.min_speaker_clips,
    }


def split_of(clip: dict, tables: dict, salt: str) -> str:
    """ "val" or "train" for a clip of a kept speaker (see the module docstring)."""
    return "val" if split_hash(clip["id"], salt) <= tables["speakers"][clip["speaker"]]["val_below"] else "train"


def speaker_rejection_detail(clip: dict, tables: dict) -> str | None:
    """Why a clip's speaker is dropped, or None when it is kept."""
    n = tables["dropped_speakers"].get(clip["speaker"])
    if n is None:
        return None
    return (
        f"speaker {clip['speaker']!r} has {n} measured clip(s), fewer than filter.min_speaker_clips "
        f"{tables['min_speaker_clips']}"
    )
