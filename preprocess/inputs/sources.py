"""Where each corpus layout keeps its files: recognising an input from its paths, checking its rows
file's first line, and listing and reading its files through Beam's FileSystems (local or gs://) for
the pure readers in `melshards.preprocess.inputs.layouts` and `melshards.preprocess.inputs.manifests`.

`LAYOUTS` registers every layout (docs/corpora.md says how to add one). `detect_corpus` decides an
input's layout from existence checks and listings of at most one file (and a `.tsv`'s first line: a
Common Voice TSV or a manifest), never from reading the rows: building the pipeline reads no corpus
file, so a Dataflow graph builds offline. `check_rows_file` reads a rows file's first line, so an
empty file or a table without the columns it needs stops the run before any work.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import itertools
import os
import posixpath
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.inputs import layouts, manifests, packed_clips
from melshards.preprocess.inputs.merge import input_name
from melshards.preprocess.inputs.rows import CorpusError, LayoutRows, complete_rows, unique_ids
from melshards.preprocess.inputs.working_set import WorkingSet
from melshards.preprocess.out_dir.lock import is_local_path
from melshards.preprocess.out_dir.staging import normal_dir

_READ_THREADS = 16  # VCTK and LibriTTS: one small transcript file per utterance, read concurrently
_CHUNK = 1 << 20  # a rows file is read a megabyte at a time
MAX_LINE = 1 << 24  # characters: a row is far shorter, and a longer line would be held in memory whole
REMOTE_ANSWER_S = 30.0  # a remote --input whose file system says nothing of it in this long is unreachable


@dataclasses.dataclass(frozen=True)
class Corpus:
    kind: str  # the layout: a key of LAYOUTS
    rows_path: str | None  # the table of rows (metadata.csv, a manifest, a Common Voice TSV); None: one file per row
    root: str  # the layout's files (and relative audio paths) are under this
    speakers_path: str | None = None  # VCTK's speaker-info.txt, LibriTTS' SPEAKERS.txt
    name: str = ""  # the input's name (`melshards.preprocess.inputs.merge`)
    language: str | None = None  # for rows that give none; None: such rows are `missing_language`
    input: str = ""  # the --input as given
    columns: tuple[tuple[str, str], ...] = ()  # --column FIELD=NAME: a field read from a column of another name

    def rows_file(self) -> str:
        """`rows_path`, in a layout that reads one (every layout but the one file per row)."""
        if self.rows_path is None:
            raise CorpusError(f"{self.input or self.root}: this {self.kind} input has no rows file")
        return self.rows_path


# A container input's files in input order, each with its scan's records (`Layout.scan`): read now,
# or read back from where the job's scan stage put them.
Scans = Sequence[tuple[str, Callable[[], Iterable]]]


@dataclasses.dataclass(frozen=True)
class Layout:
    """A corpus layout: `locate(path, forced)` the corpus at path if its telltale files are there
    (forced by --format: only what reading needs), `read(corpus, working_set, scans)` its items with unique
    ids (the working set holds what reading must remember; `scans`: a container layout's files with their
    scans, unused by the others), `count` its input rows from what tells them without reading the
    rows (a rows file's lines, listings, parquet footers; a WebDataset's, an estimate: the local
    worker count is chosen from it) and
    `language(corpus, --language)` its default language. A layout of container files (parquet, tars)
    has `files(corpus)`, its files in input order, and `scan(corpus, path)`, one file's records (all
    of its I/O: the job scans the files in parallel, one file to a worker)."""

    name: str
    telltale: str  # what `locate` looks for, as the error for an unrecognised input lists it
    locate: Callable[[str, bool], Corpus | None]
    read: Callable[[Corpus, WorkingSet, Scans], Iterator[dict]]
    count: Callable[[Corpus], int]
    language: Callable[[Corpus, str | None], str | None]
    unused: Callable[[Corpus], list[str]] = lambda corpus: []  # columns reading leaves out (the summary says)
    named_columns: bool = False  # whether --column FIELD=NAME names its columns (a table of columns of any name)
    files: Callable[[Corpus], list[str]] | None = None
    scan: Callable[[Corpus, str], Iterator] | None = None


# -- FileSystems --------------------------------------------------------------------------------------
def _join(*parts: str) -> str:
    return FileSystems.join(*parts)


def _exists(path: str) -> bool:
    return FileSystems.exists(path)


def _list(pattern: str, limit: int | None = None) -> list[str]:
    return [m.path for m in FileSystems.match([pattern], [limit])[0].metadata_list]


def _list_dir(path: str) -> Iterator[str]:
    """The paths in a directory: a local one as it is read (a million files are not held in a list),
    a remote one by one listing."""
    if is_local_path(path):
        if os.path.isdir(path):  # no wavs/: every row is missing_audio
            with os.scandir(path) as entries:
                yield from (e.path for e in entries)
    else:
        yield from _list(_join(path, "*"))


def _found(path: str) -> bool:
    """Whether anything is at `path`: a file, or files under it."""
    return _exists(path) or bool(_list(_join(path, "**"), limit=1))


def input_found(path: str, timeout_s: float | None = None) -> bool:
    """`_found(path)`; for a remote path asked in a thread of its own and given `timeout_s` (default
    REMOTE_ANSWER_S) to answer:
    a file system that cannot be reached (no network, a client retrying for ever) or that fails is
    a CorpusError in one line, before any work, rather than a run that hangs without a word."""
    if is_local_path(path):
        return _found(path)
    timeout_s = REMOTE_ANSWER_S if timeout_s is None else timeout_s
    answer: list = []
    probe = threading.Thread(
        target=lambda: answer.append(_try(_found, path)), daemon=True, name="melshards-input-probe"
    )  # daemon: a hung client does not hold the exit
    probe.start()
    probe.join(timeout_s)
    if not answer:
        raise CorpusError(
            f"--input {path}: {path.split('://')[0]}:// gave no answer in {timeout_s:g} s; check the "
            "network and the credentials (gcloud auth application-default login), then run again"
        )
    if isinstance(answer[0], Exception):
        reason = (str(answer[0]).strip().splitlines() or [""])[0][:300]
        raise CorpusError(
            f"--input {path} cannot be read ({type(answer[0]).__name__}: {reason}); check the path, "
            "the network and the credentials"
        )
    return answer[0]


def _try(fn: Callable, *args):
    """fn(*args), or the exception it raised."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 (reported in one line by the caller)
        return e


