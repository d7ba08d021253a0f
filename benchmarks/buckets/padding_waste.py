"""Padding waste: share of the stored/computed mel frames and text ids that are padding.

Reads a finished run's stats.json (by default the 2-worker LJSpeech-scale run of
benchmarks.preprocess.scale). The figure at the configured cut-offs is the job's own
(`padding.mel_padding_fraction`, `padding.text_padding_fraction`, exact). For other upper cut-offs
(p95, p99, p99.9, p100) it is recomputed from the before-filter histograms with the job's functions
(`melshards.shards_schema.stats.percentile`, `round_up`; `melshards.reports.whatif.hist_padding`): a clip is
kept per axis when its length lies within that axis's bounds. The real filter is joint (a clip dropped for its text is also
dropped from the mel histogram), which marginal histograms cannot express, so these rows are
approximations; the `p99 (recomputed)` row, set against the job's exact figure, shows their error.

With --corpus DIR instead, the lengths are measured in this process with the job's own
`clips.measure_lengths` (decode + trim + text, no mel) and the job's filter (`cutoffs_from`, `Cutoffs.reason`)
is applied jointly, so every row is exact: the same figures the job's stats.json would hold, for a
corpus whose job run is too slow or fails. The measured lengths are cached in <work-dir>/lengths-*.json.

Also shown: padding if the records were bucketed by mel length into K equal-count buckets, each
padded to its own multiple-of-8 maximum (a what-if for the trainer, not something the job does).

Run: python -m benchmarks.buckets.padding_waste [--stats /tmp/melshards-bench/scale-out-2w/stats.json]
     python -m benchmarks.buckets.padding_waste --corpus /tmp/melshards-bench/ljbig
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import emit
from benchmarks.preprocess.scale import WORK


def _hist(d: dict) -> dict[int, int]:
    return {int(k): v for k, v in d.items()}


def within(hist: dict[int, int], lo: int, hi: int) -> dict[int, int]:
    return {v: c for v, c in hist.items() if lo <= v <= hi}


def bucketed_fraction(hist: dict[int, int], buckets: int, multiple: int) -> float:
    """Padding share when each of `buckets` equal-count length buckets pads to its own rounded maximum."""
    from melshards.shards_schema.stats import percentile, round_up

    edges = [percentile(hist, 100 * (i + 1) / buckets) for i in range(buckets)]
    valid = sum(v * c for v, c in hist.items())
    padded, lo = 0, -1
    for hi in edges:
        n = sum(c for v, c in hist.items() if lo < v <= hi)
        padded += n * round_up(hi, multiple)
        lo = hi
    return round(1 - valid / padded, 6) if padded else 0.0


def measure_corpus(corpus: str, work_dir: str) -> list[tuple[int, int, int]]:
    """(text_len, mel_frames, duration_ms) of every measurable row, via the job's clips.measure_lengths."""
    import hashlib
    import os

    meta = Path(corpus) / "metadata.csv"
    key = hashlib.sha256(f"{os.path.abspath(corpus)}:{meta.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    cache = Path(work_dir) / f"lengths-{key}.json"
    if cache.exists():
        return [tuple(x) for x in json.loads(cache.read_text())]
    from benchmarks.preprocess.throughput import corpus_rows
    from melshards.preprocess.clip import clips
    from melshards.preprocess.config import PreprocessConfig

    cfg, out = PreprocessConfig(), []
    for r in corpus_rows(corpus):
        try:
            c = clips.measure_lengths(r, cfg)
        except clips.ClipRejected:
            continue
        out.append((c["text_len"], c["mel_frames"], c["duration_ms"]))
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(out))
    return out


def from_corpus(corpus: str, work_dir: str, qs: list[float]) -> tuple[list[dict], dict, dict]:
    """Exact rows (joint filter) for the default cut-offs and each upper percentile in qs."""
    import dataclasses
    from collections import Counter

    from melshards.preprocess.config import PreprocessConfig
    from melshards.preprocess.stats.global_stats import cutoffs_from
    from melshards.reports.whatif import hist_padding

    lengths = measure_corpus(corpus, work_dir)
    before = {k: Counter(x[i] for x in lengths) for i, k in enumerate(("text_len", "mel_frames", "duration_ms"))}
    base = PreprocessConfig()
    rows, default_after = [], None
    for q in [None] + qs:
        cfg = (
            base
            if q is None
            else dataclasses.replace(
                base,
                filter=dataclasses.replace(base.filter, mel_frames_upper_percentile=q, text_len_upper_percentile=q),
            )
        )
        cut = cutoffs_from(before, {"language_lengths": {"en": before}}, cfg)  # one language: English
        kept = [x for x in lengths if cut.reason(*x) is None]
        mel, text = Counter(x[1] for x in kept), Counter(x[0] for x in kept)
        if q is None:
            default_after = mel
        rows.append(
            {
                "cutoff": (
                    f"default p{base.filter.mel_frames_upper_percentile:g} (exact)" if q is None else f"p{q:g} (exact)"
                ),
                "padded_mel_frames": cut.padded_mel_frames,
                "padded_text_len": cut.padded_text_len,
                "kept": len(kept),
                "mel_padding_fraction": hist_padding(mel, cut.padded_mel_frames),
                "text_padding_fraction": hist_padding(text, cut.padded_text_len),
            }
        )
    info = {
        "measured": len(lengths),
        "mean_mel_after": round(sum(k * v for k, v in default_after.items()) / sum(default_after.values()), 1),
    }
    return rows, default_after, info


