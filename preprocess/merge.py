"""Several inputs in one run: their names, and labels kept unique across them. Pure functions.

Each input has a name: its directory's or file's stem, made unique (`name`, `name-2`, ...). A
speaker label found in more than one input is prefixed with the input's name (`NAME/label`) in every
input that has it; clip ids likewise, so two corpora that both have a clip `0001` keep both (a
repeat within one input is still `duplicate_id`). Labels found in one input only are left as they are.
"""
from __future__ import annotations

import dataclasses
import posixpath
from collections import Counter
from typing import Sequence

from melshards.preprocess.manifests import MANIFEST_EXTENSIONS


def input_name(path: str) -> str:
    """An input's name: its directory's name, or its table file's stem (`/data/LJSpeech-1.1/` ->
    `LJSpeech-1.1`, `gs://b/cv/cy/validated.tsv` -> `validated`)."""
    base = posixpath.basename(path.rstrip("/")) or path
    ext = next((e for e in MANIFEST_EXTENSIONS if base.lower().endswith(e)), "")
    return base[:len(base) - len(ext)] or base


def unique_names(names: Sequence[str]) -> list[str]:
    """Names in order, a repeat renamed `name-2`, `name-3`, ... (never to a name another input has)."""
    out: list[str] = []
    for name in names:
        unique, n = name, 1
        while unique in out or (unique != name and unique in names):
            n += 1
            unique = f"{name}-{n}"
        out.append(unique)
    return out


@dataclasses.dataclass(frozen=True)
class Merged:
    """One input's rows and read-time rejections after merging, and how many distinct speaker
    labels and ids were prefixed with its name."""
    rows: list[dict]
    rejected: list[dict]
    prefixed_speakers: int
    prefixed_ids: int


def _shared(label_sets: list[set[str]]) -> set[str]:
    counts = Counter(label for labels in label_sets for label in labels)
    return {label for label, n in counts.items() if n > 1}


def merge_inputs(inputs: Sequence[tuple[str, list[dict], list[dict]]]) -> list[Merged]:
    """[(name, rows, rejected)] of each input (ids unique within it) -> each input's `Merged`: a
    speaker label or an id that occurs in more than one input becomes `name/label` in each of them.
    The ids of rejections count (a malformed row's `row-N` too), so rejected.jsonl names one row per id."""
    speakers = _shared([{r["speaker"] for r in rows} for _, rows, _ in inputs])
    ids = _shared([{r["id"] for r in rows + rejected} for _, rows, rejected in inputs])
    merged = []
    for name, rows, rejected in inputs:
        def prefixed(label: str, shared: set[str]) -> str:
            return f"{name}/{label}" if label in shared else label

        merged.append(Merged(
            rows=[dict(r, id=prefixed(r["id"], ids), speaker=prefixed(r["speaker"], speakers)) for r in rows],
            rejected=[dict(r, id=prefixed(r["id"], ids)) for r in rejected],
            prefixed_speakers=len({r["speaker"] for r in rows} & speakers),
            prefixed_ids=len({r["id"] for r in rows + rejected} & ids)))
    return merged