def _read_text(path: str) -> str:
    """A small text file's text (a transcript, speaker-info.txt), decoded as `_lines` decodes."""
    return "".join(_lines(path, max_line=None))


_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
_CODEC_NAMES = {"utf-8-sig": "UTF-8", "utf-16": "UTF-16"}


def text_codec(head: bytes) -> str:
    """The codec of a text file from its first bytes: UTF-16 where they are UTF-16's byte-order mark
    (what Notepad and Excel write as "Unicode"), else UTF-8 (its byte-order mark, if any, skipped)."""
    return next((codec for bom, codec in _BOMS if head.startswith(bom)), "utf-8-sig")


class _Unreadable(Exception):
    """Text that cannot be a rows file's: `before` is the text decoded before it, `what` says why."""

    def __init__(self, before: str, what: str):
        super().__init__(what)
        self.before, self.what = before, what


def _decoded(f) -> Iterator[tuple[str, bool]]:
    """A binary file's text, a chunk of `_CHUNK` bytes at a time: (text, whether it is the last),
    decoded with `text_codec` of its first bytes. _Unreadable for bytes the codec cannot read or for
    a NUL character (no text row holds one: a UTF-16 file without its byte-order mark)."""
    head = b""
    while len(head) < len(codecs.BOM_UTF8):  # enough bytes to tell a byte-order mark
        chunk = f.read(_CHUNK)
        head += chunk
        if not chunk:
            break
    codec = text_codec(head)
    decoder = codecs.getincrementaldecoder(codec)()
    chunk = head
    while True:
        last = not chunk
        try:
            text = decoder.decode(chunk, final=last)
        except UnicodeDecodeError as e:
            before = e.object[: e.start].decode(e.encoding, "replace")
            raise _Unreadable(
                before,
                f"is not {_CODEC_NAMES[codec]} (byte 0x{e.object[e.start]:02x}: {e.reason}); re-save the file "
                "as UTF-8 (from Latin-1: iconv -f LATIN1 -t UTF-8 FILE > NEW), or as UTF-16 with a byte-order mark",
            ) from None
        nul = text.find("\x00")
        if nul >= 0:
            raise _Unreadable(
                text[:nul],
                "holds a NUL character, which no text row has: a UTF-16 or UTF-32 file without a "
                "byte-order mark? Re-save the file as UTF-8, or as UTF-16 with a byte-order mark",
            )
        yield text, last
        if last:
            return
        chunk = f.read(_CHUNK)


