"""Shard discovery and checking: globs, one finished run per directory, schema compatibility, and
finding the bad shard. Used by the trainer, `melshards inspect` and the public dataset API alike.

Paths go through `tf.io.gfile`, so local paths and gs:// work the same. TensorFlow is imported
inside the functions that read records, so importing this module stays cheap.

Each file is read with its own `tf.data.TFRecordDataset`, one record at a time, so a truncated or
corrupt file is named together with how many records were readable before the damage. Records are
decoded with the schema's own codec (`melshards.shards_schema.records.parse_spec` / `decode_parsed`), in
chunks for speed; a chunk that fails is decoded record by record to name the bad record.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Sequence

import numpy as np

from melshards.shards_schema.records import RAW_DTYPES, decode_parsed, parse_spec
from melshards.shards_schema.schema import (
    PUBLISH_JOURNAL,
    SCHEMA_FILE,
    SHARD_SUFFIX,
    Bucket,
    Schema,
    SchemaError,
    read_schema,
)

CHUNK = 256  # records decoded per parse_example call


@dataclasses.dataclass(frozen=True)
class Problem:
    path: str
    record: int | None  # 0-based index in the file; None for file-level problems
    what: str
    listing: bool = False  # the file disagrees with schema.json's shard list, its records may be fine

    def __str__(self) -> str:
        where = self.path if self.record is None else f"{self.path}: record {self.record}"
        return f"{where}: {self.what}"


@dataclasses.dataclass
class ShardResult:
    path: str
    split: str
    expected: int | None  # records schema.json lists for this file, None when it does not list it
    records: int = 0  # records read (including ones that failed to decode)
    problems: list[Problem] = dataclasses.field(default_factory=list)


class InputError(ValueError):
    """The shards cannot be read as given; the message names the path and how to fix it."""


def expand_globs(patterns: Sequence[str]) -> list[str]:
    """Local or gs:// globs -> sorted unique shard files; a glob matching nothing is an error."""
    import tensorflow as tf

    if not patterns:
        raise InputError("no shard globs given; pass at least one, e.g. 'DIR/train-*.tfrecord'")
    files: list[str] = []
    for pattern in patterns:
        matched = tf.io.gfile.glob(pattern)
        if not matched:
            raise InputError(
                f"{pattern!r} matches no file; check the path and quote the glob so the "
                "shell does not expand it" + bracket_hint(pattern, tf.io.gfile.glob)
            )
        files += matched
    # `DIR/*` is a natural thing to type: the run's JSON reports beside the shards are not shards
    files = [f for f in files if not f.endswith((".json", ".jsonl"))]
    not_shards = [f for f in files if not f.endswith(SHARD_SUFFIX)]
    if not_shards:
        raise InputError(
            f"{not_shards[0]} is not a {SHARD_SUFFIX} shard; pass globs of the shards "
            "`melshards preprocess` wrote, e.g. 'DIR/train-*.tfrecord'"
        )
    if not files:
        raise InputError(
            f"{' '.join(patterns)!r} matches no shard, only the run's reports; pass globs of "
            "the shards, e.g. 'DIR/train-*.tfrecord'"
        )
    return sorted(set(files))


def escape_dir(pattern: str) -> str:
    """The pattern with `[` and `]` in its directory part as glob literals (`[[]`, `[]]`): a directory
    named `run[1]` is otherwise read as a character class."""
    if "/" not in pattern:
        return pattern
    head, name = pattern.rsplit("/", 1)
    return "".join(f"[{c}]" if c in "[]" else c for c in head) + "/" + name


def bracket_hint(pattern: str, glob) -> str:
    """For a glob that matched nothing: how to spell it when its directory's name holds brackets."""
    escaped = escape_dir(pattern)
    if escaped != pattern and glob(escaped):
        return f"; `[` and `]` are glob classes: for a directory whose name holds them pass {escaped!r}"
    return ""


