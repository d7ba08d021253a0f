"""Corpora whose clips live inside bigger files: Hugging Face parquet exports (an `audio` struct of the
encoded file's `bytes` and `path` per row), WebDataset tar shards (`KEY.flac` + `KEY.json`, as
Emilia ships), and manifests of segments (`start`/`end` seconds) of long recordings.

A row of these layouts names its audio as `audio` (the parquet file, the tar, the recording) plus a
`locator` saying where inside it the clip is:

* `{"parquet": COLUMN, "row_group": G, "index": I}`: row I of row group G, the struct column COLUMN;
* `{"tar_offset": OFFSET, "size": N, "member": NAME}`: the member's bytes at OFFSET in the tar;
* `{"start": S, "end": E}`: seconds S to E of the recording.

Reading a container file is two steps: its scan (`parquet_scan`, `tar_samples`: the I/O, one file at a
time, each file by a worker of its own in the job) and its rows (`parquet_rows`, `tar_rows`: pure, from
the scan's records, in input order). The scan reads no audio: a parquet file's footer and its other
columns (the audio column's `path` alone), a tar's headers and its small `.json` members (the audio
members are seeked over), through `melshards.preprocess.inputs.ranged.RangedFile`, whose reads fetch what
they need (a few KB around each tar header, pyarrow's exact ranges), not Beam's 16 MiB chunks.

The audio is read where the clip is measured, each clip's bytes once: a tar member at its offset
(`clip_bytes`), a parquet row group's audio column streamed forward a few rows at a time (the rows of
a row group, in as many batches as it takes, are measured in order by one worker: `GROUP_STREAM_ROWS`;
the file's parsed footer kept for its next batches: FOOTERS), a segment's span from where the decoder
seeks to (`recording`: the recording held for the batch's next segments, its header read once). What
a batch reads is held until its rows are measured (`release_held`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import posixpath
import tarfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any, NamedTuple, TypeVar

import numpy as np
from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.inputs.ranged import RangedFile
from melshards.preprocess.inputs.rows import CorpusError, file_stem, gender_code, reject, row
from melshards.preprocess.out_dir.lock import is_local_path

# The column names each field is read from, first found wins: Hugging Face exports and Emilia's
# `.json` use these; `--column FIELD=NAME` names another.
FIELD_COLUMNS: dict[str, tuple[str, ...]] = {
    "audio": ("audio",),
    "text": ("text", "normalized_text", "text_normalized", "transcription", "transcript", "sentence"),
    "id": ("id", "key", "utterance_id", "segment_id", "audio_id"),
    "speaker": ("speaker", "speaker_id", "client_id"),
    "language": ("language", "locale", "lang"),
    "gender": ("gender",),
}
# Fields read when a column names them, and passed on in the row (other engineers' measures).
EXTRA_FIELDS = ("asr_text",)
AUDIO_EXTENSIONS = (".flac", ".wav", ".mp3", ".ogg", ".opus")
PARQUET_EXTENSIONS = (".parquet",)
TAR_EXTENSIONS = (".tar",)
MAX_SEGMENT_END_S = 1e9  # seconds (31 years): a segment's end beyond it is a sentinel or a typo, not a time


def column_names(columns: Iterable[str], overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """field -> the column it is read from: an override (`--column FIELD=NAME`) if given, else the
    first of FIELD_COLUMNS[field] the table has; fields without a column are left out."""
    return dict(_column_names(tuple(columns), tuple(sorted((overrides or {}).items()))))


@functools.lru_cache(maxsize=64)  # a WebDataset asks for each sample's `.json` keys: mostly the same few
def _column_names(present: tuple[str, ...], overrides: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    given_names = dict(overrides)
    found: list[tuple[str, str]] = []
    for field in (*FIELD_COLUMNS, *EXTRA_FIELDS):
        given = given_names.get(field)
        name = (
            given if given is not None else next((c for c in FIELD_COLUMNS.get(field, (field,)) if c in present), None)
        )
        if name is not None and name in present:
            found.append((field, name))
    return tuple(found)


def unused(columns: Iterable[str], used: Mapping[str, str]) -> list[str]:
    """The columns no field is read from (reported once in the summary)."""
    return [c for c in columns if c not in used.values()]


def _label(value) -> str | None:
    """A label field's value (id, speaker, language) as text: a string, or a number as written
    (`speaker_id` 19 -> "19"); "" for null; None for anything else (a list, an object, true/false)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


_KINDS = {list: "a list", tuple: "a list", dict: "an object", bool: "a boolean", int: "a number", float: "a number"}


def _not_read(field: str, column: str, value, want: str) -> str:
    """A `malformed_row` detail: the field's value (its start) is not what it must be."""
    shown = repr(value)
    kind = _KINDS.get(type(value), type(value).__name__)
    return f"{field} ({column}) is {kind}, {shown[:80]}{'...' if len(shown) > 80 else ''}, not {want}"


