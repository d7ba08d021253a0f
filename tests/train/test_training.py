"""Training end to end on tiny shard sets: it learns, it compiles once, it reports, it stops on NaN."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from melshards.commands.train import run
from melshards.shards_schema import read_schema
from melshards.shards_schema.records import encode_example
from tests.train.conftest import made, write_config, write_lite_config, write_records

STEPS = 20


@pytest.fixture(scope="module")
def overfit(four_records, shards_dir, tmp_path_factory):
    """STEPS steps on 4 records, batch 4, two steps per compiled call, a checkpoint and a validation pass
    every 10, through the CLI entry point (validating on the validation shards: --val on the training
    records is refused)."""
    tmp = tmp_path_factory.mktemp("overfit")
    cfg = write_config(
        tmp / "c.yaml",
        loop={"steps": STEPS, "steps_per_execution": 2, "checkpoint_every": 10, "val_every": 10, "log_every": 10},
    )
    model_dir = tmp / "model"
    code = run(
        [
            str(four_records / "train-*.tfrecord"),
            "--val",
            str(shards_dir / "val-*.tfrecord"),
            "--model-dir",
            str(model_dir),
            "--config",
            str(cfg),
        ]
    )
    assert code == 0
    return model_dir, json.loads((model_dir / "run_summary.json").read_text())


def test_loss_halves_when_overfitting_four_records(overfit, shards_dir):
    _, summary = overfit
    assert summary["final_losses"]["train"]["loss"] <= 0.5 * summary["first_loss"]
    val = summary["final_losses"]["val"]  # other clips: measured, not overfitted
    assert np.isfinite(val["loss"]) and val["examples"] == read_schema(str(shards_dir)).counts["val"] > 0


def test_train_and_eval_steps_trace_once_over_twenty_steps(overfit):
    _, summary = overfit
    assert summary["steps_run"] == STEPS >= 20
    assert sum(made(summary)) == 1  # traced once (or restored untraced from the tests' shared cache)
    assert sum(made(summary, "eval")) == 1


def test_run_summary_reports_throughput_compile_time_and_data_source(overfit):
    model_dir, summary = overfit
    s = summary["steady_state"]
    assert summary["synthetic_data"] is False and summary["stopped_by"] == "steps"
    assert s["calls"] == STEPS // 2 - 1  # two steps per call; the first call (compile) is excluded
    assert s["examples_per_second"] > 0 and s["mel_frames_per_second"] > s["examples_per_second"]
    assert summary["compile_seconds"] > 0
    # where the set-up went, phase by phase, in the order they ran, up to the end of the first call
    startup = ("checks", "model", "settings", "restore", "input", "program wait", "first call")
    assert tuple(summary["startup_s"]) == startup and all(s >= 0 for s in summary["startup_s"].values())
    assert sum(summary["startup_s"].values()) == pytest.approx(summary["time_to_first_step"])
    assert sorted(p.name for p in (model_dir / "checkpoints").glob("*.index")) == ["ckpt-10.index", "ckpt-20.index"]
    assert list((model_dir / "tensorboard" / "train").glob("events.out.tfevents.*"))


def test_resuming_with_another_model_config_is_refused(overfit, four_records, tmp_path, capsys):
    model_dir, _ = overfit
    cfg = write_config(tmp_path / "c.yaml", model={"d_model": 64})
    assert run([str(four_records / "train-*.tfrecord"), "--model-dir", str(model_dir), "--config", str(cfg)]) == 1
    assert "d_model" in capsys.readouterr().err


def test_nan_loss_stops_the_run_with_the_step_number(shards_dir, tmp_path, capsys):
    def poison(record: bytes) -> bytes:
        schema = read_schema(str(shards_dir))
        parsed = tf.train.Example.FromString(record).features.feature
        values = {}
        for f in schema.features:
            feat = parsed[f.name]
            if f.storage == "bytes":
                values[f.name] = feat.bytes_list.value[0]
            elif f.storage == "int64":
                values[f.name] = feat.int64_list.value[0]
            else:
                dtype = np.float16 if f.storage == "raw_float16" else np.int16
                values[f.name] = np.frombuffer(feat.bytes_list.value[0], dtype).reshape(f.shape).copy()
        values["mel"][0, 0] = np.nan
        return encode_example(schema.features, values)

    nan_dir = write_records(shards_dir, tmp_path / "nan", 4, transform=poison)
    cfg = write_lite_config(tmp_path / "c.yaml")  # the loop's check, whatever the model
    code = run([str(nan_dir / "train-*.tfrecord"), "--model-dir", str(tmp_path / "m"), "--config", str(cfg)])
    err = capsys.readouterr().err
    assert code == 1 and "loss became nan at step 1" in err


def test_synthetic_data_feeds_one_constant_batch_and_traces_once(shards_dir, tmp_path, capsys):
    cfg = write_lite_config(  # the loop's input, whatever the model
        tmp_path / "c.yaml", loop={"steps": 4, "checkpoint_every": 4, "log_every": 2, "val_every": 4}
    )
    assert (
        run(
            [
                str(shards_dir / "train-*.tfrecord"),
                "--model-dir",
                str(tmp_path / "m"),
                "--config",
                str(cfg),
                "--synthetic-data",
            ]
        )
        == 0
    )
    summary = json.loads((tmp_path / "m" / "run_summary.json").read_text())
    assert summary["synthetic_data"] is True and summary["steps_run"] == 4
    assert sum(made(summary)) == 1 and summary["steady_state"]["calls"] == 3
    assert "synthetic (one constant batch)" in capsys.readouterr().out
