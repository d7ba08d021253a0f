"""Bucket bounds: mel padding of the exact optimum vs the equal-count baseline, and the DP's runtime.

The histogram is either a finished run's stats.json (`--stats`, the kept clips' mel frames) or a
seeded synthetic 1-15 s corpus: `--clips` durations, log-normal (median `--median-s`, sigma
`--sigma`) clipped to [1, 15] s, at 22050 Hz / hop 256 (librosa's centred frame count
1 + samples // hop, ~86 frames/s), then the job's default p99 upper cut-off. Figures are exact
(integers); `--seeds` repeats the synthetic corpus to show the spread. The runtime part times
`optimal_bounds` on a histogram with `--distinct` distinct lengths (multiple 1, so every length is a
candidate) and with the default multiple 8.

Run: python -m benchmarks.buckets.bounds [--stats DIR/stats.json] [--seeds 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.common import emit
from melshards.shards_schema.buckets import WHAT_IF_KS, fill_buckets, optimal_bounds, total_padding_fraction
from melshards.shards_schema.stats import round_up

SR, HOP = 22050, 256


def equal_count_bounds(hist: dict[int, int], k: int, multiple: int) -> tuple[int, ...]:
    """The quantile baseline (NeMo, lhotse, tf.data bucket_by_sequence_length style), for comparison.

    Bound i is the inverted-CDF percentile 100 * (i+1) / k of the lengths, rounded up to `multiple`;
    bounds that coincide after rounding are merged, so fewer than k may come back.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"number of buckets must be an integer >= 1, got {k!r}")
    items = sorted((int(v), int(c)) for v, c in hist.items() if c)
    if not items:
        raise ValueError("empty length histogram")
    lengths = np.array([v for v, _ in items], dtype=np.int64)
    cum = np.cumsum([c for _, c in items], dtype=np.int64)
    n = int(cum[-1])
    out: list[int] = []
    for i in range(1, k + 1):
        # smallest length whose CDF reaches i/k of the clips, in integers: cum * k >= i * n
        j = int(np.searchsorted(cum * k, i * n, side="left"))
        b = round_up(int(lengths[j]), multiple)
        if not out or b > out[-1]:
            out.append(b)
    return tuple(out)


def synthetic(seed: int, clips: int, median_s: float, sigma: float) -> dict[int, int]:
    rng = np.random.default_rng(seed)
    dur = np.clip(rng.lognormal(np.log(median_s), sigma, clips), 1.0, 15.0)
    frames = 1 + (dur * SR).astype(np.int64) // HOP
    cut = np.sort(frames)[int(np.ceil(0.99 * clips)) - 1]  # inverted-CDF p99, as the job's filter
    return dict(Counter(int(f) for f in frames if f <= cut))


def table(hist: dict[int, int], multiple: int) -> list[dict]:
    rows = []
    for k in WHAT_IF_KS:
        opt, eq = optimal_bounds(hist, k, multiple), equal_count_bounds(hist, k, multiple)
        rows.append(
            {
                "k": k,
                "optimal_used": len(opt),
                "optimal": round(total_padding_fraction(fill_buckets(opt, hist)), 6),
                "equal_count_used": len(eq),
                "equal_count": round(total_padding_fraction(fill_buckets(eq, hist)), 6),
                "optimal_bounds": list(opt),
            }
        )
    return rows


def runtime(distinct: int, k: int, multiple: int, repeats: int = 3) -> dict:
    rng = np.random.default_rng(0)
    lengths = rng.choice(np.arange(1, 4 * distinct), size=distinct, replace=False)
    hist = {int(v): int(rng.integers(1, 50)) for v in lengths}
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        optimal_bounds(hist, k, multiple)
        times.append(time.perf_counter() - t)
    candidates = len({-(-v // multiple) for v in hist})
    return {
        "distinct_lengths": distinct,
        "candidates": candidates,
        "k": k,
        "multiple": multiple,
        "seconds_median": round(statistics.median(times), 3),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stats", default=None, help="a run's stats.json: use its after-filter mel histogram")
    ap.add_argument("--multiple", type=int, default=8)
    ap.add_argument("--clips", type=int, default=302)
    ap.add_argument("--median-s", type=float, default=6.0)
    ap.add_argument("--sigma", type=float, default=0.55)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--distinct", type=int, default=10_000)
    args = ap.parse_args(argv)

    if args.stats:
        stats = json.loads(Path(args.stats).read_text())
        hist = {int(v): c for v, c in stats["histograms"]["after_filter"]["mel_frames"].items()}
        source, spread = args.stats, None
    else:
        hist = synthetic(0, args.clips, args.median_s, args.sigma)
        source = (
            f"synthetic seed 0: {args.clips} clips, log-normal median {args.median_s} s sigma "
            f"{args.sigma}, clipped 1-15 s, p99 cut-off"
        )
        k8 = [table(synthetic(s, args.clips, args.median_s, args.sigma), args.multiple)[3] for s in range(args.seeds)]
        spread = {
            "seeds": args.seeds,
            "optimal_k8_median": statistics.median(r["optimal"] for r in k8),
            "equal_count_k8_median": statistics.median(r["equal_count"] for r in k8),
            "optimal_k8_range": [min(r["optimal"] for r in k8), max(r["optimal"] for r in k8)],
            "equal_count_k8_range": [min(r["equal_count"] for r in k8), max(r["equal_count"] for r in k8)],
            "optimal_better_every_seed": all(r["optimal"] <= r["equal_count"] for r in k8),
        }
    n = sum(hist.values())
    mean = sum(v * c for v, c in hist.items()) / n
    print(f"{source}\n{n} clips, {len(hist)} distinct lengths, mean {mean:.1f} mel frames, max {max(hist)}")
    rows = table(hist, args.multiple)
    print(f"{'K':>3} {'optimal':>8} {'used':>4} {'equal-count':>11} {'used':>4}  optimal bounds")
    for r in rows:
        print(
            f"{r['k']:>3} {100 * r['optimal']:>7.1f}% {r['optimal_used']:>4} {100 * r['equal_count']:>10.1f}% "
            f"{r['equal_count_used']:>4}  {r['optimal_bounds']}"
        )
    if spread:
        print(
            f"K=8 over {spread['seeds']} seeds: optimal median {100 * spread['optimal_k8_median']:.1f}% "
            f"{[round(100 * x, 1) for x in spread['optimal_k8_range']]}, equal-count median "
            f"{100 * spread['equal_count_k8_median']:.1f}% "
            f"{[round(100 * x, 1) for x in spread['equal_count_k8_range']]}"
        )
    rt = [runtime(args.distinct, k, m) for k, m in ((8, 1), (16, 1), (8, 8))]
    for r in rt:
        print(
            f"DP: {r['distinct_lengths']} distinct lengths, {r['candidates']} candidates, K={r['k']}, "
            f"multiple {r['multiple']}: {r['seconds_median']} s"
        )
    result = {
        "benchmark": "bucket_bounds",
        "source": source,
        "clips": n,
        "mean_mel_frames": round(mean, 1),
        "rows": rows,
        "k8_spread": spread,
        "dp_runtime": rt,
    }
    emit(result)
    return result


if __name__ == "__main__":
    main()
