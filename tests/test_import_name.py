"""The distribution owns one import name, `melshards`: a TTS repository's own train.py, preprocess.py or
shards_schema.py (almost every one has the first two) never shadows a part of it."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

HOSTILE = "raise SystemExit('the hostile {name}.py in the working directory was imported')\n"


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hostile")
    for name in ("train", "preprocess", "shards_schema"):
        (d / f"{name}.py").write_text(HOSTILE.format(name=name))
    return d


def _run(args, cwd):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=900)


def test_melshards_commands_run_beside_a_users_train_and_preprocess_py(hostile_dir, shards_dir):
    melshards = str(Path(sys.executable).parent / "melshards")
    done = _run([melshards, "inspect", str(shards_dir / "train-*.tfrecord")], hostile_dir)
    assert done.returncode == 0 and "hostile" not in done.stderr, done.stderr[-2000:]
    done = _run([sys.executable, "-m", "melshards", "stats", str(shards_dir)], hostile_dir)
    assert done.returncode == 0 and "hostile" not in done.stderr, done.stderr[-2000:]
    assert "input rows" in done.stdout


def test_python_m_melshards_train_runs_beside_a_users_train_py(hostile_dir, shards_dir, tmp_path):
    from tests.train.conftest import write_config

    cfg = write_config(
        tmp_path / "c.yaml", loop={"steps": 2, "steps_per_execution": 1, "checkpoint_every": 2, "log_every": 1}
    )
    done = _run(
        [
            sys.executable,
            "-m",
            "melshards",
            "train",
            str(shards_dir / "train-*.tfrecord"),
            "--model-dir",
            str(tmp_path / "m"),
            "--config",
            str(cfg),
        ],
        hostile_dir,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        json.loads((tmp_path / "m" / "run_summary.json").read_text())["model_factory"] == "melshards.train.model:build"
    )


def test_the_python_api_works_beside_a_users_train_and_preprocess_py(hostile_dir, shards_dir):
    code = (
        f"import melshards; ds = melshards.dataset({str(shards_dir / 'train-*.tfrecord')!r}, 2); "
        "batch = next(iter(ds)); print(sorted(batch[0] if isinstance(batch, tuple) else batch))"
    )
    done = _run([sys.executable, "-c", code], hostile_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mel" in done.stdout


def test_the_built_wheel_holds_one_top_level_package(tmp_path):
    import shutil

    src = tmp_path / "src"  # a copy: building in the checkout would leave build/ there
    for name in ("setup.py", "setup.cfg", "README.md"):
        shutil.copy(REPO / name, src / name) if src.exists() else (src.mkdir(), shutil.copy(REPO / name, src / name))
    for name in ("melshards", "preprocess", "train", "shards_schema"):
        # as the checkout holds them: melshards/{preprocess,train,shards_schema} are links to the folders
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    done = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(src),
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = tmp_path.glob("melshards-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert len(names) == len(set(names))  # each module once, not again through the links
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"melshards"}
    assert {
        "melshards/train/loop.py",
        "melshards/preprocess/pipeline.py",
        "melshards/shards_schema/schema.py",
        "melshards/commands/__init__.py",
    } <= set(names)
    top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["melshards"]


def test_a_model_dir_recorded_with_the_old_factory_name_still_names_the_built_in_model():
    from melshards.train.config import TrainConfig
    from melshards.train.contract import BUILTIN_FACTORY
    from melshards.train.plugins import load_factory

    cfg = TrainConfig(model={"factory": "train.model:build"})
    assert cfg.model_factory == BUILTIN_FACTORY
    assert load_factory(cfg.model_factory).__module__ == "melshards.train.model"
