"""`RangedFile`: what each read of a corpus file fetches (melshards.preprocess.inputs.ranged), on a local file whose
fetches are logged; the same policy fetches a gs:// object's ranges (tests/preprocess/test_gcs_reads.py)."""

from __future__ import annotations

import pytest

from melshards.preprocess.inputs.ranged import MAX_GROWN, RangedFile

DATA = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture
def path(tmp_path) -> str:
    (tmp_path / "f.bin").write_bytes(DATA)
    return str(tmp_path / "f.bin")


def _logged(f: RangedFile) -> list[tuple[int, int]]:
    """The (start, size) of every fetch `f` makes from here on."""
    log: list[tuple[int, int]] = []
    fetch = f._source.fetch
    f._source.fetch = lambda start, n: log.append((start, n)) or fetch(start, n)  # type: ignore[method-assign]
    return log


def test_an_exact_reader_fetches_what_each_read_asks_for_and_nothing_twice(path):
    with RangedFile(path, keep=1 << 20) as f:
        log = _logged(f)
        f.seek(1000)
        assert f.read(10) == DATA[1000:1010]
        f.seek(1005)
        assert f.read(20) == DATA[1005:1025]  # 1005-1009 held: only 1010-1024 fetched
        f.seek(-3, 2)
        assert f.read(10) == DATA[-3:]  # cut at the end
        assert f.read(5) == b""
    assert log == [(1000, 10), (1010, 15), (len(DATA) - 3, 3)]


def test_a_reader_with_a_least_fetch_fetches_that_much_where_a_read_misses(path):
    with RangedFile(path, min_fetch=2048) as f:
        log = _logged(f)
        assert f.read(512) == DATA[:512]
        f.seek(1536)
        assert f.read(512) == DATA[1536:2048]  # in the first fetch
        f.seek(100_000)
        assert f.read(4096) == DATA[100_000:104_096]  # a read larger than the least fetch: itself
    assert log == [(0, 2048), (100_000, 4096)]


def test_a_growing_reader_doubles_its_fetches_while_the_reads_go_on_and_starts_again_elsewhere(path):
    with RangedFile(path, min_fetch=1024, keep=1 << 20, grow=True) as f:
        log = _logged(f)
        got = b"".join(f.read(512) for _ in range(14))  # 7 KiB read on: fetches of 1, 2, 4 KiB
        f.seek(500_000)
        f.read(10)
    assert got == DATA[: 14 * 512]
    assert log == [(0, 1024), (1024, 2048), (3072, 4096), (500_000, 1024)]
    assert MAX_GROWN == 1 << 20


def test_a_miss_inside_the_expected_span_fetches_up_to_its_end_and_past_it_grows_from_the_least(path):
    with RangedFile(path, min_fetch=1024, keep=1 << 20, grow=True) as f:
        log = _logged(f)
        f.read(100)  # the header
        f.expect(10_000, 50_000)
        f.seek(12_000)
        assert f.read(8192) == DATA[12_000:20_192]
        f.seek(49_000)
        assert f.read(3000) == DATA[49_000:52_000]
    assert log == [(0, 1024), (12_000, 38_000), (50_000, 2000)]


def test_a_reader_lets_the_oldest_fetches_go_past_what_it_keeps(path):
    with RangedFile(path, keep=2500) as f:
        log = _logged(f)
        for start in (0, 10_000, 20_000, 0):
            f.seek(start)
            f.read(1000)
    assert log == [(0, 1000), (10_000, 1000), (20_000, 1000), (0, 1000)]  # 0 let go for 20,000, and read again
    with RangedFile(path, keep=2500) as f:
        log = _logged(f)
        for start in (0, 10_000, 0):
            f.seek(start)
            f.read(1000)
    assert log == [(0, 1000), (10_000, 1000)]  # within what it keeps: not fetched again


def test_a_file_shorter_than_its_size_said_is_an_io_error_naming_it(path):
    with RangedFile(path) as f:
        with open(path, "r+b") as w:
            w.truncate(1000)
        f.seek(2000)
        with pytest.raises(OSError, match="f.bin: 0 bytes at 2000, expected 10"):
            f.read(10)
