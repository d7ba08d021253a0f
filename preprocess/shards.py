"""Stage 8, Write: TFRecord shards sized from the data.

`WriteToTFRecord` fixes its shard count when the graph is built, before the job knows how many
bytes it will write; sizing shards to ~150 MB needs the byte count at run time. So records are
keyed to `split-SSSSS-of-NNNNN` from a side input, grouped, and each group is written with Beam's
own TFRecord codec (`_TFRecordUtil`, crc32c from google-crc32c) through FileSystems, to a temp
name first and renamed into place, so a retried bundle never leaves a half-written shard.
"""
from __future__ import annotations

import math
import uuid
import zlib

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import _TFRecordUtil

SHARD_SUFFIX = ".tfrecord"
TEMP_DIR = ".melshards-tmp"


def shard_count(total_bytes: int, records: int, target_mb: float, fixed: int) -> int:
    """Shards for one split: `fixed` if given, else enough for ~target_mb each; never more than records."""
    n = fixed if fixed > 0 else math.ceil(total_bytes / (target_mb * 1e6))
    return max(1, min(n, records))


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}{SHARD_SUFFIX}"


def shard_index(clip_id: str, count: int) -> int:
    """Stable across runs and workers (unlike hash())."""
    return zlib.crc32(clip_id.encode("utf-8")) % count


class _WriteShard(beam.DoFn):
    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def process(self, kv):
        name, records = kv
        tmp_dir = FileSystems.join(self.out_dir, TEMP_DIR)
        tmp = FileSystems.join(tmp_dir, f"{uuid.uuid4().hex}-{name}")
        final = FileSystems.join(self.out_dir, name)
        n = size = 0
        with FileSystems.create(tmp) as f:
            for rec in records:
                _TFRecordUtil.write_record(f, rec)
                n += 1
                size += _TFRecordUtil.encoded_num_bytes(rec)
        if FileSystems.exists(final):  # a retried bundle already moved its copy into place
            FileSystems.delete([final])
        FileSystems.rename([tmp], [final])
        beam.metrics.Metrics.counter("melshards", "shards_written").inc()
        yield {"split": name.split("-", 1)[0], "file": name, "records": n, "bytes": size}


class WriteShards(beam.PTransform):
    """(split, id, serialized Example) -> one dict per shard written: {split, file, records, bytes}."""

    def __init__(self, out_dir: str, target_shard_mb: float, num_shards: int):
        super().__init__()
        self.out_dir, self.target_mb, self.num_shards = out_dir, target_shard_mb, num_shards

    def expand(self, records):
        sizes = (records
                 | "SizePerSplit" >> beam.Map(lambda r: (r[0], (len(r[2]), 1)))
                 | "SumPerSplit" >> beam.CombinePerKey(lambda vs: tuple(map(sum, zip(*vs))) or (0, 0)))

        def key(rec, sizes):
            split, clip_id, data = rec
            total, count = sizes[split]
            n = shard_count(total, count, self.target_mb, self.num_shards)
            return shard_name(split, shard_index(clip_id, n), n), data

        return (records
                | "ShardKey" >> beam.Map(key, beam.pvalue.AsDict(sizes))
                | "GroupShards" >> beam.GroupByKey()
                | "WriteShard" >> beam.ParDo(_WriteShard(self.out_dir)))
