"""Smoke test of the device benchmark: `--quick` runs every variant to completion and reports every figure.

No figure's value is asserted, only that it is there (and null where this machine has no NVIDIA GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO


def test_step_device_quick_runs_every_variant_and_reports_every_figure(shards_dir, tmp_path):
    # the trainer tests' faster XLA setting (tests/train/conftest.py): this checks the figures, not their values
    env = dict(os.environ, MELSHARDS_BENCH_DIR=str(tmp_path), XLA_FLAGS="--xla_backend_optimization_level=0")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.step_device",
            "--quick",
            "--steps",
            "4",
            "--parse-seconds",
            "0.5",
            "--shards",
            str(shards_dir),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result["variants"]) == {"bf16", "fp32", "bf16_noxla", "synthetic", "before"}
    for name, v in result["variants"].items():
        for key in ("step_ms", "examples_per_s", "mel_frames_per_s", "input_wait", "time_to_first_step_s"):
            assert v[key] is not None and v[key] > 0 or key == "input_wait" and v[key] >= 0, (name, key)
        assert v["device_util_percent"] is None and v["peak_device_memory_gib"] is None  # no NVIDIA GPU here
    for name in ("bf16", "fp32", "bf16_noxla", "synthetic"):  # the trainer's: one trace per bucket, compiled up front
        v = result["variants"][name]
        assert v["traces"] == v["buckets"] == len(v["compile_s_by_bucket"])
    assert result["variants"]["bf16"]["layers"] == {"device": "CPU", "conv": "im2col", "dropout_rng": "threefry"}
    assert result["variants"]["bf16_noxla"]["layers"]["dropout_rng"] == "philox"  # threefry runs under XLA only
    parse = result["parse_only"]
    assert parse["1_core"]["records_per_s"] > 0 and parse["cores_per_gpu_at_fastpitch_rate"] > 0
    assert result["device"].endswith("(CPU)") and "step ms" in proc.stdout
