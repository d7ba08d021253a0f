"""Helpers shared by the benchmarks: interleaved repeated timing and the final JSON line."""
from __future__ import annotations

import json
import statistics
import time
from typing import Callable


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


def emit(result: dict) -> None:
    """The last line of every benchmark: one JSON object with its figures."""
    print(json.dumps(result, sort_keys=True))
