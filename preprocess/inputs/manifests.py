"""The table layouts, read by pure functions of the table's lines, yielding items as they go:
manifests (`.csv`, `.tsv`, `.jsonl` with `audio`, `text` and optional `id`, `speaker`, `language`,
`gender`, `asr_text`: an ASR transcript, for the quality measures) and Common Voice TSVs (`client_id`, `path`, `sentence`, optional `locale`, `gender`; audio
under `clips/` beside the TSV).

`--column FIELD=NAME` reads a manifest's field from the column NAME (`manifest_fields`). The column
checks (`check_columns`, `check_commonvoice_columns`, `check_language`) are run on the first line by
`melshards.preprocess.inputs.sources.check_rows_file` before the job, and on the header again when the rows
are read.

A row's audio path is spelt one way per file (`audio_path`), so rows of one recording compare equal
however their manifests wrote it.
"""

from __future__ import annotations

import csv
import json
import posixpath
import re
from collections.abc import Iterable, Iterator, Mapping

from melshards.preprocess.inputs.packed_clips import segment_locator
from melshards.preprocess.inputs.rows import (
    CorpusError,
    bare_lines,
    file_stem,
    gender_code,
    reject,
    row,
    split_malformed,
)

MANIFEST_EXTENSIONS = (".csv", ".tsv", ".jsonl")
MANIFEST_COLUMNS = ("audio", "text")  # required; id, speaker, language, gender and asr_text are optional
MANIFEST_READ = (
    *MANIFEST_COLUMNS,
    "id",
    "speaker",
    "language",
    "gender",
    "asr_text",
    "start",
    "end",
)  # every column read
COMMONVOICE_COLUMNS = ("client_id", "path", "sentence")  # required; locale and gender are optional
_LOCALE = re.compile(r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})*$")  # en, cy, zh-CN, rm-sursilv


def audio_path(root: str, path: str) -> str:
    """A row's audio path as every later comparison sees it: a URL (`gs://...`) as written; a path
    relative to `root` (the table's directory) joined to it; a local path normalised
    (`posixpath.normpath`: `./rec.wav`, `rec.wav` and `d/../rec.wav` under one root are one file), and
    under a URL root its relative part normalised (`./rec.wav` -> `gs://b/rec.wav`)."""
    if "://" in path:
        return path
    if path.startswith("/"):
        return posixpath.normpath(path)
    if "://" in root:
        return posixpath.join(root, posixpath.normpath(path))
    return posixpath.normpath(posixpath.join(root, path))


def _delimiter(path: str) -> str:
    return "\t" if path.lower().endswith(".tsv") else ","


# -- checks on the first line ---------------------------------------------------------------------
def manifest_columns(first_line: str, path: str) -> list[str] | None:
    """The columns a manifest's first non-blank line declares: the CSV/TSV header, or the keys of the
    first JSONL record (None if that line is not a JSON object: a malformed row, not a header problem)."""
    if path.lower().endswith(".jsonl"):
        try:
            rec = json.loads(first_line)
        except ValueError:
            return None
        return list(rec) if isinstance(rec, dict) else None
    return next(csv.reader([first_line], delimiter=_delimiter(path)), [])


def _has(path: str) -> str:
    return "its first record has keys" if path.lower().endswith(".jsonl") else "its header has columns"


def repeated_column(columns: list[str]) -> str | None:
    """The first column name a header has twice (each row then has a field a name cannot reach)."""
    return next((c for n, c in enumerate(columns) if c in columns[:n]), None)


def _check_repeats(columns: list[str] | None, path: str, what: str) -> None:
    twice = repeated_column(columns or [])
    if twice is not None:
        raise CorpusError(
            f"{what} {path}: its header has the column {twice!r} twice ({', '.join(columns or [])}); "
            "rename or remove one of them"
        )


def manifest_fields(named: Mapping[str, str] | None = None) -> dict[str, str]:
    """field -> the manifest column it is read from: its own name (MANIFEST_READ), or the column
    `--column FIELD=NAME` names (`named`)."""
    return {field: (named or {}).get(field, field) for field in MANIFEST_READ}


def check_named_columns(named: Mapping[str, str] | None, columns: list[str], what: str) -> None:
    """Refuse a `--column FIELD=NAME` whose NAME is not one of the table's `columns`; `what` says
    where the columns were read (`m.csv: its header has columns`)."""
    for field, name in (named or {}).items():
        if name not in columns:
            raise CorpusError(
                f"--column {field}={name}: {what} {', '.join(columns) or 'none'}, no {name!r}; "
                "name one of these (column names are case-sensitive)"
            )


def check_columns(columns: list[str] | None, path: str, named: Mapping[str, str] | None = None) -> None:
    """Refuse a manifest header (None: a first JSONL line that is no object, a malformed row) with a
    column twice, a `--column` naming no column of it (`named`), or no audio or text column."""
    _check_repeats(columns, path, "manifest")
    if columns is None:
        return
    check_named_columns(named, columns, f"manifest {path}: {_has(path)}")
    fields = manifest_fields(named)
    missing = [fields[f] for f in MANIFEST_COLUMNS if fields[f] not in columns]
    if missing:
        raise CorpusError(
            f"manifest {path}: {_has(path)} {columns}, missing {', '.join(missing)}; a manifest needs "
            "audio and text (and may have id, speaker, language, gender). Rename the columns, or name "
            "them with --column audio=NAME, --column text=NAME."
        )


