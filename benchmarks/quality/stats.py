"""What stats.json's quality histograms cost per clip: `quality_stats.group_histograms` (every measure on its
grid, for the corpus, the speaker and the language) against `quality_rules.rate_histograms` (the speaking-rate
histograms the quality gate already sums), on synthetic measured clips, interleaved round by round; and the
per-group reduction and the report stage's `QualityFigures.of` (percentiles, the rate rule at each k) over the
summed histograms (`quality_stats.summary_of`: in the job, the reduction runs where each group's key lands).

Run: python -m benchmarks.quality.stats [--clips 1000] [--speakers 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import random
import time

from benchmarks.common import emit
from melshards.preprocess.clip.quality import MEASURES, measure_bins
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.stats.quality_rules import rate_histograms
from melshards.preprocess.stats.quality_stats import QualityFigures, group_histograms, summary_of


def synthetic_clips(n: int, speakers: int, seed: int = 1) -> list[dict]:
    """n measured clips of `speakers` speakers in two languages, each measure a plausible random value."""
    rnd = random.Random(seed)
    ranges = {"speaking_rate": (8, 25), "snr_db": (5, 80), "bandwidth_hz": (3000, 11025), "peak_dbfs": (-20, 0)}
    return [
        {
            "speaker": f"s{i % speakers}",
            "language": ("en", "de")[i % speakers % 2],
            "quality": {m: rnd.uniform(*ranges.get(m, (0.0, 1.0))) for m in MEASURES},
        }
        for i in range(n)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=1000)
    ap.add_argument("--speakers", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    cfg = PreprocessConfig()
    clips = synthetic_clips(args.clips, args.speakers)
    bins = measure_bins(cfg.audio.sample_rate, cfg.mel.n_fft)
    times: dict[str, list[float]] = {"group_histograms": [], "rate_histograms": [], "figures": []}
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        groups = group_histograms(clips, bins)
        t1 = time.perf_counter()
        rate_histograms(clips)
        t2 = time.perf_counter()
        QualityFigures.of(summary_of(groups, cfg), cfg)
        t3 = time.perf_counter()
        for key, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
            times[key].append(dt)
    best = {k: min(v) for k, v in times.items()}
    us = 1e6 / args.clips
    print(f"{args.clips} clips, {args.speakers} speakers, best of {args.rounds} rounds")
    print(f"  group_histograms    {best['group_histograms'] * us:8.1f} us a clip")
    print(f"  rate_histograms     {best['rate_histograms'] * us:8.1f} us a clip (the gate's, for scale)")
    print(f"  ratio               {best['group_histograms'] / best['rate_histograms']:8.1f}x")
    print(f"  summary and figures {best['figures'] * 1e3:8.1f} ms once")
    emit(
        {
            "clips": args.clips,
            "speakers": args.speakers,
            "group_histograms_us_per_clip": round(best["group_histograms"] * us, 2),
            "rate_histograms_us_per_clip": round(best["rate_histograms"] * us, 2),
            "ratio": round(best["group_histograms"] / best["rate_histograms"], 2),
            "figures_ms": round(best["figures"] * 1e3, 2),
        }
    )


if __name__ == "__main__":
    main()
