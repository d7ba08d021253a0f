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
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3")
MANIFEST_EXTENSIONS = (".csv", ".tsv", ".jsonl")
MANIFEST_COLUMNS = ("audio", "text")  # required; id and speaker are optional
LJSPEECH_FIELDS = 3  # id|text|normalized_text
REJECTED = "rejected"
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
    return {"id": fields[0].strip(), "text": text, "speaker": "", "audio": None, "row": index}


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
    check_columns(list(reader.fieldnames or ()), path)
    for i, rec in enumerate(reader):
        yield i, _manifest_row(rec, i, root, path)


def _manifest_row(rec: dict, i: int, root: str, path: str):
    if not rec.get("audio"):
        return ValueError(f"row {i + 1}: no audio path")
    audio = str(rec["audio"])
    clip_id = str(rec.get("id") or posixpath.splitext(posixpath.basename(audio))[0])
    return {"id": clip_id, "text": str(rec.get("text") or ""), "speaker": str(rec.get("speaker") or ""),
            "audio": _join(root, audio), "row": i}


class _ReadRows(beam.DoFn):
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
        else:
            items = parse_manifest(text, rows_path, self.corpus.root)
        for i, row in items:
            beam.metrics.Metrics.counter(NS, "input_rows").inc()
            if isinstance(row, Exception):
                beam.metrics.Metrics.counter(NS, "malformed_row").inc()
                yield beam.pvalue.TaggedOutput(REJECTED, reject(f"row-{i + 1}", "malformed_row", str(row)))
            else:
                yield row


def _attach_ljspeech_audio(row: dict, audio_by_id: dict):
    paths = sorted(audio_by_id[row["id"]])  # AsMultiMap: an empty list for unknown ids
    if not paths:
        return dict(row, audio=None)
    return dict(row, audio=paths[0])


class ReadCorpus(beam.PTransform):
    """Rows {id, text, speaker, audio, row}; malformed rows go to the `rejected` output."""

    def __init__(self, corpus: Corpus):
        super().__init__()
        self.corpus = corpus

    def expand(self, pbegin):
        read = (pbegin
                | "RowsFile" >> beam.Create([self.corpus.rows_path])
                | "ParseRows" >> beam.ParDo(_ReadRows(self.corpus)).with_outputs(REJECTED, main="rows"))
        rows = read.rows
        if self.corpus.kind == "ljspeech":
            audio = (pbegin
                     | "ListAudio" >> fileio.MatchFiles(FileSystems.join(self.corpus.root, "wavs", "*"))
                     | "KeepAudio" >> beam.Filter(lambda m: m.path.lower().endswith(AUDIO_EXTENSIONS))
                     | "ById" >> beam.Map(lambda m: (posixpath.splitext(posixpath.basename(m.path))[0], m.path)))
            rows = rows | "AttachAudio" >> beam.Map(_attach_ljspeech_audio, beam.pvalue.AsMultiMap(audio))
        return {"rows": rows, REJECTED: read[REJECTED]}


class DropDuplicateIds(beam.PTransform):
    """Keep the first row (by position) of every id; later rows with that id are rejected."""

    def expand(self, rows):
        def split(kv):
            clip_id, group = kv
            group = sorted(group, key=lambda r: r["row"])
            yield group[0]
            for dup in group[1:]:
                beam.metrics.Metrics.counter(NS, "duplicate_id").inc()
                yield beam.pvalue.TaggedOutput(REJECTED, reject(
                    clip_id, "duplicate_id", f"row {dup['row'] + 1} repeats the id of row {group[0]['row'] + 1}"))

        # The shuffle also spreads rows over workers: the rows file is read by one worker.
        return (rows
                | "ById" >> beam.Map(lambda r: (r["id"], r))
                | "Group" >> beam.GroupByKey()
                | "FirstOfEach" >> beam.FlatMap(split).with_outputs(REJECTED, main="rows"))
