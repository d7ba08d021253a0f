"""Bad invocations and bad shards fail with a message that names the culprit (before compiling)."""

from __future__ import annotations

import json
import shutil

import pytest

from melshards.commands.train import run
from tests.train.conftest import write_config, write_lite_config


def _train(capsys, *args):
    code = run(list(map(str, args)))
    return code, capsys.readouterr()


def test_schema_mismatch_names_both_schema_files(shards_dir, tmp_path, test_config, capsys):
    other = shutil.copytree(shards_dir, tmp_path / "other")
    schema = json.loads((other / "schema.json").read_text())
    schema["mel"]["fmax"] = 7600.0
    (other / "schema.json").write_text(json.dumps(schema))
    code, out = _train(
        capsys,
        shards_dir / "train-*.tfrecord",
        other / "train-*.tfrecord",
        "--model-dir",
        tmp_path / "m",
        "--config",
        test_config,
    )
    assert code == 2
    assert f"{shards_dir}/schema.json" in out.err and f"{other}/schema.json" in out.err
    assert "differs" in out.err and "mel" in out.err
    assert not (tmp_path / "m").exists()


def test_validation_shards_of_another_schema_are_refused(shards_dir, tmp_path, test_config, capsys):
    other = shutil.copytree(shards_dir, tmp_path / "other")
    schema = json.loads((other / "schema.json").read_text())
    schema["vocabulary"] = schema["vocabulary"][:-1]
    (other / "schema.json").write_text(json.dumps(schema))
    code, out = _train(
        capsys,
        shards_dir / "train-*.tfrecord",
        "--val",
        other / "val-*.tfrecord",
        "--model-dir",
        tmp_path / "m",
        "--config",
        test_config,
    )
    assert code == 2 and f"{other}/schema.json" in out.err and "vocabulary" in out.err


def test_unfinished_run_is_refused(shards_dir, tmp_path, test_config, capsys):
    unfinished = shutil.copytree(shards_dir, tmp_path / "unfinished")
    (unfinished / "schema.json").unlink()
    code, out = _train(capsys, unfinished / "train-*.tfrecord", "--model-dir", tmp_path / "m", "--config", test_config)
    assert code == 2 and f"{unfinished}/schema.json does not exist" in out.err

    (unfinished / ".melshards-publish.json").write_text("{}")  # a publish of a new run was cut short
    shutil.copy(shards_dir / "schema.json", unfinished / "schema.json")
    code, out = _train(capsys, unfinished / "train-*.tfrecord", "--model-dir", tmp_path / "m", "--config", test_config)
    assert code == 2 and "having its run replaced" in out.err and str(unfinished) in out.err


def test_a_training_glob_matching_the_validation_shards_is_refused_naming_both_globs(
    shards_dir, tmp_path, test_config, capsys
):
    code, out = _train(capsys, shards_dir / "*.tfrecord", "--model-dir", tmp_path / "m", "--config", test_config)
    assert code == 2 and "validation shard(s)" in out.err
    assert f"pass '{shards_dir}/train-*.tfrecord' and --val '{shards_dir}/val-*.tfrecord'" in out.err
    assert not (tmp_path / "m").exists()


def cut_after_records(path, n: int) -> None:
    """Truncate a TFRecord file right after its first n records (at a record boundary: still readable)."""
    import struct

    data = path.read_bytes()
    at = 0
    for _ in range(n):
        at += 12 + struct.unpack("<Q", data[at : at + 8])[0] + 4  # length, its crc, the data, its crc
    path.write_bytes(data[:at])


