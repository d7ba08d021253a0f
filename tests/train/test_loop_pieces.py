"""The loop's named pieces on their own: run state and metrics, TensorBoard scalars, data settings,
progress lines and the stop signals."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from melshards.train.checkpoints import LAYOUT_KEY, data_settings, remove_partial_writes, settings_diff
from melshards.train.config import TrainConfig
from melshards.train.errors import TrainError
from melshards.train.input_pipeline import STATE_LAYOUT
from melshards.train.metrics import RunState, Timeline, format_summary
from melshards.train.progress import Progress
from melshards.train.summaries import Scalars
from tests.train.conftest import write_lite_config


def _metrics(loss, examples=4.0, frames=400.0):
    return {
        "loss": loss,
        "mel_loss": loss / 2,
        "postnet_loss": loss / 4,
        "stop_loss": loss / 4,
        "grad_norm": 1.0,
        "learning_rate": 0.001,
        "examples": examples,
        "mel_frames": frames,
    }


def test_run_state_counts_steps_and_leaves_the_first_call_out_of_the_steady_state():
    state = RunState(start=10, target=16, steps_per_call=2)
    state.record(_metrics(3.0), np.array([3.0, 2.9]), wait_s=0.5, call_s=20.0, last_checkpoint=None)
    state.record(_metrics(2.0), np.array([2.1, 2.0]), wait_s=0.25, call_s=1.0, last_checkpoint=None)
    state.record(
        _metrics(1.0, examples=8.0, frames=800.0), np.array([1.1, 1.0]), wait_s=0.25, call_s=1.0, last_checkpoint=None
    )
    assert state.step == 16 and not state.running and state.first_loss == 3.0
    assert state.compile_seconds == 20.0 and state.first_call_seconds == 20.0  # not compiled behind training
    assert state.rates == {
        "steps_per_second": 2.0,
        "examples_per_second": 8.0,
        "mel_frames_per_second": 800.0,
        "input_wait_seconds": 0.25,
    }
    summary = state.summary(synthetic_data=False)
    assert summary["steps_run"] == 6 and summary["start_step"] == 10 and summary["final_step"] == 16
    assert summary["steady_state"] == {
        "calls": 2,
        "steps_per_second": 2.0,
        "examples_per_second": 6.0,
        "mel_frames_per_second": 600.0,
        "input_wait_fraction": 0.25,
    }
    assert summary["final_losses"]["train"] == {"loss": 1.0, "mel_loss": 0.5, "postnet_loss": 0.25, "stop_loss": 0.25}
    assert state.train_scalars()["grad_norm"] == 1.0 and state.train_scalars()["steps_per_second"] == 2.0


def test_run_state_stops_on_a_non_finite_loss_naming_the_step_and_checkpoint():
    state = RunState(start=4, target=10, steps_per_call=2)
    with pytest.raises(TrainError, match=r"loss became inf at step 6; .*\(ckpt-4\) is intact"):
        state.record(_metrics(1.0), np.array([1.0, np.inf]), 0.0, 1.0, last_checkpoint="ckpt-4")
    assert state.step == 4


def test_run_state_due_on_multiples_only():
    state = RunState(start=0, target=100, steps_per_call=5)
    due = []
    for _ in range(6):
        state.record(_metrics(1.0), np.ones(5), 0.0, 1.0, None)
        due.append(state.due(10))
    assert due == [False, True, False, True, False, True]


def test_summary_lines_show_a_changed_input():
    state = RunState(start=0, target=2, steps_per_call=1, data_changes=["batch_size 8 -> 4 (pass ...)"])
    state.record(_metrics(1.0), np.ones(1), 0.0, 1.0, None)
    text = format_summary(
        state.summary(
            synthetic_data=False, batch_size=4, steps_per_execution=1, precision="float32", train_step_traces=1
        )
    )
    assert "input changed      fresh iterator: batch_size 8 -> 4" in text and "steps run          1" in text


def test_scalars_read_back_with_tensorboards_event_accumulator(tmp_path):
    scalars = Scalars(str(tmp_path))
    scalars.write("train", 5, {"loss": 1.5, "grad_norm": 0.25})
    scalars.write("train", 10, {"loss": 0.75, "grad_norm": 0.5})
    scalars.write("val", 10, {"loss": 2.0})
    scalars.close()
    train = EventAccumulator(str(tmp_path / "tensorboard" / "train"))
    train.Reload()
    assert sorted(train.Tags()["tensors"]) == ["grad_norm", "loss"]
    assert [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in train.Tensors("loss")] == [(5, 1.5), (10, 0.75)]
    assert train.SummaryMetadata("loss").plugin_data.plugin_name == "scalars"
    val = EventAccumulator(str(tmp_path / "tensorboard" / "val"))
    val.Reload()
    assert [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in val.Tensors("loss")] == [(10, 2.0)]


def test_data_settings_differences_say_what_to_pass():
    cfg = TrainConfig()
    before = data_settings(["a.tfrecord"], cfg.override(batch_size=100), synthetic=True)
    now = data_settings(["a.tfrecord", "b.tfrecord"], cfg, synthetic=False)
    assert settings_diff(before, now) == [
        "batch_size 100 -> 8 (pass --batch-size 100 to keep it)",
        "shard files: 1 added (b.tfrecord) (pass the same shard globs to keep them)",
        "synthetic_data True -> False (pass --synthetic-data to keep it)",
    ]
    assert settings_diff(now, json.loads(json.dumps(now))) == []
    assert settings_diff(None, now) == ["the checkpoint records no data settings"]
    earlier = {k: v for k, v in now.items() if k != LAYOUT_KEY}  # settings an earlier melshards recorded
    assert settings_diff(earlier, now) == [
        f"input state layout 1 -> {STATE_LAYOUT} (the checkpoint's input position is of another melshards "
        "version's pipeline; resume with that version to keep it)"
    ]


def test_remove_partial_writes_keeps_finished_checkpoints(tmp_path):
    (tmp_path / "ckpt-3_temp").mkdir()
    (tmp_path / "ckpt-3_temp" / "part-00000-of-00001.index").write_bytes(b"x")
    (tmp_path / "ckpt-2.index").write_bytes(b"x")
    assert remove_partial_writes(str(tmp_path)) == [str(tmp_path / "ckpt-3_temp")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-2.index"]


def test_progress_logs_every_n_steps_off_a_terminal(caplog):
    progress = Progress(total=6, every=4)
    progress.tty = False
    state = RunState(start=0, target=6, steps_per_call=2)
    with caplog.at_level(logging.INFO, logger="melshards.train"):
        for _ in range(3):
            state.record(_metrics(1.0), np.ones(2), 0.0, 0.5, None)
            progress.update(state)
    assert [r.getMessage().split(" loss")[0] for r in caplog.records] == ["step 4/6", "step 6/6"]


def test_a_ctrl_c_while_the_first_program_compiles_stops_before_any_step_without_a_checkpoint(bucketed_dir, tmp_path):
    """The steps compile on a background thread; the loop waits for the first call's program and gives up
    the wait at the first Ctrl-C: the run ends cleanly, no step run, nothing checkpointed. LITE_MODEL on
    bucketed_dir's four buckets: its first program takes seconds after the line the test waits for."""
    cfg = write_lite_config(tmp_path / "c.yaml")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "melshards",
            "train",
            str(bucketed_dir / "train-*.tfrecord"),
            "--model-dir",
            str(tmp_path / "m"),
            "--config",
            str(cfg),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", MELSHARDS_XLA_CACHE=""),
    )  # no cache: a real compile to wait for
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "behind training, in the order" in line:  # compiling every bucket's steps now
            break
    proc.send_signal(signal.SIGINT)
    lines += proc.stdout.readlines()
    out = "".join(lines)
    assert proc.wait(timeout=300) == 0, out
    assert "SIGINT received: checkpointing" in out
    summary = json.loads((tmp_path / "m" / "run_summary.json").read_text())
    assert (summary["stopped_by"], summary["steps_run"]) == ("SIGINT", 0)
    assert not list((tmp_path / "m" / "checkpoints").glob("*.index"))


def test_run_state_compiled_behind_training_reports_the_warmups_compile_not_the_first_call():
    state = RunState(start=0, target=4, steps_per_call=2, compiled=True)
    state.record(
        dict(_metrics(3.0), first_call=1.0), np.array([3.0, 2.9]), wait_s=0.0, call_s=0.5, last_checkpoint=None
    )
    assert state.compile_seconds is None and state.first_call_seconds == 0.5
    assert state.summary(compile_seconds=4.0)["compile_seconds"] == 4.0


def test_startup_timeline_gives_each_phase_its_own_seconds_and_keeps_a_phases_first_end():
    timeline = Timeline(began=100.0)
    timeline.mark("checks", now=100.25)
    timeline.mark("model", now=101.5)
    timeline.mark("model", now=109.0)  # marked once: a later mark of the same phase changes nothing
    timeline.mark("first call", now=102.0)
    assert timeline.phases() == {"checks": 0.25, "model": 1.25, "first call": 0.5}
    assert timeline.describe() == "checks 0.25 s, model 1.25 s, first call 0.50 s"
    state = RunState(start=0, target=4, steps_per_call=2, startup=timeline)
    assert state.summary()["startup_s"] == {"checks": 0.25, "model": 1.25, "first call": 0.5}
