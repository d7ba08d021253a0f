"""Helpers shared by the benchmarks: interleaved repeated timing, the preprocess command and its timed
rounds over variant configs, the common arguments, and the final JSON line."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def interleaved(fns: dict[str, Callable[[], int]], rounds: int) -> dict[str, list[float]]:
    """Run every fn once per round, in turn, `rounds` times; returns units/s per round per fn.

    Interleaving puts each variant under the same background load (the machine is shared), so
    per-round ratios are comparable even when absolute rates drift.
    """
    rates: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            units = fn()
            rates[name].append(units / (time.perf_counter() - t))
    return rates


def round_ratios(figs: dict[str, list[float]], num: str, den: str) -> list[float]:
    """Variant `num`'s figure over variant `den`'s, round by round (a round where `den`'s is 0 left out)."""
    return [a / b for a, b in zip(figs[num], figs[den]) if b]


def median_ratio(rates: dict[str, list[float]], num: str, den: str) -> float:
    return statistics.median(round_ratios(rates, num, den))


def add_corpus_args(ap: argparse.ArgumentParser, *, rounds: int, clips: int = 1000, workers: int = 2) -> None:
    """The arguments of a benchmark over the generated corpus: --clips, --rounds, --workers, --work-dir."""
    from benchmarks.preprocess.scale import WORK

    ap.add_argument("--clips", type=int, default=clips)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--workers", type=int, default=workers)
    ap.add_argument("--work-dir", default=WORK)


def work_and_corpus(args: argparse.Namespace) -> tuple[Path, str]:
    """The work folder (created) and the generated corpus of `args.clips` clips inside it, made if missing."""
    from benchmarks.preprocess.scale import ensure_corpus

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    return work, ensure_corpus(str(work / f"ljbig-{args.clips}"), args.clips)


def preprocess_command(corpus: str | Path, out: Path, *extra: str) -> list[str]:
    """`python -m melshards preprocess` reading `corpus` into `out` (replacing an earlier run's output),
    with `extra` arguments after."""
    return [
        sys.executable,
        "-m",
        "melshards",
        "preprocess",
        "--input",
        str(corpus),
        "--output",
        str(out),
        "--overwrite",
        *extra,
    ]


def preprocess_rejected(cmd: list[str], out: Path) -> list[dict]:
    """Runs the preprocess `cmd` writing `out` (its output unshown) and returns the rows of its rejected.jsonl."""
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines() if line.strip()]


def write_configs(work: Path, name: str, bodies: dict[str, dict]) -> dict[str, str]:
    """Each variant's config body written as `<work>/<name>-<variant>.yaml`; the paths, per variant."""
    import yaml

    paths = {v: work / f"{name}-{v}.yaml" for v in bodies}
    for v, body in bodies.items():
        paths[v].write_text(yaml.safe_dump(body))
    return {v: str(p) for v, p in paths.items()}


def preprocess_rounds(
    corpus: str, configs: dict[str, str], workers: int, rounds: int, work: Path, name: str, *extra: str
) -> dict[str, list[dict]]:
    """Preprocesses `corpus` once per round with each variant's config, as a sampled process tree
    (benchmarks.proctree) on `workers` Beam workers, with `extra` arguments after. The variants run in
    turn, their order reversed every other round, so that the machine's load and the order fall on every
    variant alike. A variant writes `<work>/<name>-out-<variant>` and logs to `<work>/<name>-<variant>.log`.
    Returns run_sampled's figures of each round, per variant; prints a line per run and exits naming the
    log when a run fails."""
    from benchmarks.preprocess.scale import beam_flags
    from benchmarks.proctree import run_sampled

    width = max(map(len, configs))
    runs: dict[str, list[dict]] = {v: [] for v in configs}
    for r in range(rounds):
        for v in list(configs)[:: 1 if r % 2 == 0 else -1]:
            cmd = preprocess_command(corpus, work / f"{name}-out-{v}", "--config", configs[v], *beam_flags(workers))
            log = work / f"{name}-{v}.log"
            res = run_sampled([*cmd, *extra], log_path=str(log))
            if res["rc"] != 0:
                raise SystemExit(f"{v}: preprocess exited {res['rc']}; see {log}")
            runs[v].append(res)
            print(f"round {r + 1} {v:<{width}}  wall {res['wall_s']:6.1f} s  cpu {res['cpu_s']:6.1f} s", flush=True)
    return runs


def figures(runs: dict[str, list[dict]], key: str) -> dict[str, list[float]]:
    """One figure (`wall_s`, `cpu_s`) of each round, per variant, from preprocess_rounds' runs."""
    return {v: [r[key] for r in rs] for v, rs in runs.items()}


def round_medians(benchmark: str, args: argparse.Namespace, runs: dict[str, list[dict]]) -> dict:
    """The head of a preprocess_rounds benchmark's result: its name, --clips, --workers, --rounds, and each
    variant's median wall (`wall_s_<variant>`) and CPU seconds (`cpu_s_<variant>`)."""
    walls, cpus = figures(runs, "wall_s"), figures(runs, "cpu_s")
    return {
        "benchmark": benchmark,
        "clips": args.clips,
        "workers": args.workers,
        "rounds": args.rounds,
        **{f"wall_s_{v}": round(statistics.median(walls[v]), 2) for v in runs},
        **{f"cpu_s_{v}": round(statistics.median(cpus[v]), 1) for v in runs},
    }


def melshards_train(shards: Path, model_dir: Path, config: Path, *args: str, env: dict | None = None) -> dict:
    """`melshards train` on the shards' train files as a child process (a fresh TensorFlow, as a user runs it),
    with `args` added and `env` over this process's environment; its run_summary.json. Exits on failure."""
    from benchmarks.shards_fixture import REPO

    cmd = [
        sys.executable,
        "-m",
        "melshards",
        "train",
        str(shards / "train-*.tfrecord"),
        "--model-dir",
        str(model_dir),
        "--config",
        str(config),
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, **(env or {})})
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads((model_dir / "run_summary.json").read_text())


def child_json(cmd: list[str], env: dict, log: Path, cwd: Path) -> dict:
    """Run `cmd` (its stderr to `log`): the JSON object its stdout's last line holds. Exits with the log's
    tail when the child fails."""
    with open(log, "w") as err:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    if proc.returncode:
        raise SystemExit(f"{log.stem} exited {proc.returncode}; see {log}:\n{log.read_text()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def emit(result: dict) -> None:
    """The last line of every benchmark: one JSON object with its figures."""
    print(json.dumps(result, sort_keys=True))
