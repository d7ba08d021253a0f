"""The distribution owns one import name, `melshards`: a TTS repository's own train.py, preprocess.py or
shards_schema.py (almost every one has the first two) never shadows a part of it. The same process shows,
first, that the trainer's input pipeline imports no Beam (a rule of tests/test_layering.py)."""

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


# In one process started in a directory holding a hostile train.py, preprocess.py and shards_schema.py (on
# sys.path first, as for `python -m melshards` or a user's PYTHONPATH=.): first the trainer's input pipeline
# and loop alone (the top-level packages in sys.modules then: tests/test_layering.py's rule that the trainer
# imports no Beam), then every module of ours, every command the CLI resolves by name, the model factory named
# by the default config, `python -m melshards stats`, and a batch of the Python API. Imports inside functions
# are tests/test_layering.py's (no import spells a folder name).
BESIDE_A_USERS_FILES = """
import sys
import melshards.train.input_pipeline, melshards.train.loop
train_alone = sorted({name.split(".")[0] for name in sys.modules})
import click, importlib, json, pkgutil, runpy
import melshards
modules = []
for top in ("melshards", "melshards.shards_schema", "melshards.preprocess", "melshards.train"):  # setup.cfg maps 4
    found = pkgutil.walk_packages(importlib.import_module(top).__path__, top + ".")
    modules += [m.name for m in found if m.name != "melshards.__main__" and m.name not in modules]
for name in modules:
    importlib.import_module(name)
from melshards.commands import cli
ctx = click.Context(cli)
commands = {name: type(cli.get_command(ctx, name)).__name__ for name in cli.list_commands(ctx)}
from melshards.train.config import TrainConfig
from melshards.train.plugins import load_factory
factory = load_factory(TrainConfig().model_factory).__module__
sys.argv = ["melshards", "stats", SHARDS]
try:
    runpy.run_module("melshards", run_name="__main__", alter_sys=True)
except SystemExit as e:
    assert not e.code, e.code
batch = next(iter(melshards.dataset(SHARDS + "/train-*.tfrecord", 2)))
batch = batch[0] if isinstance(batch, tuple) else batch
report = {"train_alone": train_alone, "modules": modules, "commands": commands, "factory": factory}
print(json.dumps({**report, "batch": sorted(batch)}))
"""


@pytest.fixture(scope="module")
def beside_a_users_files(hostile_dir, shards_dir) -> subprocess.CompletedProcess:
    """BESIDE_A_USERS_FILES run in `hostile_dir`: the finished process."""
    code = BESIDE_A_USERS_FILES.replace("SHARDS", repr(str(shards_dir)))
    return _run([sys.executable, "-c", code], hostile_dir)


def _report(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0 and "hostile" not in done.stderr, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_trainers_input_pipeline_imports_no_beam(beside_a_users_files):
    train_alone = _report(beside_a_users_files)["train_alone"]
    assert "melshards" in train_alone and "tensorflow" in train_alone, "the trainer's modules were not imported"
    assert "apache_beam" not in train_alone


def test_every_module_command_the_default_model_and_the_api_load_beside_a_users_train_and_preprocess_py(
    beside_a_users_files,
):
    done = beside_a_users_files
    found = _report(done)
    assert "input rows" in done.stdout, "python -m melshards stats printed no report"
    assert {"melshards.train.loop", "melshards.preprocess.job.pipeline", "melshards.shards_schema.schema"} <= set(
        found["modules"]
    ), "not every half of melshards was imported"
    assert set(found["commands"]) == {"preprocess", "train", "synthesize", "stats", "inspect", "cache"}
    assert found["factory"] == "melshards.train.model", "the default model factory"
    assert "mel" in found["batch"], "the Python API's batch"


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
    # every module of the checkout, the subpackages' (setup.cfg lists each package) as the folders' own
    folders = {
        "melshards": "melshards",
        **{f"melshards/{half}": half for half in ("preprocess", "train", "shards_schema")},
    }
    modules = {f"{name}/{p.relative_to(REPO / f)}" for name, f in folders.items() for p in (REPO / f).rglob("*.py")}
    assert modules - set(names) == set()
    assert {"melshards/train/loop.py", "melshards/preprocess/job/pipeline.py"} <= modules
    top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["melshards"]


def test_a_model_dir_recorded_with_the_old_factory_name_still_names_the_built_in_model():
    from melshards.train.config import TrainConfig
    from melshards.train.contract import BUILTIN_FACTORY
    from melshards.train.plugins import load_factory

    cfg = TrainConfig(model={"factory": "train.model:build"})
    assert cfg.model_factory == BUILTIN_FACTORY
    assert load_factory(cfg.model_factory).__module__ == "melshards.train.model"