def _row_of(rec: Mapping, used: Mapping[str, str], i: int, clip_id: str, audio: str, locator: dict, where: str) -> dict:
    """A record's fields (`used`: field -> its key in `rec`) -> a row, or its rejection: a text or
    ASR text that is no string (a list, a number, an object) or a speaker or language that is
    neither a string nor a number -> `malformed_row`, their value never turned into text by Python's
    repr; a null text -> `missing_text`. `where` (file and row) begins a rejection's detail."""
    texts: dict[str, str] = {}
    for field in ("text", *EXTRA_FIELDS):
        if field not in used:
            continue
        value = rec.get(used[field])
        if value is None and field == "text":
            return reject(clip_id, "missing_text", f"{where}: its text ({used[field]}) is null")
        if value is not None and not isinstance(value, str):
            return reject(clip_id, "malformed_row", f"{where}: {_not_read(field, used[field], value, 'a string')}")
        texts[field] = value or ""
    labels: dict[str, str] = {}
    for field in ("speaker", "language"):
        if field in used:
            value = rec.get(used[field])
            label = _label(value)
            if label is None:
                why = _not_read(field, used[field], value, "a string or a number")
                return reject(clip_id, "malformed_row", f"{where}: {why}")
            labels[field] = label
    out = row(
        clip_id,
        texts.get("text", ""),
        audio,
        i,
        speaker=labels.get("speaker", ""),
        language=labels.get("language", "").strip(),
        gender=gender_code(rec.get(used["gender"])) if "gender" in used else "",
    )
    out["locator"] = locator
    for extra in EXTRA_FIELDS:
        if extra in used:
            out[extra] = texts[extra]
    return out


# -- parquet --------------------------------------------------------------------------------------
@contextlib.contextmanager
def _readable(path: str, what: str, errors: tuple[type[BaseException], ...]) -> Iterator[None]:
    """`errors` raised inside -> CorpusError, in one line naming the file: a container file that
    cannot be read is a bad input (cut short by an interrupted download, damaged, or not the format
    its name says), and the run stops before any work rather than read part of a corpus."""
    try:
        yield
    except errors as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise CorpusError(
            f"{path} cannot be read as {what} ({reason}): a file cut short or damaged? Download it again, "
            "or leave it out of the input"
        ) from None


def _parquet_errors() -> tuple[type[BaseException], ...]:
    """What Arrow raises for a file that is no parquet file, or a damaged one (its own errors, and
    OSError for an unreadable footer)."""
    import pyarrow as pa

    return (pa.ArrowException, OSError)


def parquet_schema_columns(path: str) -> list[str]:
    """A parquet file's top-level column names, from its footer (CorpusError for an unreadable file)."""
    with contextlib.ExitStack() as stack, _readable(path, "a parquet file", _parquet_errors()):
        return list(_parquet_file(path, stack).schema_arrow.names)


def parquet_row_count(path: str) -> int:
    """A parquet file's rows, from its footer (CorpusError for an unreadable file)."""
    with contextlib.ExitStack() as stack, _readable(path, "a parquet file", _parquet_errors()):
        return int(_parquet_file(path, stack).metadata.num_rows)


def path_id(path: str) -> str:
    """A clip id from its audio's path: the path without its extension, normalised (`./spkA/001.wav`
    -> `spkA/001`, so `spkB/001.wav` is another clip); of an absolute path or a URL, the base name's
    stem (its directories name the disk it was exported from, not the corpus)."""
    if path.startswith("/") or "://" in path:
        return file_stem(path)
    return posixpath.splitext(posixpath.normpath(path))[0]


@dataclasses.dataclass(frozen=True)
class ParquetHead:
    """What a parquet file's footer says its rows are read from: its top-level columns, and of the
    audio column (the field `audio`'s, None without one) its Arrow type as text, whether it is a
    struct with a `path` and whether it holds no encoded audio."""

    names: tuple[str, ...]
    audio_type: str | None
    has_path: bool
    not_bytes: bool


def parquet_scan(path: str, overrides: Mapping[str, str] | None = None) -> Iterator:
    """A parquet file's scan: its `ParquetHead`, then each row's (fields, row group, index in it), the
    fields being the columns a field is read from but the audio, and the audio's `path` (a Hugging Face
    struct's) as `{audio column: {"path": ...}}`. The audio bytes are not read: the footer and these
    columns' chunks only, a batch at a time, a row group's chunks in one read where they lie together.
    CorpusError, naming the file, for a file Arrow cannot read.

    Holds the file's footer, parsed whole by Arrow (no part of a footer can be read alone; it grows
    with the row groups: docs/performance.md#the-read-stages-memory-on-a-parquet-export), one batch
    of the columns read and one row, nothing per row group or row beyond: the memory grows with the
    largest file's row groups, not with the rows read. The footer is parsed here, not taken from
    FOOTERS, so a scan holds one file's at a time."""
    with contextlib.ExitStack() as stack, _readable(path, "a parquet file", _parquet_errors()):
        pf = _parquet_file(path, stack, pre_buffer=True)
        names = pf.schema_arrow.names
        used = column_names(names, overrides)
        audio_col = used.get("audio")
        audio_type = pf.schema_arrow.field(audio_col).type if audio_col else None
        has_path = (
            audio_type is not None
            and hasattr(audio_type, "get_field_index")
            and audio_type.get_field_index("path") >= 0
        )
        not_bytes = audio_type is not None and not _holds_audio_bytes(audio_type)
        yield ParquetHead(tuple(names), None if audio_type is None else str(audio_type), has_path, not_bytes)
        read = [c for c in used.values() if c != audio_col] + ([f"{audio_col}.path"] if has_path else [])
        for g in range(pf.metadata.num_row_groups):
            if not read:  # no column to read (an audio column alone): the rows are counted from the footer
                yield from (({}, g, index) for index in range(pf.metadata.row_group(g).num_rows))
                continue
            index = 0
            for batch in pf.iter_batches(row_groups=[g], columns=read, batch_size=1024, use_threads=False):
                for rec in batch.to_pylist():
                    yield rec, g, index
                    index += 1


