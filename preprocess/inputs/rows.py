"""The rows every corpus layout reads into, and the read-time rejections: pure functions, no I/O.

A row is `{id, text, speaker, language, gender, audio, row}`: `audio` is the path of its audio file
(None when there is none: rejected later as `missing_audio`), `row` its position in its input (the
first row of an id wins; the read stage adds `input`, its input's index: `melshards.preprocess.inputs.merge`), `gender` "F", "M" or "" (unknown). A row whose corpus gives an ASR
transcript also has `asr_text` (the quality measures compare it with `text`: `melshards.preprocess.clip.quality`);
other rows have no such key. A row whose clip is inside a bigger file (a parquet row, a tar member, a
segment of a recording) has a `locator` too (`melshards.preprocess.inputs.packed_clips`). A rejection is
`{id, reason, detail}`.

A layout's reader yields items, rows and rejections in input order, one per input row, and holds
none: a corpus is read as a stream (`LayoutRows.of` collects one, for tests and small reads).
`unique_ids` drops repeated ids, `complete_rows` gives every row a speaker and a language.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Iterable, Iterator, MutableMapping

from melshards.shards_schema.text_clean import canonical_language

ROW_KEYS = ("id", "text", "speaker", "language", "gender", "audio", "row")
_GENDERS = {
    "f": "F",
    "female": "F",
    "woman": "F",
    "female_feminine": "F",  # Common Voice 17+ spells
    "m": "M",
    "male": "M",
    "man": "M",
    "male_masculine": "M",
}  # them "female_feminine", ...


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

    @classmethod
    def of(cls, items: Iterable[dict]) -> LayoutRows:
        """A reader's items, collected."""
        read = cls([], [])
        for item in items:
            (read.rejected if is_rejection(item) else read.rows).append(item)
        return read


def row(
    clip_id: str,
    text: str,
    audio: str | None,
    index: int,
    speaker: str = "",
    language: str = "",
    gender: str = "",
    asr_text: str = "",
) -> dict:
    out = {
        "id": clip_id,
        "text": text,
        "speaker": speaker,
        "language": language,
        "gender": gender,
        "audio": audio,
        "row": index,
    }
    if asr_text.strip():
        out["asr_text"] = asr_text
    return out


def file_stem(path: str) -> str:
    """A file's name without its folder and last extension (`a/b/LJ001-0001.wav` -> `LJ001-0001`): the id a
    layout or manifest gives a clip that its input names only by file."""
    return posixpath.splitext(posixpath.basename(path))[0]


def reject(row_id: str, reason: str, detail: str) -> dict:
    return {"id": row_id, "reason": reason, "detail": detail}


def is_rejection(item: dict) -> bool:
    return "reason" in item


def bare_lines(lines: Iterable[str]) -> Iterator[str]:
    """The non-blank lines of a file's lines, each without its line break."""
    for line in lines:
        bare = line.splitlines()[0] if line else line  # a line ends in at most one break, of any kind
        if bare.strip():
            yield bare


def gender_code(value) -> str:
    """A corpus' spelling of a speaker's gender -> "F", "M", or "" (unknown, other, not given)."""
    return _GENDERS.get(str(value or "").strip().lower(), "")


def split_malformed(items: Iterable[tuple[int, dict | Exception]]) -> Iterator[dict]:
    """(index, row or the ValueError that row raised) -> the row, or a `malformed_row` rejection (id
    `row-N`) for an error."""
    for i, item in items:
        yield reject(f"row-{i + 1}", "malformed_row", str(item)) if isinstance(item, Exception) else item


def unique_ids(items: Iterable[dict], first: MutableMapping[str, int]) -> Iterator[dict]:
    """Items in input order -> the first row of every id, and a `duplicate_id` rejection for each later
    repeat; rejections pass. `first` (id -> row position; a dict, or a `working_set.SqliteMap` for a large
    corpus) starts empty."""
    for item in items:
        if is_rejection(item):
            yield item
            continue
        seen = first.setdefault(item["id"], item["row"])
        yield (
            item
            if seen == item["row"]
            else reject(item["id"], "duplicate_id", f"row {item['row'] + 1} repeats the id of row {seen + 1}")
        )


def complete_rows(
    items: Iterable[dict], name: str, language: str | None, folded: MutableMapping[str, str] | None = None
) -> Iterator[dict]:
    """Every row gets a speaker (its own label, else the input's name: a corpus without speakers is
    one speaker) and a language (its own, else the input's default `language`), spelt as
    `canonical_language` spells it (`EN` and `en` are one language); a row left without a language ->
    `missing_language`. `folded` (written spelling -> code) gets each spelling that was changed.
    Rejections pass."""
    for r in items:
        if is_rejection(r):
            yield r
            continue
        lang = (r.get("language") or "").strip() or (language or "")
        if not lang:
            yield reject(
                r["id"],
                "missing_language",
                f"row {r['row'] + 1} says no language and its input has no default; "
                "give --language CODE, or fill the row's language column",
            )
        else:
            code = canonical_language(lang)
            if code != lang and folded is not None:
                folded[lang] = code
            yield dict(r, speaker=r["speaker"].strip() or name, language=code)
