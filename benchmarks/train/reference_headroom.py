"""Input headroom with references in every batch: `melshards train` with a model asking for `reference_mel`
(`benchmarks.train.reference_headroom:build`, the built-in model plus `features = ("reference_mel",)`) on shards with
other_clip references (stored in the records) and on a same_clip run (cut from each batch's mels in the input
pipeline), each against the same run with --synthetic-data; and the pair without references in the batch.

The shards are the demo corpus preprocessed twice in one bucket, with `reference: {source: other_clip}` and
with `reference: {source: same_clip}` (a same_clip run stores what a run without references stores), both of
`--frames` reference frames. Same model, config, batch and steps; runs alternate (other_clip real, other_clip
synthetic, same_clip real, same_clip synthetic, none real, none synthetic, ...) so all see the same background
load. --synthetic-data repeats one real batch from memory: neither the stored references' bytes nor the
same_clip slice are paid per step. Reported: steady-state examples/s, the real / synthetic ratios side by side
(goal, issue 37: >= 0.98 with references), the input wait of each, the bytes a batch carries, and the
records/s of each input pipeline alone (parse and, on the same_clip run, the slice; no step) against the
records/s the step consumes.

Run: python -m benchmarks.train.reference_headroom [--steps 120] [--rounds 2] [--frames 256] [--config configs/train_tiny.yaml]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.common import emit
from benchmarks.shards_fixture import demo_shards
from benchmarks.train.audio_headroom import with_model
from benchmarks.train.input_headroom import (
    add_train_args,
    examples_per_second,
    records_per_second,
    train_rounds,
    train_run,
)
from melshards.train.model import build as _builtin
from melshards.train.model import validate as _validate

SOURCES = ("other_clip", "same_clip", "none")
FACTORY = "benchmarks.train.reference_headroom:build"
KINDS = tuple(f"{s}{x}" for s in SOURCES for x in ("", "_synthetic"))


def build(schema, options: dict):
    """The built-in model, with the reference in its batch (it reads what it always reads)."""
    return _builtin(schema, options)


build.validate = _validate
build.features = ("reference_mel",)


def reference_shards(work: Path, source: str, frames: int) -> Path:
    """The demo corpus with `reference: {source, frames}`, one bucket (made once per source and frames)."""
    reference = {"source": source, "frames": frames, "min_seconds": 1.0}
    return demo_shards(str(work / f"shards-{source}-{frames}"), reference=reference)


def parse_only_rate(shards: Path, config: str, factory: str | None, batches: int) -> float:
    """Records/s of the trainer's own input pipeline for the model of `factory` (None: the built-in), a
    same_clip run's slices included, with nothing consuming it but a loop (benchmarks.train.input_headroom's)."""

    from melshards.shards_schema import read_schema
    from melshards.train import input_pipeline
    from melshards.train.config import load_config
    from melshards.train.contract import BUILTIN_FACTORY
    from melshards.train.plugins import model_inputs
    from melshards.train.references import same_clip

    cfg = load_config(config)
    schema = read_schema(str(shards))
    names = model_inputs(factory or BUILTIN_FACTORY)
    files = input_pipeline.expand_globs([str(shards / "train-*.tfrecord")])
    ds = input_pipeline.train_dataset(files, schema, cfg.data, names, 1, same_clip=same_clip(schema, names))
    return records_per_second(ds, batches, cfg.data.batch_size)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    add_train_args(ap, "reference-headroom")
    ap.add_argument("--frames", type=int, default=256, help="reference.frames of both runs")
    ap.add_argument("--parse-batches", type=int, default=200, help="batches of each parse-only measurement")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    shards = {s: reference_shards(work, s, args.frames) for s in ("other_clip", "same_clip")}
    shards["none"] = shards["same_clip"]  # the same records, read by a model that asks for no reference
    configs = {
        "other_clip": with_model(args.config, FACTORY, work / "reference-train.yaml"),
        "none": with_model(args.config, None, work / "mel-train.yaml"),
    }
    configs["same_clip"] = configs["other_clip"]

    def run(kind: str) -> dict:
        base = kind.removesuffix("_synthetic")
        return train_run(shards[base], work / f"model-{kind}", configs[base], args.steps, kind.endswith("synthetic"))

    runs = train_rounds(run, KINDS, args.rounds)
    ex = examples_per_second(runs)
    ratios = {b: [a / s for a, s in zip(ex[b], ex[f"{b}_synthetic"])] for b in SOURCES}
    factories = {b: FACTORY if b != "none" else None for b in SOURCES}
    parse: dict[str, list[float]] = {b: [] for b in SOURCES}
    for _ in range(args.rounds):  # interleaved, as the runs
        for b in SOURCES:
            parse[b].append(parse_only_rate(shards[b], args.config, factories[b], args.parse_batches))
    from melshards.shards_schema import read_schema

    sizes = {f.name: f.shape for f in read_schema(str(shards["other_clip"])).largest.features}
    frames, n_mels = sizes["mel"]
    result = {
        "benchmark": "reference_headroom",
        "steps": args.steps,
        "rounds": args.rounds,
        "reference_frames": args.frames,
        "config": Path(args.config).name,
        "bytes_per_record_mel": frames * n_mels * 2,
        "bytes_per_record_reference": args.frames * n_mels * 2,
        **{f"examples_per_s_{k}": round(statistics.median(v), 1) for k, v in ex.items()},
        **{f"{b}_over_synthetic_median": round(statistics.median(v), 3) for b, v in ratios.items()},
        **{f"{b}_over_synthetic_per_round": [round(x, 3) for x in v] for b, v in ratios.items()},
        **{
            f"input_wait_{k}": round(statistics.median(s["steady_state"]["input_wait_fraction"] for s in v), 4)
            for k, v in runs.items()
        },
        **{f"parse_only_records_per_s_{b}": round(statistics.median(v), 1) for b, v in parse.items()},
        **{f"parse_headroom_{b}": round(statistics.median(v) / statistics.median(ex[b]), 1) for b, v in parse.items()},
        "train_step_traces": sorted({s["train_step_traces"] for v in runs.values() for s in v}),
    }
    print(
        f"real / synthetic examples/s: other_clip {result['other_clip_over_synthetic_median']:.3f}, same_clip "
        f"{result['same_clip_over_synthetic_median']:.3f}, without references "
        f"{result['none_over_synthetic_median']:.3f} (goal >= 0.98 with references); input wait other_clip "
        f"{100 * result['input_wait_other_clip']:.1f}%, same_clip {100 * result['input_wait_same_clip']:.1f}%, "
        f"none {100 * result['input_wait_none']:.1f}%; tf.data alone gives "
        + ", ".join(
            f"{b} {result[f'parse_only_records_per_s_{b}']:.0f} records/s ({result[f'parse_headroom_{b}']}x what the "
            "step consumes)"
            for b in SOURCES
        )
    )
    emit(result)
    return result


if __name__ == "__main__":
    main()