def dir_of(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else "."


def base_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _listing(schema: Schema, path: str) -> tuple[str, dict | None]:
    """The split and shard list entry ({file, records, bytes}) schema.json gives for this file; the
    name prefix and None when it is not listed."""
    name = base_name(path)
    for split, files in schema.shards.items():
        for f in files:
            if f["file"] == name:
                return split, f
    return name.split("-", 1)[0], None


def listed_split(schema: Schema, path: str) -> tuple[str, int | None]:
    """The split and record count schema.json gives for this file; the name prefix when it is not listed."""
    split, entry = _listing(schema, path)
    return split, None if entry is None else int(entry["records"])


def size_problems(by_file: dict[str, Schema]) -> list[Problem]:
    """Each shard whose size is not the `bytes` its schema.json lists (one stat per file, local or
    gs://): a file cut short, even at a record boundary, or damaged in a copy. Files schema.json does
    not list, or lists without a size (written before 3.2), are not checked."""
    import tensorflow as tf

    problems = []
    for path, schema in by_file.items():
        entry = _listing(schema, path)[1]
        if entry is None or "bytes" not in entry:
            continue
        size = tf.io.gfile.stat(path).length
        if size != int(entry["bytes"]):
            problems.append(
                Problem(
                    path,
                    None,
                    (
                        f"holds {size} bytes, schema.json lists {int(entry['bytes'])} ({entry['records']} records): the file "
                        "was cut short or damaged in a copy; copy it again, or re-run `melshards preprocess`"
                    ),
                )
            )
    return problems


def check_sizes(by_file: dict[str, Schema]) -> None:
    """InputError naming the first shard whose size is not the one schema.json lists (`size_problems`)."""
    problems = size_problems(by_file)
    if problems:
        more = f" (and {len(problems) - 1} more shards)" if len(problems) > 1 else ""
        raise InputError(f"{problems[0]}{more}")


def _first_line(e: Exception) -> str:
    """The useful part of a TensorFlow error: no {{function_node ...}} prefix or [Op:...] suffix."""
    msg = getattr(e, "message", None) or str(e)
    msg = re.sub(r"\{\{[^}]*\}\}\s*", "", msg)
    msg = re.sub(r"\s*\[Op:[^\]]*\].*$", "", msg.strip().splitlines()[0] if msg.strip() else "")
    line = msg.strip() or type(e).__name__
    return line if len(line) <= 240 else line[:237] + "..."


def id_problems(schema: Schema, rec: dict[str, np.ndarray]) -> list[str]:
    """A record's speaker and language ids against schema.json's tables: in range, naming its own
    speaker and language."""
    out = []
    for key, table, name_key, attr in (
        ("speaker_id", schema.speakers, "speaker", "name"),
        ("language_id", schema.languages, "language", "code"),
    ):
        i = int(rec[key])
        if not 0 <= i < len(table):
            out.append(f"{key} {i} outside 0..{len(table) - 1} (schema.json {name_key}s)")
        elif getattr(table[i], attr).encode("utf-8") != bytes(rec[name_key]):
            out.append(
                f"{key} {i} is {getattr(table[i], attr)!r} in schema.json, the record says "
                f"{bytes(rec[name_key]).decode('utf-8', 'replace')!r}"
            )
    return out


def record_problems(schema: Schema | Bucket, rec: dict[str, np.ndarray]) -> list[str]:
    """Shape and length checks on one decoded record (numpy values), against its bucket's shapes."""
    out = []
    for f in schema.features:
        shape = tuple(np.shape(rec[f.name]))
        if shape != tuple(f.shape):
            out.append(f"{f.name} has shape {list(shape)}, schema says {list(f.shape)}")
    text_len, mel_len = int(rec["text_len"]), int(rec["mel_len"])
    if not 0 < text_len <= schema.max_text_len:
        out.append(f"text_len {text_len} outside 1..{schema.max_text_len} (max_text_len)")
    if not 0 < mel_len <= schema.max_mel_frames:
        out.append(f"mel_len {mel_len} outside 1..{schema.max_mel_frames} (max_mel_frames)")
    if not np.isfinite(rec["mel"]).all():
        out.append("mel holds NaN or infinite values")
    return out + feature_problems(schema, rec, text_len, mel_len)


def feature_problems(schema: Schema | Bucket, rec: dict, text_len: int, mel_len: int) -> list[str]:
    """The optional features against the lengths: durations sum to mel_len, audio_len gives mel_len
    frames, pitch and energy are finite, not negative, and 0 in padding."""
    out = []
    names = {f.name for f in schema.features}
    if "durations" in names:
        d = np.asarray(rec["durations"], np.int64)
        if d[:text_len].sum() != mel_len or (d < 0).any() or d[text_len:].any():
            out.append(
                f"durations sum to {int(d[:text_len].sum())} over text_len {text_len} phones (mel_len "
                f"{mel_len}), or are negative or non-zero in padding"
            )
    for name in ("pitch", "energy"):
        if name in names:
            x = np.asarray(rec[name], np.float32)
            if not np.isfinite(x).all() or (x < 0).any() or x[mel_len:].any():
                out.append(f"{name} holds NaN, infinite or negative values, or non-zero padding")
    if "audio" in names:
        hop = len(rec["audio"]) // schema.max_mel_frames
        audio_len = int(rec["audio_len"])
        if hop and 1 + audio_len // hop != mel_len:
            out.append(f"audio_len {audio_len} gives {1 + audio_len // hop} frames at hop {hop}, mel_len is {mel_len}")
        elif np.asarray(rec["audio"])[audio_len:].any():
            out.append("audio is not zero after audio_len")
    return out


def raw_size_problems(schema: Schema | Bucket, parsed: dict) -> list[str]:
    """Raw byte features whose length does not match their schema shape, named with both sizes."""
    out = []
    for f in schema.features:
        if f.storage in RAW_DTYPES:
            got = len(parsed[f.name].numpy())
            want = int(np.prod(f.shape)) * RAW_DTYPES[f.storage].itemsize
            if got != want:
                out.append(f"{f.name} holds {got} bytes, schema shape {list(f.shape)} of {f.storage} needs {want}")
    return out


def _decode_one(schema: Schema | Bucket, spec: dict, raw: bytes) -> dict | str:
    import tensorflow as tf

    try:
        parsed = tf.io.parse_single_example(raw, spec)
    except tf.errors.InvalidArgumentError as e:
        return f"does not parse as the schema's features: {_first_line(e)}"
    try:
        return {k: v.numpy() for k, v in decode_parsed(schema, parsed, None).items()}
    except tf.errors.InvalidArgumentError as e:
        sizes = raw_size_problems(schema, parsed)
        return "wrong shape: " + ("; ".join(sizes) if sizes else _first_line(e))


def decode_records(schema: Schema | Bucket, raws: list[bytes]) -> list[dict | str]:
    """Each raw record decoded to numpy values, or the reason it does not parse."""
    import tensorflow as tf

    spec = parse_spec(schema)
    try:
        parsed = tf.io.parse_example(tf.constant(raws), spec)
        batch = {k: v.numpy() for k, v in decode_parsed(schema, parsed, len(raws)).items()}
    except tf.errors.InvalidArgumentError:
        # Some record in the chunk is bad; decoding one by one says which and why.
        return [_decode_one(schema, spec, raw) for raw in raws]
    return [{k: v[i] for k, v in batch.items()} for i in range(len(raws))]


def check_shard(path: str, schema: Schema, keep: int = 0) -> tuple[ShardResult, list[dict]]:
    """Read and check every record of one file against its bucket's shapes; also return up to `keep`
    good records for --show."""
    import tensorflow as tf

    split, expected = listed_split(schema, path)
    result = ShardResult(path, split, expected)
    shown: list[dict] = []
    bucket = schema.bucket_of_file(path)
    if bucket is None:
        result.problems.append(
            Problem(
                path,
                None,
                (
                    f"schema.json does not list this file and its name says no bucket of the {len(schema.buckets)} "
                    "(expected split-bNN-SSSSS-of-CCCCC.tfrecord): its records' shapes are unknown"
                ),
            )
        )
        return result, shown

    def flush(chunk: list[bytes], first: int) -> None:
        for i, rec in enumerate(decode_records(bucket, chunk)):
            problems = [rec] if isinstance(rec, str) else record_problems(bucket, rec) + id_problems(schema, rec)
            result.problems += [Problem(path, first + i, p) for p in problems]
            if isinstance(rec, dict) and not problems and len(shown) < keep:
                shown.append(dict(rec, _file=path, _index=first + i))

    chunk: list[bytes] = []
    it = iter(tf.data.TFRecordDataset(path))
    while True:
        try:
            raw = next(it)
        except StopIteration:
            break
        except tf.errors.DataLossError as e:
            result.problems.append(
                Problem(
                    path,
                    None,
                    (
                        f"truncated or corrupt after {result.records} readable records ({_first_line(e)}); the file was "
                        "cut short or damaged in a copy: copy it again, or re-run `melshards preprocess`"
                    ),
                )
            )
            break
        except tf.errors.OpError as e:
            result.problems.append(Problem(path, None, f"cannot read: {_first_line(e)}"))
            break
        chunk.append(raw.numpy())
        result.records += 1
        if len(chunk) == CHUNK:
            flush(chunk, result.records - len(chunk))
            chunk = []
    if chunk:
        flush(chunk, result.records - len(chunk))
    if expected is not None and result.records != expected:
        result.problems.append(
            Problem(path, None, f"holds {result.records} records, schema.json lists {expected}", listing=True)
        )
    return result, shown


def schema_file_of(directory: str, schema_path: str | None) -> str:
    """The schema.json a directory's shards are read with: its own, else `schema_path` when given."""
    import tensorflow as tf

    own = posixpath.join(directory, SCHEMA_FILE)
    return own if schema_path is None or tf.io.gfile.exists(own) else schema_path


def schemas_for(files: Sequence[str], schema_path: str | None) -> tuple[dict[str, Schema], list[Problem]]:
    """The schema of each file's directory, and problems if they cannot be mixed.

    Each directory's own schema.json is checked against the reference: `schema_path` when given,
    else the first directory's. A directory without schema.json is read with `schema_path` when
    given (shards copied away from their run), and is an error otherwise. A directory whose run is
    being replaced (preprocess's publish journal is there) is an error: its files are a mix.
    """
    import tensorflow as tf

    dirs = sorted({dir_of(f) for f in files})
    for d in dirs:
        if tf.io.gfile.exists(posixpath.join(d, PUBLISH_JOURNAL)):
            raise InputError(
                f"{d} is in the middle of having its run replaced ({PUBLISH_JOURNAL} is there); let "
                "`melshards preprocess` finish, or run it again with the same --output to complete the move"
            )
    where = {d: schema_file_of(d, schema_path) for d in dirs}
    ref_path = schema_path or where[dirs[0]]
    read = {path: read_schema(path) for path in {*where.values(), ref_path}}  # each file once
    by_dir = {d: read[where[d]] for d in dirs}
    ref = read[ref_path]
    problems = []
    for d in dirs:
        try:
            ref.check_compatible(by_dir[d], ref_path, where[d])
        except SchemaError as e:
            problems.append(Problem(d, None, str(e)))
    return {f: by_dir[dir_of(f)] for f in files}, problems


def check_schemas(files: Sequence[str], schema_path: str | None) -> tuple[Schema, str]:
    """The one schema every file can be read with (the first file's directory's), and the file it was
    read from; raises otherwise, and when a shard's size is not the one its schema.json lists
    (`check_sizes`).

    `schema_path` is the reference the directories must agree with, and the schema of a directory
    without its own; the returned file is the directory's own schema.json when it has one, since its
    mel statistics are the ones the records are normalised with. Without `schema_path` the first
    directory's schema.json is the reference.
    """
    by_file, problems = schemas_for(files, schema_path)
    if problems:
        raise SchemaError(problems[0].what)
    check_sizes(by_file)
    first = sorted(files)[0]
    return by_file[first], schema_file_of(dir_of(first), schema_path)


def first_bad_shard(files: Sequence[str], schema: Schema) -> Problem | None:
    """The first problem of the first shard that has one (unreadable, truncated, or a bad record).

    Run only after a read failed: TensorFlow's DataLossError gives a byte offset but no file name.
    """
    for f in files:
        result, _ = check_shard(f, schema)
        unreadable = [p for p in result.problems if not p.listing]
        if unreadable:
            return unreadable[0]
    return None


# -- references (other_clip runs) ---------------------------------------------------------------
def _digest(x: np.ndarray) -> bytes:
    import hashlib

    return hashlib.sha1(np.ascontiguousarray(x.astype("<f2")).tobytes()).digest()


def check_references(records, pad_value: float) -> list[Problem]:
    """Each record's reference against the clip it names. `records()` yields (path, index, split, record)
    for every record, and is called twice: first to note each record's speaker and split and each
    reference's request (a digest of its frames, not the frames), then to compare every named clip's stored
    mel over [reference_start, reference_start + reference_len) with those digests. A problem for a
    reference naming a clip not in the records, of another speaker, of the validation split in a training
    record (a validation record may name a training clip: `choose_references`), whose frames differ, or
    whose padding is not `pad_value`."""
    where: dict[str, tuple] = {}
    asked: dict[str, list] = {}
    problems: list[Problem] = []
    pad = np.float16(pad_value)
    for path, i, split, rec in records():
        clip_id = rec["id"].decode() if isinstance(rec["id"], bytes) else str(rec["id"])
        where[clip_id] = (rec["speaker"], split)
        n, start = int(rec["reference_len"]), int(rec["reference_start"])
        ref = rec["reference_mel"]
        if np.any(ref[n:].astype("<f2") != pad):
            problems.append(Problem(path, i, f"reference_mel is not padded with {pad_value} after reference_len {n}"))
        name = rec["reference_id"].decode() if isinstance(rec["reference_id"], bytes) else str(rec["reference_id"])
        asked.setdefault(name, []).append((path, i, rec["speaker"], split, start, n, _digest(ref[:n])))
    for name, requests in asked.items():
        for path, i, speaker, split, *_ in requests:
            if name not in where:
                problems.append(Problem(path, i, f"reference_id {name!r} names no record of these shards"))
            elif where[name][0] != speaker:
                problems.append(Problem(path, i, f"reference_id {name!r} is of another speaker"))
            elif where[name][1] != split and split == "train":
                what = f"reference_id {name!r} is a {where[name][1]} clip: a training record's reference is a training clip"
                problems.append(Problem(path, i, what))
    for _, _, _, rec in records():
        clip_id = rec["id"].decode() if isinstance(rec["id"], bytes) else str(rec["id"])
        for path, i, _, _, start, n, digest in asked.get(clip_id, ()):
            if start + n > int(rec["mel_len"]) or _digest(rec["mel"][start : start + n]) != digest:
                what = f"reference_mel is not {clip_id!r}'s mel over frames {start}..{start + n}"
                problems.append(Problem(path, i, what))
    return problems


def reference_problems(files: Sequence[str], schemas: dict[str, Schema]) -> list[Problem]:
    """`check_references` over the records of `files` that hold references (their schema's buckets; the
    others and records that do not decode are skipped: `check_shard` reports them)."""
    import tensorflow as tf

    def records():
        for path in files:
            bucket = schemas[path].bucket_of_file(path)
            if bucket is None or "reference_mel" not in {f.name for f in bucket.features}:
                continue
            split = listed_split(schemas[path], path)[0]
            index = 0
            try:
                for chunk in tf.data.TFRecordDataset(path).batch(CHUNK):
                    for rec in decode_records(bucket, list(chunk.numpy())):
                        if isinstance(rec, dict):
                            yield path, index, split, rec
                        index += 1
            except tf.errors.OpError:
                continue  # a damaged file: check_shard says so

    pads = {s.mel.pad_value for s in schemas.values()}
    return check_references(records, pads.pop()) if len(pads) == 1 else []
