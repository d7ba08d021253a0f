"""Corpora whose clips live inside bigger files: Hugging Face parquet exports (an `audio` struct of the
encoded file's `bytes` and `path` per row), WebDataset tar shards (`KEY.flac` + `KEY.json`, as
Emilia ships), and manifests of segments (`start`/`end` seconds) of long recordings.

A row of these layouts names its audio as `audio` (the parquet file, the tar, the recording) plus a
`locator` saying where inside it the clip is:

* `{"parquet": COLUMN, "row_group": G, "index": I}`: row I of row group G, the struct column COLUMN;
* `{"tar_offset": OFFSET, "size": N, "member": NAME}`: the member's bytes at OFFSET in the tar;
* `{"start": S, "end": E}`: seconds S to E of the recording.

The read stage reads no audio: a parquet file's other columns (the audio column's `path` alone), a
tar's headers and its small `.json` members (the audio members are skipped by seeking). The audio is
read where the clip is measured, by `clip_bytes` (one row group's audio column, held for the rows
of a batch that fall in it, the file's parsed footer kept for its next batches: FOOTERS; a tar
member's byte range, the tar held open for the batch's next members) and decoded from memory
(`melshards.preprocess.audio.decode_audio`); a segment decodes its span only. So the audio is read
by every worker in parallel, never all by one process.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import posixpath
import tarfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any, TypeVar

import numpy as np
from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.lock import is_local_path
from melshards.preprocess.rows import CorpusError, gender_code, reject, row

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


def _stem(path: str) -> str:
    return posixpath.splitext(posixpath.basename(path))[0]


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
        return _stem(path)
    return posixpath.splitext(posixpath.normpath(path))[0]


def parquet_rows(
    path: str,
    start: int,
    overrides: Mapping[str, str] | None = None,
    name: str | None = None,
    taken: MutableMapping[str, int] | None = None,
) -> Iterator[dict]:
    """One parquet file's rows -> items, row positions from `start`. Its columns but the audio bytes
    are read, a batch at a time. A row's id is its id column; else its audio `path`'s `path_id`,
    unless an earlier row of the input had that one (`taken`, path id -> row position: an export
    that kept base names only); else `<name>-<row in the file, from 0>`, `name` being the file's
    path under its input without `.parquet` (default: its stem). A row whose audio is null, or whose
    table has no audio or text column -> `missing_audio` / `missing_text`; a field of the wrong type
    (`_row_of`) -> `malformed_row`. CorpusError, naming the file, for a file Arrow cannot read.

    Holds the file's footer, parsed whole by Arrow (no part of a footer can be read alone: about 8 KB
    per row group of 5 columns), one batch of the columns read and one row, nothing per row group or
    row beyond: the memory grows with the largest file's row groups, not with the rows read. The
    footer is parsed here, not taken from FOOTERS, so the read stage holds one file's at a time."""
    name = name or _stem(path)
    taken = {} if taken is None else taken
    with contextlib.ExitStack() as stack, _readable(path, "a parquet file", _parquet_errors()):
        pf = _parquet_file(path, stack)
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
        read = [c for c in used.values() if c != audio_col] + ([f"{audio_col}.path"] if has_path else [])
        i = start
        for g in range(pf.metadata.num_row_groups):
            index = 0
            for batch in pf.iter_batches(row_groups=[g], columns=read or None, batch_size=1024):
                for rec in batch.to_pylist():
                    inner = rec.get(audio_col) if has_path else None
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
                    elif not_bytes:
                        why = f"{path}: column {audio_col} holds {audio_type}, not encoded audio (binary, or a struct with `bytes`)"
                        yield reject(clip_id, "missing_audio", why)
                    elif "text" not in used:
                        yield reject(clip_id, "missing_text", f"{path}: no text column ({', '.join(names)})")
                    else:
                        locator = {"parquet": audio_col, "row_group": g, "index": index}
                        yield _row_of(rec, used, i, clip_id, path, locator, where)
                    i += 1
                    index += 1


def _holds_audio_bytes(kind) -> bool:
    """Whether a parquet column of Arrow type `kind` holds encoded audio: binary (plain, large or
    view), or a struct with a binary `bytes` field (a Hugging Face audio struct)."""
    import pyarrow as pa

    if pa.types.is_struct(kind):
        i = kind.get_field_index("bytes")
        return i >= 0 and _holds_audio_bytes(kind.field(i).type)
    return bool(pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind))


