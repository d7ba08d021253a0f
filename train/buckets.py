"""Length buckets in the trainer: batch size per bucket, the seeded bucket schedule, and each bucket
as the trainer runs it (`TrainerBucket`, made by `trainer_buckets`).

The shards come in K >= 1 length buckets, each with its own static shapes (schema.json). The trainer
keeps one input pipeline, one compiled train step and one eval step per bucket used, each bound to
that bucket's input_signature, so each traces exactly once. Python picks the bucket of every
compiled call from a schedule that is a pure function of (seed, call index): nothing about the
order is stored, so a checkpoint's step counter is the schedule position, and a resumed run draws
exactly the buckets an uninterrupted one would. K = 1 is the same code with one bucket.

Batch size per bucket (`batch_sizes`). `data.batch_size` B is the batch of the longest bucket (the
one the memory budget is set for). A bucket of T frames gets floor(B * T_max / T) records, so every
bucket's batch holds about the same padded frames as the longest one's (B * T_max, never more),
capped at the bucket's training records (one batch never holds a record twice), then rounded down
to a multiple of lcm(replicas, gcd(B, 8)): the replicas divide it, and so does whatever divides B
up to 8 (multiples of 8 suit tensor cores). That multiple divides B, so a bucket with at least B
records gets at least B. A bucket with fewer training records than B cannot fill a batch without
repeating records: the run is refused (`check_batch_fits`, `BatchError`), naming the largest batch every
bucket fits; `melshards.dataset` refuses such a batch_size by the same check.
`data.fixed_batch_size: true` gives every bucket batch B (the same refusal applies).

Schedule (`schedule`). Calls run in epochs of the schedule: bucket i appears n_i times per epoch,
n_i = its records / (its batch * steps_per_execution) rounded, at least 1 (no bucket starves), so an
epoch sees every record about once; the order within epoch e is a permutation drawn by numpy from
(seed, e). A call's K = steps_per_execution steps all come from one bucket. With balanced sampling
(train/balance.py) a bucket's records count times the share of them the filter keeps: the buckets
then give the records trained on in proportion to what each keeps, which gives the groups their
target shares however they are spread over the buckets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from melshards.shards_schema import Schema
from melshards.shards_schema.config import ConfigError
from melshards.shards_schema.schema import Bucket
from melshards.shards_schema.shards import InputError, listed_split

if TYPE_CHECKING:
    from melshards.train.config import DataConfig


class BatchError(ConfigError):
    """The batch does not fit the training records (a batch would hold a record twice)."""


def batch_multiple(batch_size: int, replicas: int = 1) -> int:
    """What every bucket's batch is a multiple of: the replicas and gcd(B, 8); it divides B."""
    return math.lcm(replicas, math.gcd(batch_size, 8))


