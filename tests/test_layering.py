"""The import rules of docs/architecture.md: the contract at the bottom, the two halves apart, the CLI on top."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OURS = ("shards_schema", "preprocess", "train", "melshards")
# package -> top-level modules it must never import (at module level or inside a function)
FORBIDDEN = {
    "shards_schema": {"apache_beam", "preprocess", "train", "melshards"},
    "preprocess": {"train", "melshards", "tensorflow", "keras"},
    "train": {"preprocess", "melshards", "apache_beam"},
}


def imported_roots(path: Path) -> set[str]:
    """Top-level names of every import statement in a module, wherever it stands."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_nothing_above_or_beside_it(package):
    offences = {str(p.relative_to(REPO)): sorted(imported_roots(p) & FORBIDDEN[package])
                for p in (REPO / package).rglob("*.py")}
    assert {p: bad for p, bad in offences.items() if bad} == {}


def test_rule_checker_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from apache_beam.io import fileio\n    import train.loop\n")
    assert imported_roots(module) == {"apache_beam", "train"}


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, cwd=REPO, check=True).stdout
    return {m.split(".")[0] for m in out.split()}


def test_the_trainers_input_pipeline_imports_no_beam():
    assert "apache_beam" not in _modules_after("import train.input_pipeline, train.loop")


def test_the_beam_job_imports_no_tensorflow():
    assert "tensorflow" not in _modules_after("import preprocess.pipeline, preprocess.run")


def test_melshards_help_and_stats_import_no_tensorflow(shards_dir):
    mods = _modules_after(
        "from melshards.cli import cli\n"
        "for args in (['--help'], ['stats', '--help'], ['stats', %r]):\n"
        "    try:\n"
        "        cli.main(args=args, standalone_mode=False)\n"
        "    except SystemExit:\n"
        "        pass\n" % str(shards_dir))
    assert "tensorflow" not in mods and "melshards" in mods
