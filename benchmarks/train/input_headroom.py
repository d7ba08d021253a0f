"""Input headroom: `melshards train` on real shards, on the same shards balanced by speaker
(`data.balance: speaker`), and the same run with --synthetic-data.

The shards are the demo corpus's, relabelled as two speakers of very different sizes (every 10th
clip by the second: 90% / 10%), so balancing drops records: at alpha 0 it reads 5 records per record
trained on. Same model, config, batch and step count; runs alternate (real, balanced, synthetic,
real, ...) so all see the same background load. Reports the steady-state examples/s of each (first
call, i.e. trace + compile, excluded, as run_summary.json defines it), the ratios real / synthetic
and balanced / synthetic side by side (goal >= 0.98), the input wait of each, plus the raw tf.data
throughput of both input pipelines (parse only, no step) against the rate the step consumes records.

Run: python -m benchmarks.train.input_headroom [--steps 120] [--rounds 2] [--config configs/train_tiny.yaml] [--alpha 0]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from benchmarks.common import emit, melshards_train
from benchmarks.shards_fixture import REPO, demo_shards, relabel

KINDS = ("real", "balanced", "synthetic")


def train_run(shards: Path, model_dir: Path, config: Path, steps: int, synthetic: bool) -> dict:
    shutil.rmtree(model_dir, ignore_errors=True)
    return melshards_train(
        shards, model_dir, config, "--steps", str(steps), *(["--synthetic-data"] if synthetic else [])
    )


def train_rounds(run: Callable[[str], dict], kinds: Sequence[str], rounds: int) -> dict[str, list[dict]]:
    """`run(kind)` for every kind in turn, once per round, so that the machine's load falls on every kind
    alike; the run summaries of each round, per kind. Prints a line per run."""
    width = max(map(len, kinds))
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    for r in range(rounds):
        for kind in kinds:
            s = run(kind)
            runs[kind].append(s)
            st = s["steady_state"]
            print(
                f"round {r + 1} {kind:<{width}} {st['examples_per_second']:8.1f} examples/s  "
                f"{st['steps_per_second']:6.2f} steps/s  input wait {100 * st['input_wait_fraction']:.1f}%  "
                f"traces {s['train_step_traces']}  compile {s['compile_seconds']:.1f}s",
                flush=True,
            )
    return runs


def examples_per_second(runs: dict[str, list[dict]]) -> dict[str, list[float]]:
    """The steady-state examples/s of each round, per kind, from train_rounds' summaries."""
    return {k: [s["steady_state"]["examples_per_second"] for s in v] for k, v in runs.items()}


def records_per_second(ds, batches: int, batch_size: int) -> float:
    """Records/s of iterating the batched dataset `ds` alone for `batches` batches, after five warm-up
    batches (thread pools, autotune)."""
    it = iter(ds)
    for _ in range(5):
        next(it)
    t = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches * batch_size / (time.perf_counter() - t)


def add_train_args(ap: argparse.ArgumentParser, work: str) -> None:
    """The arguments of a headroom benchmark: --steps, --rounds, --config, and --work (a folder named
    `work` under the temp dir's melshards-bench by default)."""
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--config", default=str(REPO / "configs" / "train_tiny.yaml"))
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "melshards-bench" / work))


def two_speakers(work: Path) -> Path:
    """The demo shards as two speakers, 90% and 10% of the clips (made once)."""
    out = work / "two-speakers"
    if not (out / "schema.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        relabel(
            demo_shards(str(work / "shards")), out, lambda i: int(i % 10 == 9), lambda i: 0, ("big", "small"), ("en",)
        )
    return out


def balanced_config(config: str, alpha: float, path: Path) -> Path:
    """`config` with data.balance: speaker and data.balance_alpha: alpha."""
    cfg = yaml.safe_load(Path(config).read_text()) or {}
    cfg.setdefault("data", {}).update(balance="speaker", balance_alpha=alpha)
    path.write_text(yaml.safe_dump(cfg))
    return path


