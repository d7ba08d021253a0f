"""The statistics, bucket choice, what-if and report at the size of a 1,000,000-clip corpus.

A finished run's stats.json (default: the 13,100-clip run `benchmarks/cache/wall.py` leaves,
`<work-dir>/cache-wall/out-plain`) scaled to `--clips` clips: every count and histogram count
multiplied by the same integer, so every sum still adds up and the distinct lengths stay those of a
real corpus of that size (`smear`: ~9,000 distinct durations in ms, ~1,000 mel frame counts). Timed, each `--rounds` times (median): the cut-offs from the histograms (`compute_cutoffs`),
the bucket choice with per-bucket text lengths (`bucketing.choose_from_summary`, the exact DP, over
a (mel frames, text length) table of the same size), the stats.json check (`stats_problem`), and
`melshards stats`'s report with its what-if tables (`build_report`). Goal (issue 22): under 10 s.

Run: python -m benchmarks.preprocess.stats_scale [--stats DIR/stats.json] [--clips 1000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path

from benchmarks.common import emit
from benchmarks.preprocess.scale import WORK


def scaled(value, k: int):
    """Every count in a stats.json-like value times k (lengths, percentiles and settings unchanged)."""
    if isinstance(value, dict):
        out = {}
        for key, v in value.items():
            if key in ("histograms",):
                out[key] = {
                    side: {name: {length: c * k for length, c in h.items()} for name, h in hs.items()}
                    for side, hs in v.items()
                }
            elif key in ("counts", "per_split", "per_reason") or key in (
                "in_shards",
                "filtered",
                "rejected",
                "input_rows",
                "records",
                "clips",
                "measured",
                "count",
                "rows",
            ):
                out[key] = scaled_counts(v, k)
            else:
                out[key] = scaled(v, k)
        return out
    if isinstance(value, list):
        return [scaled(v, k) for v in value]
    return value


def scaled_counts(value, k: int):
    if isinstance(value, dict):
        return {key: scaled_counts(v, k) for key, v in value.items()}
    return value * k if isinstance(value, int) and not isinstance(value, bool) else value


SPREAD = {"duration_ms": 28, "mel_frames": 3, "text_len": 2}  # of each synthetic-corpus length, see smear


def smear(hist: dict, width: int) -> dict:
    """Each length's count spread over it and the next width - 1 lengths (the total unchanged): the
    synthetic corpus's lengths are quantised (trimming works in 512-sample steps: 328 distinct
    durations), a real corpus of a million clips has nearly every millisecond from 1 to 10 s."""
    out: Counter = Counter()
    for v, c in hist.items():
        v = int(v)
        for j in range(width):
            out[str(v + j)] += c // width + (1 if j < c % width else 0)
    return {k: n for k, n in out.items() if n}


def timed(fn, rounds: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(rounds):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stats", default=f"{WORK}/cache-wall/out-plain/stats.json")
    ap.add_argument("--clips", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work-dir", default=WORK)
    args = ap.parse_args(argv)
    from melshards.preprocess.config import PreprocessConfig
    from melshards.preprocess.stats import bucketing
    from melshards.reports.stats_report import Run, build_report
    from melshards.shards_schema.stats import compute_cutoffs
    from melshards.shards_schema.stats_model import stats_problem

    base = json.loads(Path(args.stats).read_text())
    k = max(1, round(args.clips / base["counts"]["input_rows"]))
    stats = scaled(base, k)
    for side in ("before_filter", "after_filter"):
        stats["histograms"][side] = {
            name: smear(h, SPREAD.get(name, 1)) for name, h in stats["histograms"][side].items()
        }
    assert stats_problem(stats) is None, stats_problem(stats)
    before = {name: {int(v): c for v, c in h.items()} for name, h in stats["histograms"]["before_filter"].items()}
    after = {name: {int(v): c for v, c in h.items()} for name, h in stats["histograms"]["after_filter"].items()}
    cfg = PreprocessConfig()
    f = cfg.filter
    t_cut, _ = timed(
        lambda: compute_cutoffs(
            before,
            f.min_duration_s,
            f.mel_frames_lower_percentile,
            f.mel_frames_upper_percentile,
            f.text_len_upper_percentile,
            cfg.pad.multiple,
        ),
        args.rounds,
    )
    # a (mel frames, text length) table as large as a real one: each frame count with the text lengths
    # around its typical length (~0.17 symbols per frame), its clips spread over them
    text_by_frames = Counter()
    for frames, n in after["mel_frames"].items():
        for d in range(-8, 9):
            text_by_frames[(frames, max(1, round(0.17 * frames) + d))] += max(1, n // 17)
    summary = {"after": after, "train": Counter(after["mel_frames"]), "text_by_frames": text_by_frames}
    t_buckets, chosen = timed(lambda: bucketing.choose_from_summary(summary, cfg.pad), args.rounds)
    t_check, _ = timed(lambda: stats_problem(stats), args.rounds)
    run = Run(args.stats, stats, 80, None)
    t_report, _ = timed(lambda: build_report(run, 32), args.rounds)
    total = t_cut + t_buckets + t_check + t_report
    result = {
        "benchmark": "stats_scale",
        "clips": stats["counts"]["input_rows"],
        "scale": k,
        "distinct": {name: len(h) for name, h in before.items()},
        "text_by_frames_entries": len(text_by_frames),
        "buckets": len(chosen["buckets"]["bounds"]),
        "seconds": {
            "cutoffs": round(t_cut, 4),
            "buckets": round(t_buckets, 3),
            "stats_check": round(t_check, 3),
            "report_with_what_if": round(t_report, 3),
            "total": round(total, 3),
        },
    }
    print(
        f"{result['clips']:,} clips ({k} x {args.stats}); distinct lengths {result['distinct']}; "
        f"{len(text_by_frames):,} (frames, text) pairs"
    )
    for name, s in result["seconds"].items():
        print(f"  {name:<20}{s:>8.3f} s")
    print(f"goal: under 10 s in all; measured {total:.2f} s")
    emit(result)
    return result


if __name__ == "__main__":
    main()
