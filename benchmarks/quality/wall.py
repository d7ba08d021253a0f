"""What the default quality measures cost a whole `melshards preprocess`: wall with and without them.

The same corpus (benchmarks/make_big_corpus.py, 1,000 clips by default) is preprocessed two ways, each
a separate `python -m melshards preprocess` process timed from start to exit, interleaved in every
round, the order swapped every other round so neither variant always runs second (the machine is
shared: compare same-round ratios):

- `none`: `quality: {measures: false}` (every measure NaN; the audio hash is still taken);
- `default`: the default config (the measures of `melshards.preprocess.clip.quality.MEASURES`).

Goal (issue 35): default / none <= 1.15 at 1,000 clips and 2 workers.

Run: python -m benchmarks.quality.wall [--clips 1000] [--rounds 3] [--workers 2] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import yaml

from benchmarks.common import emit
from benchmarks.preprocess.scale import WORK, beam_flags, ensure_corpus
from benchmarks.proctree import run_sampled

VARIANTS = {"none": {"measures": False}, "default": {"measures": True}}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work-dir", default=WORK)
    args = ap.parse_args(argv)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    corpus = ensure_corpus(str(work / f"ljbig-{args.clips}"), args.clips)
    walls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpus: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for v, quality in list(VARIANTS.items())[:: 1 if r % 2 == 0 else -1]:
            config = work / f"quality-{v}.yaml"
            config.write_text(yaml.safe_dump({"quality": quality}))
            out = work / f"quality-out-{v}"
            cmd = [sys.executable, "-m", "melshards", "preprocess", "--input", corpus, "--output", str(out)]
            cmd += ["--overwrite", "--config", str(config), *beam_flags(args.workers)]
            res = run_sampled(cmd, log_path=str(work / f"quality-{v}.log"))
            if res["rc"] != 0:
                raise SystemExit(f"{v}: preprocess exited {res['rc']}; see {work / f'quality-{v}.log'}")
            walls[v].append(res["wall_s"])
            cpus[v].append(res.get("cpu_s", 0.0))
            print(f"round {r + 1} {v:<8} wall {res['wall_s']:6.1f} s  cpu {res.get('cpu_s', 0.0):6.1f} s", flush=True)
    ratios = [d / n for d, n in zip(walls["default"], walls["none"])]
    cpu_ratios = [d / n for d, n in zip(cpus["default"], cpus["none"]) if n]
    result = {
        "benchmark": "quality_wall",
        "clips": args.clips,
        "workers": args.workers,
        "rounds": args.rounds,
        **{f"wall_s_{v}": round(statistics.median(walls[v]), 2) for v in VARIANTS},
        "default_over_none": round(statistics.median(ratios), 3),
        "per_round_ratios": [round(x, 3) for x in ratios],
        **{f"cpu_s_{v}": round(statistics.median(cpus[v]), 1) for v in VARIANTS},
        "default_over_none_cpu": round(statistics.median(cpu_ratios), 3) if cpu_ratios else None,
        "per_round_cpu_ratios": [round(x, 3) for x in cpu_ratios],
    }
    print(
        f"goal: default / none <= 1.15; measured {result['default_over_none']:.3f} (rounds {result['per_round_ratios']})"
    )
    emit(result)
    return result


if __name__ == "__main__":
    main()
