"""Resuming a model dir: a changed input restarts the iterator (with a warning), bad dirs are refused
before compiling, and leftovers of killed checkpoint writes are removed.

The checkpoints are written by the loop's own pieces without running a step (the step counter is
set by hand; the Trainer that writes them compiles nothing). A resume builds a Trainer, which traces
and compiles its steps, so the resumes share what they can: one resume shows every change of input
at once, and they run the LITE_MODEL (tests/train/conftest.py), whose steps trace fastest.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest

from melshards.commands.train import run
from melshards.train.config import load_config
from melshards.train.inputs import resolve_inputs
from melshards.train.model_dir import check_model_dir, record_settings
from melshards.train.trainer import Trainer
from tests.train.conftest import write_lite_config

AT = 4  # the step the hand-written checkpoints are at


def prepare_model_dir(model_dir: str, inputs) -> None:
    """The model dir as a run leaves it once it starts: checked (nothing trained yet), its settings recorded."""
    check_model_dir(model_dir, inputs, trained=False)
    record_settings(model_dir, inputs)


def write_own_config(model_dir) -> None:
    """A train_config.json such as melshards train writes (its sections, the model's factory)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    config = {"data": {}, "model": {"factory": "melshards.train.model:build"}, "optim": {}, "loop": {}}
    (model_dir / "train_config.json").write_text(json.dumps(config))


def _checkpoint_without_training(globs, model_dir, cfg_path, synthetic=False, batch_size=None):
    """A checkpoint at step AT as training lays it out (model, optimizer, step, iterators, data settings),
    written by a Trainer whose steps are neither traced nor compiled (no step runs)."""
    cfg = load_config(cfg_path).override(batch_size=batch_size)
    inputs = resolve_inputs([str(g) for g in globs], [], None, cfg)
    prepare_model_dir(str(model_dir), inputs)
    r = Trainer(inputs, str(model_dir), synthetic)  # its steps compile once a run starts (`start_warmup`)
    r.step_var.assign(AT)
    return r.checkpointer.save(AT)


def _resume(capsys, caplog, *args):
    with caplog.at_level(logging.WARNING, logger="melshards.train"):
        code = run([str(a) for a in args] + ["--steps", str(AT)])
    return code, capsys.readouterr(), caplog.text


@pytest.fixture(scope="module")
def checkpointed(shards_dir, tmp_path_factory):
    """A model dir checkpointed at step AT on shards_dir's training shards with the config `c.yaml` beside it
    (the LITE_MODEL: what a resume does does not depend on the model). Read-only: the tests resume copies."""
    tmp = tmp_path_factory.mktemp("checkpointed")
    _checkpoint_without_training([shards_dir / "train-*.tfrecord"], tmp / "m", write_lite_config(tmp / "c.yaml"))
    return tmp / "m"


def test_the_same_input_and_step_count_resume_runs_nothing_warns_nothing_and_removes_a_killed_writes_leftover(
    checkpointed, shards_dir, tmp_path, capsys, caplog
):
    model_dir, test_config = tmp_path / "m", checkpointed.parent / "c.yaml"
    shutil.copytree(checkpointed, model_dir)
    temp = model_dir / "checkpoints" / "ckpt-8_temp"  # what a checkpoint write killed midway leaves
    temp.mkdir()
    (temp / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"\0" * 64)
    glob = shards_dir / "train-*.tfrecord"
    code, out, logged = _resume(capsys, caplog, glob, "--model-dir", model_dir, "--config", test_config)
    assert code == 0, out.err
    summary = json.loads((model_dir / "run_summary.json").read_text())
    assert "afresh" not in logged, "the same input started the iterator afresh"
    assert summary["data_changed"] == [], "the same input was taken for a changed one"
    assert summary["start_step"] == summary["final_step"] == AT and summary["steps_run"] == 0, (
        "training again to the step count of the checkpoint ran steps"
    )
    assert not temp.exists(), "the leftover of a killed checkpoint write was kept"
    assert (model_dir / "checkpoints" / f"ckpt-{AT}.index").exists()


def test_a_changed_input_restores_the_weights_starts_the_iterator_afresh_and_training_continues(
    shards_dir, four_records, tmp_path, capsys, caplog
):
    """A checkpoint written on synthetic data with batch 8, resumed on real data with batch 4 and one more
    glob: each change is named, the weights and step are restored, and the fresh iterator feeds 2 steps."""
    cfg = write_lite_config(
        tmp_path / "c.yaml", loop={"steps": AT + 2, "checkpoint_every": 2, "log_every": 2, "val_every": 2}
    )
    model_dir = tmp_path / "m"
    glob, extra = shards_dir / "train-*.tfrecord", four_records / "train-*.tfrecord"
    _checkpoint_without_training([glob], model_dir, cfg, synthetic=True, batch_size=8)
    shutil.rmtree(model_dir / "tensorboard", ignore_errors=True)
    with caplog.at_level(logging.WARNING, logger="melshards.train"):
        code = run([str(glob), str(extra), "--model-dir", str(model_dir), "--config", str(cfg)])
    out = capsys.readouterr()
    assert code == 0, out.err
    summary = json.loads((model_dir / "run_summary.json").read_text())
    assert (summary["start_step"], summary["final_step"], summary["batch_size"]) == (AT, AT + 2, 4)
    expected = {
        "batch_size": "batch_size 8 -> 4 (pass --batch-size 8 to keep it)",
        "extra_glob": "shard files: 1 added (" + str(next(four_records.glob("train-*.tfrecord"))),
        "synthetic_to_real": "synthetic_data True -> False (pass --synthetic-data to keep it)",
    }
    for change, message in expected.items():
        assert message in caplog.text, f"{change}: not named in the warning"
        assert [d for d in summary["data_changed"] if message in d], f"{change}: not in run_summary.json"
    assert len(summary["data_changed"]) == len(expected), summary["data_changed"]
    assert "started the input pipeline afresh" in caplog.text
    assert "input changed" in out.out


@pytest.mark.parametrize("blocker", ["checkpoints_is_a_file", "parent_is_a_file"])
def test_an_unusable_model_dir_stops_before_anything_is_built(blocker, shards_dir, tmp_path, test_config, capsys):
    if blocker == "checkpoints_is_a_file":
        model_dir = tmp_path / "m"
        write_own_config(model_dir)
        (model_dir / "checkpoints").write_text("")
        bad = model_dir / "checkpoints"
    else:
        (tmp_path / "file").write_text("")
        model_dir = bad = tmp_path / "file" / "m"
    code = run([str(shards_dir / "train-*.tfrecord"), "--model-dir", str(model_dir), "--config", str(test_config)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{bad} is not a writable directory" in err and "--model-dir" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_checkpoints_dir_stops_before_anything_is_built(shards_dir, tmp_path, test_config, capsys):
    (tmp_path / "m" / "checkpoints").mkdir(parents=True)
    write_own_config(tmp_path / "m")
    os.chmod(tmp_path / "m" / "checkpoints", 0o555)
    try:
        code = run(
            [str(shards_dir / "train-*.tfrecord"), "--model-dir", str(tmp_path / "m"), "--config", str(test_config)]
        )
    finally:
        os.chmod(tmp_path / "m" / "checkpoints", 0o755)
    assert code == 2 and "is not a writable directory" in capsys.readouterr().err


@pytest.mark.parametrize("own_schema", [True, False])
def test_the_model_dir_records_the_schema_the_shards_were_read_and_normalised_with(
    shards_dir, tmp_path, test_config, own_schema
):
    """--schema is the reference; shards with their own schema.json are read (and their mel normalised)
    with it, so that one is recorded for synthesis; shards without one are read with --schema."""
    shards = tmp_path / "shards"
    shutil.copytree(shards_dir, shards)
    reference = json.loads((shards / "schema.json").read_text())
    reference["mel_mean"] = [m + 1.0 for m in reference["mel_mean"]]  # same contract, other statistics
    (tmp_path / "reference.json").write_text(json.dumps(reference))
    if not own_schema:
        (shards / "schema.json").unlink()
    inputs = resolve_inputs(
        [str(shards / "train-*.tfrecord")], [], str(tmp_path / "reference.json"), load_config(str(test_config))
    )
    prepare_model_dir(str(tmp_path / "m"), inputs)
    recorded = json.loads((tmp_path / "m" / "schema.json").read_text())
    assert recorded["mel_mean"] == pytest.approx(list(inputs.schema.mel_mean))
    expected = json.loads((shards_dir / "schema.json").read_text()) if own_schema else reference
    assert recorded["mel_mean"] == pytest.approx(expected["mel_mean"])


@pytest.mark.parametrize("model_dir", ["run", "run/./", "other_run", "own_schema", "lightning", "own_config"])
def test_train_refuses_a_model_dir_holding_shards_a_run_or_files_it_did_not_write(
    model_dir, shards_dir, tmp_path, test_config, capsys, monkeypatch
):
    """The shards' own directory (however spelt), another preprocess run, a directory with a schema.json
    of the user's, a PyTorch Lightning project (its `checkpoints/` is no melshards mark) or one with a
    train_config.json of another trainer's: exit 2 naming the problem, before anything is built, every
    file as it was."""
    import melshards.train.loop as loop

    def built(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(loop, "Trainer", built)
    shutil.copytree(shards_dir, tmp_path / "run")
    shutil.copytree(shards_dir, tmp_path / "other_run")
    (tmp_path / "own_schema").mkdir()
    (tmp_path / "own_schema" / "schema.json").write_text('{"mine": true}')
    (tmp_path / "lightning" / "checkpoints").mkdir(parents=True)
    (tmp_path / "lightning" / "checkpoints" / "epoch=3-step=120.ckpt").write_bytes(b"weights")
    (tmp_path / "lightning" / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    (tmp_path / "lightning" / "hparams.yaml").write_text("lr: 0.001\n")
    (tmp_path / "own_config").mkdir()
    (tmp_path / "own_config" / "train_config.json").write_text('{"lr": 0.001, "epochs": 3}')
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    dirs = sorted(p for p in tmp_path.rglob("*") if p.is_dir())
    monkeypatch.chdir(tmp_path)
    code = run(["run/train-*.tfrecord", "--model-dir", model_dir, "--config", str(test_config)])
    err = capsys.readouterr().err
    assert code == 2, err
    problem = {
        "run": "is the directory of the shards it trains on",
        "run/./": "is the directory of the shards",
        "other_run": "holds a preprocess run or shards (rejected.jsonl, stats.json, train-",
        "own_schema": "holds schema.json, which melshards train did not write",
        "lightning": "holds checkpoints, which melshards train did not write",
        "own_config": "holds train_config.json, which melshards train did not write",
    }[model_dir]
    assert f"--model-dir {model_dir} {problem}" in err and "pass a new --model-dir" in err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("Error: --model-dir"), err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert sorted(p for p in tmp_path.rglob("*") if p.is_dir()) == dirs


def test_a_schema_given_from_the_model_dir_itself_is_not_copied_onto_itself(shards_dir, tmp_path, test_config):
    """Shards without a schema.json of their own, read with --schema MODEL_DIR/schema.json."""
    cfg = load_config(str(test_config))
    prepare_model_dir(str(tmp_path / "m"), resolve_inputs([str(shards_dir / "train-*.tfrecord")], [], None, cfg))
    recorded = (tmp_path / "m" / "schema.json").read_bytes()
    shutil.copytree(shards_dir, tmp_path / "shards")
    (tmp_path / "shards" / "schema.json").unlink()
    again = resolve_inputs(
        [str(tmp_path / "shards" / "train-*.tfrecord")], [], str(tmp_path / "m" / "schema.json"), cfg
    )
    assert again.schema_path == str(tmp_path / "m" / "schema.json")
    prepare_model_dir(str(tmp_path / "m"), again)
    assert (tmp_path / "m" / "schema.json").read_bytes() == recorded


def test_model_dir_problem_allows_a_new_or_empty_dir_and_a_model_dir_only():
    from melshards.train.model_dir import model_dir_problem

    assert model_dir_problem("m", [], ["shards"], False) is None
    assert model_dir_problem("m", ["notes.txt"], ["shards"], False) is None  # nothing of the user's written over
    every = ["schema.json", "train_config.json", "checkpoints/", "tensorboard/", "run_summary.json"]
    assert model_dir_problem("m", every, ["shards"], True) is None
    assert "holds checkpoints, schema.json, train_config.json, which melshards train did not write" in (
        model_dir_problem("m", ["schema.json", "checkpoints/", "train_config.json"], ["shards"], False)
    )
    assert "holds checkpoints, schema.json, which" in model_dir_problem("m", ["schema.json", "checkpoints/"], [], False)
    assert "did not write" in model_dir_problem("m", ["run_summary.json", "tensorboard/"], ["shards"], False)
    assert "holds a preprocess run" in model_dir_problem("m", ["train_config.json", "a.tfrecord"], ["shards"], True)
    assert "the directory of the shards" in model_dir_problem("gs://b/run/", [], ["gs://b/run"], False)


def test_a_model_dir_training_prepared_is_recognised_as_one(shards_dir, tmp_path, test_config):
    """The train_config.json a run records is what `preprocess --output` refuses as a model dir, and what
    lets training write into the dir again; its sections are the train config's."""
    import dataclasses

    from melshards.shards_schema.ownership import (
        MODEL_CONFIG_SECTIONS,
        MODEL_DIR_MARKS,
        holds_model_config,
        model_dir_marks,
    )
    from melshards.train.config import TrainConfig
    from melshards.train.model_dir import CONFIG_FILE

    assert (CONFIG_FILE,) == MODEL_DIR_MARKS
    assert MODEL_CONFIG_SECTIONS == tuple(f.name for f in dataclasses.fields(TrainConfig))
    inputs = resolve_inputs([str(shards_dir / "train-*.tfrecord")], [], None, load_config(str(test_config)))
    prepare_model_dir(str(tmp_path / "m"), inputs)
    assert model_dir_marks(os.listdir(tmp_path / "m")) == list(MODEL_DIR_MARKS)
    assert holds_model_config(str(tmp_path / "m"))


def test_a_model_dir_without_a_checkpoint_takes_another_model_and_one_with_a_checkpoint_refuses_it(
    checkpointed, shards_dir, tmp_path
):
    """The settings of a dir where nothing was trained describe no model: another model's run replaces
    them. A checkpoint's settings are kept: another model is refused, naming what differs."""
    import dataclasses

    from melshards.train.distribute import Topology
    from melshards.train.errors import TrainError
    from melshards.train.loop import check_checkpoint, check_target

    cfg = load_config(str(checkpointed.parent / "c.yaml"))
    inputs = resolve_inputs([str(shards_dir / "train-*.tfrecord")], [], None, cfg)
    wider = dataclasses.replace(cfg, model=dict(cfg.model, d_model=2 * cfg.model["d_model"]))
    other = resolve_inputs([str(shards_dir / "train-*.tfrecord")], [], None, wider)
    untrained = tmp_path / "untrained"
    prepare_model_dir(str(untrained), inputs)
    check_target(other, str(untrained), Topology("one", None))
    check_checkpoint(other, str(untrained), Topology("one", None))
    trained = shutil.copytree(checkpointed, tmp_path / "trained")
    check_target(other, str(trained), Topology("one", None))
    with pytest.raises(TrainError, match=r"holds a model trained with other model settings \(d_model\)"):
        check_checkpoint(other, str(trained), Topology("one", None))