def parquet_rows(
    path: str,
    start: int,
    overrides: Mapping[str, str] | None = None,
    name: str | None = None,
    taken: MutableMapping[str, int] | None = None,
    scanned: Iterable | None = None,
) -> Iterator[dict]:
    """One parquet file's rows -> items, row positions from `start`, from its scan (`scanned`: what
    `parquet_scan` gave; default: the file scanned now). A row's id is its id column; else its audio
    `path`'s `path_id`, unless an earlier row of the input had that one (`taken`, path id -> row
    position: an export that kept base names only); else `<name>-<row in the file, from 0>`, `name`
    being the file's path under its input without `.parquet` (default: its stem). A row whose audio is
    null, or whose table has no audio or text column -> `missing_audio` / `missing_text`; a field of
    the wrong type (`_row_of`) -> `malformed_row`. CorpusError, naming the file, for a file Arrow
    cannot read."""
    name = name or file_stem(path)
    taken = {} if taken is None else taken
    records = iter(parquet_scan(path, overrides) if scanned is None else scanned)
    head: ParquetHead = next(records)
    names = head.names
    used = column_names(names, overrides)
    audio_col = used.get("audio")
    i = start
    for rec, g, index in records:
        inner = rec.get(audio_col) if head.has_path else None
        apath = str(inner.get("path") or "") if isinstance(inner, dict) else ""
        ident = _label(rec.get(used["id"])) if "id" in used else ""
        clip_id = ident or f"{name}-{i - start}"
        from_path = path_id(apath) if apath and not ident else ""
        if from_path and taken.setdefault(from_path, i) == i:
            clip_id = from_path
        where = f"{path}: row {i - start}"
        if ident is None:
            why = _not_read("id", used["id"], rec.get(used["id"]), "a string or a number")
            yield reject(clip_id, "malformed_row", f"{where}: {why}")
        elif audio_col is None:
            yield reject(clip_id, "missing_audio", f"{path}: no audio column ({', '.join(names)})")
        elif head.not_bytes:
            why = f"{path}: column {audio_col} holds {head.audio_type}, not encoded audio (binary, or a struct with `bytes`)"
            yield reject(clip_id, "missing_audio", why)
        elif "text" not in used:
            yield reject(clip_id, "missing_text", f"{path}: no text column ({', '.join(names)})")
        else:
            locator = {"parquet": audio_col, "row_group": g, "index": index}
            yield _row_of(rec, used, i, clip_id, path, locator, where)
        i += 1


def _holds_audio_bytes(kind) -> bool:
    """Whether a parquet column of Arrow type `kind` holds encoded audio: binary (plain, large or
    view), or a struct with a binary `bytes` field (a Hugging Face audio struct)."""
    import pyarrow as pa

    if pa.types.is_struct(kind):
        i = kind.get_field_index("bytes")
        return i >= 0 and _holds_audio_bytes(kind.field(i).type)
    return bool(pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind))


def _parquet_file(
    path: str, stack: contextlib.ExitStack, metadata=None, pre_buffer: bool = False, buffer_size: int = 0
):
    """A `pyarrow.parquet.ParquetFile` of `path`: a local file by its path (Arrow's own reads, no
    Python file object between; not memory-mapped, which would keep every page the reads touch in
    the process' RSS), a remote one through a `RangedFile` (closed with `stack`), whose reads fetch
    the ranges Arrow asks for, its footer read exactly (`_footer`). With `metadata` (the file's parsed
    footer) the footer is not read again. `pre_buffer`: the column chunks a read needs fetched at
    once, those that lie together in one read; `buffer_size` > 0: a column chunk streamed through a
    buffer of that many bytes rather than read whole."""
    import pyarrow.parquet as pq

    if is_local_path(path):
        return pq.ParquetFile(path, metadata=metadata, pre_buffer=pre_buffer, buffer_size=buffer_size)
    f = stack.enter_context(RangedFile(path))
    return pq.ParquetFile(
        f, metadata=_footer(f) if metadata is None else metadata, pre_buffer=pre_buffer, buffer_size=buffer_size
    )


