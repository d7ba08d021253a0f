"""What other_clip references cost: preprocess wall with and without them, side by side.

The same corpus (benchmarks/make_big_corpus.py, 1,000 clips by default) read as a manifest whose clips
are dealt round-robin to `--speakers` speakers, preprocessed two ways, each a separate `python -m
melshards preprocess` process timed from start to exit, interleaved in every round (the machine is
shared: compare same-round ratios):

- `none`: the default config;
- `other_clip`: + `reference: {source: other_clip, frames: 256, min_seconds: 3.0}`.

Reported: wall and CPU seconds (the process tree's) per variant per round, the per-round ratios
other_clip / none and their medians (goal, issue 37: wall <= 1.2), and the bytes per record of each.

Run: python -m benchmarks.features.reference_wall [--clips 1000] [--rounds 2] [--workers 2] [--speakers 10]
         [--work-dir /tmp/melshards-bench]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

from benchmarks import common

VARIANTS = {"none": {}, "other_clip": {"reference": {"source": "other_clip", "frames": 256, "min_seconds": 3.0}}}


def manifest(corpus: str, speakers: int, work: Path) -> str:
    """The corpus's clips as a manifest, clip i spoken by speaker i % speakers."""
    path = work / f"references-{Path(corpus).name}-{speakers}.csv"
    lines = (Path(corpus) / "metadata.csv").read_text(encoding="utf-8").splitlines()
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "audio", "text", "speaker"])
        for i, line in enumerate(lines):
            clip_id, text = line.split("|")[:2]
            w.writerow([clip_id, str(Path(corpus) / "wavs" / f"{clip_id}.wav"), text, f"s{i % speakers}"])
    return str(path)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_corpus_args(ap, rounds=2)
    ap.add_argument("--speakers", type=int, default=10)
    args = ap.parse_args(argv)
    work, corpus = common.work_and_corpus(args)
    rows = manifest(corpus, args.speakers, work)
    configs = common.write_configs(work, "references", VARIANTS)
    runs = common.preprocess_rounds(rows, configs, args.workers, args.rounds, work, "references", "--language", "en")
    walls = {v: [round(x, 1) for x in xs] for v, xs in common.figures(runs, "wall_s").items()}
    cpus = {v: [round(x, 1) for x in xs] for v, xs in common.figures(runs, "cpu_s").items()}
    sizes = {}
    for v in VARIANTS:
        out = work / f"references-out-{v}"
        records = json.loads((out / "stats.json").read_text())["counts"]["in_shards"]
        total = sum(f.stat().st_size for f in out.glob("*.tfrecord"))
        sizes[v] = {"records": records, "bytes_per_record": round(total / records)}
    ratios = [round(x, 3) for x in common.round_ratios(walls, "other_clip", "none")]
    cpu_ratios = [round(x, 3) for x in common.round_ratios(cpus, "other_clip", "none")]
    result = {
        "benchmark": "reference_wall",
        "clips": args.clips,
        "speakers": args.speakers,
        "workers": args.workers,
        "wall_s": walls,
        "ratio_other_clip_over_none": ratios,
        "median_ratio": statistics.median(ratios),
        "cpu_s": cpus,
        "cpu_ratio_other_clip_over_none": cpu_ratios,
        "median_cpu_ratio": statistics.median(cpu_ratios) if cpu_ratios else None,
        "goal": "<= 1.2",
        "shards": sizes,
    }
    common.emit(result)
    return result


if __name__ == "__main__":
    main()