def batch_sizes(
    frames: Sequence[int], records: Sequence[int], batch_size: int, fixed: bool = False, replicas: int = 1
) -> list[int]:
    """Batch per bucket: ~constant padded frames per batch (see the module doc); B for all when fixed.

    Raises BatchError when a bucket with records has fewer than B (B must divide by the replicas:
    Topology.per_replica_batch checks that first). A bucket without records gets B (it is never run).
    """
    check_batch_fits(records, batch_size, replicas)
    if fixed:
        return [batch_size] * len(frames)
    longest, multiple = max(frames), batch_multiple(batch_size, replicas)
    return [
        batch_size if n == 0 else min(batch_size * longest // t, n) // multiple * multiple
        for t, n in zip(frames, records)
    ]


def check_batch_fits(
    records: Sequence[int],
    batch_size: int,
    replicas: int = 1,
    *,
    name: str = "data.batch_size",
    setting: str = "--batch-size {}",
    what: str = "training records",
) -> None:
    """BatchError when a bucket with records (`records`: each bucket's, by index; 0 for a bucket not
    read) holds fewer than `batch_size`: its batches would hold records twice, or none would be whole.
    The message names the counts and the largest batch that fits (a multiple of `replicas`), as `name`
    ("data.batch_size") and spelt as `setting` gives it ("--batch-size {}"); `what` is what is counted."""
    short = [(i, n) for i, n in enumerate(records) if 0 < n < batch_size]
    if short:
        raise BatchError(_too_few_records(short, records, batch_size, replicas, name, setting, what))


def _too_few_records(
    short: list[tuple[int, int]],
    records: Sequence[int],
    batch_size: int,
    replicas: int,
    name: str,
    setting: str,
    what: str,
) -> str:
    fits = min(n for n in records if n) // replicas * replicas
    which = ", ".join(f"bucket {i} has {n}" for i, n in short)
    if sum(1 for n in records if n) == 1:
        which = f"the shards hold {short[0][1]}"
    advice = (
        f"the largest batch that fits is {fits}: pass {setting.format(fits)} or less"
        if fits
        else f"no bucket batch can divide by the {replicas} replicas: use fewer replicas or more records"
    )
    per_bucket = (
        ""
        if sum(1 for n in records if n) == 1
        else (
            " (largest per bucket: "
            + ", ".join(f"bucket {i} {n // replicas * replicas}" for i, n in enumerate(records) if n)
            + ")"
        )
    )
    return (
        f"{name} {batch_size} is more than the {what} ({which}): a batch never holds a "
        f"record twice, so {advice}{per_bucket}, or add shards"
    )


def calls_per_epoch(records: Sequence[float], batches: Sequence[int], steps_per_execution: int) -> list[int]:
    """Compiled calls of each bucket in one schedule epoch: its batches, rounded, >= 1; 0 if no records."""
    return [0 if n == 0 else max(1, round(n / (b * steps_per_execution))) for n, b in zip(records, batches)]


def epoch_order(calls: Sequence[int], seed: int, epoch: int) -> np.ndarray:
    """The buckets of one schedule epoch's calls, in order: a seeded permutation of n_i copies of i."""
    slots = np.repeat(np.arange(len(calls)), calls)
    return np.random.default_rng([seed, epoch]).permutation(slots)


class Schedule:
    """The bucket of each call, a pure function of (calls, seed, call index); keeps the current
    epoch's order, as the loop asks call by call."""

    def __init__(self, calls: Sequence[int], seed: int):
        self.calls, self.seed = list(calls), seed
        self.per_epoch = int(sum(calls))
        if self.per_epoch == 0:
            raise ValueError("no bucket has records")
        self._epoch, self._order = -1, np.zeros(0, np.int64)

    def bucket(self, call: int) -> int:
        epoch, pos = divmod(call, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._order = epoch, epoch_order(self.calls, self.seed, epoch)
        return int(self._order[pos])


def schedule(calls: Sequence[int], seed: int, first: int, count: int) -> np.ndarray:
    """The buckets of calls first .. first + count - 1."""
    s = Schedule(calls, seed)
    return np.array([s.bucket(c) for c in range(first, first + count)], np.int64)


@dataclasses.dataclass(frozen=True)
class TrainerBucket:
    """One length bucket as the trainer runs it: the schema's bucket (shapes), its batch, its train
    and validation shard files, its training records and its calls per schedule epoch."""

    bucket: Bucket
    batch_size: int
    files: tuple[str, ...]
    val_files: tuple[str, ...]
    records: int  # training records in `files`
    calls_per_epoch: int

    @property
    def index(self) -> int:
        return self.bucket.index

    def data_config(self, data: DataConfig) -> DataConfig:
        """The data config of this bucket's pipelines: its own (global) batch size."""
        return dataclasses.replace(data, batch_size=self.batch_size)


def files_by_bucket(files: Sequence[str], schema: Schema) -> dict[int, list[str]]:
    """Each bucket's files among `files`; a file of no bucket is an InputError (its shapes are unknown)."""
    out: dict[int, list[str]] = {b.index: [] for b in schema.buckets}
    for f in files:
        b = schema.bucket_of_file(f)
        if b is None:
            raise InputError(
                f"{f}: schema.json does not list it and its name says no bucket of the "
                f"{len(schema.buckets)} (split-bNN-SSSSS-of-CCCCC.tfrecord); its shapes are "
                "unknown. Keep the names preprocess gave the shards"
            )
        out[b.index].append(f)
    return out


def records_in(files: Sequence[str], schema: Schema, bucket: Bucket) -> int:
    """Training records of a bucket's files as schema.json lists them; an unlisted file (renamed or
    copied) counts as the bucket's mean file."""
    listed = bucket.shards.get("train", [])
    mean = round(bucket.counts.get("train", 0) / len(listed)) if listed else 0
    total = 0
    for f in files:
        _, n = listed_split(schema, f)
        total += mean if n is None else n
    return total


def trainer_buckets(
    files: Sequence[str],
    val_files: Sequence[str],
    schema: Schema,
    batch_size: int,
    fixed: bool,
    steps_per_execution: int,
    replicas: int = 1,
    kept: Sequence[float] | None = None,
) -> list[TrainerBucket]:
    """The buckets of a run, each with its batch, files and share of the schedule; `kept`: the share
    of each bucket's records balanced sampling keeps (`balance.Balancing.bucket_kept`), which scales its
    records in the schedule (None: all).

    Pure and cheap (schema.json's record counts, no reads): the trainer calls it before anything is
    written, so a batch that does not fit is refused first (BatchError)."""
    train, val = files_by_bucket(files, schema), files_by_bucket(val_files, schema)
    records = [records_in(train[b.index], schema, b) if train[b.index] else 0 for b in schema.buckets]
    frames = [b.max_mel_frames for b in schema.buckets]
    batches = batch_sizes(frames, records, batch_size, fixed, replicas)
    drawn = records if kept is None else [n * k for n, k in zip(records, kept)]
    calls = calls_per_epoch(drawn, batches, steps_per_execution)
    return [
        TrainerBucket(b, batches[b.index], tuple(train[b.index]), tuple(val[b.index]), records[b.index], calls[b.index])
        for b in schema.buckets
    ]
