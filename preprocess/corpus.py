"""Stage 1, Read: LJSpeech directories and manifest files (CSV/TSV/JSONL) -> row dicts.

Building the pipeline opens no corpus file: `detect_corpus` only checks that paths exist, and the
rows are read inside the pipeline, so a Dataflow graph builds offline. `check_rows_file` reads the
first line of the rows file; the CLI calls it before the job so an empty file or a manifest without
audio/text columns stops the run at once.
"""
from __future__ import annotations

import codecs
import csv
import dataclasses
import io
import json
import posixpath

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3")
MANIFEST_EXTENSIONS = (".csv", ".tsv", ".jsonl")
MANIFEST_COLUMNS = ("audio", "text")  # required; id and speaker are optional
LJSPEECH_FIELDS = 3  # id|text|normalized_text
REJECTED = "rejected"
INPUT_ROWS = "input_rows"
NS = "melshards"


class CorpusError(ValueError):
    """The input path is not a corpus melshards can read; the message says what it expected."""


@dataclasses.dataclass(frozen=True)
class Corpus:
    kind: str  # "ljspeech" | "manifest"
    rows_path: str  # metadata.csv or the manifest
    root: str  # audio paths are relative to this


def detect_corpus(path: str) -> Corpus:
    """Decide the corpus layout from paths alone (existence checks, no reads)."""
    path = path.rstrip("/")
    if path.lower().endswith(MANIFEST_EXTENSIONS):
        if not FileSystems.exists(path):
            raise CorpusError(f"manifest {path} does not exist; check the --input path")
        return Corpus("manifest", path, posixpath.dirname(path) or ".")
    metadata = FileSystems.join(path, "metadata.csv")
    if FileSystems.exists(metadata):
        return Corpus("ljspeech", metadata, path)
    if not FileSystems.exists(path) and not FileSystems.match([path + "/*"])[0].metadata_list:
        raise CorpusError(f"--input {path} does not exist; give an LJSpeech directory or a manifest file")
    raise CorpusError(
        f"--input {path} is not a corpus: expected an LJSpeech directory with metadata.csv and wavs/, "
        f"or a manifest file ending in {', '.join(MANIFEST_EXTENSIONS)} with columns audio, text "
        "(and optional id, speaker)")


def reject(row_id: str, reason: str, detail: str) -> dict:
    return {"id": row_id, "reason": reason, "detail": detail}


def parse_ljspeech_line(line: str, index: int) -> dict:
    """`id|text|normalized_text` -> row; the normalised column wins when present (LJSpeech convention)."""
    fields = line.rstrip("\r\n").split("|")
    if len(fields) < 2 or not fields[0].strip():
        raise ValueError(f"line {index + 1}: expected id|text|normalized_text, got {line.strip()[:80]!r}")
    if len(fields) > LJSPEECH_FIELDS:  # a "|" inside the text: no way to tell which part is the transcript
        raise ValueError(f"line {index + 1}: {len(fields)} |-separated fields, expected at most "
                         f"{LJSPEECH_FIELDS} (id|text|normalized_text); a '|' in the text? {line.strip()[:80]!r}")
    text = fields[2] if len(fields) > 2 and fields[2].strip() else fields[1]
    return {"id": fields[0].strip(), "text": text, "speaker": "ljspeech", "language": "en", "gender": "",
            "audio": None, "row": index}


def _join(root: str, rel: str) -> str:
    return rel if "://" in rel or rel.startswith("/") else FileSystems.join(root, rel)


def _delimiter(path: str) -> str:
    return "\t" if path.lower().endswith(".tsv") else ","


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


def check_columns(columns: list[str] | None, path: str) -> None:
    missing = [c for c in MANIFEST_COLUMNS if columns is not None and c not in columns]
    if missing:
        kind = "its first record has keys" if path.lower().endswith(".jsonl") else "its header has columns"
        raise CorpusError(f"manifest {path}: {kind} {columns}, missing {', '.join(missing)}; a manifest needs "
                          "audio and text (and may have id, speaker). Rename the columns.")