def _line_breaks(text: str) -> int:
    return len((text + "x").splitlines()) - 1


def _lines(path: str, max_line: int | None = MAX_LINE) -> Iterator[str]:
    """A text file's lines as `str.splitlines(keepends=True)` splits them, read a chunk at a time and
    decoded as `_decoded` decodes them (UTF-8, or UTF-16 with a byte-order mark). CorpusError, naming
    the file and the line, for bytes the codec cannot read, a NUL character, or a line longer than
    `max_line` characters (None: no limit): no rows file has one, and reading on would hold it all in
    memory."""
    held, n = "", 0
    with FileSystems.open(path) as f:
        pieces = _decoded(f)
        while True:
            try:
                text, last = next(pieces)
            except _Unreadable as e:
                raise CorpusError(f"{path}: line {n + _line_breaks(held + e.before) + 1} {e.what}") from None
            lines = (held + text).splitlines(keepends=True)
            # The last line may go on in the next chunk (a "\r" too: the "\n" of a "\r\n" may follow).
            held = lines.pop() if not last and lines else ""
            long = (
                None
                if max_line is None
                else next(
                    (i for i, line in enumerate(lines) if len(line) > max_line),
                    len(lines) if len(held) > max_line else None,
                )
            )
            if long is not None:
                yield from lines[:long]
                raise CorpusError(
                    f"{path}: line {n + long + 1} is longer than {max_line} characters; a rows file "
                    "holds one row per line: check that --input names the corpus' rows file"
                )
            n += len(lines)
            yield from lines
            if last:
                return


def _read_texts(paths: Iterable[str]) -> dict[str, str]:
    paths = list(paths)
    with ThreadPoolExecutor(_READ_THREADS) as pool:
        return dict(zip(paths, pool.map(_read_text, paths)))


def _first_line(path: str, limit: int = 1 << 20) -> tuple[str | None, bool]:
    """(the first non-blank line, without its line break, or None; for None, whether the file ended:
    it holds no rows), as `_lines` reads and decodes it (a CorpusError for text it cannot decode in
    the first chunk read). Gives up after `limit` characters of blank lines; a first line longer than
    `limit` is a CorpusError."""
    blank = 0
    for line in _lines(path, max_line=limit):
        if line.strip():
            return line.splitlines()[0], False
        blank += len(line)
        if blank > limit:
            return None, False
    return None, True


def _is_table(path: str) -> bool:
    return path.lower().endswith(manifests.MANIFEST_EXTENSIONS)


def _is_dir(path: str) -> bool:
    """A directory; remote, a prefix with objects under it rather than an object (the caller has
    checked that one of the two is there)."""
    return os.path.isdir(path) if is_local_path(path) else not _exists(path)


def _count_lines(corpus: Corpus) -> int:
    """Non-blank lines of the rows file as the readers see them (`_lines`: so a file they cannot
    decode stops a local run here, before the job), less a table's header (every CSV/TSV but
    LJSpeech's metadata.csv)."""
    n = sum(1 for line in _lines(corpus.rows_file()) if line.strip())
    header = corpus.kind != "ljspeech" and not corpus.rows_file().lower().endswith(".jsonl")
    return n - 1 if header else n


# -- the layouts ----------------------------------------------------------------------------------
def _locate_ljspeech(path: str, forced: bool) -> Corpus | None:
    metadata = _join(path, "metadata.csv")
    return Corpus("ljspeech", metadata, path) if _exists(metadata) else None


def _read_ljspeech(c: Corpus, working_set: WorkingSet, scans: Scans = ()) -> Iterator[dict]:
    files = working_set.lists(layouts.audio_files(_list_dir(_join(c.root, "wavs"))))
    return layouts.ljspeech_rows(_lines(c.rows_file()), files, working_set.map())