def _footer(f: RangedFile):
    """A parquet file's parsed footer, its bytes alone read (pyarrow reads the file's last 64 KiB to find
    it, most of it the last row group's audio); None where the file does not end as a parquet file
    does (pyarrow then reads it and says what is wrong)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if f.size < 12:
        return None
    f.seek(-8, os.SEEK_END)
    tail = f.read(8)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or length + 12 > f.size:
        return None
    f.seek(-8 - length, os.SEEK_END)
    return pq.read_metadata(pa.BufferReader(b"PAR1" + f.read(length) + tail))


def _file_stamp(path: str) -> tuple:
    """What tells one version of a file from another: a local file's size, modification and change
    times (ns) and inode; a remote one's size and update time (its file system's metadata call)."""
    if is_local_path(path):
        st = os.stat(path)
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    m = FileSystems.get_filesystem(path).metadata(path)
    return (m.size_in_bytes, getattr(m, "last_updated_in_seconds", 0))


# The parsed footers a process keeps for the workers' batches: at most this many bytes of serialized
# footer (parsed, Arrow holds several times that: docs/performance.md#a-workers-fetch-from-one-large-file),
# or the one footer read last when it alone is bigger.
FOOTER_CACHE_BYTES = 4 * 2**20


class _Footers:
    """Parsed parquet footers by path, the least recently used let go past FOOTER_CACHE_BYTES of
    serialized footer; each with its file's stamp (`_file_stamp`), so a file changed since is read
    with its new footer, never a stale one. Shared by the process' threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kept: OrderedDict[str, tuple[tuple, Any]] = OrderedDict()

    def get(self, path: str, stamp: tuple):
        with self.lock:
            found = self.kept.get(path)
            if found is None or found[0] != stamp:
                return None
            self.kept.move_to_end(path)
            return found[1]

    def put(self, path: str, stamp: tuple, metadata) -> None:
        with self.lock:
            self.kept[path] = (stamp, metadata)
            self.kept.move_to_end(path)
            total = sum(int(m.serialized_size) for _, m in self.kept.values())
            while len(self.kept) > 1 and total > FOOTER_CACHE_BYTES:
                _, (_, old) = self.kept.popitem(last=False)
                total -= int(old.serialized_size)

    def clear(self) -> None:
        """Let go of every footer kept."""
        with self.lock:
            self.kept.clear()


FOOTERS = _Footers()


def _kept_parquet_file(path: str, stack: contextlib.ExitStack, buffer_size: int = 0):
    """`_parquet_file(path)` with its footer parsed once per process while the file is unchanged
    (FOOTERS): a worker reads a file's row groups batch by batch, and Arrow parses a footer whole,
    so parsing it per batch costs a file of N row groups N parses of size N."""
    stamp = _file_stamp(path)
    metadata = FOOTERS.get(path, stamp)
    pf = _parquet_file(path, stack, metadata, buffer_size=buffer_size)
    if metadata is None:
        FOOTERS.put(path, stamp, pf.metadata)
    return pf


# This thread's held readers: (kind, path, ...) -> an open tar, a row group's stream, a recording. A
# cache of open files inside one worker thread, not data between stages: nothing is written, and each
# element's readers are let go once it is measured (`release_held`), so a retried bundle opens its own.
_HELD = threading.local()


def _held(key: tuple, make: Callable[[], Any]) -> Any:
    """What `make` gives for `key`, made once and held for the next calls with the same key until
    `release_held` (the rows a worker measures together share their row group, their tar, their
    recording)."""
    held = _HELD.__dict__.setdefault("items", {})
    if key not in held:
        held[key] = make()
    return held[key]


def _let_go(key: tuple) -> None:
    value = _HELD.__dict__.setdefault("items", {}).pop(key, None)
    if value is not None and hasattr(value, "close"):
        value.close()


def release_held() -> None:
    """Let go of what is held for the next rows (once a worker has measured the rows it was given):
    the row groups' streams, the open tars and recordings (closed)."""
    for key in list(_HELD.__dict__.get("items", {})):
        _let_go(key)


GROUP_STREAM_ROWS = 8  # rows: a row group's audio column is streamed this many rows at a time
GROUP_STREAM_BUFFER = 1 << 20  # bytes: ... through a buffer of this size (a page larger than it is read whole)