def main(argv=None) -> dict:
    from melshards.reports.whatif import hist_padding
    from melshards.shards_schema.stats import percentile, round_up

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stats", default=f"{WORK}/scale-out-2w/stats.json")
    ap.add_argument("--percentiles", default="95,99,99.9,100")
    ap.add_argument("--corpus", default=None, help="measure this corpus in-process instead of reading --stats")
    ap.add_argument(
        "--corpus-fallback",
        default=None,
        help="use --corpus mode on this corpus when --stats does not exist (e.g. the job failed)",
    )
    ap.add_argument("--work-dir", default=WORK)
    args = ap.parse_args(argv)
    qs = [float(x) for x in args.percentiles.split(",")]
    if not args.corpus and args.corpus_fallback and not Path(args.stats).exists():
        print(f"{args.stats} does not exist: measuring {args.corpus_fallback} instead")
        args.corpus = args.corpus_fallback
    if args.corpus:
        rows, kept_mel, info = from_corpus(args.corpus, args.work_dir, qs)
        return report(
            rows,
            kept_mel,
            pad_multiple=8,
            source=args.corpus,
            header=f"{args.corpus}: {info['measured']} measured clips, mean {info['mean_mel_after']} "
            "mel frames after the default filter (lengths measured with clips.measure_lengths)",
        )
    stats = json.loads(Path(args.stats).read_text())
    f, pad = stats["filter"], stats["padding"]
    multiple = pad["multiple"]
    before = {k: _hist(v) for k, v in stats["histograms"]["before_filter"].items()}
    after = {k: _hist(v) for k, v in stats["histograms"]["after_filter"].items()}
    n_before = sum(before["mel_frames"].values())
    mel_lo = percentile(before["mel_frames"], f["mel_frames_lower_percentile"])

    rows = [
        {
            "cutoff": f"default p{f['mel_frames_upper_percentile']:g} (job, exact)",
            "padded_mel_frames": pad["max_mel_frames"],
            "padded_text_len": pad["max_text_len"],
            "kept": stats["counts"]["in_shards"],
            "mel_padding_fraction": pad["mel_padding_fraction"],
            "text_padding_fraction": pad["text_padding_fraction"],
        }
    ]
    for q in qs:
        mel_hi, text_hi = percentile(before["mel_frames"], q), percentile(before["text_len"], q)
        mel_kept = within(before["mel_frames"], mel_lo, mel_hi)
        text_kept = within(before["text_len"], 0, text_hi)
        pm, pt = round_up(mel_hi, multiple), round_up(text_hi, multiple)
        rows.append(
            {
                "cutoff": f"p{q:g}" + (" (recomputed)" if q == f["mel_frames_upper_percentile"] else ""),
                "padded_mel_frames": pm,
                "padded_text_len": pt,
                "kept": min(sum(mel_kept.values()), sum(text_kept.values())),  # upper bound on the joint count
                "mel_padding_fraction": hist_padding(mel_kept, pm),
                "text_padding_fraction": hist_padding(text_kept, pt),
            }
        )
    return report(
        rows,
        after["mel_frames"],
        multiple,
        args.stats,
        f"{args.stats}: {n_before} measured clips, mean {stats['after_filter']['mel_frames']['mean']} "
        "mel frames after the filter",
    )


def report(rows: list[dict], kept_mel: dict, pad_multiple: int, source: str, header: str) -> dict:
    buckets = {k: bucketed_fraction(kept_mel, k, pad_multiple) for k in (1, 2, 4, 8)}
    print(header)
    print(f"{'upper cut-off':<28} {'pad mel':>7} {'pad text':>8} {'kept':>6} {'mel padding':>11} {'text padding':>12}")
    for r in rows:
        print(
            f"{r['cutoff']:<28} {r['padded_mel_frames']:>7} {r['padded_text_len']:>8} {r['kept']:>6} "
            f"{100 * r['mel_padding_fraction']:>10.1f}% {100 * r['text_padding_fraction']:>11.1f}%"
        )
    print("\nmel padding if kept records were bucketed by length (K equal-count buckets):")
    for k, v in buckets.items():
        print(f"  K={k}: {100 * v:.1f}%")
    result = {
        "benchmark": "padding_waste",
        "source": source,
        "rows": rows,
        "mel_padding_fraction_bucketed": {str(k): v for k, v in buckets.items()},
    }
    emit(result)
    return result


if __name__ == "__main__":
    main()
