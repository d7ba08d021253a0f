"""The import rules of docs/architecture.md: the contract at the bottom, the two halves apart, the CLI on top,
and inside preprocess/ its rooms in the order the data flows through them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The distribution's one import name is `melshards`; its three halves live in the repository's
# top-level folders of the same names (setup.cfg maps them). `melshards` alone is the top: the
# commands, the reports and the API.
HALVES = ("shards_schema", "preprocess", "train")
# package -> the packages of ours and the libraries it must never import (at module level or inside a function)
FORBIDDEN = {
    "melshards.shards_schema": {"apache_beam", "melshards.preprocess", "melshards.train", "melshards"},
    "melshards.preprocess": {"melshards.train", "melshards", "tensorflow", "keras"},
    "melshards.train": {"melshards.preprocess", "melshards", "apache_beam"},
}


def package_of(module: str) -> str:
    """`melshards.train.loop` -> `melshards.train`; `melshards.commands` -> `melshards`; `numpy.linalg` -> `numpy`."""
    parts = module.split(".")
    if parts[0] == "melshards":
        return f"melshards.{parts[1]}" if len(parts) > 1 and parts[1] in HALVES else "melshards"
    return parts[0]


def imported_roots(path: Path) -> set[str]:
    """The package (ours: which of the four; others: the top-level name) of every import statement in a
    module, wherever it stands."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {package_of(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "melshards" else [f"melshards.{a.name}" for a in node.names]
            roots |= {package_of(n) for n in names}
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_nothing_above_or_beside_it(package):
    folder = REPO / package.split(".")[1]
    offences = {str(p.relative_to(REPO)): sorted(imported_roots(p) & FORBIDDEN[package]) for p in folder.rglob("*.py")}
    assert {p: bad for p, bad in offences.items() if bad} == {}


def test_no_module_imports_the_halves_by_their_folder_names():
    """`import train` would find a user's own train.py first: every import of ours goes through `melshards`."""
    offences = {
        str(p.relative_to(REPO)): sorted(imported_roots(p) & set(HALVES))
        for folder in (*HALVES, "melshards", "tests", "benchmarks", "examples", "scripts")
        for p in (REPO / folder).rglob("*.py")
    }
    assert {p: bad for p, bad in offences.items() if bad} == {}


def imported_modules(path: Path) -> set[str]:
    """The full dotted name of every module a module imports (`from melshards import api` -> `melshards.api`)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_reports_and_the_api_import_no_command():
    """Inside `melshards`, the commands sit on top: the reports and the public API never import them."""
    paths = [
        *(REPO / "melshards" / "reports").rglob("*.py"),
        REPO / "melshards" / "api.py",
        REPO / "melshards" / "__init__.py",
    ]
    offences = {
        str(p.relative_to(REPO)): sorted(
            m for m in imported_modules(p) if m == "melshards.commands" or m.startswith("melshards.commands.")
        )
        for p in paths
    }
    assert {p: bad for p, bad in offences.items() if bad} == {}


# preprocess/'s rooms, bottom to top: each imports only the rooms below it (and the modules directly in
# preprocess/: the config, Beam's options, the worker processes, which import no room).
ROOMS = ("out_dir", "inputs", "clip", "stats", "write", "job")
# (importing module, imported module): the arrows that still point up, each with why. The test fails when
# one is gone too, so the list shrinks with them.
UPWARD = {
    # the filter's rule (`clips.filter_rejection`) sits beside the measuring: the speaker rule and the quality rules
    ("preprocess/clip/clips.py", "melshards.preprocess.stats.quality_rules"),
    ("preprocess/clip/clips.py", "melshards.preprocess.stats.tables"),
    # each clip's feature summary for the statistics (`feature_stats.clip_summary`) is made where it is measured
    ("preprocess/clip/measure_stage.py", "melshards.preprocess.stats.feature_stats"),
    # reading a measured batch back applies its duplicate verdicts (`quality_rules.mark_duplicates`)
    ("preprocess/out_dir/batch_files.py", "melshards.preprocess.stats.quality_rules"),
}


def room_of(module: str) -> int | None:
    """The floor of a module of ours inside preprocess/: 0 for the modules directly in it, 1 + the room's
    index for a room's modules; None for any other module."""
    parts = module.split(".")
    if parts[:2] != ["melshards", "preprocess"]:
        return None
    return 1 + ROOMS.index(parts[2]) if len(parts) > 3 and parts[2] in ROOMS else 0


