"""What compiling costs before the first step: 8 length buckets against 1, and a resumed run against a cold one.

One corpus (benchmarks/make_big_corpus.py, --clips clips) preprocessed twice, with `--buckets 1` and
`--buckets 8`. Per round, each a separate `melshards train` process with validation shards:

- `one`, `eight`: a cold run (no persistent cache) of --steps steps; reported: time to the first step
  (run_summary.json `time_to_first_step`: model, every bucket's train and eval step traced and compiled
  up front, the first call), compile seconds, traces per bucket;
- `resumed`: the 8-bucket run again with a persistent cache: a first run to --steps fills it and
  checkpoints, then the same command with twice the steps resumes; reported: its compile seconds
  against the cold run's (goal <= 0.10), and whether it added cache entries.

`--startup`: what building a Trainer costs a process, this checkout against another (`--before DIR`, e.g.
a `git worktree` of an older commit, run with this interpreter): the demo corpus preprocessed into 2
length buckets, and per round `melshards train` from each tree, with loop.jit_compile false and true,
interleaved, no persistent cache; reported per run: wall and CPU seconds of the process, the summary's
compile seconds (every bucket's step traced and run once) and time to the first step, and the weights
digest (equal digests: the same training).

Run: python -m benchmarks.train.compile_wall [--clips 800] [--rounds 2] [--steps 4] [--config <tiny test model>]
     python -m benchmarks.train.compile_wall --startup [--before DIR] [--rounds 3] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from benchmarks.common import emit, melshards_train
from benchmarks.shards_fixture import REPO
from benchmarks.train.step_device import QUICK_MODEL, WORK


def shards(corpus: str, buckets: int, out: Path, config: Path = REPO / "configs" / "ljspeech.yaml") -> Path:
    if not (out / "schema.json").exists():
        code = subprocess.run(
            [
                sys.executable,
                "-m",
                "melshards",
                "preprocess",
                "--input",
                corpus,
                "--output",
                str(out),
                "--config",
                str(config),
                "--overwrite",
                "--buckets",
                str(buckets),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if code.returncode:
            raise SystemExit(f"preprocess --buckets {buckets} failed:\n{code.stderr[-2000:]}")
    return out


def train(shard_dir: Path, model_dir: Path, cfg: Path, steps: int, cache: str) -> dict:
    """A run with validation and its persistent cache in `cache` ("" off; TF_XLA_FLAGS names none)."""
    return melshards_train(
        shard_dir,
        model_dir,
        cfg,
        "--val",
        str(shard_dir / "val-*.tfrecord"),
        "--steps",
        str(steps),
        env={"MELSHARDS_XLA_CACHE": cache, "TF_XLA_FLAGS": ""},
    )


def timed_train(tree: Path, shard_dir: Path, model_dir: Path, cfg: Path) -> dict:
    """One `melshards train` process run from `tree` (`python -m` puts the working directory first on
    sys.path: the tree's own code), no persistent cache: wall and CPU seconds, the summary's figures
    and the weights digest it logs."""
    shutil.rmtree(model_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "melshards", "train", str(shard_dir / "train-*.tfrecord")]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    proc = subprocess.run(
        [*cmd, "--model-dir", str(model_dir), "--config", str(cfg)],
        cwd=tree,
        capture_output=True,
        text=True,
        env={**os.environ, "MELSHARDS_XLA_CACHE": "", "TF_XLA_FLAGS": ""},
    )
    wall = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} in {tree} failed:\n{proc.stderr[-3000:]}")
    s = json.loads((model_dir / "run_summary.json").read_text())
    digest = re.findall(r"weights digest (\w+)", proc.stdout + proc.stderr)
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 2),
        "compile_s": round(s["compile_seconds"], 2),
        "trace_s": round(sum(t["trace_s"] for t in s["compile_by_bucket"].values()), 2),
        "first_step_s": round(s["time_to_first_step"], 2),
        "traces": s["train_step_traces"],
        "digest": digest[-1] if digest else None,
        "load": round(os.getloadavg()[0], 1),
    }


def startup(args, work: Path) -> dict:
    """--startup: this tree against --before, jit_compile false and true, interleaved (module docstring)."""
    shard_dir = shards(
        str(REPO / "data" / "ljspeech_tiny"), 2, work / "shards-demo-2", REPO / "configs" / "ljspeech_tiny.yaml"
    )
    trees = {"after": REPO} | ({"before": Path(args.before).resolve()} if args.before else {})
    configs = {}
    for jit in (False, True):
        configs[jit] = work / f"startup-jit-{str(jit).lower()}.yaml"
        configs[jit].write_text(
            yaml.safe_dump(
                {
                    "model": QUICK_MODEL,
                    "data": {"batch_size": 8, "shuffle_buffer": 64, "cycle_length": 2},
                    "loop": {"steps": args.steps, "log_every": 1, "checkpoint_every": 1000, "jit_compile": jit},
                }
            )
        )
    runs: dict[str, list[dict]] = {f"{tree} jit_compile {str(jit).lower()}": [] for jit in configs for tree in trees}
    for r in range(args.rounds):
        for jit, cfg in configs.items():
            for tree, path in trees.items():
                row = timed_train(path, shard_dir, work / "model-startup", cfg)
                runs[f"{tree} jit_compile {str(jit).lower()}"].append(row)
                print(f"round {r + 1} {tree} jit_compile {str(jit).lower()}: {row}", flush=True)
    med = statistics.median
    result: dict = {"benchmark": "compile_wall --startup", "host_cores": os.cpu_count(), "rounds": runs}
    for jit in ("false", "true"):
        a = runs[f"after jit_compile {jit}"]
        print(
            f"jit_compile {jit}: after, medians: "
            + ", ".join(f"{k} {med(x[k] for x in a)}" for k in a[0] if k.endswith("_s"))
        )
        if args.before:
            b = runs[f"before jit_compile {jit}"]
            print(
                f"jit_compile {jit}: before, medians: "
                + ", ".join(f"{k} {med(x[k] for x in b)}" for k in b[0] if k.endswith("_s"))
            )
            ratios = {
                k: round(med(x[k] / y[k] for x, y in zip(a, b)), 3)
                for k in ("wall_s", "cpu_s", "compile_s", "first_step_s")
            }
            same = all(x["digest"] == y["digest"] for x, y in zip(a, b))
            result[f"after_over_before_jit_{jit}"] = ratios
            result[f"same_weights_jit_{jit}"] = same
            print(f"jit_compile {jit}: after / before, median of per-round ratios: {ratios}; same weights: {same}")
    emit(result)
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=800)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--config", default=None, help="train config (default: the tests' tiny model, batch 8)")
    ap.add_argument("--startup", action="store_true", help="time a Trainer build: this tree against --before")
    ap.add_argument("--before", default=None, help="--startup: another checkout to compare with")
    args = ap.parse_args(argv)
    work = WORK / "compile-wall"
    work.mkdir(parents=True, exist_ok=True)
    if args.startup:
        return startup(args, work)
    from benchmarks.preprocess.scale import ensure_corpus

    corpus = ensure_corpus(str(WORK / f"ljbig-{args.clips}"), args.clips)
    sets = {"one": shards(corpus, 1, work / "shards-1"), "eight": shards(corpus, 8, work / "shards-8")}
    if args.config:
        cfg = Path(args.config)
    else:
        cfg = work / "tiny.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "model": QUICK_MODEL,
                    "data": {"batch_size": 8, "shuffle_buffer": 64},
                    "loop": {"log_every": 1, "checkpoint_every": 1, "val_every": 1000},
                }
            )
        )
    rows: dict[str, list[dict]] = {"one": [], "eight": [], "resumed": []}
    for r in range(args.rounds):
        for name, shard_dir in sets.items():
            model_dir = work / f"model-{name}"
            shutil.rmtree(model_dir, ignore_errors=True)
            s = train(shard_dir, model_dir, cfg, args.steps, "")
            rows[name].append(
                {
                    "time_to_first_step": s["time_to_first_step"],
                    "compile_seconds": s["compile_seconds"],
                    "buckets": len(s["compile_by_bucket"]),
                    "traces": s["train_step_traces"],
                }
            )
        cache, model_dir = work / "xla-cache", work / "model-resumed"
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(model_dir, ignore_errors=True)
        cold = train(sets["eight"], model_dir, cfg, args.steps, str(cache))
        entries = len(list(cache.iterdir()))
        resumed = train(sets["eight"], model_dir, cfg, 2 * args.steps, str(cache))
        rows["resumed"].append(
            {
                "cold_compile_seconds": cold["compile_seconds"],
                "compile_seconds": resumed["compile_seconds"],
                "time_to_first_step": resumed["time_to_first_step"],
                "trace_seconds": sum(t["trace_s"] for t in resumed["compile_by_bucket"].values()),
                "new_cache_entries": len(list(cache.iterdir())) - entries,
                "traces": resumed["train_step_traces"],
            }
        )
        print(
            f"round {r + 1}: first step one {rows['one'][-1]['time_to_first_step']:.1f} s, eight "
            f"{rows['eight'][-1]['time_to_first_step']:.1f} s; resumed compile {resumed['compile_seconds']:.1f} s "
            f"vs cold {cold['compile_seconds']:.1f} s",
            flush=True,
        )
    eight_over_one = statistics.median(
        e["time_to_first_step"] / o["time_to_first_step"] for e, o in zip(rows["eight"], rows["one"])
    )
    resumed_over_cold = statistics.median(x["compile_seconds"] / x["cold_compile_seconds"] for x in rows["resumed"])
    result = {
        "benchmark": "compile_wall",
        "host_cores": os.cpu_count(),
        "clips": args.clips,
        "steps": args.steps,
        "rounds": rows,
        "eight_over_one_first_step": round(eight_over_one, 2),
        "resumed_over_cold_compile": round(resumed_over_cold, 3),
    }
    print(f"time to first step, 8 buckets / 1: {eight_over_one:.2f} (goal <= 2 on 4 cores; {os.cpu_count()} here)")
    print(f"resumed run's compile / cold run's: {resumed_over_cold:.3f} (goal <= 0.10)")
    emit(result)
    return result


if __name__ == "__main__":
    main()
