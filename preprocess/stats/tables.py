"""The corpus tables: speakers, languages, the vocabulary and the validation split, from the measured clips.

Each batch of measured clips gives, keyed, its share of the tables (`summarize_clips`): per speaker its
clips' split hashes, gender and languages; for the corpus the histograms of the three lengths per language
and the set of text symbols. `global_stats.CorpusTables` sums the shares per key (`add_part`) and turns each
speaker's into its row where its key lands (`finish_part`: the split hashes, the one thing kept per clip,
go no further); `finish_tables` turns the rows and the corpus's part into the one side input the later
stages read:

- speakers with at least `filter.min_speaker_clips` measured clips, with ids in name order (the others'
  clips are dropped as `speaker_too_few_clips`);
- languages of those speakers' clips, ids in code order;
- the vocabulary: pad, eos, then every symbol the front ends produced, sorted (deterministic);
- per speaker, the split-hash threshold of its validation clips: the round(val_fraction * n) clips of
  smallest hash (stable across runs; a speaker of >= 0.5 / val_fraction clips has some in val), or
  all of them for a speaker in `split.val_speakers`.

Pure functions on plain dicts, unit-tested for exact values; `global_stats.CorpusTables` runs them in Beam.
"""

from __future__ import annotations

import array
import hashlib
import math
from collections import Counter

import numpy as np

from melshards.preprocess.config import PreprocessConfig
from melshards.shards_schema.stats import LENGTH_KEYS
from melshards.shards_schema.vocab import Vocabulary, tokens


def split_hash(clip_id: str, salt: str) -> float:
    """A clip's place in [0, 1): the same on every run and every worker."""
    h = hashlib.sha256(f"{salt}:{clip_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0**64


SPEAKER, CORPUS = "speaker", "corpus"  # the keys of a batch's shares: (SPEAKER, name) and (CORPUS, "")


def _speaker_entry() -> dict:
    # the split hashes as a packed array: 8 bytes a clip, the one thing the tables keep per clip
    return {"hashes": array.array("d"), "gender": "", "languages": Counter()}


def _corpus_entry() -> dict:
    return {"languages": {}, "symbols": set()}


def summarize_clips(clips, salt: str, unit: str = "character") -> dict[tuple, dict]:
    """One batch of measured clips -> its share of the tables, keyed: (SPEAKER, name) -> {hashes, gender,
    languages} of each speaker's clips; (CORPUS, "") -> {languages: the three length histograms per
    language, symbols}, there even without clips. `unit`: what a symbol of the clips' text is
    (`PreprocessConfig.text_unit`). Sum shares of one key with `add_part`."""
    corpus = _corpus_entry()
    out: dict[tuple, dict] = {(CORPUS, ""): corpus}
    for c in clips:
        s = out.get((SPEAKER, c["speaker"]))
        if s is None:
            s = out[(SPEAKER, c["speaker"])] = _speaker_entry()
        s["hashes"].append(split_hash(c["id"], salt))
        s["gender"] = s["gender"] or c.get("gender", "")
        s["languages"][c["language"]] += 1
        lang = corpus["languages"].setdefault(c["language"], {k: Counter() for k in LENGTH_KEYS})
        for k in LENGTH_KEYS:
            lang[k][c[k]] += 1
        corpus["symbols"].update(tokens(c["text"], unit))
    return out


def add_part(acc: dict, part: dict) -> dict:
    """A share of one key (`summarize_clips`' values: a speaker's or the corpus's, told by its fields) added
    into `acc` ({} or a sum of shares of that key), in place; returns `acc`."""
    if not part:
        return acc
    if "hashes" in part:
        if not acc:
            acc.update(_speaker_entry())
        acc["hashes"].extend(part["hashes"])
        acc["gender"] = acc["gender"] or part["gender"]
        acc["languages"].update(part["languages"])
        return acc
    if not acc:
        acc.update(_corpus_entry())
    for code, hists in part["languages"].items():
        mine = acc["languages"].setdefault(code, {k: Counter() for k in LENGTH_KEYS})
        for k in LENGTH_KEYS:
            mine[k].update(hists[k])
    acc["symbols"] |= part["symbols"]
    return acc


def val_count(n: int, val_fraction: float) -> int:
    """Validation clips of a speaker with n clips: round(val_fraction * n), halves up."""
    return int(math.floor(val_fraction * n + 0.5))


def finish_part(item: tuple[tuple, dict], cfg: PreprocessConfig) -> dict[tuple, dict]:
    """A key's summed share -> {key: what the tables keep of it}: a speaker's row {measured, gender,
    languages, val_below} (a clip is val iff its split hash <= val_below: the round(val_fraction * n)
    smallest of its n, every one for a speaker in `split.val_speakers`, none: -1.0); the corpus's as it is."""
    key, part = item
    if key[0] != SPEAKER:
        return {key: part}
    hashes = np.frombuffer(part["hashes"], dtype=np.float64)
    k = len(hashes) if key[1] in cfg.split.val_speakers else val_count(len(hashes), cfg.split.val_fraction)
    row = {
        "measured": len(hashes),
        "gender": part["gender"],
        "languages": part["languages"],
        "val_below": float(np.partition(hashes, k - 1)[k - 1]) if k else -1.0,  # the k-th smallest, in O(n)
    }
    return {key: row}


def add_rows(acc: dict, part: dict) -> dict:
    """`finish_part`'s results (one key each) gathered into `acc`, in place; returns `acc`."""
    acc.update(part)
    return acc


def finish_tables(rows: dict[tuple, dict], cfg: PreprocessConfig) -> dict:
    """Every key's `finish_part` -> the tables the filter, the writer and the report read (a plain dict)."""
    speakers_in = {key[1]: row for key, row in rows.items() if key[0] == SPEAKER}
    corpus = rows.get((CORPUS, ""), _corpus_entry())
    kept = sorted(name for name, s in speakers_in.items() if s["measured"] >= cfg.filter.min_speaker_clips)
    held_out = set(cfg.split.val_speakers)
    speakers = {
        name: {
            "id": i,
            "gender": speakers_in[name]["gender"],
            "measured": speakers_in[name]["measured"],
            "val_below": speakers_in[name]["val_below"],
        }
        for i, name in enumerate(kept)
    }
    languages = sorted({code for name in kept for code in speakers_in[name]["languages"]})
    return {
        "speakers": speakers,
        "dropped_speakers": {name: s["measured"] for name, s in speakers_in.items() if name not in speakers},
        "languages": {code: {"id": i, "text_frontend": cfg.frontend_for(code)} for i, code in enumerate(languages)},
        "language_lengths": {
            code: {k: dict(h) for k, h in hists.items()} for code, hists in corpus["languages"].items()
        },
        "vocabulary": list(Vocabulary.from_symbols(corpus["symbols"], cfg.text_unit).symbols),
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
