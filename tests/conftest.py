"""Shared fixtures: the shipped corpus, and one preprocessing run reused by every test package."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "ljspeech_tiny"
TINY_CONFIG = REPO / "configs" / "ljspeech_tiny.yaml"


@pytest.fixture(autouse=True)
def sigint_as_it_was():
    """Every test leaves Ctrl-C as it found it: the subprocesses later tests start inherit an ignored
    SIGINT, and the preprocess tests that interrupt a run (tests/preprocess/test_output.py) need it."""
    before = signal.getsignal(signal.SIGINT)
    yield
    if signal.getsignal(signal.SIGINT) is not before and before is not None:
        signal.signal(signal.SIGINT, before)


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    return CORPUS


@pytest.fixture(scope="session")
def shards_dir(tmp_path_factory) -> Path:
    """Shards, schema.json, stats.json and rejected.jsonl from the shipped corpus (in-process runner),
    in one length bucket (`--buckets 1`: the demo config's `auto` makes four, see `bucketed_dir`).

    Read-only for tests: copy it before changing anything.
    """
    from melshards.commands.preprocess import run

    out = tmp_path_factory.mktemp("shards")
    code = run(["--input", str(CORPUS), "--output", str(out), "--config", str(TINY_CONFIG), "--overwrite",
                "--workers", "1", "--buckets", "1"])
    assert code == 0, f"preprocess exited with {code}"
    return out


@pytest.fixture(scope="session")
def bucketed_dir(tmp_path_factory) -> Path:
    """The shipped corpus preprocessed into 4 length buckets (`--buckets 4`, what the demo config's
    `auto` gives: min_bucket_records 8 merges the rest). Read-only for tests."""
    from melshards.commands.preprocess import run

    out = tmp_path_factory.mktemp("bucketed")
    code = run(["--input", str(CORPUS), "--output", str(out), "--config", str(TINY_CONFIG), "--buckets", "4"])
    assert code == 0, f"preprocess exited with {code}"
    return out