def _locate_vctk(path: str, forced: bool) -> Corpus | None:
    if not _is_dir(path):
        return None
    info = _join(path, "speaker-info.txt")
    has_info = _exists(info)
    if not (has_info or forced) or not _list(_join(path, layouts.VCTK_AUDIO_DIR, "*", "*"), limit=1):
        return None
    return Corpus("vctk", None, path, speakers_path=info if has_info else None)


def _vctk_files(c: Corpus) -> tuple[list[str], list[str]]:
    return _list(_join(c.root, "txt", "*", "*.txt")), _list(_join(c.root, layouts.VCTK_AUDIO_DIR, "*", "*"))


def _read_vctk(c: Corpus, working_set: WorkingSet, scans: Scans = ()) -> Iterator[dict]:
    txts, audio = _vctk_files(c)
    info = _read_text(c.speakers_path) if c.speakers_path else None
    return unique_ids(layouts.vctk_rows(_read_texts(txts), audio, info), working_set.map())


def _count_vctk(c: Corpus) -> int:
    txts, audio = _vctk_files(c)
    return sum(1 for _ in layouts.vctk_rows(dict.fromkeys(txts, ""), audio, None))


def _locate_libritts(path: str, forced: bool) -> Corpus | None:
    """The corpus root (SPEAKERS.txt in it) or one subset (SPEAKERS.txt in its parent)."""
    if not _is_dir(path):
        return None
    speakers = next(
        (p for p in (_join(path, "SPEAKERS.txt"), _join(posixpath.dirname(path), "SPEAKERS.txt")) if _exists(p)), None
    )
    return Corpus("libritts", None, path, speakers_path=speakers) if speakers or forced else None


def _libritts_files(c: Corpus) -> tuple[list[str], list[str]]:
    files = _list(_join(c.root, "**"))
    return [p for p in files if p.endswith(layouts.LIBRITTS_TEXT)], files


def _read_libritts(c: Corpus, working_set: WorkingSet, scans: Scans = ()) -> Iterator[dict]:
    txts, files = _libritts_files(c)
    speakers = _read_text(c.speakers_path) if c.speakers_path else None
    return unique_ids(
        layouts.libritts_rows(_read_texts(txts), files, speakers), working_set.map()
    )  # one utterance in two subsets


def _count_libritts(c: Corpus) -> int:
    txts, files = _libritts_files(c)
    return sum(1 for _ in layouts.libritts_rows(dict.fromkeys(txts, ""), files, None))


def _locate_commonvoice(path: str, forced: bool) -> Corpus | None:
    """A locale directory (its validated.tsv), or a TSV whose header has client_id, path, sentence."""
    if path.lower().endswith(".tsv"):
        line = _first_line(path)[0]
        if forced or (line is not None and manifests.is_commonvoice_header(manifests.commonvoice_columns(line))):
            return Corpus("commonvoice", path, posixpath.dirname(path))
        return None
    tsv = _join(path, "validated.tsv")
    return Corpus("commonvoice", tsv, path) if _exists(tsv) else None


def _read_commonvoice(c: Corpus, working_set: WorkingSet, scans: Scans = ()) -> Iterator[dict]:
    return unique_ids(manifests.commonvoice_rows(_lines(c.rows_file()), c.rows_file()), working_set.map())


def _locate_manifest(path: str, forced: bool) -> Corpus | None:
    return Corpus("manifest", path, posixpath.dirname(path) or ".") if _is_table(path) and not _is_dir(path) else None


def _read_manifest(c: Corpus, working_set: WorkingSet, scans: Scans = ()) -> Iterator[dict]:
    items = manifests.manifest_rows(_lines(c.rows_file()), c.rows_file(), c.root, dict(c.columns))
    return unique_ids(packed_clips.refuse_overlaps(items, working_set), working_set.map())


def _manifest_unused(c: Corpus) -> list[str]:
    """A manifest's columns that no field is read from (`start`/`end` are: a segment's span)."""
    line = _first_line(c.rows_file())[0]
    columns = manifests.manifest_columns(line, c.rows_file()) if line is not None else None
    read = manifests.manifest_fields(dict(c.columns)).values()
    return [k for k in columns or [] if k not in read]


