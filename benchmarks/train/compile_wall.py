"""Time to the first step: 8 length buckets against 1, and a resumed run against a cold one, side by side.

One corpus (benchmarks/make_big_corpus.py, --clips clips) preprocessed twice, with `--buckets 1` and
`--buckets 8`. Per round, each a separate `melshards train` process with validation shards, the tests'
tiny model, --steps steps (enough for the schedule to reach every bucket):

- `one`: 1 bucket, cold (no persistent cache);
- `eight`: 8 buckets, cold: its persistent cache starts empty and it fills it;
- `resumed`: the 8-bucket run resumed from its checkpoint to twice the steps, the cache warm.

Reported per run: time to the first step, its start-up phases (`startup_s`) and how long it waited for
its program, when the last bucket was first trained (all buckets trained), the programs compiled,
restored untraced and loaded from the cache, the train step traces, and the process's wall and CPU
seconds; then the medians over the rounds of the per-round ratios against the goals: eight / one <= 1.3,
resumed / eight <= 0.15, every bucket trained within 120 s.

`--startup`: what building a Trainer costs a process, this checkout against another (`--before DIR`, e.g.
a `git worktree` of an older commit, run with this interpreter): the demo corpus preprocessed into 2
length buckets, and per round `melshards train` from each tree, with loop.jit_compile false and true,
interleaved, no persistent cache; reported per run: wall and CPU seconds of the process, the summary's
compile seconds and time to the first step, and the weights digest (equal digests: the same training).

Run: python -m benchmarks.train.compile_wall [--clips 600] [--rounds 1] [--steps 64] [--config <tiny test model>]
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

from benchmarks.common import emit, melshards_train, preprocess_command
from benchmarks.shards_fixture import REPO
from benchmarks.train.step_device import QUICK_MODEL, WORK


def shards(corpus: str, buckets: int, out: Path, config: Path = REPO / "configs" / "ljspeech.yaml") -> Path:
    if not (out / "schema.json").exists():
        command = preprocess_command(corpus, out, "--config", str(config), "--buckets", str(buckets))
        code = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if code.returncode:
            raise SystemExit(f"preprocess --buckets {buckets} failed:\n{code.stderr[-2000:]}")
    return out


def train(shard_dir: Path, model_dir: Path, cfg: Path, steps: int, cache: str) -> dict:
    """A run with validation and its persistent cache in `cache` ("" off; TF_XLA_FLAGS names none): its
    run_summary.json figures, the process's wall and CPU seconds and the load average."""
    before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    s = melshards_train(
        shard_dir,
        model_dir,
        cfg,
        "--val",
        str(shard_dir / "val-*.tfrecord"),
        "--steps",
        str(steps),
        env={"MELSHARDS_XLA_CACHE": cache, "TF_XLA_FLAGS": ""},
    )
    wall, after = time.monotonic() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
    programs = s.get("programs") or []
    trained = [p["called_s"] for p in programs if p["kind"] == "train"]
    return {
        "time_to_first_step": round(s["time_to_first_step"], 2),
        "startup_s": {phase: round(seconds, 2) for phase, seconds in (s.get("startup_s") or {}).items()},
        "first_step_wait_s": s.get("first_step_wait_s"),
        "all_buckets_trained_s": max(trained) if trained and None not in trained else None,
        "buckets": len(trained),
        "compile_seconds": round(s["compile_seconds"], 2),
        "programs_compiled": s.get("programs_compiled"),
        "programs_restored": s.get("programs_restored"),
        "programs_from_cache": s.get("programs_from_cache"),
        "traces": s["train_step_traces"] + s["eval_step_traces"],
        "wall_s": round(wall, 1),
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
        "load": round(os.getloadavg()[0], 1),
    }


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
        "trace_s": round(sum(p["trace_s"] for p in s.get("programs", [])), 2),
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
    ap.add_argument("--clips", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=64, help="--startup: 4 is plenty")
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
                    "loop": {"log_every": 16, "checkpoint_every": 1000, "val_every": 1000},
                }
            )
        )
    rows: dict[str, list[dict]] = {"one": [], "eight": [], "resumed": []}
    for r in range(args.rounds):
        cache = work / "xla-cache"
        for d in (cache, work / "model-one", work / "model-eight"):
            shutil.rmtree(d, ignore_errors=True)
        rows["one"].append(train(sets["one"], work / "model-one", cfg, args.steps, ""))
        rows["eight"].append(train(sets["eight"], work / "model-eight", cfg, args.steps, str(cache)))
        rows["resumed"].append(train(sets["eight"], work / "model-eight", cfg, 2 * args.steps, str(cache)))
        for name in rows:
            print(f"round {r + 1} {name}: {rows[name][-1]}", flush=True)
    med = statistics.median
    eight_over_one = med(e["time_to_first_step"] / o["time_to_first_step"] for e, o in zip(rows["eight"], rows["one"]))
    resumed_over_eight = med(
        x["time_to_first_step"] / e["time_to_first_step"] for x, e in zip(rows["resumed"], rows["eight"])
    )
    all_trained = med(e["all_buckets_trained_s"] or float("inf") for e in rows["eight"])
    result = {
        "benchmark": "compile_wall",
        "host_cores": os.cpu_count(),
        "clips": args.clips,
        "steps": args.steps,
        "rounds": rows,
        "eight_over_one_first_step": round(eight_over_one, 3),
        "resumed_over_eight_first_step": round(resumed_over_eight, 3),
        "eight_all_buckets_trained_s": round(all_trained, 1),
    }
    print(f"time to first step, 8 buckets / 1: {eight_over_one:.2f} (goal <= 1.3)")
    print(f"time to first step, 8 buckets resumed / cold: {resumed_over_eight:.3f} (goal <= 0.15)")
    print(f"every bucket of the 8 trained after {all_trained:.1f} s (goal <= 120)")
    emit(result)
    return result


if __name__ == "__main__":
    main()
