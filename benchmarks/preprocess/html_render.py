"""`melshards stats --html`'s rendering: the histograms drawn as filled outlines (`html_report._filled_hist`,
one patch per histogram) against `ax.hist`'s bars (one Rectangle per bar, the report's drawing before),
the whole report (`render_html`) each way, interleaved, in CPU seconds of this process.

Run: python -m benchmarks.preprocess.html_render [--run DIR] [--rounds 5]
(DIR: a preprocess run; the shipped corpus is preprocessed into it first if it holds none; default
/tmp/melshards-bench/demo-shards)
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

from benchmarks.common import emit
from benchmarks.shards_fixture import demo_shards
from melshards.reports import html_report
from melshards.reports.stats_report import build_report, load_run
from melshards.reports.whatif import DEFAULT_WHAT_IF


def bars(ax, values, bins, weights, colour, label=None) -> None:
    ax.hist(values, bins=bins, weights=weights, color=colour, label=label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="/tmp/melshards-bench/demo-shards")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    run = load_run(str(demo_shards(args.run)), None)
    report = build_report(run, 32, list(DEFAULT_WHAT_IF))

    def render() -> None:
        html_report.render_html(report, run.stats["histograms"], None, None, run.stats.get("quality"))

    def bars_render() -> None:
        with mock.patch.object(html_report, "_filled_hist", bars):
            render()

    variants = {"bars": bars_render, "outline": render}
    for fn in variants.values():  # fonts and matplotlib's caches, once
        fn()
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            t = time.process_time()
            fn()
            cpu[name].append(time.process_time() - t)
    for name, v in cpu.items():
        print(f"{name:8s} CPU s per report: " + " ".join(f"{x:.2f}" for x in v))
    ratio = statistics.median(a / b for a, b in zip(cpu["outline"], cpu["bars"]))
    print(f"outline/bars CPU, median of per-round ratios: {ratio:.2f}")
    emit(
        {
            "bars_cpu_s": statistics.median(cpu["bars"]),
            "outline_cpu_s": statistics.median(cpu["outline"]),
            "ratio": ratio,
        }
    )


if __name__ == "__main__":
    main()
