"""Length buckets: the K static mel shapes that minimise padding, chosen from an exact length histogram.

Pure math, no Beam and no TensorFlow: the preprocessing job calls it with its exact histogram of kept
clips' mel frames (`melshards.preprocess.stats.bucketing`; the figures go into stats.json's `buckets`), and
the benchmarks for their tables. Long because the derivation below is part of it.

Names: a `BucketFill` is how full one bound leaves its bucket (clips, valid frames), not the
schema's `melshards.shards_schema.schema.Bucket` (a bucket's shapes and shards); `choose_buckets`
returns a `BucketChoice`; `padding_by_k` is the padding over K (stats.json's `what_if`).

Model. A clip of `v` mel frames goes to the bucket with the smallest bound `b >= v` and is padded to
`b` frames. Bounds are multiples of `multiple` and the last one is `>= max(v)`. The cost of a bound set
is the total padded frames, sum over clips of the clip's bound; the valid frames are fixed, so
minimising padded frames minimises padding.

Why only the round-ups of observed lengths are candidates: a clip fits a bound `b` (a multiple) iff
`round_up(v) <= b`, so lowering any bound to the largest candidate below it keeps every bucket's members
and never costs more. An optimal set is therefore a subset of the C distinct candidates that contains
the largest one, and the dynamic programme below searches exactly those subsets.

Dynamic programme. Sort candidates c_0 < ... < c_{C-1} with counts w_j and prefix counts P (P_0 = 0).
g_k[e] = least cost of covering the first e candidates with at most k buckets, the last bound c_{e-1}:

    g_k[e] = min_{0 <= s < e} g_{k-1}[s] + c_{e-1} * (P_e - P_s),   g_{k-1}[0] = 0 (the first bucket)

One pass gives the optimum for every k <= K at once (the "auto" rule and the what-if table read it
off). Cost O(K * C^2) integer operations (half of them, the s < e triangle), vectorised over s with
numpy in row blocks, O(K * C) memory for the back-pointers. Integers (int64) throughout, so costs are
exact and comparable with `==`.

Minimum records per bucket. Every bucket must hold at least one full training batch (the trainer
drops remainders), otherwise a compiled shape is never run and its records are lost to training.
This is a constraint inside the DP (a transition s -> e is allowed only if P_e - P_s >= the bucket's
minimum), not a repair afterwards: the constrained DP is exact (the least padding among all bound sets
that respect the minimum), costs the same O(K * C^2) (one more mask), and can move a bound rather than
only delete it (greedy merging of the unconstrained optimum can only delete bounds, so it is never
better and often worse: `tests/shards_schema/test_buckets.py` keeps it as the reference). The minimum
may depend on the bound (a callable), since shorter buckets get larger batches. `choose_buckets` reports, as `merges`, the buckets of the
unconstrained optimum that the minimum removed, with the padding that the constraint costs.

Tie-breaking: among bound sets of equal cost the one with fewer buckets wins (fewer compiles).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from melshards.shards_schema.stats import padding_fraction, round_up  # round_up re-exported: the one rounding rule

MinRecords = int | Callable[[int], int]
WHAT_IF_KS = (1, 2, 4, 8, 16)
AUTO = "auto"

_INF = np.int64(2**61)  # unreachable state; every real cost is < 2**60 (checked), so sums never overflow
_BLOCK_ELEMS = 1 << 20  # rows per vectorised block are chosen so each temporary stays ~8 MB of int64


def text_bound(max_text_len: int, multiple: int) -> int:
    """A bucket's padded text length: the longest text among its clips, rounded up (at least `multiple`).

    Text lengths are not a function of mel length, so the job finds each bucket's longest text with a
    combiner keyed by bucket; marginal histograms cannot give it.
    """
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    return max(round_up(max_text_len, multiple), multiple)


def bucket_index(mel_frames: int, bounds: Sequence[int]) -> int:
    """Index of the bucket a clip of `mel_frames` goes to: the smallest bound >= mel_frames."""
    i = bisect.bisect_left(bounds, mel_frames)
    if i == len(bounds):
        raise ValueError(f"{mel_frames} mel frames exceed the largest bucket bound {bounds[-1]}")
    return i


# -- per-bucket figures ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BucketFill:
    """One bucket: its bound (padded mel frames), how many clips it holds and their valid frames."""

    bound: int
    records: int
    valid_frames: int

    @property
    def padded_frames(self) -> int:
        return self.records * self.bound

    @property
    def padding_fraction(self) -> float:
        return padding_fraction(self.valid_frames, self.padded_frames)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bound": self.bound,
            "records": self.records,
            "valid_frames": self.valid_frames,
            "padded_frames": self.padded_frames,
            "padding_fraction": round(self.padding_fraction, 6),
        }


def fill_buckets(bounds: Sequence[int], hist: Mapping[int, int]) -> tuple[BucketFill, ...]:
    """The clips of `hist` split by `bounds` (ascending, last >= max length): one BucketFill per bound."""
    bounds = _check_bounds(bounds)
    lengths, counts = _arrays(hist)
    if lengths[-1] > bounds[-1]:
        raise ValueError(f"largest length {lengths[-1]} exceeds the largest bound {bounds[-1]}")
    idx = np.searchsorted(np.asarray(bounds, dtype=np.int64), lengths, side="left")
    records = np.bincount(idx, weights=counts, minlength=len(bounds))
    valid = np.bincount(idx, weights=counts * lengths, minlength=len(bounds))
    # bincount weights are float64: exact for integers below 2**53, far above any corpus
    return tuple(BucketFill(int(b), int(r), int(v)) for b, r, v in zip(bounds, records, valid))


def total_padding_fraction(buckets: Sequence[BucketFill]) -> float:
    """Share of all padded mel frames that is padding, over every bucket (`padding_fraction` of the sums)."""
    return padding_fraction(sum(b.valid_frames for b in buckets), sum(b.padded_frames for b in buckets))


# -- choosing bounds ------------------------------------------------------------------------------
def optimal_bounds(hist: Mapping[int, int], k: int, multiple: int, min_records: MinRecords = 0) -> tuple[int, ...]:
    """At most `k` bounds (multiples of `multiple`, the last >= max length) with the least padded frames.

    With `min_records`, every bucket holds at least that many clips (an int, or a function of the
    bucket's bound); raises ValueError when even one bucket cannot (the histogram holds fewer clips).
    """
    table = _Table(hist, k, multiple, min_records)
    kk = table.best_k(k)
    if kk is None:
        raise ValueError(f"{table.total} clips cannot fill one bucket of min_records")
    return table.bounds(kk)


@dataclasses.dataclass(frozen=True)
class Merge:
    """Bucket `bound` held `records` < `min_records` clips; its bound was removed (or moved).

    `into` is the bound its clips are padded to afterwards.
    """

    bound: int
    records: int
    min_records: int
    into: int

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class BucketChoice:
    """The buckets the job writes, with the figures stats.json shows (its `buckets.plan`).

    `merges`: buckets of the unconstrained optimum (same k) that held fewer than `min_records` clips,
    each with `into`, the chosen bound their longest clips are padded to; `unconstrained_padding` is that
    optimum's padding, so the cost of the minimum is visible. `min_records_met` is False only when all
    clips together cannot fill one bucket (the choice is then the single bucket).
    """

    buckets: tuple[BucketFill, ...]
    k_requested: int | str
    max_buckets: int
    target_padding: float
    multiple: int
    merges: tuple[Merge, ...]
    unconstrained_padding: float
    min_records_met: bool

    @property
    def bounds(self) -> tuple[int, ...]:
        return tuple(b.bound for b in self.buckets)

    @property
    def records(self) -> tuple[int, ...]:
        return tuple(b.records for b in self.buckets)

    @property
    def k_used(self) -> int:
        return len(self.buckets)

    @property
    def padding_fraction(self) -> float:
        return total_padding_fraction(self.buckets)

    def to_dict(self) -> dict[str, Any]:
        return {
            "k_requested": self.k_requested,
            "k_used": self.k_used,
            "max_buckets": self.max_buckets,
            "target_padding": self.target_padding,
            "multiple": self.multiple,
            "bounds": list(self.bounds),
            "buckets": [b.to_dict() for b in self.buckets],
            "padding_fraction": round(self.padding_fraction, 6),
            "unconstrained_padding_fraction": round(self.unconstrained_padding, 6),
            "merges": [m.to_dict() for m in self.merges],
            "min_records_met": self.min_records_met,
        }


def choose_buckets(
    hist: Mapping[int, int],
    buckets: int | str,
    max_buckets: int,
    target_padding: float,
    multiple: int,
    min_records: MinRecords = 0,
) -> BucketChoice:
    """The job's rule: `buckets` = K, or "auto" = the smallest K <= max_buckets with mel padding <=
    target_padding (else max_buckets); bounds are the exact optimum with every bucket >= min_records.

    `hist` is the histogram of the clips that fill training batches (the train split) when
    `min_records` is the batch size; the same bounds then serve the validation split.
    """
    if buckets == AUTO:
        _check_k(max_buckets)
        if not 0.0 <= target_padding < 1.0:
            raise ValueError(f"target_padding must be in [0, 1), got {target_padding}")
        kmax = max_buckets
    elif isinstance(buckets, int) and not isinstance(buckets, bool):
        _check_k(buckets)
        kmax = buckets
    else:
        raise ValueError(f"buckets must be an integer >= 1 or {AUTO!r}, got {buckets!r}")
    table = _Table(hist, kmax, multiple, min_records)
    free = _Table(hist, kmax, multiple, 0) if table.constrained else table
    k_ask = kmax
    if buckets == AUTO:
        k_ask = next(
            (
                k
                for k in range(1, kmax + 1)
                if (cost := table.cost(k)) is not None and padding_fraction(table.valid, cost) <= target_padding
            ),
            kmax,
        )
    kk = table.best_k(k_ask)
    met = kk is not None
    bounds = table.bounds(kk) if kk is not None else (int(table.cand[-1]),)
    free_buckets = fill_buckets(free.bounds(free.best_k(k_ask)), hist)  # type: ignore[arg-type]  # without min_records every k is feasible: best_k is not None
    need = _min_records_fn(min_records)
    if met:
        merges = tuple(
            Merge(b.bound, b.records, need(b.bound), bounds[bucket_index(b.bound, bounds)])
            for b in free_buckets
            if b.records < need(b.bound)
        )
    else:
        merges = (Merge(bounds[0], table.total, need(bounds[0]), bounds[0]),)
    return BucketChoice(
        fill_buckets(bounds, hist),
        buckets,
        max_buckets,
        target_padding,
        multiple,
        merges,
        total_padding_fraction(free_buckets),
        met,
    )


def padding_by_k(
    hist: Mapping[int, int], multiple: int, min_records: MinRecords = 0, ks: Sequence[int] = WHAT_IF_KS
) -> tuple[dict[str, Any], ...]:
    """Padding and compile count (= buckets used) of the optimal bounds for each K in `ks`; one DP pass
    (stats.json's `buckets.what_if`)."""
    table = _Table(hist, max(ks), multiple, min_records)
    rows: list[dict[str, Any]] = []
    for k in ks:
        kk = table.best_k(k)
        cost = table.cost(kk) if kk is not None else None
        if kk is None or cost is None:
            rows.append({"k": k, "buckets_used": None, "padding_fraction": None})
            continue
        rows.append({"k": k, "buckets_used": kk, "padding_fraction": round(padding_fraction(table.valid, cost), 6)})
    return tuple(rows)


# -- the dynamic programme -------------------------------------------------------------------------
class _Table:
    """g_k[e] and back-pointers for k = 1..kmax over the candidates of `hist` (see module docstring)."""

    def __init__(self, hist: Mapping[int, int], kmax: int, multiple: int, min_records: MinRecords):
        _check_k(kmax)
        if multiple < 1:
            raise ValueError(f"multiple must be >= 1, got {multiple}")
        lengths, counts = _arrays(hist)
        cand = -(-lengths // multiple) * multiple
        self.cand, first = np.unique(cand, return_index=True)
        w = np.add.reduceat(counts, first)
        C = len(self.cand)
        P = np.concatenate(([0], np.cumsum(w))).astype(np.int64)
        self.total = int(P[-1])
        self.valid = int((lengths * counts).sum())
        if int(self.cand[-1]) * self.total >= 2**60:
            raise ValueError("histogram too large for exact int64 costs")
        need = _min_records_fn(min_records)
        m = np.array([need(int(b)) for b in self.cand], dtype=np.int64)  # minimum of a bucket ending at e
        self.constrained = bool((m > 0).any())
        g = np.full((kmax + 1, C + 1), _INF, dtype=np.int64)
        arg = np.zeros((kmax + 1, C + 1), dtype=np.int32)
        g[:, 0] = 0
        rows = max(1, _BLOCK_ELEMS // max(C, 1))
        for k in range(1, kmax + 1):
            prev = g[k - 1]
            for a in range(1, C + 1, rows):
                e = np.arange(a, min(a + rows, C + 1))  # block of prefix ends
                b = e[-1]  # s ranges over 0..b-1 in this block
                ce, Pe = self.cand[e - 1][:, None], P[e][:, None]
                Ps = P[None, :b]
                ok = (np.arange(b)[None, :] < e[:, None]) & (Pe - Ps >= m[e - 1][:, None]) & (prev[None, :b] < _INF)
                cost = np.where(ok, prev[None, :b] + ce * (Pe - Ps), _INF)
                s = cost.argmin(axis=1)
                g[k, e] = cost[np.arange(len(e)), s]
                arg[k, e] = s
        self.g, self.arg = g, arg

    def cost(self, k: int) -> int | None:
        """Least padded frames with at most k buckets, or None if infeasible."""
        c = int(self.g[k, -1])
        return None if c >= _INF else c

    def best_k(self, k: int) -> int | None:
        """The fewest buckets reaching the optimum for at most k buckets (fewer compiles on ties)."""
        best = self.cost(k)
        if best is None:
            return None
        return next(j for j in range(1, k + 1) if self.cost(j) == best)

    def bounds(self, k: int) -> tuple[int, ...]:
        out, e = [], len(self.cand)
        while e > 0:
            out.append(int(self.cand[e - 1]))
            e = int(self.arg[k, e])
            k -= 1
        return tuple(reversed(out))


# -- checks ----------------------------------------------------------------------------------------
def _arrays(hist: Mapping[int, int]) -> tuple[np.ndarray, np.ndarray]:
    items = sorted((int(v), int(c)) for v, c in hist.items() if c)
    if not items:
        raise ValueError("empty length histogram")
    lengths, counts = (np.array(x, dtype=np.int64) for x in zip(*items))
    if lengths[0] < 1 or counts.min() < 0:
        raise ValueError("lengths must be >= 1 and counts >= 0")
    return lengths, counts


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"number of buckets must be an integer >= 1, got {k!r}")


def _check_bounds(bounds: Sequence[int]) -> tuple[int, ...]:
    bounds = tuple(int(b) for b in bounds)
    if not bounds or any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"bounds must be non-empty and strictly ascending, got {bounds}")
    return bounds


def _min_records_fn(min_records: MinRecords) -> Callable[[int], int]:
    if callable(min_records):
        return lambda b: int(min_records(b))
    return lambda b: int(min_records)