def module_files(path: Path) -> set[str]:
    """The modules of preprocess/ a module imports, as dotted names: each imported name that is a module file
    (`from melshards.preprocess.stats import tables` -> `melshards.preprocess.stats.tables`; not the room's
    package, nor a function or class imported from a module)."""
    return {
        m
        for m in imported_modules(path)
        if room_of(m) is not None and (REPO / "preprocess" / Path(*m.split(".")[2:])).with_suffix(".py").is_file()
    }


def upward_imports(path: Path) -> set[tuple[str, str]]:
    """(module, imported module) for each import of a module of preprocess/ that points to a room above its own."""
    name = ".".join(("melshards", *path.relative_to(REPO).with_suffix("").parts))
    return {(str(path.relative_to(REPO)), m) for m in module_files(path) if room_of(m) > room_of(name)}


def test_preprocess_rooms_import_only_the_rooms_below_them():
    rooms = {p.name for p in (REPO / "preprocess").iterdir() if (p / "__init__.py").is_file()}
    assert rooms == set(ROOMS), "a room of preprocess/ that ROOMS does not place, or a room gone"
    assert {arrow for p in (REPO / "preprocess").rglob("*.py") for arrow in upward_imports(p)} == UPWARD


def test_the_room_checker_sees_an_arrow_up_even_inside_a_function(tmp_path, monkeypatch):
    module = tmp_path / "preprocess" / "inputs" / "m.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "from melshards.preprocess.config import load_config\n"
        "from melshards.preprocess.out_dir import lock\n"
        "def f():\n    from melshards.preprocess.write.report import build_stats\n"
        "    from melshards.preprocess.clip import audio\n"
    )
    for name in ("config.py", "out_dir/lock.py", "write/report.py", "clip/audio.py"):
        (tmp_path / "preprocess" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "preprocess" / name).touch()
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert upward_imports(module) == {
        ("preprocess/inputs/m.py", "melshards.preprocess.write.report"),
        ("preprocess/inputs/m.py", "melshards.preprocess.clip.audio"),
    }


def test_rule_checker_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from apache_beam.io import fileio\n    import melshards.train.loop\n"
        "    from melshards import preprocess\n"
        "    from melshards.commands import main\n    import train\n"
    )
    assert imported_roots(module) == {"apache_beam", "melshards.train", "melshards.preprocess", "melshards", "train"}


# That the trainer's input pipeline imports no Beam is checked in the one process of
# tests/test_import_name.py that imports every module of ours (the trainer's modules first, before anything
# else): one TensorFlow import for both checks.


def test_the_beam_job_melshards_help_and_stats_import_no_tensorflow(shards_dir):
    # one process: the job's modules first, then the CLI's; each step notes whether TensorFlow was in by then
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "import melshards.preprocess.job.pipeline, melshards.preprocess.job.run\n"
            "print('job:', 'tensorflow' in sys.modules)\n"
            "from melshards.commands import cli\n"
            f"for args in (['--help'], ['stats', '--help'], ['stats', {str(shards_dir)!r}]):\n"
            "    try:\n"
            "        cli.main(args=args, standalone_mode=False)\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print('cli:', 'tensorflow' in sys.modules)\n"
            "print('melshards:', 'melshards' in sys.modules)\n",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout.splitlines()
    assert "job: False" in out, "the Beam job imported TensorFlow"
    assert "cli: False" in out, "melshards --help or stats imported TensorFlow"
    assert "melshards: True" in out
