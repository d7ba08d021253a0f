"""Input headroom with the waveform in every batch: `melshards train` on shards with audio, the model
asking for it (`benchmarks.train.audio_headroom:build`, the built-in model plus `features = ("audio",)`), vs
the same run with --synthetic-data; and the same pair without audio in the batch.

The shards are the demo corpus preprocessed with `features: {audio: true}` in one bucket. Same model,
config, batch and steps; runs alternate (audio real, audio synthetic, mel real, mel synthetic, ...) so
all see the same background load. Reported: steady-state examples/s, the real / synthetic ratios side
by side (goal, issue 21: >= 0.98 with audio), the input wait of each, and the bytes a batch carries.

Run: python -m benchmarks.train.audio_headroom [--steps 120] [--rounds 2] [--config configs/train_tiny.yaml]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import yaml

from benchmarks.common import emit
from benchmarks.shards_fixture import demo_shards
from benchmarks.train.input_headroom import add_train_args, examples_per_second, train_rounds, train_run
from melshards.train.model import build as _builtin
from melshards.train.model import validate as _validate

KINDS = ("audio", "audio_synthetic", "mel", "mel_synthetic")


def build(schema, options: dict):
    """The built-in model, with the audio in its batch (it reads what it always reads)."""
    return _builtin(schema, options)


build.validate = _validate
build.features = ("audio",)


def audio_shards(work: Path) -> Path:
    return demo_shards(str(work / "shards-audio"), features={"audio": True})


def with_model(config: str, factory: str | None, path: Path) -> Path:
    cfg = yaml.safe_load(Path(config).read_text()) or {}
    if factory:
        cfg.setdefault("model", {})["factory"] = factory
    path.write_text(yaml.safe_dump(cfg))
    return path


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    add_train_args(ap, "audio-headroom")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    shards = audio_shards(work)
    configs = {
        "audio": with_model(args.config, "benchmarks.train.audio_headroom:build", work / "audio-train.yaml"),
        "mel": with_model(args.config, None, work / "mel-train.yaml"),
    }
    runs = train_rounds(
        lambda kind: train_run(
            shards, work / f"model-{kind}", configs[kind.split("_")[0]], args.steps, kind.endswith("synthetic")
        ),
        KINDS,
        args.rounds,
    )
    ex = examples_per_second(runs)
    ratios = {b: [a / s for a, s in zip(ex[b], ex[f"{b}_synthetic"])] for b in ("audio", "mel")}
    from melshards.shards_schema import read_schema

    bucket = read_schema(str(shards)).largest
    sizes = {f.name: f.shape for f in bucket.features}
    frames, n_mels = sizes["mel"]
    result = {
        "benchmark": "audio_headroom",
        "steps": args.steps,
        "rounds": args.rounds,
        "config": Path(args.config).name,
        "bytes_per_record_mel": frames * n_mels * 2,
        "bytes_per_record_audio": sizes["audio"][0] * 2,
        **{f"examples_per_s_{k}": round(statistics.median(v), 1) for k, v in ex.items()},
        **{f"{b}_over_synthetic_median": round(statistics.median(v), 3) for b, v in ratios.items()},
        **{f"{b}_over_synthetic_per_round": [round(x, 3) for x in v] for b, v in ratios.items()},
        **{
            f"input_wait_{k}": round(statistics.median(s["steady_state"]["input_wait_fraction"] for s in v), 4)
            for k, v in runs.items()
        },
    }
    print(
        f"real / synthetic examples/s: with audio {result['audio_over_synthetic_median']:.3f}, without "
        f"{result['mel_over_synthetic_median']:.3f} (goal >= 0.98 with audio); a record carries "
        f"{result['bytes_per_record_audio']:,} bytes of audio beside {result['bytes_per_record_mel']:,} of mel"
    )
    emit(result)
    return result


if __name__ == "__main__":
    main()