def parse_only_rate(shards: Path, config: str, batches: int) -> float:
    """Records/s of the trainer's own input pipeline with nothing consuming it but a loop."""
    from melshards.shards_schema import read_schema
    from melshards.train import input_pipeline
    from melshards.train.balance import balancing
    from melshards.train.config import load_config
    from melshards.train.step import MODEL_INPUTS

    cfg = load_config(config)
    schema = read_schema(str(shards))
    files = input_pipeline.expand_globs([str(shards / "train-*.tfrecord")])
    balance = balancing(schema, cfg.data.balance, cfg.data.balance_alpha)
    ds = input_pipeline.train_dataset(files, schema, cfg.data, MODEL_INPUTS, 1, balance=balance)
    return records_per_second(ds, batches, cfg.data.batch_size)


def main(argv=None) -> dict:
    from melshards.shards_schema import read_schema
    from melshards.train.balance import accept_probs, group_counts, reads_per_kept

    ap = argparse.ArgumentParser()
    add_train_args(ap, "train-input")
    ap.add_argument("--alpha", type=float, default=0.0, help="data.balance_alpha of the balanced runs")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    shards = two_speakers(work)
    configs = {
        "real": Path(args.config),
        "synthetic": Path(args.config),
        "balanced": balanced_config(args.config, args.alpha, work / "balanced.yaml"),
    }
    counts = group_counts(read_schema(str(shards)), "speaker")
    reads = reads_per_kept(counts, accept_probs(counts, args.alpha))
    runs = train_rounds(
        lambda kind: train_run(shards, work / f"model-{kind}", configs[kind], args.steps, kind == "synthetic"),
        KINDS,
        args.rounds,
    )
    ex = examples_per_second(runs)
    ratios = {k: [a / b for a, b in zip(ex[k], ex["synthetic"])] for k in ("real", "balanced")}
    wait = {k: statistics.median(s["steady_state"]["input_wait_fraction"] for s in v) for k, v in runs.items()}
    parse = {
        "real": parse_only_rate(shards, args.config, 200),
        "balanced": parse_only_rate(shards, str(configs["balanced"]), 200),
    }
    consume = {k: statistics.median(ex[k]) for k in ("real", "balanced")}
    result = {
        "benchmark": "train_input",
        "steps": args.steps,
        "rounds": args.rounds,
        "config": Path(args.config).name,
        "speaker_clips": counts,
        "balance_alpha": args.alpha,
        "balanced_reads_per_record_used": round(reads, 2),
        **{f"examples_per_s_{k}": round(statistics.median(ex[k]), 1) for k in KINDS},
        **{f"{k}_over_synthetic_median": round(statistics.median(v), 3) for k, v in ratios.items()},
        **{f"{k}_over_synthetic_per_round": [round(x, 3) for x in v] for k, v in ratios.items()},
        **{f"input_wait_fraction_{k}": round(v, 4) for k, v in wait.items()},
        **{f"parse_only_records_per_s_{k}": round(v, 1) for k, v in parse.items()},
        **{f"parse_headroom_{k}": round(parse[k] / consume[k], 1) for k in parse},
        "train_step_traces": sorted({s["train_step_traces"] for v in runs.values() for s in v}),
    }
    print(
        f"examples/s over synthetic: real {result['real_over_synthetic_median']:.3f}, balanced "
        f"{result['balanced_over_synthetic_median']:.3f} (goal >= 0.98); input wait real {100 * wait['real']:.1f}%, "
        f"balanced {100 * wait['balanced']:.1f}%, synthetic {100 * wait['synthetic']:.1f}%; tf.data alone gives "
        f"{parse['real']:.0f} records/s ({result['parse_headroom_real']}x what the step consumes), balanced "
        f"{parse['balanced']:.0f} ({result['parse_headroom_balanced']}x, reading {reads:.1f} records per record used)"
    )
    emit(result)
    return result


if __name__ == "__main__":
    main()
