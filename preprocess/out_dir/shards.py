"""Stage 8, Write: TFRecord shards of about `target_shard_mb`, written where the records are made.

Records are written by the stage that filters and pads them (reading each measured batch's mels
back once), into temp files that roll over at the target size, so no encoded record is ever
materialised between stages or shuffled (holding and grouping them all lost records in Beam's local
runner at LJSpeech size: docs/performance.md#decode-once-where-the-mel-waits).
The small per-file results are then grouped into shards: files at the target size are renamed,
smaller ones (each bundle's last) are concatenated, which is valid because a TFRecord file is just
a sequence of framed records. Records are framed by the contract's own `frame_record` (crc32c from
google-crc32c) and written through FileSystems, so gs:// works.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.out_dir.staging import STAGE_PREFIX
from melshards.shards_schema.atomic import atomic_write
from melshards.shards_schema.records import frame_record
from melshards.shards_schema.schema import SHARD_SUFFIX, shard_name

_COPY_CHUNK = 16 << 20
TEMP_DIR = ".melshards-tmp"  # under the run's staging dir: temp shards and the other temp files (`temp_files`)


def create_file(path: str):
    """A write channel for a new file, as FileSystems.create gives (which makes the directories), but
    never a directory inside a local staging dir: one removed while the job runs (`rm -rf OUT`) would
    come back as debris no run removes. The write fails instead (FileNotFoundError), and the run
    stops (`melshards.preprocess.job.run`); the temp dir is made before the job (`make_temp_dir`)."""
    if "://" not in path and any(part.startswith(STAGE_PREFIX) for part in path.split(os.sep)[:-1]):
        return open(path, "wb")
    return FileSystems.create(path)


class StagingFiles:
    """Beam's FileSystems with `create_file` for create: how preprocess's `atomic_write`s write."""

    create = staticmethod(create_file)
    rename = staticmethod(FileSystems.rename)
    delete = staticmethod(FileSystems.delete)


def make_temp_dir(out_dir: str) -> None:
    """The temp dir of a local staging dir, made before the job writes into it (nothing on gs://)."""
    if "://" not in out_dir:
        os.makedirs(FileSystems.join(out_dir, TEMP_DIR), exist_ok=True)


def group_into_shards(parts: list[dict], target_bytes: int) -> list[dict]:
    """Group temp files into shards of at most ~target_bytes, per split and bucket; name them
    split-bNN-SSSSS-of-CCCCC (`melshards.shards_schema.schema.shard_name`: counted within the bucket).

    parts: [{split, bucket, path, records, bytes}]. A part is never split; a part larger than the
    target (one record over, at most) is a shard by itself. Deterministic for a given set of parts.
    """
    shards = []
    for split, bucket in sorted({(p["split"], p["bucket"]) for p in parts}):
        groups: list[list[dict]] = []
        sizes: list[int] = []
        # first-fit decreasing: each part goes into the first shard it fits, biggest parts first
        mine = (p for p in parts if (p["split"], p["bucket"]) == (split, bucket))
        for part in sorted(mine, key=lambda p: (-p["bytes"], p["path"])):
            i = next((i for i, size in enumerate(sizes) if size + part["bytes"] <= target_bytes), len(groups))
            if i == len(groups):
                groups.append([])
                sizes.append(0)
            groups[i].append(part)
            sizes[i] += part["bytes"]
        for i, group in enumerate(groups):
            shards.append(
                {
                    "split": split,
                    "bucket": bucket,
                    "file": shard_name(split, bucket, i, len(groups)),
                    "parts": [p["path"] for p in group],
                    "records": sum(p["records"] for p in group),
                    "bytes": sum(p["bytes"] for p in group),
                }
            )
    return shards


class RollingFiles:
    """Temp TFRecord files of ~target bytes under the output's temp dir, one open file per split and
    bucket; `write` and `close_all` return the closed files as {split, bucket, path, records, bytes}.

    A file is written under a temporary name of its own (`split-bNN-<random>.writing`) and, once
    closed, renamed to `split-bNN-<sha1 of its bytes>.tfrecord`: a bundle run again on the same
    batches (a runner's retry) gives the same files, names and bytes, and two attempts running at
    once never write into one file. A run's records differ (each holds its clip's id), so do its
    files' names. `discard` removes the temporary files of an attempt that failed.
    """

    def __init__(self, out_dir: str, target_bytes: int):
        self.out_dir, self.target = out_dir, target_bytes
        self.open: dict[tuple[str, int], dict] = {}

    def _close(self, key: tuple[str, int]) -> dict:
        w = self.open.pop(key)
        w.pop("fh").close()
        temp, name = w.pop("temp"), f"{key[0]}-b{key[1]:02d}-{w.pop('sha1').hexdigest()}{SHARD_SUFFIX}"
        w["path"] = FileSystems.join(self.out_dir, TEMP_DIR, name)
        FileSystems.rename([temp], [w["path"]])  # the same bytes if a retried bundle wrote it before
        beam.metrics.Metrics.counter("melshards", "temp_files_written").inc()
        return w

    def write(self, split: str, bucket: int, data: bytes) -> list[dict]:
        key, closed = (split, bucket), []
        w = self.open.get(key)
        if w is not None and w["bytes"] >= self.target:
            closed.append(self._close(key))
            w = None
        if w is None:
            temp = FileSystems.join(self.out_dir, TEMP_DIR, f"{split}-b{bucket:02d}-{uuid.uuid4().hex}.writing")
            w = self.open[key] = {
                "split": split,
                "bucket": bucket,
                "records": 0,
                "bytes": 0,
                "temp": temp,
                "sha1": hashlib.sha1(),
                "fh": create_file(temp),
            }
        framed = frame_record(data)
        w["fh"].write(framed)
        w["sha1"].update(framed)
        w["records"] += 1
        w["bytes"] += len(framed)
        return closed

    def close_all(self) -> list[dict]:
        return [self._close(key) for key in list(self.open)]

    def discard(self) -> None:
        """Close and remove the files still open (a bundle that failed: its retry writes them again)."""
        for w in self.open.values():
            with contextlib.suppress(Exception):  # the error that failed the bundle is the one to tell
                w["fh"].close()
                FileSystems.delete([w["temp"]])
        self.open.clear()


class _AssembleShard(beam.DoFn):
    """Move (one part) or concatenate (several) temp files into the final shard; safe to retry.

    Runners retry bundles, so this may run again over a shard an earlier attempt finished, or
    stopped half-way. Concatenation goes to a temporary name that is renamed onto the final one,
    so a final shard is never partial; parts are deleted only after that. Hence: all parts present
    -> (re)assemble; final present and parts (some or all) gone -> done, delete what is left;
    final absent and parts gone -> records were lost, fail loudly.
    """

    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def process(self, shard):
        final = FileSystems.join(self.out_dir, shard["file"])
        parts = shard["parts"]
        missing = [p for p in parts if not FileSystems.exists(p)]
        if missing:
            if not FileSystems.exists(final):
                raise OSError(f"cannot assemble {final}: parts {missing} are gone and the shard was never written")
            left = [p for p in parts if p not in missing]
            if left:
                FileSystems.delete(left)
        elif len(parts) == 1:
            FileSystems.rename(parts, [final])
        else:
            tmp = FileSystems.join(self.out_dir, TEMP_DIR, f"{shard['file']}.assembling")
            with atomic_write(final, temp=tmp, fs=StagingFiles) as out:
                for part in parts:
                    with FileSystems.open(part) as f:
                        while chunk := f.read(_COPY_CHUNK):
                            out.write(chunk)
            FileSystems.delete(parts)
        beam.metrics.Metrics.counter("melshards", "shards_written").inc()
        yield {k: shard[k] for k in ("split", "bucket", "file", "records", "bytes")}


def remove_temp_dir(out_dir: str) -> None:
    """Delete what is left under the temp dir (parts of failed bundle attempts), then the dir.

    Matched file by file: on gs:// a directory is only a prefix, and exists() is false for it.
    """
    tmp = FileSystems.join(out_dir, TEMP_DIR)
    leftovers = [m.path for m in FileSystems.match([FileSystems.join(tmp, "*")])[0].metadata_list]
    if leftovers:
        FileSystems.delete(leftovers)
    if FileSystems.exists(tmp):
        FileSystems.delete([tmp])


class AssembleShards(beam.PTransform):
    """Temp files ({split, bucket, path, records, bytes}) -> one dict per shard written: {split, bucket,
    file, records, bytes}; `bytes` is the shard's size (its parts' framed records), which schema.json
    lists and readers check each shard against before reading."""

    def __init__(self, out_dir: str, target_shard_mb: float):
        super().__init__()
        self.out_dir, self.target = out_dir, int(target_shard_mb * 1e6)

    def expand(self, parts):
        return (
            parts.pipeline
            | "Once" >> beam.Create([None])
            | "Group"
            >> beam.FlatMap(lambda _, parts: group_into_shards(list(parts), self.target), beam.pvalue.AsList(parts))
            | "Spread" >> beam.Reshuffle()  # assemble shards in parallel
            | "Assemble" >> beam.ParDo(_AssembleShard(self.out_dir))
        )
