"""What the feature cache saves: preprocess wall with and without `--cache`, interleaved.

On the benchmark corpus (benchmarks/make_big_corpus.py), each run a separate `melshards preprocess`
process timed from start to exit, in every round:

- `plain`: no cache;
- `cold`: an empty cache (the cost of filling it; goal, issue 22: <= 1.05x plain);
- `changed`: the warm cache, with other cut-offs and bucket count (`--buckets 3`, p98 cut-offs): no
  audio decoded (goal <= 0.20x cold at 13,100 clips);
- `killed`: a cold run killed (SIGKILL to its process group) at 80 % of the cold run's wall, then the
  same command again, timed (goal <= 0.35x cold);
- `new_rows`: a cache filled from the first 90 % of the rows, then the whole corpus, the same audio
  paths (goal <= 0.30x cold).

Reported: wall per variant (median), each ratio (median of the rounds), and the cache's counts
(clips read from it, computed) of the timed runs.

Run: python -m benchmarks.cache.wall [--clips 1000] [--rounds 2] [--workers 2] [--work-dir /tmp/melshards-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path

import yaml

from benchmarks.common import add_corpus_args, emit, preprocess_command
from benchmarks.preprocess.scale import beam_flags, ensure_corpus

VARIANTS = ("plain", "cold", "changed", "killed", "new_rows")


def command(corpus: str, out: Path, workers: int, cache: Path | None, *extra: str) -> list[str]:
    return preprocess_command(corpus, out, *beam_flags(workers), *extra, *(["--cache", str(cache)] if cache else []))


def timed(cmd: list[str], log: Path, kill_after: float | None = None) -> float:
    start = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return -1.0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}; see {log}")
    return time.perf_counter() - start


def cache_counts(out: Path) -> dict:
    c = json.loads((out / "stats.json").read_text()).get("cache") or {}
    return {"hits": c.get("hits"), "computed": c.get("computed")}


def growing_corpus(corpus: str, work: Path) -> tuple[str, Path, list[str]]:
    """A corpus dir reading the benchmark corpus's audio (the same paths on every run), whose
    metadata.csv the caller sets to a share of the rows: (its path, its metadata.csv, all rows)."""
    out = work / f"growing-{Path(corpus).name}"  # its own per corpus: the wavs link points into it
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "wavs").exists():
        (out / "wavs").symlink_to(Path(corpus, "wavs").resolve())
    lines = (Path(corpus) / "metadata.csv").read_text(encoding="utf-8").splitlines(keepends=True)
    return str(out), out / "metadata.csv", lines


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_corpus_args(ap, rounds=2)
    args = ap.parse_args(argv)
    work = Path(args.work_dir) / "cache-wall"
    work.mkdir(parents=True, exist_ok=True)
    corpus = ensure_corpus(str(Path(args.work_dir) / f"ljbig-{args.clips}"), args.clips)
    growing, growing_meta, rows = growing_corpus(corpus, work)
    changed_cfg = work / "changed.yaml"
    changed_cfg.write_text(
        yaml.safe_dump({"filter": {"mel_frames_upper_percentile": 98.0, "text_len_upper_percentile": 98.0}})
    )
    walls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    counts: dict[str, dict] = {}
    for r in range(args.rounds):
        caches = {v: work / f"cache-{v}" for v in VARIANTS}
        for c in caches.values():
            shutil.rmtree(c, ignore_errors=True)
        out = {v: work / f"out-{v}" for v in VARIANTS}
        w = args.workers
        walls["plain"].append(timed(command(corpus, out["plain"], w, None), work / "plain.log"))
        walls["cold"].append(timed(command(corpus, out["cold"], w, caches["cold"]), work / "cold.log"))
        counts["cold"] = cache_counts(out["cold"])
        # the cold run's cache, with other cut-offs and buckets
        walls["changed"].append(
            timed(
                command(corpus, out["changed"], w, caches["cold"], "--buckets", "3", "--config", str(changed_cfg)),
                work / "changed.log",
            )
        )
        counts["changed"] = cache_counts(out["changed"])
        timed(
            command(corpus, out["killed"], w, caches["killed"]),
            work / "killed-first.log",
            kill_after=0.8 * walls["cold"][-1],
        )
        walls["killed"].append(timed(command(corpus, out["killed"], w, caches["killed"]), work / "killed.log"))
        counts["killed"] = cache_counts(out["killed"])
        growing_meta.write_text("".join(rows[: int(0.9 * len(rows))]), encoding="utf-8")  # 90 % of the rows
        timed(command(growing, out["new_rows"], w, caches["new_rows"]), work / "new-rows-first.log")
        growing_meta.write_text("".join(rows), encoding="utf-8")  # then all of them
        walls["new_rows"].append(timed(command(growing, out["new_rows"], w, caches["new_rows"]), work / "new-rows.log"))
        counts["new_rows"] = cache_counts(out["new_rows"])
        print(f"round {r + 1}: " + ", ".join(f"{v} {walls[v][-1]:.1f} s" for v in VARIANTS), flush=True)
    ratio = {
        "cold_over_plain": [c / p for c, p in zip(walls["cold"], walls["plain"])],
        **{
            f"{v}_over_cold": [x / c for x, c in zip(walls[v], walls["cold"])]
            for v in ("changed", "killed", "new_rows")
        },
    }
    result = {
        "benchmark": "cache_wall",
        "clips": args.clips,
        "workers": args.workers,
        "rounds": args.rounds,
        **{f"wall_s_{v}": round(statistics.median(x), 2) for v, x in walls.items()},
        **{k: round(statistics.median(v), 3) for k, v in ratio.items()},
        "per_round": {k: [round(x, 3) for x in v] for k, v in ratio.items()},
        "cache_counts": counts,
    }
    print("\n| variant | wall s (median) | ratio (median) | goal | cache: read, computed |")
    print("|---|---|---|---|---|")
    goals = {
        "cold": ("cold_over_plain", "<= 1.05 x plain"),
        "changed": ("changed_over_cold", "<= 0.20 x cold"),
        "killed": ("killed_over_cold", "<= 0.35 x cold"),
        "new_rows": ("new_rows_over_cold", "<= 0.30 x cold"),
    }
    for v in VARIANTS:
        key, goal = goals.get(v, (None, "-"))
        c = counts.get(v, {})
        print(
            f"| {v} | {result[f'wall_s_{v}']:.1f} | {result[key] if key else '-'} | {goal} | "
            f"{c.get('hits', '-')}, {c.get('computed', '-')} |"
        )
    emit(result)
    return result


if __name__ == "__main__":
    main()
