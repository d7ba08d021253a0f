"""What the job's run-wide combines and side inputs hold, per million clips: the elements built from synthetic
measured clips by the job's own pure functions, their pickled bytes (what a runner ships) and their size in a
worker's memory (`sys.getsizeof` summed over every object they reach, each once), and that per million clips:
an element that does not grow with the clips shows the same MiB at each size.

The clips: each of `--clips` (20,000 and 200,000) of `--per-speaker` clips a speaker (20, about Common Voice English's mean; 0
for one speaker of every clip), in two languages, every quality measure a random value, lengths of clips of
1-10 s. Each row says what one worker holds at the end of that combine:

  quality, flat           the whole run's quality histograms as one Counter of (scope, name, measure, key):
                          what the run-wide quality combine held before it was summed per group
  quality, per group      the largest group's histograms (`quality_stats.add_group`): what the worker that
                          sums one key holds (the corpus's, bounded by the grids)
  quality summary         `quality_stats.summary_of`: what the run-wide combine holds now
  gate                    `quality_rules.QualityGate`'s bounds (a side input of every later stage)
  tables, with hashes     every speaker's split hashes and the corpus's part (`tables.summarize_clips`
                          summed): what the run-wide tables combine held before it was summed per speaker
  tables rows             `tables.finish_part` of every key: what it holds now
  tables                  `tables.finish_tables` (a side input of every later stage)
  length histograms       `global_stats.length_histograms` (the cut-offs' combine)
  features, per group     (`--pitch`: every clip 100 voiced frames of f0, and energy) every group's summed pitch and
                          energy summaries with its f0 histogram (`feature_stats.merge`): what the run-wide
                          feature-statistics combine held before it was summed per group
  features, gathered      `feature_stats.finish`: what it holds now (a side input of the report)
  written counts          `filter_and_write.written_counts` of every clip (4 buckets): the writer's run-wide sum

Run: python -m benchmarks.preprocess.combine_sizes [--clips 20000,200000] [--per-speaker 20] [--batch 32] [--pitch]
"""

from __future__ import annotations

import argparse
import pickle
import random
import sys
from collections import Counter

import numpy as np

from benchmarks.common import emit
from melshards.preprocess.clip import features
from melshards.preprocess.clip.quality import MEASURES, measure_bins
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.stats import feature_stats, quality_rules, quality_stats, tables
from melshards.preprocess.stats.global_stats import length_histograms
from melshards.preprocess.write.filter_and_write import written_counts

RANGES = {"speaking_rate": (8, 25), "snr_db": (5, 80), "bandwidth_hz": (3000, 11025), "peak_dbfs": (-20, 0)}


def synthetic_clips(n: int, per_speaker: int, seed: int = 1) -> list[dict]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        speaker = i // per_speaker if per_speaker else 0
        seconds = rnd.uniform(1, 10)
        text_len = int(seconds * rnd.uniform(10, 18))
        out.append(
            {
                "id": f"c{i:08d}",
                "speaker": f"speaker-{speaker:06d}",
                "language": ("en", "de")[speaker % 2],
                "text": "a" * text_len,
                "text_len": text_len,
                "mel_frames": int(seconds * 22050 / 256) + 1,
                "duration_ms": int(seconds * 1000),
                "quality": {m: rnd.uniform(*RANGES.get(m, (0.0, 1.0))) for m in MEASURES},
            }
        )
    return out


def deep_size(obj, seen: set | None = None) -> int:
    """sys.getsizeof of `obj` and of every object it reaches (containers, dataclass fields), each once."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple | set | frozenset):
        size += sum(deep_size(x, seen) for x in obj)
    elif hasattr(obj, "__dataclass_fields__"):
        size += sum(deep_size(getattr(obj, f), seen) for f in obj.__dataclass_fields__)
    return size


def elements(clips: list[dict], batch: int, cfg: PreprocessConfig, pitch: bool = False) -> dict[str, object]:
    bins = measure_bins(cfg.audio.sample_rate, cfg.mel.n_fft)
    groups: dict = {}
    parts: dict = {}
    for i in range(0, len(clips), batch):
        for key, group in quality_stats.group_histograms(clips[i : i + batch], bins).items():
            quality_stats.add_group(groups.setdefault(key, {}), group)
        for key, part in tables.summarize_clips(clips[i : i + batch], cfg.split.salt).items():
            tables.add_part(parts.setdefault(key, {}), part)
    flat = Counter(
        {(scope, name, m, k): n for (scope, name), g in groups.items() for m, h in g.items() for k, n in h.items()}
    )
    rows: dict = {}
    for item in parts.items():
        rows.update(tables.finish_part(item, cfg))
    rules = cfg.quality_rules
    written = written_counts(
        dict(c, bucket=c["mel_frames"] % 4, split=("train", "val")[c["mel_frames"] % 20 == 0]) for c in clips
    )
    out = {
        "quality, flat": flat,
        "quality, per group": max(groups.values(), key=lambda g: sum(len(h) for h in g.values())),
        "quality summary": quality_stats.summary_of(groups, cfg),
        "gate": quality_rules.rate_bounds(quality_rules.rate_histograms(clips), rules),
        "tables, with hashes": parts,
        "tables rows": rows,
        "tables": tables.finish_tables(rows, cfg),
        "length histograms": length_histograms(clips),
        "written counts": written,
    }
    if pitch:
        rng = np.random.default_rng(1)
        parts = []
        for i in range(0, len(clips), batch):
            kept = [
                (
                    dict(c, split="train"),
                    features.clip_summary({"pitch": rng.uniform(80, 400, 100), "energy": rng.uniform(0, 1, 100)}),
                )
                for c in clips[i : i + batch]
            ]
            parts.append(feature_stats.batch_stats(kept))
        merged = feature_stats.merge(parts)
        out["features, per group"] = merged
        out["features, gathered"] = feature_stats.finish(merged, ("pitch", "energy"))
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", default="20000,200000", help="corpus sizes, comma-separated")
    ap.add_argument("--per-speaker", type=int, default=20, help="clips a speaker; 0: one speaker")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--pitch", action="store_true", help="also the pitch and energy statistics (slower)")
    args = ap.parse_args(argv)
    cfg = PreprocessConfig()
    runs = []
    for n in (int(x) for x in args.clips.split(",")):
        clips = synthetic_clips(n, args.per_speaker)
        speakers = len({c["speaker"] for c in clips})
        print(f"{n:,} clips, {speakers:,} speakers: MiB pickled, in memory; in memory per million clips")
        sizes = {}
        for name, element in elements(clips, args.batch, cfg, args.pitch).items():
            pickled, memory = len(pickle.dumps(element)) / 2**20, deep_size(element) / 2**20
            sizes[name] = {"pickled_mib": round(pickled, 2), "memory_mib": round(memory, 2)}
            print(f"  {name:<22} {pickled:10.2f} {memory:10.2f} {memory * 1e6 / n:10.1f}")
        runs.append({"clips": n, "speakers": speakers, "sizes": sizes})
        del clips
    result = {"benchmark": "combine_sizes", "per_speaker": args.per_speaker, "runs": runs}
    emit(result)
    return result


if __name__ == "__main__":
    main()