def _parquet_file(path: str, stack: contextlib.ExitStack, metadata=None):
    """A `pyarrow.parquet.ParquetFile` of `path`: a local file by its path (Arrow's own reads, no
    Python file object between; not memory-mapped, which would keep every page the reads touch in
    the process' RSS), a remote one through Beam's FileSystems (closed with `stack`). With
    `metadata` (the file's parsed footer) the footer is not read again."""
    import pyarrow.parquet as pq

    if is_local_path(path):
        return pq.ParquetFile(path, metadata=metadata)
    return pq.ParquetFile(stack.enter_context(FileSystems.open(path)), metadata=metadata)


def _file_stamp(path: str) -> tuple:
    """What tells one version of a file from another: a local file's size, modification and change
    times (ns) and inode; a remote one's size and update time (its file system's metadata call)."""
    if is_local_path(path):
        st = os.stat(path)
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    m = FileSystems.get_filesystem(path).metadata(path)
    return (m.size_in_bytes, getattr(m, "last_updated_in_seconds", 0))


# The parsed footers a process keeps for the workers' batches: at most this many bytes of serialized
# footer (parsed, Arrow holds about 4 times that: docs/performance.md#parquet-and-webdataset-inputs),
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


def _kept_parquet_file(path: str, stack: contextlib.ExitStack):
    """`_parquet_file(path)` with its footer parsed once per process while the file is unchanged
    (FOOTERS): a worker reads a file's row groups batch by batch, and Arrow parses a footer whole,
    so parsing it per batch costs a file of N row groups N parses of size N."""
    stamp = _file_stamp(path)
    metadata = FOOTERS.get(path, stamp)
    pf = _parquet_file(path, stack, metadata)
    if metadata is None:
        FOOTERS.put(path, stamp, pf.metadata)
    return pf


_HELD = threading.local()  # this thread's held reader: (kind, path, ...) -> an open file, or a row group's audio


def _held(key: tuple, make: Callable[[], Any]) -> Any:
    """What `make` gives for `key`, made once and held for the next calls with the same key (the rows
    of a batch are consecutive: they share their row group, their tar); one thing is held at a time,
    the old one let go (closed) before the new one is made."""
    held = getattr(_HELD, "item", None)
    if held is not None and held[0] == key:
        return held[1]
    release_held()
    value = make()
    _HELD.item = (key, value)
    return value


def release_held() -> None:
    """Let go of what is held for the next rows (at the end of a batch): a row group's audio, an open
    tar (closed)."""
    held = getattr(_HELD, "item", None)
    _HELD.item = None
    if held is not None and hasattr(held[1], "close"):
        held[1].close()


def _row_group_audio(path: str, group: int, column: str) -> _AudioValues:
    """The audio column of one row group, as Arrow holds it (a row's bytes are copied out only when
    asked for); held for the next rows of the batch."""

    def read() -> _AudioValues:
        with contextlib.ExitStack() as stack:
            pf = _kept_parquet_file(path, stack)
            if group >= pf.metadata.num_row_groups:
                raise IndexError(f"row group {group} of {pf.metadata.num_row_groups}")
            kind = pf.schema_arrow.field(column).type
            struct = hasattr(kind, "get_field_index") and kind.get_field_index("bytes") >= 0
            # An audio struct's `bytes` alone (its `path` is not read); one thread: a column is one job
            wanted = [f"{column}.bytes" if struct else column]
            chunks = pf.read_row_group(group, columns=wanted, use_threads=False).column(0)
        return _AudioValues(chunks.chunk(0) if chunks.num_chunks == 1 else chunks.combine_chunks())

    return _held(("parquet", path, group, column), read)