def _container_files(c: Corpus, extensions: tuple[str, ...]) -> list[str]:
    """The input's files with one of `extensions`: itself, or those under it (any depth; one listing
    per extension, of those files alone), sorted."""
    return sorted(_container_sizes(c, extensions))


def _container_sizes(c: Corpus, extensions: tuple[str, ...]) -> dict[str, int]:
    """`_container_files`, each with its size in bytes (from the same listings)."""
    patterns = [c.root] if c.root.lower().endswith(extensions) and not _is_dir(c.root) else None
    patterns = patterns or [_join(c.root, f"**{ext}") for ext in extensions]
    return {m.path: m.size_in_bytes for r in FileSystems.match(patterns) for m in r.metadata_list}


def _numbered(read: Callable[[str, int, Iterable], Iterator[dict]], scans: Scans) -> Iterator[dict]:
    """Each file's items in turn (`read(path, first row position, its scan's records)`), the row
    positions running on from file to file."""
    n = 0
    for path, records in scans:
        for item in read(path, n, records()):
            n += 1
            yield item


_CONTAINER_EXTENSIONS = {"parquet": packed_clips.PARQUET_EXTENSIONS, "webdataset": packed_clips.TAR_EXTENSIONS}


def _locate_container(kind: str, extensions: tuple[str, ...]) -> Callable[[str, bool], Corpus | None]:
    def locate(path: str, forced: bool) -> Corpus | None:
        if path.lower().endswith(extensions) and not _is_dir(path):
            return Corpus(kind, None, path)
        if _is_dir(path) and any(_list(_join(path, f"**{ext}"), limit=1) for ext in extensions):
            return Corpus(kind, None, path)
        return None

    return locate


def _name_in(c: Corpus, path: str) -> str:
    """A file's path under its input, without its extension (`data/en/train-0.parquet` under the
    input `ds` -> `data/en/train-0`); the input's own file -> its stem."""
    root = c.root.rstrip("/") + "/"
    rel = path[len(root) :] if path.startswith(root) else posixpath.basename(path)
    return posixpath.splitext(rel)[0]


def _read_parquet(c: Corpus, working_set: WorkingSet, scans: Scans) -> Iterator[dict]:
    taken = working_set.map()  # the ids taken from audio paths (`packed_clips.parquet_rows`)
    columns = dict(c.columns)

    def read(path: str, start: int, records: Iterable) -> Iterator[dict]:
        return packed_clips.parquet_rows(path, start, columns, _name_in(c, path), taken, records)

    return unique_ids(_numbered(read, scans), working_set.map())


def _scan_parquet(c: Corpus, path: str) -> Iterator:
    return packed_clips.parquet_scan(path, dict(c.columns))


def _count_parquet(c: Corpus) -> int:
    return sum(packed_clips.parquet_row_count(p) for p in _container_files(c, packed_clips.PARQUET_EXTENSIONS))


def _parquet_unused(c: Corpus) -> list[str]:
    names = (_first_columns(c) or ("", []))[1]
    return packed_clips.unused(names, packed_clips.column_names(names, dict(c.columns)))


def _read_webdataset(c: Corpus, working_set: WorkingSet, scans: Scans) -> Iterator[dict]:
    columns = dict(c.columns)

    def read(path: str, start: int, records: Iterable) -> Iterator[dict]:
        return packed_clips.tar_rows(path, start, columns, records)

    return unique_ids(_numbered(read, scans), working_set.map())


def _scan_webdataset(c: Corpus, path: str) -> Iterator:
    return packed_clips.tar_samples(path)


_ESTIMATE_SAMPLES = 32  # a WebDataset input's row count is estimated from its first tar's first samples


def _count_webdataset(c: Corpus) -> int:
    """About the tars' samples (the local worker count's figure): their bytes over the bytes a sample
    takes in the first tar's first _ESTIMATE_SAMPLES samples (their headers read, a few KB each),
    exact for a first tar of no more samples. Counting every tar's samples would cost a read of every
    tar's headers before the job (the job's read stage scans them once, in parallel)."""
    sizes = _container_sizes(c, packed_clips.TAR_EXTENSIONS)
    if not sizes:
        return 0
    path = min(sizes)
    first = list(itertools.islice(packed_clips.tar_samples(path, read_json=False), _ESTIMATE_SAMPLES + 1))
    if len(first) <= _ESTIMATE_SAMPLES:
        head, n = sizes[path], len(first)
    else:
        head, n = min(m.offset for m in first[-1][1].values()), _ESTIMATE_SAMPLES
    return round(sum(sizes.values()) * n / head) if head else 0


