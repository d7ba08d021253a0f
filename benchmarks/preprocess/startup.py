"""Preprocessing start-up: a 1-row run of `melshards preprocess`, timed from process start to exit.

No process-tree sampler here (benchmarks.proctree reads /proc of every worker 5 times a second,
which adds ~1 s to a 5 s run): each run is a plain subprocess timed with a monotonic clock, and
its CPU seconds come from the children's rusage. Variants run interleaved in every round:
  wN          `python -m melshards preprocess --workers N` on the 1-row corpus, this tree
  wN@TREE     the same from another checkout (--before DIR, e.g. a `git worktree` of an older
              commit, run with this interpreter), for before/after figures
  demo        the 56-row demo corpus (`data/ljspeech_tiny`, its config) with the default workers
Goals (issue 14): a 1-row run <= 4 s with 1 worker, <= 6 s with 2.

Run: python -m benchmarks.preprocess.startup [--rounds 3] [--workers 1,2] [--before DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import emit
from benchmarks.preprocess.scale import WORK, ensure_corpus
from benchmarks.preprocess.throughput import load, one_clip_corpus

REPO = Path(__file__).resolve().parents[2]


def timed(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """(wall s, CPU s of the process and its children) of one run; raises if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--before", help="another checkout to compare with (its code, this interpreter)")
    ap.add_argument("--work-dir", default=WORK)
    args = ap.parse_args(argv)

    os.makedirs(args.work_dir, exist_ok=True)
    tiny = one_clip_corpus(
        ensure_corpus(os.path.join(args.work_dir, "lj1000"), 1000), os.path.join(args.work_dir, "lj1")
    )
    trees = {"": REPO} | ({"@before": Path(args.before).resolve()} if args.before else {})
    variants = {}
    for suffix, tree in trees.items():
        for w in (int(x) for x in args.workers.split(",") if x):
            variants[f"w{w}{suffix}"] = (tree, ["--input", tiny, "--workers", str(w)])
        variants[f"demo{suffix}"] = (
            tree,
            ["--input", str(REPO / "data/ljspeech_tiny"), "--config", str(REPO / "configs/ljspeech_tiny.yaml")],
        )
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for rnd in range(args.rounds):
        for v, (tree, flags) in variants.items():
            out = os.path.join(args.work_dir, f"startup-{v.replace('@', '_')}")
            before = load()
            # `python -m` puts the working directory first on sys.path: each tree runs its own code
            wall, cpu = timed(
                [sys.executable, "-m", "melshards", "preprocess", *flags, "--output", out, "--overwrite"], cwd=tree
            )
            runs[v].append({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load": before})
        print(
            f"round {rnd + 1}/{args.rounds}: "
            + ", ".join(f"{v} {runs[v][-1]['wall_s']:.2f}s (load {runs[v][-1]['load']:.1f})" for v in variants),
            flush=True,
        )

    med = statistics.median
    result = {
        "benchmark": "preprocess_startup",
        "rounds": args.rounds,
        "per_round": runs,
        "wall_s_median": {v: med(r["wall_s"] for r in rs) for v, rs in runs.items()},
        "cpu_s_median": {v: med(r["cpu_s"] for r in rs) for v, rs in runs.items()},
        "load_range": [
            min(r["load"] for rs in runs.values() for r in rs),
            max(r["load"] for rs in runs.values() for r in rs),
        ],
        "goals": {"w1_wall_s": 4.0, "w2_wall_s": 6.0},
    }
    print(
        f"\n{args.rounds} interleaved rounds, medians; load average {result['load_range'][0]:.1f}-"
        f"{result['load_range'][1]:.1f} on {os.cpu_count()} cores"
    )
    print(f"{'variant':<12} {'wall s':>7} {'CPU s':>7}  per round")
    for v in variants:
        print(
            f"{v:<12} {result['wall_s_median'][v]:>7.2f} {result['cpu_s_median'][v]:>7.2f}  "
            + " ".join(f"{r['wall_s']:.2f}" for r in runs[v])
        )
    emit(result)
    return result


if __name__ == "__main__":
    main()
