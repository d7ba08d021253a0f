"""Shards of the shipped corpus for the training benchmarks, made once and reused."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "ljspeech_tiny"
TINY = REPO / "configs" / "ljspeech_tiny.yaml"


def demo_shards(out: str) -> Path:
    """Preprocess data/ljspeech_tiny into `out` unless a finished run is already there."""
    path = Path(out)
    if not (path / "schema.json").exists():
        from melshards.commands.preprocess import run
        # one shape: these benchmarks compare input pipelines of the schema's one static shape
        code = run(["--input", str(CORPUS), "--output", str(path), "--config", str(TINY), "--overwrite",
                    "--buckets", "1"])
        if code:
            raise SystemExit(f"preprocessing the demo corpus into {out} failed with exit code {code}")
    return path