def test_a_shard_cut_at_a_record_boundary_is_refused_by_its_size_before_anything_is_built(
    shards_dir, tmp_path, test_config, capsys
):
    cut = shutil.copytree(shards_dir, tmp_path / "cut")
    shard = next(cut.glob("train-*.tfrecord"))
    records = json.loads((cut / "schema.json").read_text())["buckets"][0]["shards"]["train"][0]["records"]
    cut_after_records(shard, records // 2)
    code, out = _train(capsys, cut / "train-*.tfrecord", "--model-dir", tmp_path / "m", "--config", test_config)
    assert code == 2 and f"{shard}: holds {shard.stat().st_size} bytes, schema.json lists" in out.err
    assert "cut short or damaged in a copy" in out.err and not (tmp_path / "m").exists()
    # the validation shards are checked alike
    code, out = _train(
        capsys,
        shards_dir / "train-*.tfrecord",
        "--val",
        cut / "train-*.tfrecord",
        "--model-dir",
        tmp_path / "m",
        "--config",
        test_config,
    )
    assert code == 2 and "schema.json lists" in out.err


def test_glob_matching_nothing_is_an_error(tmp_path, test_config, capsys):
    code, out = _train(capsys, tmp_path / "nope-*.tfrecord", "--model-dir", tmp_path / "m", "--config", test_config)
    assert code == 2 and "matches no file" in out.err


def test_explicit_schema_must_match_the_shards(shards_dir, tmp_path, test_config, capsys):
    schema = json.loads((shards_dir / "schema.json").read_text())
    schema["max_mel_frames"] += 8
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    code, out = _train(
        capsys,
        shards_dir / "train-*.tfrecord",
        "--schema",
        tmp_path / "schema.json",
        "--model-dir",
        tmp_path / "m",
        "--config",
        test_config,
    )
    assert code == 2 and "max_mel_frames" in out.err


@pytest.mark.parametrize(
    "loop, expected",
    [
        ({"steps": 21, "steps_per_execution": 2}, "loop.steps 21 is not a multiple of loop.steps_per_execution 2"),
        ({"precision": "float8"}, "loop.precision"),
    ],
)
def test_step_arithmetic_and_precision_are_checked_before_compiling(shards_dir, tmp_path, capsys, loop, expected):
    cfg = write_config(tmp_path / "c.yaml", loop=loop)
    code, out = _train(capsys, shards_dir / "train-*.tfrecord", "--model-dir", tmp_path / "m", "--config", cfg)
    assert code == 2 and expected in out.err


def test_batch_size_zero_and_unknown_config_keys_are_errors(shards_dir, tmp_path, test_config, capsys):
    code, out = _train(
        capsys,
        shards_dir / "train-*.tfrecord",
        "--model-dir",
        tmp_path / "m",
        "--config",
        test_config,
        "--batch-size",
        0,
    )
    assert code == 2 and "data.batch_size is 0" in out.err
    bad = tmp_path / "bad.yaml"
    bad.write_text("loop:\n  stepz: 3\n")
    code, out = _train(capsys, shards_dir / "train-*.tfrecord", "--model-dir", tmp_path / "m", "--config", bad)
    assert code == 2 and "stepz" in out.err


def test_reduction_factor_must_divide_the_padded_mel_length(shards_dir, tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", model={"reduction_factor": 5})
    code, out = _train(capsys, shards_dir / "train-*.tfrecord", "--model-dir", tmp_path / "m", "--config", cfg)
    assert code == 2 and "not divisible by model.reduction_factor 5" in out.err


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_or_truncated_shard_error_names_the_file(shards_dir, tmp_path, capsys, damage):
    bad = shutil.copytree(shards_dir, tmp_path / "bad")
    shard = next(bad.glob("train-*.tfrecord"))
    data = bytearray(shard.read_bytes())
    if damage == "flip":
        data[len(data) // 3] ^= 0xFF
    else:
        data = data[: len(data) // 10]  # inside the first shuffle-buffer fill: fails before any compile
    shard.write_bytes(bytes(data))
    cfg = write_lite_config(tmp_path / "c.yaml")  # a flipped byte is found at the first call, after the build
    code, out = _train(capsys, bad / "train-*.tfrecord", "--model-dir", tmp_path / "m", "--config", cfg)
    if damage == "truncate":  # refused by its size before anything is built
        assert code == 2 and f"{shard}: holds {len(data)} bytes, schema.json lists" in out.err
        return
    assert code == 1
    assert f"corrupt or truncated shard {shard}" in out.err and "corrupted record" in out.err


def test_validation_on_the_training_shards_is_refused_before_anything_is_written(
    shards_dir, tmp_path, test_config, capsys
):
    code, out = _train(
        capsys,
        shards_dir / "train-*.tfrecord",
        "--val",
        shards_dir / "*.tfrecord",
        "--model-dir",
        tmp_path / "m",
        "--config",
        test_config,
    )
    assert code == 2 and "--val matches 1 of the training shards" in out.err
    assert not (tmp_path / "m").exists()


def test_validation_records_with_training_ids_are_refused(shards_dir, tmp_path, test_config, capsys):
    """A copy of the training shards elsewhere: other files, the same records (compared by their `id`)."""
    copy = shutil.copytree(shards_dir, tmp_path / "copy")
    code, out = _train(
        capsys,
        shards_dir / "train-*.tfrecord",
        "--val",
        copy / "train-*.tfrecord",
        "--model-dir",
        tmp_path / "m",
        "--config",
        test_config,
    )
    assert code == 2 and "--val shards hold 40 records with the ids of training records" in out.err
    assert not (tmp_path / "m").exists()


def test_a_batch_larger_than_the_training_records_is_refused_naming_the_largest_that_fits(
    shards_dir, tmp_path, test_config, capsys
):
    # the shards hold 40 training records: a batch of 64 would hold each record about 1.6 times
    code, out = _train(
        capsys,
        shards_dir / "train-*.tfrecord",
        "--model-dir",
        tmp_path / "m",
        "--config",
        test_config,
        "--batch-size",
        64,
        "--steps",
        1,
    )
    assert code == 2 and "the largest batch that fits is 40: pass --batch-size 40 or less" in out.err
    assert not (tmp_path / "m").exists()
