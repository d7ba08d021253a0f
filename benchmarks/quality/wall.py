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

from benchmarks import common

VARIANTS = {"none": {"measures": False}, "default": {"measures": True}}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_corpus_args(ap, rounds=3)
    args = ap.parse_args(argv)
    work, corpus = common.work_and_corpus(args)
    configs = common.write_configs(work, "quality", {v: {"quality": q} for v, q in VARIANTS.items()})
    runs = common.preprocess_rounds(corpus, configs, args.workers, args.rounds, work, "quality")
    walls, cpus = common.figures(runs, "wall_s"), common.figures(runs, "cpu_s")
    ratios, cpu_ratios = common.round_ratios(walls, "default", "none"), common.round_ratios(cpus, "default", "none")
    result = {
        **common.round_medians("quality_wall", args, runs),
        "default_over_none": round(statistics.median(ratios), 3),
        "per_round_ratios": [round(x, 3) for x in ratios],
        "default_over_none_cpu": round(statistics.median(cpu_ratios), 3) if cpu_ratios else None,
        "per_round_cpu_ratios": [round(x, 3) for x in cpu_ratios],
    }
    print(
        f"goal: default / none <= 1.15; measured {result['default_over_none']:.3f} (rounds {result['per_round_ratios']})"
    )
    common.emit(result)
    return result


if __name__ == "__main__":
    main()