class _GroupAudio:
    """One row group's audio column read forward from its first row, GROUP_STREAM_ROWS at a time
    (pyarrow's `iter_batches` over a buffered stream of the column chunk): the chunk's bytes are read
    once, in order, and a few rows and the page they are in are held, whatever the row group's size.
    An audio struct's `bytes` alone is read (its `path` is not)."""

    def __init__(self, path: str, group: int, column: str):
        self.stack = contextlib.ExitStack()
        try:
            pf = _kept_parquet_file(path, self.stack, buffer_size=GROUP_STREAM_BUFFER)
            if group >= pf.metadata.num_row_groups:
                raise IndexError(f"row group {group} of {pf.metadata.num_row_groups}")
            kind = pf.schema_arrow.field(column).type
            struct = hasattr(kind, "get_field_index") and kind.get_field_index("bytes") >= 0
            self.batches = pf.iter_batches(
                batch_size=GROUP_STREAM_ROWS,
                row_groups=[group],
                columns=[f"{column}.bytes" if struct else column],
                use_threads=False,  # one column: one job
            )
        except BaseException:
            self.stack.close()
            raise
        self.first = 0  # the first row of `values`
        self.values: _AudioValues | None = None

    def __getitem__(self, index: int) -> bytes | None:
        """Row `index`'s audio; the rows before it are let go (IndexError past the group's last row)."""
        if index < self.first:
            raise ValueError(f"row {index} is behind the stream (at row {self.first})")
        while self.values is None or index >= self.first + len(self.values):
            if self.values is not None:
                self.first += len(self.values)
            batch = next(self.batches, None)
            if batch is None:
                raise IndexError(f"row {index} of {self.first}")
            self.values = _AudioValues(batch.column(0))
        return self.values[index - self.first]

    def close(self) -> None:
        self.values = None
        self.stack.close()


def _row_group_row(path: str, group: int, column: str, index: int) -> bytes | None:
    """Row `index` of a row group's audio column, from the stream held for the next rows (a new one,
    read from the group's first row, for a row before the stream's)."""
    key = ("parquet", path, group, column)
    stream = _held(key, lambda: _GroupAudio(path, group, column))
    if index < stream.first:
        _let_go(key)
        stream = _held(key, lambda: _GroupAudio(path, group, column))
    return stream[index]


class _AudioValues:
    """Audio values of a row group's rows: a binary column, or a struct column's `bytes` (a Hugging Face audio
    struct; null where the struct is). A binary column's row is sliced out of its Arrow buffers: no
    Python object per row but the bytes returned; other types go through `as_py`."""

    def __init__(self, values):
        import pyarrow as pa

        if pa.types.is_struct(values.type) and values.type.get_field_index("bytes") >= 0:
            # flatten: the children with the struct's own nulls and offset applied (buffers shared)
            values = values.flatten()[values.type.get_field_index("bytes")]
        self.values = values
        self.data: memoryview | None = None
        self.offsets: list[int] = []
        if pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
            bufs = values.buffers()
            kind = np.int64 if pa.types.is_large_binary(values.type) else np.int32
            self.offsets = np.frombuffer(
                bufs[1], dtype=kind, count=len(values) + 1, offset=values.offset * kind().itemsize
            ).tolist()
            self.data = memoryview(bufs[2] if bufs[2] is not None else b"").cast("B")
            self.nulls = values.is_null().to_numpy(zero_copy_only=False)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: int) -> bytes | None:
        if self.data is None:
            value = self.values[i].as_py()
            return None if value is None else bytes(value)
        if self.nulls[i]:
            return None
        return bytes(self.data[self.offsets[i] : self.offsets[i + 1]])


# -- WebDataset tars ------------------------------------------------------------------------------
def _split_key(name: str) -> tuple[str, str]:
    """A WebDataset member name -> (key, extension): the key is the path up to the first dot of the
    base name (`a/b.seg1.flac` -> `a/b`, `seg1.flac`)."""
    base = name.rfind("/") + 1
    dot = name.find(".", base)
    if dot <= base:  # no dot, or a base name that starts with one
        return name, ""
    return name[:dot], name[dot + 1 :].lower()


_USTAR_MAGIC = (b"ustar\x0000", b"ustar  \x00")  # POSIX ustar / pax (Python's tarfile, webdataset), GNU tar


_Member = TypeVar("_Member", bound=tarfile.TarInfo)