def commonvoice_columns(first_line: str) -> list[str]:
    return first_line.rstrip("\r\n").split("\t")


def is_commonvoice_header(columns: list[str]) -> bool:
    return set(COMMONVOICE_COLUMNS) <= set(columns)


def check_commonvoice_columns(columns: list[str], path: str) -> None:
    _check_repeats(columns, path, "Common Voice TSV")
    missing = [c for c in COMMONVOICE_COLUMNS if c not in columns]
    if missing:
        raise CorpusError(
            f"Common Voice TSV {path}: its header has columns {columns}, missing {', '.join(missing)}; "
            "give a TSV of a Common Voice release (validated.tsv, train.tsv, ...), or --format manifest"
        )


def check_language(columns: list[str] | None, column: str, default: str | None, path: str) -> None:
    """Refuse a table whose rows cannot have a language: no `column` and no default (--language)."""
    if default is None and columns is not None and column not in columns:
        raise CorpusError(
            f"{path}: {_has(path)} {columns}, no {column}, and this input has no default language; "
            f"give --language CODE (e.g. --language en), or add a {column} column"
        )


def commonvoice_language(tsv_path: str) -> str | None:
    """An old Common Voice TSV (no locale column) has its locale in its directory's name (`.../cy/`)."""
    name = posixpath.basename(posixpath.dirname(tsv_path.rstrip("/")))
    return name if _LOCALE.match(name) else None


# -- manifests ------------------------------------------------------------------------------------
def parse_manifest(lines: Iterable[str], path: str, root: str, named: Mapping[str, str] | None = None):
    """Yield (index, row-or-ValueError) for every data row of a CSV/TSV/JSONL manifest's lines (with
    their line breaks: a quoted CSV field may hold one); each field read from its column
    (`manifest_fields`: `named` holds the `--column FIELD=NAME` values).

    A CSV/TSV record the csv reader cannot read in its strict mode (a `"` inside a quoted field not
    written twice, a quote never closed, a field past its size limit), or one with a field holding
    both a line break and the separator (a quote opened by mistake that swallowed the rows after it),
    is a ValueError for each non-blank line it spans (`malformed_row`), naming its line number, so
    every line of the file is a row or a rejection."""
    fields = manifest_fields(named)
    if path.lower().endswith(".jsonl"):
        for i, line in enumerate(bare_lines(lines)):
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                yield i, ValueError(f"line {i + 1}: not a JSON object ({e})")
                continue
            yield i, _manifest_row(_named(rec, fields), i, root)
        return
    delimiter = _delimiter(path)
    records = table_records(lines, delimiter)
    header = next(records, None)  # the first non-blank record
    columns = header[2] if header is not None and not isinstance(header[2], Exception) else []
    check_columns(columns, path, named)
    i = 0
    for first, spanned, values in records:
        if isinstance(values, Exception) or swallowed(values, delimiter):
            for number in spanned:  # one rejection per line: every line of the file is accounted for
                yield i, ValueError(f"row {i + 1}: {_swallowed_detail(number, first, spanned, values)}")
                i += 1
            continue
        yield i, _manifest_fields(values, columns, fields, i, root)
        i += 1


def _named(rec: Mapping, fields: Mapping[str, str]) -> dict:
    """A record's values by field (`manifest_fields`); a field whose column it lacks is left out."""
    return {field: rec[column] for field, column in fields.items() if column in rec}


def _manifest_fields(values: list[str], columns: list[str], fields: Mapping[str, str], i: int, root: str):
    """One CSV/TSV record's values -> row, or the ValueError of a record with another number of values."""
    extra = [v for v in values[len(columns) :] if v.strip()]
    if len(values) < len(columns):
        return ValueError(
            f"row {i + 1}: {len(values)} fields, the header has {len(columns)} "
            f"({', '.join(columns)}); a missing separator?"
        )
    if extra:  # e.g. an unquoted comma in the text: reading on would cut the transcript short
        return ValueError(
            f"row {i + 1}: {len(columns) + len(extra)} fields, the header has {len(columns)} "
            f"({', '.join(columns)}); quote a field that holds the separator"
        )
    return _manifest_row(_named(dict(zip(columns, values)), fields), i, root)


class _Tape:
    """An iterator of lines that keeps the lines read since `take` was last called."""

    def __init__(self, lines: Iterable[str]):
        self.lines = iter(lines)
        self.held: list[str] = []

    def __iter__(self):
        return self

    def __next__(self) -> str:
        line = next(self.lines)
        self.held.append(line)
        return line

    def take(self) -> list[str]:
        held, self.held = self.held, []
        return held


