"""Helpers shared by the benchmarks: interleaved repeated timing and the final JSON line."""

from __future__ import annotations

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


def median_ratio(rates: dict[str, list[float]], num: str, den: str) -> float:
    return statistics.median(a / b for a, b in zip(rates[num], rates[den]))


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


def emit(result: dict) -> None:
    """The last line of every benchmark: one JSON object with its figures."""
    print(json.dumps(result, sort_keys=True))