def _first_line(path: str, limit: int = 1 << 20) -> tuple[str | None, bool]:
    """(first non-blank line or None, whether the whole file was read). Reads at most `limit` bytes."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")
    text, done = "", False
    with FileSystems.open(path) as f:
        while len(text) < limit:
            chunk = f.read(64 * 1024)
            done = not chunk
            text += decoder.decode(chunk, final=done)
            lines = text.splitlines()
            complete = lines if done else lines[:-1]  # the last piece may continue in the next chunk
            line = next((l for l in complete if l.strip()), None)
            if line is not None or done:
                return line, done
    return None, False


def check_rows_file(corpus: Corpus) -> None:
    """Refuse an empty metadata.csv/manifest, or a manifest without audio/text columns, from its first line.

    Called by the CLI before any work (the rest of the file is read inside the pipeline).
    """
    line, whole = _first_line(corpus.rows_path)
    if line is None:
        if whole:
            raise CorpusError(f"{corpus.rows_path} holds no rows: it is empty. Point --input at a corpus "
                              "with at least one row.")
        return  # a megabyte of blank lines: leave it to the pipeline
    if corpus.kind == "manifest":
        check_columns(manifest_columns(line, corpus.rows_path), corpus.rows_path)


def parse_manifest(text: str, path: str, root: str):
    """Yield (index, row-or-ValueError) for every data row of a CSV/TSV/JSONL manifest."""
    if path.lower().endswith(".jsonl"):
        for i, line in enumerate(l for l in text.splitlines() if l.strip()):
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                yield i, ValueError(f"line {i + 1}: not a JSON object ({e})")
                continue
            yield i, _manifest_row(rec, i, root, path)
        return
    lines = text.splitlines(keepends=True)
    start = next((n for n, l in enumerate(lines) if l.strip()), len(lines))  # the header: first non-blank line
    reader = csv.DictReader(io.StringIO("".join(lines[start:])), delimiter=_delimiter(path))
    columns = list(reader.fieldnames or ())
    check_columns(columns, path)
    for i, rec in enumerate(reader):
        given = sum(v is not None for k, v in rec.items() if k is not None)
        if given < len(columns):  # DictReader fills the missing columns with None
            yield i, ValueError(f"row {i + 1}: {given} fields, the header has {len(columns)} "
                                f"({', '.join(columns)}); a missing separator?")
            continue
        extra = [v for v in rec.get(None) or () if v.strip()]  # DictReader puts fields past the header there
        if extra:  # e.g. an unquoted comma in the text: reading on would cut the transcript short
            yield i, ValueError(f"row {i + 1}: {given + len(extra)} fields, the header has {len(columns)} "
                                f"({', '.join(columns)}); quote a field that holds the separator")
            continue
        yield i, _manifest_row(rec, i, root, path)


def _manifest_row(rec: dict, i: int, root: str, path: str):
    if not rec.get("audio"):
        return ValueError(f"row {i + 1}: no audio path")
    if rec.get("text") is None:  # a JSONL record without the key; an empty text is `empty_text`
        return ValueError(f"row {i + 1}: no text field")
    audio = str(rec["audio"])
    clip_id = str(rec.get("id") or posixpath.splitext(posixpath.basename(audio))[0])
    return {"id": clip_id, "text": str(rec.get("text") or ""), "speaker": str(rec.get("speaker") or "manifest"),
            "language": str(rec.get("language") or "en"), "gender": "", "audio": _join(root, audio), "row": i}


def drop_duplicate_ids(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(rows keeping the first row of every id, by position; a rejection for each later repeat)."""
    first: dict[str, dict] = {}
    kept, dups = [], []
    for row in sorted(rows, key=lambda r: r["row"]):
        seen = first.setdefault(row["id"], row)
        if seen is row:
            kept.append(row)
        else:
            dups.append(reject(row["id"], "duplicate_id",
                               f"row {row['row'] + 1} repeats the id of row {seen['row'] + 1}"))
    return kept, dups


def audio_files_by_id(paths) -> dict[str, list[str]]:
    """Audio files (paths of one listing of `wavs/`) -> id (the file's stem) -> its files, in the order
    of AUDIO_EXTENSIONS (`.wav`, `.flac`, `.ogg`, `.mp3`), then by path. Other files are ignored."""
    found: dict[str, list[str]] = {}
    for path in paths:
        ext = posixpath.splitext(path)[1].lower()
        if ext in AUDIO_EXTENSIONS:
            found.setdefault(posixpath.splitext(posixpath.basename(path))[0], []).append(path)
    for files in found.values():
        files.sort(key=lambda p: (AUDIO_EXTENSIONS.index(posixpath.splitext(p)[1].lower()), p))
    return found


