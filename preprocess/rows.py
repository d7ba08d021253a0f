"""The rows every corpus layout reads into, and the read-time rejections: pure functions, no I/O.

A row is `{id, text, speaker, language, gender, audio, row}`: `audio` is the path of its audio file
(None when there is none: rejected later as `missing_audio`), `row` its position in its input (the
first row of an id wins), `gender` "F", "M" or "" (unknown). A layout's reader returns a
`LayoutRows`; `complete_rows` then gives every row a speaker and a language.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

ROW_KEYS = ("id", "text", "speaker", "language", "gender", "audio", "row")
_GENDERS = {"f": "F", "female": "F", "woman": "F", "female_feminine": "F",  # Common Voice 17+ spells
            "m": "M", "male": "M", "man": "M", "male_masculine": "M"}       # them "female_feminine", ...


class CorpusError(ValueError):
    """The input path is not a corpus melshards can read; the message says what it expected."""


@dataclasses.dataclass
class LayoutRows:
    """What a layout's reader found: the rows, and the input rows already rejected (each with its
    reason). Every input row is in exactly one of the two."""
    rows: list[dict]
    rejected: list[dict]

    @property
    def input_rows(self) -> int:
        return len(self.rows) + len(self.rejected)


def row(clip_id: str, text: str, audio: str | None, index: int, speaker: str = "", language: str = "",
        gender: str = "") -> dict:
    return {"id": clip_id, "text": text, "speaker": speaker, "language": language, "gender": gender,
            "audio": audio, "row": index}


def reject(row_id: str, reason: str, detail: str) -> dict:
    return {"id": row_id, "reason": reason, "detail": detail}


def gender_code(value) -> str:
    """A corpus' spelling of a speaker's gender -> "F", "M", or "" (unknown, other, not given)."""
    return _GENDERS.get(str(value or "").strip().lower(), "")


def split_malformed(items: Iterable[tuple[int, dict | Exception]]) -> LayoutRows:
    """(index, row or the ValueError that row raised) -> rows, and a `malformed_row` rejection (id
    `row-N`) for each error."""
    rows, rejected = [], []
    for i, item in items:
        if isinstance(item, Exception):
            rejected.append(reject(f"row-{i + 1}", "malformed_row", str(item)))
        else:
            rows.append(item)
    return LayoutRows(rows, rejected)


def drop_duplicate_ids(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(rows keeping the first row of every id, by position; a rejection for each later repeat)."""
    first: dict[str, dict] = {}
    kept, dups = [], []
    for r in sorted(rows, key=lambda r: r["row"]):
        seen = first.setdefault(r["id"], r)
        if seen is r:
            kept.append(r)
        else:
            dups.append(reject(r["id"], "duplicate_id", f"row {r['row'] + 1} repeats the id of row {seen['row'] + 1}"))
    return kept, dups


def complete_rows(rows: list[dict], name: str, language: str | None) -> tuple[list[dict], list[dict]]:
    """Every row gets a speaker (its own label, else the input's name: a corpus without speakers is
    one speaker) and a language (its own, else the input's default `language`); a row left without a
    language -> `missing_language`."""
    kept, rejected = [], []
    for r in rows:
        lang = (r.get("language") or "").strip() or (language or "")
        if not lang:
            rejected.append(reject(r["id"], "missing_language",
                                   f"row {r['row'] + 1} says no language and its input has no default; "
                                   "give --language CODE, or fill the row's language column"))
            continue
        kept.append(dict(r, speaker=r["speaker"].strip() or name, language=lang))
    return kept, rejected
