"""Mixed precision: float16 (under loss scaling) and bfloat16 train with a finite, falling loss; a bfloat16
checkpoint synthesizes. In-process runs of 8 steps on four records.

Loss scaling is the train step's and the optimizer's (train/step.py), whatever the model: the float16 run
trains the plug-in LITE_MODEL, whose step traces in about a quarter of the built-in model's time. The
built-in model's own mixed-precision path (its layers under the policy, its float32 heads) is the bfloat16
run's, and that run's checkpoint is the one synthesis reads."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.train.conftest import made, write_config, write_lite_config


def _summary(model_dir) -> dict:
    return json.loads((model_dir / "run_summary.json").read_text())


@pytest.fixture(scope="module")
def bf16_run(four_records, tmp_path_factory):
    from melshards.commands.train import run

    tmp = tmp_path_factory.mktemp("bf16")
    cfg = write_config(tmp / "c.yaml", loop={"steps": 8, "log_every": 4, "checkpoint_every": 8, "val_every": 8})
    assert (
        run(
            [
                str(four_records / "train-*.tfrecord"),
                "--model-dir",
                str(tmp / "model"),
                "--config",
                str(cfg),
                "--precision",
                "mixed_bfloat16",
            ]
        )
        == 0
    )
    return tmp / "model"


def test_mixed_float16_trains_with_a_finite_falling_loss_under_loss_scaling(four_records, tmp_path):
    from melshards.commands.train import run

    precision = "mixed_float16"

    cfg = write_lite_config(
        tmp_path / "c.yaml", loop={"steps": 8, "log_every": 4, "checkpoint_every": 8, "val_every": 8}
    )
    assert (
        run(
            [
                str(four_records / "train-*.tfrecord"),
                "--model-dir",
                str(tmp_path / "m"),
                "--config",
                str(cfg),
                "--precision",
                precision,
            ]
        )
        == 0
    )
    s = _summary(tmp_path / "m")
    assert s["precision"] == precision and sum(made(s)) == 1
    assert np.isfinite(s["final_losses"]["train"]["loss"]) and s["final_losses"]["train"]["loss"] < s["first_loss"]


def test_mixed_bfloat16_trains_with_a_finite_falling_loss(bf16_run):
    s = _summary(bf16_run)
    assert s["precision"] == "mixed_bfloat16" and sum(made(s)) == 1
    assert np.isfinite(s["final_losses"]["train"]["loss"]) and s["final_losses"]["train"]["loss"] < s["first_loss"]


def test_synthesize_from_a_bfloat16_checkpoint(bf16_run):
    """The bfloat16 run's checkpoint loads into the float32 model synthesis builds, and generates a finite
    mel. (The WAV from a mel, Griffin-Lim, is the same for any checkpoint: tests/train/test_synthesize_cli.py.)"""
    from melshards.train.synthesize import load_synthesizer, normalise, padded_text_ids

    synth = load_synthesizer(str(bf16_run))
    schema = synth.schema
    ids, n = padded_text_ids(normalise("Printing, in the only sense.", schema.languages[0]), schema)
    out = synth.speak(ids, n, schema.speakers[0], schema.languages[0])
    assert out["mel"].dtype == np.float32 and np.isfinite(out["mel"].numpy()).all() and out["mel_len"].numpy()[0] > 0