def table_records(lines: Iterable[str], delimiter: str) -> Iterator[tuple[int, list[int], list[str] | Exception]]:
    """A CSV/TSV's lines (with their line breaks) -> (the line number its record starts on, the
    numbers of the non-blank lines it spans, its fields) for every record that is not blank, header
    included. The csv reader is strict: a record it cannot read (`x,"a "b" c",y`: a quote inside a
    quoted field not written twice; a quote never closed; a field past its size limit) -> its
    csv.Error in place of the fields, and reading goes on from the next line (not strict, the reader
    would keep the first example as the text `a b" c`)."""
    tape = _Tape(lines)
    reader = csv.reader(tape, delimiter=delimiter, strict=True)
    n = 0  # lines read before the record
    while True:
        try:
            fields: list[str] | Exception = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            fields = e
        read = tape.take()
        spanned = [n + k + 1 for k, line in enumerate(read) if line.strip()]
        n += len(read)
        if spanned:
            yield spanned[0], spanned, fields


def swallowed(fields: list[str], delimiter: str) -> bool:
    """Whether a record holds a field with a line break and the separator: a quote opened by mistake
    (`a.wav,"Hello,...`) that took the rows after it into one field, not a transcript."""
    return any(("\n" in f or "\r" in f) and delimiter in f for f in fields)


def _swallowed_detail(line: int, first: int, spanned: list[int], fields: list[str] | Exception) -> str:
    """The `malformed_row` detail of one line of a record `table_records` gave as unreadable or
    `swallowed`: a record over several lines is a quoted field that opened on its first line."""
    if isinstance(fields, Exception) and spanned == [first]:
        return (
            f"line {line}: the csv reader cannot read it ({fields}): a '\"' inside a quoted field must be "
            'written twice ("a ""quoted"" word"); fix the quoting'
        )
    what = (
        f"and cannot be read by the csv reader ({fields})"
        if isinstance(fields, Exception)
        else f"and holds the separator and {len(spanned) - 1} line break(s)"
    )
    return (
        f"line {line} is inside a quoted field that opens on line {first} {what} (lines {first}-{spanned[-1]}): "
        "a stray '\"' at the start of a field, or a '\"' inside a quoted field not written twice? Remove it, "
        "or write it twice"
    )


def _manifest_row(rec: dict, i: int, root: str):
    if not rec.get("audio"):
        return ValueError(f"row {i + 1}: no audio path")
    if rec.get("text") is None:  # a JSONL record without the key; an empty text is `empty_text`
        return ValueError(f"row {i + 1}: no text field")
    audio = str(rec["audio"])
    locator = segment_locator(rec, i)
    given = str(rec.get("id") or "")
    if isinstance(locator, str):  # the row's number tells apart the bad segments of one recording
        return reject(given or f"{file_stem(audio)}-row-{i + 1}", "bad_segment", locator)
    clip_id = given or (f"{file_stem(audio)}-{rec['start']}-{rec['end']}" if locator is not None else file_stem(audio))
    out = row(
        clip_id,
        str(rec.get("text") or ""),
        audio_path(root, audio),
        i,
        speaker=str(rec.get("speaker") or ""),
        language=str(rec.get("language") or "").strip(),
        gender=gender_code(rec.get("gender")),
        asr_text=str(rec.get("asr_text") or ""),
    )
    if locator is not None:
        out["locator"] = locator
    return out


def manifest_rows(lines: Iterable[str], path: str, root: str, named: Mapping[str, str] | None = None) -> Iterator[dict]:
    """A manifest's lines -> items; audio paths relative to `root` (the manifest's directory); `named`:
    the `--column FIELD=NAME` values."""
    return split_malformed(parse_manifest(lines, path, root, named))


# -- Common Voice ---------------------------------------------------------------------------------
def commonvoice_rows(lines: Iterable[str], path: str) -> Iterator[dict]:
    """A Common Voice TSV's lines -> items: id the clip's file stem, audio `clips/<path>` beside the TSV,
    speaker the `client_id`, language the `locale` column where there is one.

    Common Voice writes its TSVs unquoted: a `"` in a sentence is part of it, so fields are split on
    tabs alone. A row with another number of fields than the header -> `malformed_row`.
    """
    lines = bare_lines(lines)
    header = next(lines, None)
    columns = commonvoice_columns(header) if header is not None else []
    check_commonvoice_columns(columns, path)
    return split_malformed(_commonvoice_items(lines, columns, posixpath.join(posixpath.dirname(path), "clips")))


def _commonvoice_items(lines: Iterable[str], columns: list[str], clips: str):
    for i, line in enumerate(lines):
        fields = line.split("\t")
        rec = dict(zip(columns, fields))
        if len(fields) != len(columns):
            yield (
                i,
                ValueError(
                    f"row {i + 1}: {len(fields)} tab-separated fields, the header has "
                    f"{len(columns)} ({', '.join(columns)})"
                ),
            )
        elif not rec["path"].strip():
            yield i, ValueError(f"row {i + 1}: no path")
        else:
            clip = rec["path"].strip()
            yield (
                i,
                row(
                    file_stem(clip),
                    rec["sentence"],
                    audio_path(clips, clip),
                    i,
                    speaker=rec["client_id"],
                    language=rec.get("locale", "").strip(),
                    gender=gender_code(rec.get("gender")),
                ),
            )