class _AudioValues:
    """A row group's audio values: a binary column, or a struct column's `bytes` (a Hugging Face audio
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


def tar_samples(
    path: str, read_json: bool = True
) -> Iterator[tuple[str, dict[str, tarfile.TarInfo], dict | None, str | None]]:
    """A tar's samples in order: (key, {extension: member}, its `.json` parsed or None, why the json
    could not be read or None). Members are read by header only, except the `.json` ones (not even
    those with `read_json` False).

    CorpusError, in one line naming the file, for a file that is not a whole tar (`_readable`):
    empty, not a tar, cut short (a member's data past the file's end, or no end-of-archive block
    where the members end: every tar writer ends a tar with one), or a header that cannot be read
    after the first; and for a sample whose members are not together (a key met again after other
    keys: WebDataset writes a sample's members one after another and reads them so). The keys met
    are held, a few bytes each, until the tar is read."""
    with _readable(path, "a tar", (tarfile.TarError,)), _open(path) as f:
        with tarfile.open(fileobj=f, mode="r:", tarinfo=_UstarFile) as tar:
            key: str | None = None
            members: dict[str, tarfile.TarInfo] = {}
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
                members[ext] = m
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


def tar_rows(path: str, start: int, overrides: Mapping[str, str] | None = None) -> Iterator[dict]:
    """One WebDataset tar's samples -> items, row positions from `start`: the audio member (`.flac`,
    `.wav`, `.mp3`, `.ogg`, `.opus`; exactly one) with the fields of the `.json` member (text, id,
    speaker, language, gender as FIELD_COLUMNS name them; id defaults to the key). A sample without
    its `.json` -> `missing_text`; a `.json` without audio -> `missing_audio`; two audio members ->
    `ambiguous_audio`; a `.json` that is no object or lacks the text, or a field of the wrong type
    (`_row_of`) -> `malformed_row`; a null text -> `missing_text`. CorpusError for a file that is not
    a whole tar (`tar_samples`)."""
    for n, (key, members, meta, problem) in enumerate(tar_samples(path), start):
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
            locator = {"tar_offset": m.offset_data, "size": m.size, "member": m.name}
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


def _open(path: str):
    """`path` open for reading: a local file by the OS (buffered), a remote one through Beam's FileSystems."""
    return open(path, "rb") if is_local_path(path) else FileSystems.open(path)


def clip_bytes(path: str, locator: Mapping) -> bytes:
    """The encoded audio of a clip inside a parquet file or a tar (NoAudio for a null value). The tar
    stays open, the parquet row group's audio column stays read, for the next rows of the batch
    (`release_held` lets them go)."""
    if "tar_offset" in locator:
        f = _held(("tar", path), lambda: _open(path))
        try:
            f.seek(int(locator["tar_offset"]))
            member = f.read(int(locator["size"]))
        except OSError:
            release_held()
            raise
        if len(member) != int(locator["size"]):
            raise OSError(f"{path}: member {locator['member']} is cut short ({len(member)} of {locator['size']} bytes)")
        return member
    group, index = int(locator["row_group"]), int(locator["index"])
    try:
        data = _row_group_audio(path, group, str(locator["parquet"]))[index]
    except IndexError as e:  # the row was listed from the file's footer at the read stage: the file changed since
        raise OSError(f"{path}: row group {group} has no row {index} (the file changed during the run?)") from e
    except ValueError as e:  # pyarrow's ArrowInvalid: a page Arrow cannot decode
        raise OSError(f"{path}: row group {group}: {e}") from e
    if not data:
        raise NoAudio("the row's audio bytes are null" if data is None else "the row's audio bytes are empty")
    return data


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


def refuse_overlaps(items: Iterable[dict], spill) -> Iterator[dict]:
    """A manifest's rows -> the same, but a row whose audio overlaps that of a row kept earlier (in
    input order) of the same recording -> `overlapping_segment`: the overlap holds another
    utterance's speech (crosstalk, or one stretch segmented twice), which the row's text does not
    say, and a clip of one split would hold audio of the other. A segment is its span; a whole-file
    row is its whole recording, [0, its duration): it overlaps every segment of the recording, but
    not another whole-file row of it (one file twice is the duplicate rules' to judge). Segments that
    touch (one's end the next one's start) do not overlap. A recording is its `canonical_path`. What
    is kept waits in the spill's sqlite file."""
    table = spill.table("segments")
    spill.db.execute(f"CREATE TABLE {table} (rec TEXT, s REAL, e REAL)")
    spill.db.execute(f"CREATE INDEX {table}_rec ON {table} (rec, s)")
    whole_table = spill.table("wholes")  # each recording with a whole-file row kept: the first such row
    spill.db.execute(f"CREATE TABLE {whole_table} (rec TEXT PRIMARY KEY, row INTEGER) WITHOUT ROWID")
    here = os.getcwd()
    db, segments, wholes = spill.db, False, False  # whether any is kept yet: whole files alone ask nothing
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