def _webdataset_unused(c: Corpus) -> list[str]:
    keys = (_first_columns(c) or ("", []))[1]
    return packed_clips.unused(keys, packed_clips.column_names(keys, dict(c.columns)))


def _first_columns(c: Corpus) -> tuple[str, list[str]] | None:
    """The input's first container file that holds a row, and its columns (a parquet file's, from its
    footer; a tar's, the keys of its first `.json`); None when none holds a row."""
    for path in _container_files(c, _CONTAINER_EXTENSIONS[c.kind]):
        if c.kind == "parquet" and packed_clips.parquet_row_count(path):
            return path, packed_clips.parquet_schema_columns(path)
        if c.kind == "webdataset":
            keys = packed_clips.tar_json_keys(path)
            if keys is not None:
                return path, keys
    return None


# The default language of a layout's rows that give none, from the corpus and --language (or None).
def _given_else_english(corpus: Corpus, given: str | None) -> str:
    return given or "en"  # the LJSpeech layout: LJSpeech is English, many corpora in its layout are not


def _english(corpus: Corpus, given: str | None) -> str:
    return "en"  # VCTK and LibriTTS are English corpora, whatever --language says


def _given_else_locale_dir(corpus: Corpus, given: str | None) -> str | None:
    return given or manifests.commonvoice_language(corpus.rows_file())


def _given(corpus: Corpus, given: str | None) -> str | None:
    return given


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (  # in the order detection tries them
        Layout("ljspeech", "metadata.csv", _locate_ljspeech, _read_ljspeech, _count_lines, _given_else_english),
        Layout(
            "vctk", f"speaker-info.txt and {layouts.VCTK_AUDIO_DIR}/", _locate_vctk, _read_vctk, _count_vctk, _english
        ),
        Layout(
            "libritts",
            "SPEAKERS.txt in it or in its parent",
            _locate_libritts,
            _read_libritts,
            _count_libritts,
            _english,
        ),
        Layout(
            "commonvoice",
            "validated.tsv, or a .tsv with columns client_id, path, sentence",
            _locate_commonvoice,
            _read_commonvoice,
            _count_lines,
            _given_else_locale_dir,
        ),
        Layout(
            "parquet",
            "a .parquet file, or a directory with .parquet files under it",
            _locate_container("parquet", packed_clips.PARQUET_EXTENSIONS),
            _read_parquet,
            _count_parquet,
            _given,
            _parquet_unused,
            named_columns=True,
            files=lambda c: _container_files(c, packed_clips.PARQUET_EXTENSIONS),
            scan=_scan_parquet,
        ),
        Layout(
            "webdataset",
            "a .tar file, or a directory with .tar files under it",
            _locate_container("webdataset", packed_clips.TAR_EXTENSIONS),
            _read_webdataset,
            _count_webdataset,
            _given,
            _webdataset_unused,
            named_columns=True,
            files=lambda c: _container_files(c, packed_clips.TAR_EXTENSIONS),
            scan=_scan_webdataset,
        ),
        Layout(
            "manifest",
            "a .csv/.tsv/.jsonl file with columns audio, text",
            _locate_manifest,
            _read_manifest,
            _count_lines,
            _given,
            _manifest_unused,
            named_columns=True,
        ),
    )
}


