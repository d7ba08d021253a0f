"""Input headroom: `melshards train` on real shards vs the same run with --synthetic-data.

Same model, config, batch and step count; runs alternate (real, synthetic, real, ...) so both see
the same background load. Reports the steady-state examples/s of each (first call, i.e. trace +
compile, excluded, as run_summary.json defines it) and their ratio (goal >= 0.98), plus the raw
tf.data throughput of the same input pipeline (parse only, no step) against the rate the step
consumes records.

Run: python -m benchmarks.train_input [--steps 120] [--rounds 2] [--config configs/train_tiny.yaml]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import emit
from benchmarks.shards_fixture import REPO, demo_shards


def train_run(shards: Path, model_dir: Path, config: str, steps: int, synthetic: bool) -> dict:
    shutil.rmtree(model_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "melshards", "train", str(shards / "train-*.tfrecord"), "--model-dir", str(model_dir),
           "--config", config, "--steps", str(steps)] + (["--synthetic-data"] if synthetic else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads((model_dir / "run_summary.json").read_text())


def parse_only_rate(shards: Path, config: str, batches: int) -> float:
    """Records/s of the trainer's own input pipeline with nothing consuming it but a loop."""
    from melshards.train.config import load_config
    from melshards.train import input_pipeline as ip
    from melshards.train.step import MODEL_INPUTS
    from melshards.shards_schema import read_schema

    cfg = load_config(config)
    schema = read_schema(str(shards))
    files = ip.expand_globs([str(shards / "train-*.tfrecord")])
    it = iter(ip.train_dataset(files, schema, cfg.data, MODEL_INPUTS, 1))
    for _ in range(5):  # warm-up: thread pools, autotune
        next(it)
    t = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches * cfg.data.batch_size / (time.perf_counter() - t)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--config", default=str(REPO / "configs" / "train_tiny.yaml"))
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "melshards-bench" / "train-input"))
    args = ap.parse_args(argv)
    work = Path(args.work)
    shards = demo_shards(str(work / "shards"))
    runs = {"real": [], "synthetic": []}
    for r in range(args.rounds):
        for kind in ("real", "synthetic"):
            s = train_run(shards, work / f"model-{kind}", args.config, args.steps, kind == "synthetic")
            runs[kind].append(s)
            st = s["steady_state"]
            print(f"round {r + 1} {kind:<9} {st['examples_per_second']:8.1f} examples/s  "
                  f"{st['steps_per_second']:6.2f} steps/s  input wait {100 * st['input_wait_fraction']:.1f}%  "
                  f"traces {s['train_step_traces']}  compile {s['compile_seconds']:.1f}s")
    ex = {k: [s["steady_state"]["examples_per_second"] for s in v] for k, v in runs.items()}
    ratios = [a / b for a, b in zip(ex["real"], ex["synthetic"])]
    parse_rate = parse_only_rate(shards, args.config, 200)
    consume = statistics.median(ex["real"])
    result = {
        "benchmark": "train_input", "steps": args.steps, "rounds": args.rounds, "config": Path(args.config).name,
        "examples_per_s_real": round(consume, 1),
        "examples_per_s_synthetic": round(statistics.median(ex["synthetic"]), 1),
        "real_over_synthetic_median": round(statistics.median(ratios), 3),
        "real_over_synthetic_per_round": [round(r, 3) for r in ratios],
        "input_wait_fraction_real": round(statistics.median(
            s["steady_state"]["input_wait_fraction"] for s in runs["real"]), 4),
        "parse_only_records_per_s": round(parse_rate, 1),
        "parse_headroom": round(parse_rate / consume, 1),
        "train_step_traces": sorted({s["train_step_traces"] for v in runs.values() for s in v}),
    }
    print(f"real/synthetic examples/s: {result['real_over_synthetic_median']:.3f} (goal >= 0.98); "
          f"tf.data alone parses {parse_rate:.0f} records/s, {result['parse_headroom']}x what the step consumes")
    emit(result)
    return result


if __name__ == "__main__":
    main()
