"""What a `melshards synthesize` process costs, and what the persistent XLA cache saves a second one.

A model dir made once: the demo corpus preprocessed in one length bucket (benchmarks/shards_fixture.py), then
`melshards train` with configs/train_tiny.yaml for --steps steps (without XLA: only its checkpoint is used).
Per round, three fresh `melshards synthesize` processes, interleaved, each speaking the same text with
`--griffin-lim-iters 2`:

- `off`: MELSHARDS_XLA_CACHE= (no persistent cache): generate traced and compiled, as every run did
  before synthesize kept its compiled program;
- `cold`: the cache in a new, empty directory: compiled, and the program written there;
- `warm`: the same directory again: the program loaded, not compiled.

Reported per run: wall and CPU seconds of the process, the cache entries it added, and that its WAV is the
`off` run's byte for byte; then the medians over the rounds of warm ÷ off and cold ÷ off (wall, CPU).
TF_XLA_FLAGS is cleared for the children (a directory it named would win over MELSHARDS_XLA_CACHE); XLA_FLAGS
is left as the caller's environment has it.

Run: python -m benchmarks.train.synthesize_wall [--rounds 3] [--steps 40]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from benchmarks.common import emit, melshards_train
from benchmarks.shards_fixture import REPO, demo_shards
from benchmarks.train.step_device import WORK

TEXT = "Printing, in the only sense."


def model_dir(work: Path, steps: int) -> Path:
    """The train_tiny model after `steps` steps on the demo shards (made once; reused while its checkpoint is there)."""
    model = work / f"model-{steps}"
    if not (model / "checkpoints" / "checkpoint").exists():
        shards = demo_shards(str(work / "shards"))
        cfg = yaml.safe_load((REPO / "configs" / "train_tiny.yaml").read_text())
        cfg["loop"].update(steps=steps, checkpoint_every=steps, val_every=steps, jit_compile=False)
        (work / "train.yaml").write_text(yaml.safe_dump(cfg))
        shutil.rmtree(model, ignore_errors=True)
        melshards_train(shards, model, work / "train.yaml", env={"MELSHARDS_XLA_CACHE": ""})
    return model


def synthesize(model: Path, wav: Path, cache: str) -> dict:
    """One `melshards synthesize` process with MELSHARDS_XLA_CACHE=cache: wall and CPU seconds, entries added."""
    env = {**os.environ, "MELSHARDS_XLA_CACHE": cache, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_XLA_FLAGS", None)
    entries = len(os.listdir(cache)) if cache and os.path.isdir(cache) else 0
    cmd = [sys.executable, "-m", "melshards", "synthesize", "--model-dir", str(model), TEXT, "-o", str(wav)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    proc = subprocess.run([*cmd, "--griffin-lim-iters", "2"], capture_output=True, text=True, cwd=REPO, env=env)
    wall = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 2),
        "entries_added": (len(os.listdir(cache)) if cache else 0) - entries,
        "load": round(os.getloadavg()[0], 1),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40, help="training steps of the model that speaks")
    args = ap.parse_args(argv)
    work = WORK / "synthesize-wall"
    work.mkdir(parents=True, exist_ok=True)
    model = model_dir(work, args.steps)
    rows: dict[str, list[dict]] = {"off": [], "cold": [], "warm": []}
    for r in range(args.rounds):
        cache = work / "xla-cache"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        for name, where in (("off", ""), ("cold", str(cache)), ("warm", str(cache))):
            row = synthesize(model, work / f"{name}.wav", where)
            row["same_wav"] = (work / f"{name}.wav").read_bytes() == (work / "off.wav").read_bytes()
            rows[name].append(row)
            print(f"round {r + 1} {name:4s} {row}", flush=True)
    ratios = {
        f"{name}_over_off_{key}": round(
            statistics.median(a[key] / b[key] for a, b in zip(rows[name], rows["off"])),
            3,
        )
        for name in ("warm", "cold")
        for key in ("wall_s", "cpu_s")
    }
    print(
        f"\nmedian of {args.rounds} rounds: warm ÷ off wall {ratios['warm_over_off_wall_s']}, "
        f"CPU {ratios['warm_over_off_cpu_s']}; cold ÷ off wall {ratios['cold_over_off_wall_s']}, "
        f"CPU {ratios['cold_over_off_cpu_s']}"
    )
    result = {"benchmark": "synthesize_wall", "rounds": rows, **ratios, "steps": args.steps}
    emit(result)
    return result


if __name__ == "__main__":
    main()