def detect_corpus(
    path: str, format: str | None = None, language: str | None = None, columns: Sequence[str] = ()
) -> Corpus:
    """The corpus at `path`: its layout (`format` forces one), name and default language (`language`
    where the layout takes one). Raises CorpusError, in one line, for a path that is not there, that
    cannot be reached (`input_found`), or that no layout recognises (listing what each looks for)."""
    path = path.rstrip("/") or path
    if format is not None and format not in LAYOUTS:
        raise CorpusError(f"--format {format} is not a layout melshards reads; choose one of {', '.join(LAYOUTS)}")
    if language is not None and not language.strip():
        raise CorpusError("--language is empty; give a language code such as en, de or zh-CN")
    if not input_found(path):
        raise CorpusError(f"--input {path} does not exist; check the path")
    for layout in [LAYOUTS[format]] if format else LAYOUTS.values():
        found = layout.locate(path, format is not None)
        if found:
            given = language.strip() if language else None
            return dataclasses.replace(
                found,
                name=input_name(path),
                language=layout.language(found, given),
                input=path,
                columns=parse_columns(columns),
            )
    if format:
        raise CorpusError(
            f"--input {path} is not a {format} corpus: no {LAYOUTS[format].telltale}; "
            "check the path, or leave --format out to have the layout recognised"
        )
    looked = "; ".join(f"{layout.telltale} ({name})" for name, layout in LAYOUTS.items())
    raise CorpusError(
        f"--input {path} is not a corpus: looked for {looked}; point --input at one of these, "
        "or force a layout with --format NAME (see docs/corpora.md)"
    )