class _UstarFile(tarfile.TarInfo):
    """tarfile's TarInfo, but a plain regular file's header (ustar, pax or GNU magic, no name prefix,
    octal size, the checksum right) is parsed for what the scan uses alone: name and size (the rest
    left at TarInfo's defaults). tarfile parses every field of every header, most of a WebDataset
    tar's scan (docs/performance.md#parquet-and-webdataset-inputs); every other header (pax or GNU
    long names, directories, links, sparse files, base-256 sizes, a bad checksum) is tarfile's own
    `frombuf`, and tarfile does the rest as always (pax records applied, offsets, the end of the tar)."""

    @classmethod
    def frombuf(cls: type[_Member], buf: bytes | bytearray, encoding: str, errors: str) -> _Member:
        if (
            len(buf) == tarfile.BLOCKSIZE
            and buf[156:157] in (tarfile.REGTYPE, tarfile.AREGTYPE)
            and buf[257:265] in _USTAR_MAGIC
            and buf[345] == 0
            and 0x30 <= buf[124] <= 0x37
        ):
            checksum = int(buf[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
            name = buf[0:100].split(b"\0", 1)[0].decode(encoding, errors)
            if checksum == sum(buf) - sum(buf[148:156]) + 256 and not name.endswith("/"):  # "/": a V7 directory
                obj = cls(name)
                obj.size = int(buf[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
                obj.type, obj.chksum = tarfile.REGTYPE, checksum
                return obj
        return super().frombuf(buf, encoding, errors)


class Member(NamedTuple):
    """A tar member as a scan finds it: its name, its data's offset in the tar and its size."""

    name: str
    offset: int
    size: int


TAR_SCAN_FETCH = 2048  # bytes: the least a tar scan's read fetches (a header, a small `.json` member, the next header)


def tar_samples(path: str, read_json: bool = True) -> Iterator[tuple[str, dict[str, Member], dict | None, str | None]]:
    """A tar's samples in order, its scan: (key, {extension: member}, its `.json` parsed or None, why
    the json could not be read or None). Members are read by header only, except the `.json` ones (not
    even those with `read_json` False), through a `RangedFile` fetching TAR_SCAN_FETCH bytes or more
    where a header is read: a header, the small `.json` after it and the next header in one read, and
    of the audio members a few KB at most.

    CorpusError, in one line naming the file, for a file that is not a whole tar (`_readable`):
    empty, not a tar, cut short (a member's data past the file's end, or no end-of-archive block
    where the members end: every tar writer ends a tar with one), or a header that cannot be read
    after the first; and for a sample whose members are not together (a key met again after other
    keys: WebDataset writes a sample's members one after another and reads them so). The keys met
    are held, a few bytes each, until the tar is read."""
    with (
        _readable(path, "a tar", (tarfile.TarError,)),
        RangedFile(path, min_fetch=TAR_SCAN_FETCH) as f,
        tarfile.open(fileobj=f, mode="r:", tarinfo=_UstarFile) as tar,
    ):
        key: str | None = None
        members: dict[str, Member] = {}
        meta: dict | None = None
        problem: str | None = None
        done: set[str] = set()
        for m in tar:
            if not m.isfile():
                continue
            k, ext = _split_key(m.name)
            if k != key:
                if key is not None:
                    yield key, members, meta, problem
                    done.add(key)
                if k in done:
                    raise CorpusError(
                        f"{path}: the members of sample {k} are not together ({m.name} comes after other "
                        "samples' members); a WebDataset tar holds each sample's files one after another: "
                        "write it again so (e.g. tar --sort=name)"
                    )
                key, members, meta, problem = k, {}, None, None
            members[ext] = Member(m.name, m.offset_data, m.size)
            if ext == "json" and read_json:
                try:
                    data = _member_bytes(f, tar, m)
                    parsed = json.loads(data.decode("utf-8"))
                    if isinstance(parsed, dict):
                        meta = parsed
                    else:
                        problem = "its .json is not an object"
                except (ValueError, UnicodeDecodeError) as e:
                    meta, problem = None, f"its .json cannot be read ({e})"
        f.seek(tar.offset)
        if f.read(tarfile.BLOCKSIZE) != tarfile.NUL * tarfile.BLOCKSIZE:
            raise tarfile.ReadError(f"no end-of-archive block at byte {tar.offset}")
        if key is not None:
            yield key, members, meta, problem


def _member_bytes(f, tar: tarfile.TarFile, m: tarfile.TarInfo) -> bytes:
    """A regular member's bytes: read at its offset in `f` (the tar's own file; tarfile seeks to the
    next header itself), a sparse one through tarfile."""
    if m.issparse():
        return tar.extractfile(m).read()  # type: ignore[union-attr]  # a regular file: extractfile gives its reader
    f.seek(m.offset_data)
    return f.read(m.size)


def tar_rows(
    path: str, start: int, overrides: Mapping[str, str] | None = None, scanned: Iterable | None = None
) -> Iterator[dict]:
    """One WebDataset tar's samples -> items, row positions from `start`, from its scan (`scanned`:
    what `tar_samples` gave; default: the tar scanned now): the audio member (`.flac`, `.wav`, `.mp3`,
    `.ogg`, `.opus`; exactly one) with the fields of the `.json` member (text, id, speaker, language,
    gender as FIELD_COLUMNS name them; id defaults to the key). A sample without its `.json` ->
    `missing_text`; a `.json` without audio -> `missing_audio`; two audio members ->
    `ambiguous_audio`; a `.json` that is no object or lacks the text, or a field of the wrong type
    (`_row_of`) -> `malformed_row`; a null text -> `missing_text`. CorpusError for a file that is not
    a whole tar (`tar_samples`)."""
    samples = tar_samples(path) if scanned is None else scanned
    for n, (key, members, meta, problem) in enumerate(samples, start):
        audio = [ext for ext in members if "." + ext.rsplit(".", 1)[-1] in AUDIO_EXTENSIONS]
        used = column_names(meta, overrides) if meta is not None else {}
        given = _label(meta.get(used["id"])) if meta is not None and "id" in used else ""
        ident = given or key
        where = f"{path}: {key}"
        if problem:
            yield reject(ident, "malformed_row", f"{where}: {problem}")
        elif given is None:
            why = _not_read("id", used["id"], meta.get(used["id"]) if meta else None, "a string or a number")
            yield reject(ident, "malformed_row", f"{where}: {why}")
        elif len(audio) > 1:
            yield reject(ident, "ambiguous_audio", f"{where}: {len(audio)} audio members ({', '.join(audio)})")
        elif not audio:
            yield reject(ident, "missing_audio", f"{where}: no audio member, only {', '.join(members)}")
        elif meta is None:
            yield reject(ident, "missing_text", f"{where}: no .json member beside {key}.{audio[0]}")
        elif "text" not in used:
            yield reject(ident, "malformed_row", f"{where}: its .json has no text ({', '.join(meta)})")
        else:
            m = members[audio[0]]
            locator = {"tar_offset": m.offset, "size": m.size, "member": m.name}
            yield _row_of(meta, used, n, ident, path, locator, where)


def tar_json_keys(path: str) -> list[str] | None:
    """The keys of a tar's first `.json` member (the fields its samples carry): [] if it has none,
    None if the tar holds no sample."""
    found: list[str] | None = None
    for _key, _members, meta, _problem in tar_samples(path):
        if meta is not None:
            return list(meta)
        found = []
    return found


# -- reading a clip's bytes -----------------------------------------------------------------------
class NoAudio(ValueError):
    """A row's audio is null (a parquet row without bytes)."""


def clip_bytes(path: str, locator: Mapping) -> bytes:
    """The encoded audio of a clip inside a parquet file or a tar (NoAudio for a null value): a tar
    member's bytes at its offset, in one read of exactly them; a parquet row from its row group's
    stream (`_GroupAudio`). The tar stays open, the stream stays where it is, for the next rows
    (`release_held` lets them go)."""
    if "tar_offset" in locator:
        try:
            f = _held(("tar", path), lambda: RangedFile(path))
            f.seek(int(locator["tar_offset"]))
            member = f.read(int(locator["size"]))
        except OSError:
            _let_go(("tar", path))
            raise
        if len(member) != int(locator["size"]):
            raise OSError(f"{path}: member {locator['member']} is cut short ({len(member)} of {locator['size']} bytes)")
        return member
    group, index, column = int(locator["row_group"]), int(locator["index"]), str(locator["parquet"])
    try:
        data = _row_group_row(path, group, column, index)
    except IndexError as e:  # the row was listed from the file's footer at the read stage: the file changed since
        _let_go(("parquet", path, group, column))
        raise OSError(f"{path}: row group {group} has no row {index} (the file changed during the run?)") from e
    except (OSError, ValueError) as e:  # a read that failed; pyarrow's ArrowInvalid: a page Arrow cannot decode
        _let_go(("parquet", path, group, column))
        raise OSError(f"{path}: row group {group}: {e}") from e
    if not data:
        raise NoAudio("the row's audio bytes are null" if data is None else "the row's audio bytes are empty")
    return data


SEGMENT_FETCH = 8192  # bytes: a recording's header, and the least a segment's read past its estimate fetches
SEGMENT_SLACK = 16384  # bytes: a segment's estimated span widened by this much each side
RECORDING_KEEP = 32 << 20  # bytes of a recording held for a batch's next segments


class _Recording:
    """A long recording held for the segments of a batch: a `RangedFile` (its header fetched once,
    what it fetched kept up to RECORDING_KEEP), and its length in seconds from its header (0 when the
    header does not read: the decoder then says why)."""

    def __init__(self, path: str):
        import soundfile as sf

        self.file = RangedFile(path, min_fetch=SEGMENT_FETCH, keep=RECORDING_KEEP, grow=True)
        try:
            info = sf.info(self.file)
            self.seconds = info.frames / info.samplerate if info.samplerate and info.frames > 0 else 0.0
        except (RuntimeError, TypeError, ValueError):  # soundfile's LibsndfileError is a RuntimeError
            self.seconds = 0.0

    def close(self) -> None:
        self.file.close()


def recording(path: str, start_s: float, end_s: float) -> RangedFile:
    """The recording at `path`, at its start, to decode seconds [start_s, end_s) from: a `RangedFile`
    held for the batch's next segments of it (`release_held` lets it go), told where the segment's
    bytes are (their estimate: the recording's bytes in proportion to its seconds, exact for PCM
    and close for FLAC, SEGMENT_SLACK wider each side), so the decoder's reads from where it seeks
    to fetch the segment's bytes in one read, and past the estimate fetch SEGMENT_FETCH, then twice
    as much each read on. OSError when the recording cannot be opened."""
    held = _held(("recording", path), lambda: _Recording(path))
    f = held.file
    if held.seconds:
        f.expect(
            int(f.size * start_s / held.seconds) - SEGMENT_SLACK, int(f.size * end_s / held.seconds) + SEGMENT_SLACK
        )
    f.seek(0)
    return f


# -- segments of long recordings -----------------------------------------------------------------
def segment_locator(rec: Mapping, i: int) -> dict | str | None:
    """A manifest record's `start`/`end` (seconds) -> its locator {"start", "end"}, None when it has
    neither, or the reason it is refused (a `bad_segment` detail): one without the other, not a
    number, a negative start, end <= start, an end not below MAX_SEGMENT_END_S (inf, 1e309: no
    recording is that long, and its sample index would overflow)."""
    has = [k for k in ("start", "end") if str(rec.get(k) if rec.get(k) is not None else "").strip()]
    if not has:
        return None
    if len(has) == 1:
        return f"row {i + 1}: {has[0]} is given without {'end' if has[0] == 'start' else 'start'}"
    try:
        start, end = float(rec["start"]), float(rec["end"])
    except (TypeError, ValueError):
        return f"row {i + 1}: start {rec['start']!r} and end {rec['end']!r} are not both seconds"
    if not (start >= 0 and end > start):  # NaN fails too
        return f"row {i + 1}: the segment {start:g}-{end:g} s is empty or reversed (end <= start) or starts before 0"
    if not end < MAX_SEGMENT_END_S:
        return (
            f"row {i + 1}: end {rec['end']!r} is not a time in a recording (at most {MAX_SEGMENT_END_S:,.0f} s); "
            "give the segment's end in seconds"
        )
    return {"start": start, "end": end}


def canonical_path(path: str, cwd: str | None = None) -> str:
    """One spelling per file, to tell whether two rows name one recording: a local path absolute
    (relative to `cwd`, default the working directory) and normalised (`rec.wav`, `./rec.wav`,
    `d/../rec.wav` and its absolute path are one file; symbolic links are not followed); a URL as
    written (an object name may hold `//` or `./`: `gs://b/x/./r.flac` is another object than
    `gs://b/x/r.flac`)."""
    if not is_local_path(path):
        return path
    return "/" + posixpath.normpath(posixpath.join(os.getcwd() if cwd is None else cwd, path)).lstrip("/")


def refuse_overlaps(items: Iterable[dict], working_set) -> Iterator[dict]:
    """A manifest's rows -> the same, but a row whose audio overlaps that of a row kept earlier (in
    input order) of the same recording -> `overlapping_segment`: the overlap holds another
    utterance's speech (crosstalk, or one stretch segmented twice), which the row's text does not
    say, and a clip of one split would hold audio of the other. A segment is its span; a whole-file
    row is its whole recording, [0, its duration): it overlaps every segment of the recording, but
    not another whole-file row of it (one file twice is the duplicate rules' to judge). Segments that
    touch (one's end the next one's start) do not overlap. A recording is its `canonical_path`. What
    is kept waits in the read's working set (`working_set`)."""
    table = working_set.table("segments")
    working_set.db.execute(f"CREATE TABLE {table} (rec TEXT, s REAL, e REAL)")
    working_set.db.execute(f"CREATE INDEX {table}_rec ON {table} (rec, s)")
    whole_table = working_set.table("wholes")  # each recording with a whole-file row kept: the first such row
    working_set.db.execute(f"CREATE TABLE {whole_table} (rec TEXT PRIMARY KEY, row INTEGER) WITHOUT ROWID")
    here = os.getcwd()
    db, segments, wholes = working_set.db, False, False  # whether any is kept yet: whole files alone ask nothing
    for item in items:
        loc = item.get("locator")
        if "reason" in item or (loc and "start" not in loc):
            yield item
            continue
        rec = canonical_path(item["audio"], here)
        other: str | None = None  # what kept row it overlaps
        if loc:
            s, e = loc["start"], loc["end"]
            what = f"{s:g}-{e:g} s of {item['audio']}"
            hit = (
                segments
                and db.execute(
                    f"SELECT s, e FROM {table} WHERE rec = ? AND s < ? AND e > ? LIMIT 1", (rec, e, s)
                ).fetchone()
            )
            whole = not hit and wholes and db.execute(f"SELECT row FROM {whole_table} WHERE rec = ?", (rec,)).fetchone()
            other = f"the whole file, row {whole[0] + 1}" if whole else None
        else:
            what = f"the whole of {item['audio']} (a row without start and end)"
            hit = segments and db.execute(f"SELECT s, e FROM {table} WHERE rec = ? LIMIT 1", (rec,)).fetchone()
        if hit:
            other = f"{hit[0]:g}-{hit[1]:g} s, an earlier row's segment"
        if other:
            yield reject(item["id"], "overlapping_segment", f"row {item['row'] + 1}: {what} overlaps {other}")
            continue
        if loc:
            db.execute(f"INSERT INTO {table} VALUES (?, ?, ?)", (rec, s, e))
            segments = True
        else:
            db.execute(f"INSERT OR IGNORE INTO {whole_table} VALUES (?, ?)", (rec, item["row"]))
            wholes = True
        yield item


def locator_key(locator: Mapping | None) -> str:
    """A locator as text, for the feature cache's key (a row group and row, a member's offset, a span)."""
    return json.dumps(dict(locator), sort_keys=True) if locator else ""