def ljspeech_audio(root: str) -> dict[str, list[str]]:
    """id -> its audio files under root/wavs (one listing through FileSystems: local or gs://)."""
    return audio_files_by_id(m.path for m in FileSystems.match([FileSystems.join(root, "wavs", "*")])[0].metadata_list)


def attach_audio(rows: list[dict], files: dict[str, list[str]]) -> tuple[list[dict], list[dict]]:
    """(rows with the audio file of their id, None where there is none (rejected later as
    missing_audio); an `ambiguous_audio` rejection for each row whose id has several files).

    Two files for one id (`c1.wav` beside `c1.flac`) may hold different speech: which one the
    transcript belongs to cannot be known, so no file is picked.
    """
    kept, ambiguous = [], []
    for row in rows:
        found = files.get(row["id"], [])
        if len(found) > 1:
            ambiguous.append(reject(row["id"], "ambiguous_audio",
                                    f"{len(found)} audio files for this id: {', '.join(found)}; keep one"))
        else:
            kept.append(dict(row, audio=found[0] if found else None))
    return kept, ambiguous


MAX_BATCH_ROWS = 32


def batch_rows(n: int) -> int:
    """Rows per element: up to MAX_BATCH_ROWS, but at least ~16 elements when there are rows enough.

    Beam's per-element cost (coding, the local runner relaying every element through its launcher)
    is paid per batch instead of per clip; 16 elements or more keep every worker busy.
    """
    return max(1, min(MAX_BATCH_ROWS, -(-n // 16)))


def batches(rows: list[dict], size: int) -> list[list[dict]]:
    return [rows[i:i + size] for i in range(0, len(rows), size)]


class _ReadRows(beam.DoFn):
    """The rows file -> batches of unique rows; malformed and duplicate rows, and LJSpeech rows whose id
    has several audio files, -> `rejected`; the number of input rows -> `input_rows` (one element)."""

    def __init__(self, corpus: Corpus):
        self.corpus = corpus

    def process(self, rows_path):
        with FileSystems.open(rows_path) as f:
            text = f.read().decode("utf-8-sig")
        if self.corpus.kind == "ljspeech":
            items = []
            for i, line in enumerate(l for l in text.splitlines() if l.strip()):
                try:
                    items.append((i, parse_ljspeech_line(line, i)))
                except ValueError as e:
                    items.append((i, e))
            audio = ljspeech_audio(self.corpus.root)
        else:
            items, audio = list(parse_manifest(text, rows_path, self.corpus.root)), None
        rows = []
        for i, row in items:
            if isinstance(row, Exception):
                beam.metrics.Metrics.counter(NS, "malformed_row").inc()
                yield beam.pvalue.TaggedOutput(REJECTED, reject(f"row-{i + 1}", "malformed_row", str(row)))
            else:
                rows.append(row)
        beam.metrics.Metrics.counter(NS, "input_rows").inc(len(items))
        yield beam.pvalue.TaggedOutput(INPUT_ROWS, len(items))
        rows, rejected = drop_duplicate_ids(rows)
        if audio is not None:  # LJSpeech: the id names the audio file
            rows, ambiguous = attach_audio(rows, audio)
            rejected += ambiguous
        for r in rejected:
            beam.metrics.Metrics.counter(NS, r["reason"]).inc()
            yield beam.pvalue.TaggedOutput(REJECTED, r)
        # Always at least one (maybe empty) batch: every later statistic then has an input.
        for batch in batches(rows, batch_rows(len(rows))) or [[]]:
            yield batch


class ReadCorpus(beam.PTransform):
    """Batches of unique rows {id, text, speaker, audio, row}, spread over the workers; malformed,
    duplicate and ambiguous-audio rows go to `rejected`; `input_rows` holds the row count.

    The rows file is read by one worker (it is small next to the audio): duplicates are found there
    without a shuffle, and an LJSpeech corpus' audio is listed with one match. The Reshuffle then
    spreads the batches, which carry the work, over every worker.
    """

    def __init__(self, corpus: Corpus):
        super().__init__()
        self.corpus = corpus

    def expand(self, pbegin):
        read = (pbegin
                | "RowsFile" >> beam.Create([self.corpus.rows_path])
                | "ParseRows" >> beam.ParDo(_ReadRows(self.corpus)).with_outputs(REJECTED, INPUT_ROWS, main="rows"))
        spread = read.rows | "Spread" >> beam.Reshuffle()
        return {"batches": spread, REJECTED: read[REJECTED], INPUT_ROWS: read[INPUT_ROWS]}
