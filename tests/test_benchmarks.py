"""Smoke test of the device benchmark, benchmarks/train/step_device.py.

One end-to-end run (`--quick --steps 2`) of one trainer variant (bf16_noxla: the trainer's loop without an
XLA compile, the cheapest of the four to run) and the `before` loader, the two kinds of variant it has, shows
the script runs to completion and reports every figure. The script's own part (the variants in turn,
parse-only throughput, the table, the JSON line) runs in the test's process through `step_device.main`, as
`python -m benchmarks.train.step_device` calls it; the trainer variant runs in the `melshards train` process the
script starts for it, as a user's run does. The before loader (`step_device.before_loader`) runs in the
test's process, which has TensorFlow already: `in_fresh_process`, which a user's run starts it through, is
swapped for a call of the same function with the same JSON-encoded arguments and result, and is itself
shown to run a function of the script in a child process (a cheap one, no TensorFlow) and to stop the
script when the child fails. Every trainer variant (bf16, fp32, bf16_noxla, synthetic) differs from the
others only in the config and the arguments it gives `melshards train`: those go through the trainer's own
argument parser and config loader, and the figures come out of the end-to-end run's real run_summary.json.
Training itself at each precision, with and without XLA and with synthetic data, is tests/train's.

No figure's value is asserted, only that it is there (and null where this machine has no NVIDIA GPU).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

FIGURES = ("step_ms", "examples_per_s", "mel_frames_per_s", "input_wait", "time_to_first_step_s")


def assert_every_figure(name: str, v: dict) -> None:
    for key in FIGURES:
        assert v[key] is not None and v[key] > 0 or key == "input_wait" and v[key] >= 0, (name, key)
    assert v["device_util_percent"] is None and v["peak_device_memory_gib"] is None, name  # no NVIDIA GPU here


@pytest.fixture(scope="module")
def eight_records(shards_dir, tmp_path_factory) -> Path:
    """`shards_dir` cut to its first 8 training records (--quick's batch), schema.json's counts and shard
    listing made to match, as a preprocessing run of those 8 clips lists them. Every batch the `before` loader
    pads then holds the same 8 clips, padded to the same lengths: its step (a tf.function without a signature)
    traces once, not once per batch shape."""
    import tensorflow as tf

    out = tmp_path_factory.mktemp("eight") / "shards"
    out.mkdir()
    schema = json.loads((shards_dir / "schema.json").read_text())
    (bucket,) = schema["buckets"]  # shards_dir has one length bucket
    (listed,) = bucket["shards"]["train"]
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(shards_dir / listed["file"])).take(8)]
    with tf.io.TFRecordWriter(str(out / listed["file"])) as w:
        for r in records:
            w.write(r)
    listed.update(records=8, bytes=(out / listed["file"]).stat().st_size)
    schema["counts"]["train"] = bucket["counts"]["train"] = 8
    bucket["groups"]["train"] = {kind: [8] for kind in bucket["groups"]["train"]}  # one speaker, one language
    (out / "schema.json").write_text(json.dumps(schema))
    return out


@pytest.fixture(scope="module")
def quick_run(eight_records, tmp_path_factory):
    """`python -m benchmarks.train.step_device --quick --steps 2 --variants bf16_noxla,before --shards
    <eight_records>`, its `main` called in this process, and the before loader with it (one process, one
    TensorFlow import, instead of two; `in_fresh_process` has its own test): what it printed (the table,
    then the JSON line), the directory it worked in and the functions run in place of a child process."""
    from benchmarks.train import step_device

    def in_this_process(function, *args):
        ran.append(function)
        return json.loads(json.dumps(getattr(step_device, function)(*json.loads(json.dumps(args)))))

    bench_dir, ran = tmp_path_factory.mktemp("bench"), []
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(step_device, "WORK", bench_dir)  # what MELSHARDS_BENCH_DIR sets
        monkeypatch.setattr(step_device, "in_fresh_process", in_this_process)
        with contextlib.redirect_stdout(printed):
            step_device.main(
                [
                    "--quick",
                    "--steps",
                    "2",
                    "--parse-seconds",
                    "0.1",
                    "--variants",
                    "bf16_noxla,before",
                    "--shards",
                    str(eight_records),
                ]
            )
    return printed.getvalue(), bench_dir, ran


def test_step_device_quick_runs_a_trainer_variant_and_the_before_loader_and_reports_every_figure(quick_run):
    stdout, _, ran = quick_run
    assert ran == ["before_loader"]  # the before loader, through the function a user's run starts its child with
    result = json.loads(stdout.strip().splitlines()[-1])
    assert set(result["variants"]) == {"bf16_noxla", "before"}
    for name, v in result["variants"].items():
        assert_every_figure(name, v)
    trainer = result["variants"]["bf16_noxla"]  # the trainer's: one trace per bucket, compiled up front
    assert trainer["traces"] == trainer["buckets"] == len(trainer["compile_s_by_bucket"])
    assert trainer["layers"] == {"device": "CPU", "conv": "im2col", "dropout_rng": "philox"}  # no XLA: philox
    parse = result["parse_only"]
    assert parse["1_core"]["records_per_s"] > 0 and parse["cores_per_gpu_at_fastpitch_rate"] > 0
    assert result["device"].endswith("(CPU)") and "step ms" in stdout


def test_every_trainer_variant_gives_melshards_train_arguments_and_a_config_it_accepts_and_reports_every_figure(
    quick_run, shards_dir, tmp_path, monkeypatch
):
    from benchmarks.train import step_device
    from melshards.commands.train import train_command
    from melshards.train import device
    from melshards.train.config import load_config

    _, bench_dir, _ = quick_run
    summary = json.loads((bench_dir / "step-device" / "model-bf16_noxla" / "run_summary.json").read_text())
    given = {}

    def melshards_train(shards, model_dir, config, *args, env=None):
        argv = [str(shards / "train-*.tfrecord"), "--model-dir", str(model_dir), "--config", str(config), *args]
        given[model_dir.name] = (train_command.make_context("train", argv).params, load_config(config), env)
        return summary

    monkeypatch.setattr(step_device, "melshards_train", melshards_train)
    trainer_variants = [v for v in step_device.VARIANTS if v != "before"]
    assert set(trainer_variants) == {"bf16", "fp32", "bf16_noxla", "synthetic"}
    for name in trainer_variants:
        figures = step_device.train_variant(name, shards_dir, tmp_path, True, 2)
        assert_every_figure(name, figures)
        assert figures["traces"] == figures["buckets"] == len(figures["compile_s_by_bucket"]), name
        params, cfg, env = given[f"model-{name}"]
        want_precision = "float32" if name == "fp32" else "mixed_bfloat16"
        assert params["precision"] == want_precision, (name, "precision")
        assert params["synthetic_data"] == (name == "synthetic"), (name, "synthetic data")
        assert cfg.loop.jit_compile == (name != "bf16_noxla"), (name, "jit_compile")
        # the layers the trainer reports for it (train/trainer.py): threefry runs under XLA only
        want_rng = "philox" if name == "bf16_noxla" else "threefry"
        assert device.choices_for("CPU", cfg.loop.jit_compile).dropout_rng == want_rng, (name, "dropout rng")
        assert cfg.loop.steps == 2 and cfg.data.batch_size == 8, (name, "the quick sizes")
        assert cfg.model["d_model"] == step_device.QUICK_MODEL["d_model"], (name, "the quick model")
        assert env == {"MELSHARDS_XLA_CACHE": ""}, (name, "compile seconds are the cold ones")


def test_in_fresh_process_runs_a_function_of_the_script_in_a_child_and_stops_the_script_when_it_fails(monkeypatch):
    from benchmarks.train import step_device

    here = step_device.device_name()
    monkeypatch.setattr(step_device, "device_name", lambda: "this process's")  # a child imports its own
    assert step_device.in_fresh_process("device_name") == here
    assert step_device.in_fresh_process("median_of", [{"a": 1, "b": "x"}, {"a": 3, "b": "y"}]) == {"a": 2, "b": "x"}
    with pytest.raises(SystemExit, match=r"(?s)step_device\.no_such_function failed in its child.*AttributeError"):
        step_device.in_fresh_process("no_such_function")
