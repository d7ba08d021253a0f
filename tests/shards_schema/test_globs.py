"""Shard globs: a directory whose name holds glob brackets is named, with the pattern that reads it."""

from __future__ import annotations

import pytest

from melshards.shards_schema.shards import InputError, escape_dir, expand_globs


def test_brackets_in_the_directory_part_are_escaped_and_the_file_name_glob_kept():
    assert escape_dir("/out/run[1]/train-*.tfrecord") == "/out/run[[]1[]]/train-*.tfrecord"
    assert escape_dir("gs://b/x]/val-[0-9]*.tfrecord") == "gs://b/x[]]/val-[0-9]*.tfrecord"
    assert escape_dir("train-*.tfrecord") == "train-*.tfrecord"


def test_a_glob_into_a_bracketed_directory_says_how_to_spell_it_and_that_spelling_reads(tmp_path):
    run = tmp_path / "run[1]"
    run.mkdir()
    (run / "train-b00-00000-of-00001.tfrecord").write_bytes(b"")
    pattern = f"{run}/train-*.tfrecord"
    with pytest.raises(InputError, match=r"for a directory whose name holds them pass '.*run\[\[\]1\[\]\]/train-\*"):
        expand_globs([pattern])
    assert expand_globs([escape_dir(pattern)]) == [str(run / "train-b00-00000-of-00001.tfrecord")]
