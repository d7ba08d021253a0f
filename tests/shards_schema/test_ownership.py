"""The one rule of every writer: a path that exists is written over only when it carries the mark the
command writes into such a file (HTML report, WAV, mel PNG); otherwise NotOurs names it."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
from matplotlib.figure import Figure

from melshards.shards_schema.ownership import (
    HTML,
    HTML_MARK,
    MODEL_DIR_MARKS,
    PNG,
    PNG_SOFTWARE,
    WAV,
    WAV_SOFTWARE,
    NotOurs,
    check_may_fill_dir,
    check_may_write,
    holds_model_config,
    model_dir_marks,
)


def wav(path, software=None):
    with sf.SoundFile(path, "w", 16000, 1, subtype="PCM_16", format="WAV") as f:
        if software:
            f.software = software
        f.write(np.zeros(400, np.float32))


def png(path, software=None):
    fig = Figure(figsize=(1, 1))
    fig.subplots().plot([0, 1])
    fig.savefig(path, format="png", **({"metadata": {"Software": software}} if software else {}))


def test_a_path_that_does_not_exist_may_be_written(tmp_path):
    for kind in (HTML, WAV, PNG):
        check_may_write("-o", str(tmp_path / "new"), kind)


@pytest.mark.parametrize(
    "kind, write_ours, write_theirs",
    [
        (
            HTML,
            lambda p: p.write_text(f"<!DOCTYPE html><html><head>{HTML_MARK}<title>x</title>"),
            lambda p: p.write_text("<!DOCTYPE html><html><head><title>x</title>"),
        ),
        (WAV, lambda p: wav(p, WAV_SOFTWARE), lambda p: wav(p)),
        (WAV, lambda p: wav(p, WAV_SOFTWARE), lambda p: wav(p, "another tool")),
        (PNG, lambda p: png(p, PNG_SOFTWARE), lambda p: png(p)),
    ],
)
def test_only_a_file_carrying_the_commands_mark_may_be_written_over(tmp_path, kind, write_ours, write_theirs):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    write_ours(ours)
    write_theirs(theirs)
    check_may_write("--opt", str(ours), kind)
    with pytest.raises(NotOurs, match=f"^--opt {theirs}: it exists and is not {kind.what}"):
        check_may_write("--opt", str(theirs), kind)


@pytest.mark.parametrize("kind", [HTML, WAV, PNG])
def test_a_runs_json_a_directory_and_a_dangling_link_are_refused(tmp_path, kind):
    (tmp_path / "schema.json").write_text('{"version": 1}')
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    for name in ("schema.json", "dir", "link"):
        with pytest.raises(NotOurs, match=f"--o {tmp_path / name}: it exists and "):
            check_may_write("--o", str(tmp_path / name), kind)


def test_a_wav_mark_after_an_odd_sized_data_chunk_is_found(tmp_path):
    p = tmp_path / "late.wav"
    with sf.SoundFile(p, "w", 16000, 1, subtype="PCM_U8", format="WAV") as f:
        f.write(np.zeros(1001, np.float32))  # 1001 bytes of data, then a pad byte
        f.software = WAV_SOFTWARE  # set after the data: libsndfile writes the LIST chunk after it
    assert p.read_bytes().find(b"LIST") > 1001
    check_may_write("-o", str(p), WAV)


def test_a_truncated_wav_header_is_not_taken_for_ours(tmp_path):
    p = tmp_path / "x.wav"
    wav(p, WAV_SOFTWARE)
    p.write_bytes(p.read_bytes()[:40])  # cut inside the LIST chunk's header
    with pytest.raises(NotOurs):
        check_may_write("-o", str(p), WAV)


def test_a_remote_path_is_read_through_the_files_passed_in():
    class Fake:
        def exists(self, path):
            return True

        def isdir(self, path):
            return False

        def open(self, path):
            return io.BytesIO(f"<html><head>{HTML_MARK}".encode())

    check_may_write("--html", "gs://b/r.html", HTML, fs=Fake())


def test_a_model_dir_is_recognised_by_its_config_never_by_a_checkpoints_folder(tmp_path):
    """`checkpoints/` is every trainer's (PyTorch Lightning writes one): only train_config.json marks a model
    dir, and training writes only where that file is a train config melshards wrote."""
    import json

    assert MODEL_DIR_MARKS == ("train_config.json",)
    assert model_dir_marks(["schema.json", "checkpoints/"]) == []
    assert model_dir_marks({"train_config.json", "run_summary.json"}) == ["train_config.json"]
    assert model_dir_marks(["schema.json", "stats.json", "train-00000-of-00001.tfrecord"]) == []
    ours = {"data": {"batch_size": 8}, "model": {"factory": "melshards.train.model:build"}, "optim": {}, "loop": {}}
    for content, expected in [
        (json.dumps(ours), True),
        (json.dumps({"lr": 0.1, "epochs": 3}), False),  # another project's train_config.json
        (json.dumps(dict(ours, model={})), True),  # a run from before model plug-ins: no factory named
        (json.dumps(dict(ours, model={"factory": 3})), False),
        (json.dumps(dict(ours, loop=[])), False),
        (json.dumps(dict(ours, trainer={})), False),
        ("[1, 2]", False),
        ("not json", False),
        ("\udcff", False),
    ]:
        (tmp_path / "train_config.json").write_text(content, errors="surrogateescape")
        assert holds_model_config(str(tmp_path)) is expected, content
    (tmp_path / "train_config.json").unlink()
    (tmp_path / "checkpoints").mkdir()
    assert holds_model_config(str(tmp_path)) is False
    (tmp_path / "train_config.json").mkdir()
    assert holds_model_config(str(tmp_path)) is False


def test_a_dir_is_filled_only_when_missing_empty_or_holding_the_commands_mark(tmp_path):
    check_may_fill_dir("--export", str(tmp_path / "new"), "mark.json", "an export")
    (tmp_path / "empty").mkdir()
    check_may_fill_dir("--export", str(tmp_path / "empty"), "mark.json", "an export")
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "saved_model.pb").write_bytes(b"x")
    (ours / "mark.json").write_text("{}")
    check_may_fill_dir("--export", str(ours), "mark.json", "an export")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for path in (theirs, afile):
        with pytest.raises(NotOurs, match=rf"^--export {path}: it exists and is not an export, so it is left"):
            check_may_fill_dir("--export", str(path), "mark.json", "an export")
