"""A run stopped by SIGINT and resumed ends where an uninterrupted run ends, with the same weights.

Runs `python -m melshards train` in subprocesses: op determinism is process-global and must not leak into
other tests, and the SIGINT is a real signal to a real process. One test on a shard set with two length
buckets and two speakers of very different sizes (`two_speakers_bucketed_dir`), so the same three runs
resume every piece of input state. The model is the example plug-in (LITE_MODEL: resuming is the loop's,
whatever the model; its steps trace in a quarter of the built-in model's time) with dropout on, so the
dropout masks, keyed by the step's seed, must resume too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import tensorflow as tf

from tests.train.conftest import write_lite_config

# The example's steps take ~10 ms: the steps after the SIGINT at step 3 give the signal more than a second
# (more under load) to arrive before the interrupted run would end on its own.
STEPS = 160


def _start(shards_dir, model_dir, cfg, cache_dir, train_glob):
    env = dict(os.environ, TF_XLA_FLAGS=f"--tf_xla_persistent_cache_directory={cache_dir}", PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "melshards",
            "train",
            str(shards_dir / train_glob),
            "--model-dir",
            str(model_dir),
            "--config",
            str(cfg),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _weights(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir / "checkpoints"))
    names = [
        n
        for n in reader.get_variable_to_shape_map()
        if n.startswith(("model/", "optimizer/", "step/")) and "OPTIMIZER_SLOT" not in n
    ]
    return {n: reader.get_tensor(n) for n in names}


def test_interrupted_and_resumed_run_matches_an_uninterrupted_one(two_speakers_bucketed_dir, tmp_path):
    """Two length buckets of two speakers of very different sizes sampled equally often: every bucket's
    iterator, the schedule position, the balancing draws and the dropout masks resume (each bucket more
    is one more trace per run). The interrupted run saves where SIGINT stops it; no other checkpoint."""
    shards_dir, train_glob = two_speakers_bucketed_dir, "train-*.tfrecord"
    cfg = write_lite_config(
        tmp_path / "c.yaml",
        data={"balance": "speaker"},
        model={"dropout": 0.1},
        loop={"steps": STEPS, "checkpoint_every": STEPS, "log_every": 1, "op_determinism": True},
    )
    cache = tmp_path / "xla-cache"
    whole = _start(shards_dir, tmp_path / "whole", cfg, cache, train_glob)
    whole_out = whole.stdout.read()
    assert whole.wait(timeout=300) == 0, whole_out
    parts = _start(shards_dir, tmp_path / "parts", cfg, cache, train_glob)
    lines = []
    for line in parts.stdout:
        lines.append(line)
        if f"step 3/{STEPS}" in line:
            parts.send_signal(signal.SIGINT)
            break
    lines += parts.stdout.readlines()
    assert parts.wait(timeout=300) == 0, "".join(lines)
    stopped = json.loads((tmp_path / "parts" / "run_summary.json").read_text())
    assert stopped["stopped_by"] == "SIGINT" and 3 <= stopped["final_step"] < STEPS, "".join(lines)

    resumed = _start(shards_dir, tmp_path / "parts", cfg, cache, train_glob)
    out = resumed.stdout.read()
    assert resumed.wait(timeout=300) == 0, out
    assert f"at step {stopped['final_step']}" in out  # "resumed from ... at step N"

    done = json.loads((tmp_path / "parts" / "run_summary.json").read_text())
    assert done["start_step"] == stopped["final_step"] and done["final_step"] == STEPS
    whole_summary = json.loads((tmp_path / "whole" / "run_summary.json").read_text())
    trained = {p.name.split("-")[1] for p in shards_dir.glob(train_glob)}  # the buckets the glob reads
    assert whole_summary["buckets_used"] == len(trained) == 2  # the steps reach every bucket
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "parts")
    assert a.keys() == b.keys() and any(k.startswith("optimizer/") for k in a)
    different = [k for k in a if not np.array_equal(a[k], b[k])]
    assert different == []