def parse_columns(given: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """`--column FIELD=NAME` values -> (field, column) pairs; CorpusError for a malformed one or an
    unknown field."""
    fields = (*packed_clips.FIELD_COLUMNS, *packed_clips.EXTRA_FIELDS)
    pairs = []
    for value in given:
        field, sep, name = value.partition("=")
        if not sep or not name.strip() or field.strip() not in fields:
            raise CorpusError(
                f"--column {value}: give FIELD=COLUMN with FIELD one of {', '.join(fields)} (e.g. --column text=transcript)"
            )
        pairs.append((field.strip(), name.strip()))
    return tuple(pairs)


def check_named_columns(corpora: Sequence[Corpus]) -> None:
    """Refuse `--column` when no input has columns for it to name (LJSpeech, VCTK, LibriTTS and Common
    Voice read fixed files): it would change nothing. Where some input has columns, each such input
    checks the names against its own (`check_rows_file`)."""
    given = next((c.columns for c in corpora if c.columns), ())
    if given and not any(LAYOUTS[c.kind].named_columns for c in corpora):
        field, name = given[0]
        inputs = ", ".join(f"{c.input or c.root} is {c.kind}" for c in corpora)
        tables = ", ".join(n for n, layout in LAYOUTS.items() if layout.named_columns)
        raise CorpusError(
            f"--column {field}={name}: no input has columns to name ({inputs}); --column names a column "
            f"of a table ({tables}). Leave it out"
        )


def unused_columns(corpus: Corpus) -> list[str]:
    """The columns (a manifest's, a parquet file's, a tar's `.json` keys) that no field is read from."""
    return LAYOUTS[corpus.kind].unused(corpus)


def corpus_location(corpus: Corpus) -> str:
    """Where a corpus is, one spelling per place: its rows file (else its root), resolved locally
    (`lj8`, `./lj8/` and a symlink to it are one place) and without repeated `/` on gs://."""
    path = corpus.rows_path or corpus.root
    return os.path.realpath(path) if is_local_path(path) else normal_dir(path)


def check_distinct_inputs(corpora: Sequence[Corpus]) -> None:
    """CorpusError, in one line, for two inputs that are one corpus however spelt (one place, or a
    directory listed inside another's listing of the same layout): read twice, every clip would be
    in the shards twice, under two prefixed ids and on both sides of the split."""
    for n, c in enumerate(corpora):
        for d in corpora[:n]:
            a, b = corpus_location(d), corpus_location(c)
            nested = (
                c.kind == d.kind
                and c.rows_path is None
                and d.rows_path is None
                and (a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/"))
            )
            if a == b and c.input == d.input:
                raise CorpusError(f"--input {c.input} is given twice; give each corpus once")
            if a == b or nested:
                how = f"both {a}" if a == b else f"{a if len(a) > len(b) else b} is inside the other"
                raise CorpusError(
                    f"--input {d.input} and --input {c.input} are one corpus ({how}): every clip "
                    "would be read twice; give each corpus once"
                )


def check_rows_file(corpus: Corpus) -> None:
    """Refuse an empty rows file, or a table without the columns its layout needs (a language column
    too when the input has no default language), from its first line.

    Called by the CLI before any work (the rest of the file is read inside the pipeline).
    """
    if corpus.kind in ("parquet", "webdataset"):
        _check_container_columns(corpus)
        return
    if corpus.rows_path is None:
        return
    line, whole = _first_line(corpus.rows_path)
    if line is None:
        if whole:
            raise CorpusError(
                f"{corpus.rows_path} holds no rows: it is empty. Point --input at a corpus with at least one row."
            )
        return  # a megabyte of blank lines: leave it to the pipeline
    if corpus.kind == "manifest":
        columns = manifests.manifest_columns(line, corpus.rows_path)
        manifests.check_columns(columns, corpus.rows_path, dict(corpus.columns))
        language = manifests.manifest_fields(dict(corpus.columns))["language"]
        manifests.check_language(columns, language, corpus.language, corpus.rows_path)
    elif corpus.kind == "commonvoice":
        columns = manifests.commonvoice_columns(line)
        manifests.check_commonvoice_columns(columns, corpus.rows_path)
        manifests.check_language(columns, "locale", corpus.language, corpus.rows_path)


def _check_container_columns(corpus: Corpus) -> None:
    """A parquet export's columns (the footer of its first file that holds a row) or a WebDataset's
    `.json` keys (the first `.json` of its first tar that holds a sample) must give each row an audio,
    a text and a language (or --language). An input whose files hold no row at all stops the run
    here, as an empty rows file does; a file that cannot be read, on the way, too (`containers`)."""
    parquet = corpus.kind == "parquet"
    ext = ".parquet" if parquet else ".tar"
    given = corpus.input or corpus.root
    files = _container_files(corpus, _CONTAINER_EXTENSIONS[corpus.kind])
    if not files:
        raise CorpusError(f"--input {given}: no {ext} file in it")
    first = _first_columns(corpus)
    if first is None:
        what = files[0] if files == [given] else f"--input {given}: its {len(files)} {ext} file(s)"
        raise CorpusError(
            f"{what} hold{'s' if files == [given] else ''} no rows. Point --input at a corpus with at least one row."
        )
    path, names = first
    manifests.check_named_columns(
        dict(corpus.columns), names, f"{path}: its {'columns are' if parquet else 'first .json has keys'}"
    )
    used = packed_clips.column_names(names, dict(corpus.columns))
    what = f"{path}: its {'columns' if parquet else '.json keys'} are {', '.join(names) or 'none'}"
    needed = ("audio", "text") if parquet else ("text",)
    for field in [f for f in needed if f not in used] + (
        ["language"] if "language" not in used and corpus.language is None else []
    ):
        tried = ", ".join(packed_clips.FIELD_COLUMNS[field])
        raise CorpusError(
            f"{what}: no {field} ({tried}); name its column with --column {field}=NAME"
            + (", or give --language CODE" if field == "language" else "")
        )


def count_input_rows(corpus: Corpus) -> int:
    """The corpus' input rows from its rows file's lines, its listings or its parquet footers (no
    transcript is read; a WebDataset input's, an estimate from its sizes and its first samples: no
    tar is scanned): what the local worker count is chosen from."""
    return LAYOUTS[corpus.kind].count(corpus)


def file_scans(corpus: Corpus) -> Scans:
    """A container input's files, each with its scan read when it is asked for (nothing for a layout
    that scans no file)."""
    layout = LAYOUTS[corpus.kind]
    if layout.files is None or layout.scan is None:
        return ()
    scan = layout.scan
    return [(path, functools.partial(scan, corpus, path)) for path in layout.files(corpus)]


def input_items(
    corpus: Corpus, working_set: WorkingSet, folded: dict | None = None, scans: Scans | None = None
) -> Iterator[dict]:
    """One input's items as they are read: its rows, each with a speaker and a language and an id of
    its own (the first row of an id wins), and its rejected input rows; `folded` gets the language
    codes respelt (`complete_rows`). `scans`: a container input's files and their scans (default:
    `file_scans`, each file scanned as it is read)."""
    scans = file_scans(corpus) if scans is None else scans
    return complete_rows(LAYOUTS[corpus.kind].read(corpus, working_set, scans), corpus.name, corpus.language, folded)


def read_input(corpus: Corpus) -> LayoutRows:
    """One input's `input_items`, collected (a small corpus, or a test: the read stage streams them)."""
    with WorkingSet() as working_set:
        return LayoutRows.of(input_items(corpus, working_set))
