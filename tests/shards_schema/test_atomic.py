"""atomic_write: a file is written whole or not at all; the old file stays until the new one is whole;
nothing is left behind when the write fails."""

from __future__ import annotations

import os

import pytest

from melshards.shards_schema.atomic import atomic_write


def test_the_new_content_replaces_the_old_whole_and_no_temp_file_is_left(tmp_path):
    path = tmp_path / "run.json"
    path.write_bytes(b"old")
    with atomic_write(str(path)) as f:
        f.write(b"new ")
        assert path.read_bytes() == b"old"  # while the write is under way, a reader finds the old file
        f.write(b"content")
    assert path.read_bytes() == b"new content"
    assert os.listdir(tmp_path) == ["run.json"]


def test_a_new_file_is_not_there_until_it_is_whole(tmp_path):
    path = tmp_path / "new.txt"
    with atomic_write(str(path)) as f:
        f.write(b"part")
        assert not path.exists()
    assert path.read_bytes() == b"part"


def test_a_write_that_fails_leaves_the_old_file_and_removes_the_temp_file(tmp_path):
    path = tmp_path / "report.txt"
    path.write_bytes(b"old")
    with pytest.raises(OSError, match="disk full"):
        with atomic_write(str(path)) as f:
            f.write(b"half of the new")
            raise OSError("disk full")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["report.txt"]


def test_the_temp_name_given_is_the_one_written_and_renamed(tmp_path):
    (tmp_path / "temp").mkdir()
    path, temp = tmp_path / "stats.json", tmp_path / "temp" / "stats.json.writing"
    with atomic_write(str(path), temp=str(temp)) as f:
        f.write(b"{}")
        assert temp.exists()
    assert path.read_bytes() == b"{}" and not temp.exists()


def test_a_missing_directory_is_an_error_and_nothing_is_made(tmp_path):
    path = tmp_path / "gone" / "file"
    with pytest.raises(FileNotFoundError):
        with atomic_write(str(path)) as f:
            f.write(b"x")
    assert os.listdir(tmp_path) == []


def test_sync_puts_the_data_on_disk_before_the_rename(tmp_path, monkeypatch):
    path = tmp_path / "journal"
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(path.exists()))
    with atomic_write(str(path), sync=True) as f:
        f.write(b"x")
    assert synced == [False] and path.read_bytes() == b"x"
    with atomic_write(str(path)) as f:
        f.write(b"y")
    assert synced == [False]  # without sync, no fsync


def test_it_writes_through_beams_file_systems_as_preprocess_passes_them(tmp_path):
    from apache_beam.io.filesystems import FileSystems

    path = tmp_path / "entries" / "batch.keys"  # FileSystems.create makes the directory
    with atomic_write(str(path), fs=FileSystems) as f:
        f.write(b"a\n")
    assert path.read_bytes() == b"a\n" and os.listdir(path.parent) == ["batch.keys"]
    with pytest.raises(ValueError):
        with atomic_write(str(path), fs=FileSystems) as f:
            f.write(b"b\n")
            raise ValueError("the data is bad")
    assert path.read_bytes() == b"a\n" and os.listdir(path.parent) == ["batch.keys"]
