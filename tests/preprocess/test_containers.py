"""Corpora whose clips live inside bigger files: Hugging Face parquet exports, WebDataset tars, and
manifests of segments of long recordings (`melshards.preprocess.inputs.packed_clips`), read from fixtures
written here (pyarrow writes the parquet, tarfile the tars, soundfile the audio)."""

from __future__ import annotations

import csv
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
import yaml

from melshards.preprocess.clip import cache
from melshards.preprocess.clip.clips import ClipRejected, load_decoded
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.inputs import packed_clips, read_stage
from melshards.preprocess.inputs.manifests import manifest_rows
from melshards.preprocess.inputs.merge import input_name
from melshards.preprocess.inputs.read_stage import batches
from melshards.preprocess.inputs.rows import CorpusError, LayoutRows
from melshards.preprocess.inputs.rows import row as make_row
from melshards.preprocess.inputs.sources import (
    check_rows_file,
    count_input_rows,
    detect_corpus,
    read_input,
    unused_columns,
)
from melshards.preprocess.inputs.working_set import WorkingSet
from melshards.preprocess.out_dir.batch_files import read_rows
from tests.conftest import QUALITY_RULES_OFF
from tests.preprocess.conftest import encode, tone

SR = 22050
# (id, speaker, text, seconds, hz): the utterances every form ships
CLIPS = [
    ("u1", "A", "the first one", 0.8, 220.0),
    ("u2", "B", "a second clip", 1.1, 330.0),
    ("u3", "A", "and the third", 0.9, 262.0),
    ("u4", "B", "number four here", 1.3, 196.0),
]
GAP_S = 0.5  # silence between the utterances of the long recording


def _clip(seconds: float, hz: float) -> np.ndarray:
    return tone(seconds, SR, hz)


def write_wav_manifest(root: Path) -> Path:
    (root / "wavs").mkdir(parents=True)
    with open(root / "clips.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "audio", "text", "speaker", "language"])
        for cid, spk, text, secs, hz in CLIPS:
            sf.write(root / "wavs" / f"{cid}.wav", _clip(secs, hz), SR)
            out.writerow([cid, f"wavs/{cid}.wav", text, spk, "en"])
    return root / "clips.csv"


def write_parquet(path: Path, fmt: str = "FLAC", bad: bool = True) -> Path:
    """An HF `datasets` export: audio {bytes, path}, text, speaker_id, language, id, and a column no
    field reads (`snr`); with `bad`, a row with null bytes and one with bytes no decoder reads."""
    ext = fmt.lower()
    audio = [{"bytes": encode(_clip(s, hz), SR, fmt), "path": f"{cid}.{ext}"} for cid, _, _, s, hz in CLIPS]
    ids, speakers, texts = [c[0] for c in CLIPS], [c[1] for c in CLIPS], [c[2] for c in CLIPS]
    if bad:
        audio += [{"bytes": None, "path": "nul.flac"}, {"bytes": b"not audio" * 50, "path": "junk.flac"}]
        ids, speakers, texts = ids + ["nul", "junk"], speakers + ["A", "A"], texts + ["null bytes", "junk bytes"]
    table = pa.table(
        {
            "audio": pa.array(audio, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            "id": ids,
            "text": texts,
            "speaker_id": speakers,
            "language": ["en"] * len(ids),
            "snr": [30.0] * len(ids),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=2)  # several row groups: rows are found across them
    return path


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_tar(path: Path, fmt: str = "FLAC", bad: bool = True) -> Path:
    """Emilia-style WebDataset shard: KEY.<audio> + KEY.json {id, text, speaker, language, duration};
    with `bad`, a .json without audio and an audio member without .json."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ext = fmt.lower()
    with tarfile.open(path, "w") as tar:
        for cid, spk, text, secs, hz in CLIPS:
            meta = {"id": cid, "text": text, "speaker": spk, "language": "en", "duration": secs, "dnsmos": 3.2}
            _add(tar, f"{cid}.{ext}", encode(_clip(secs, hz), SR, fmt))
            _add(tar, f"{cid}.json", json.dumps(meta).encode())
        if bad:
            _add(tar, "lonely.json", json.dumps({"id": "lonely", "text": "no audio", "speaker": "A"}).encode())
            _add(tar, f"mute.{ext}", encode(_clip(0.5, 440.0), SR, fmt))
    return path


def write_long(root: Path, bad: bool = True) -> Path:
    """One long recording holding every utterance (GAP_S of silence between them) and a manifest of
    their segments; with `bad`: a segment past the recording's end, one with end <= start, one
    overlapping an earlier one."""
    root.mkdir(parents=True, exist_ok=True)
    pieces, rows, t = [], [], 0.0
    for cid, spk, text, secs, hz in CLIPS:
        y = _clip(secs, hz)
        pieces += [np.zeros(int(GAP_S * SR), np.float32), y]
        start = t + GAP_S
        rows.append([cid, "session.flac", text, spk, "en", f"{start:.6f}", f"{start + y.size / SR:.6f}"])
        t = start + y.size / SR
    whole = np.concatenate([*pieces, np.zeros(int(GAP_S * SR), np.float32)])
    sf.write(root / "session.flac", whole, SR)
    if bad:
        end = whole.size / SR
        rows += [
            ["past", "session.flac", "beyond the end", "A", "en", f"{end - 0.2:.3f}", f"{end + 1:.3f}"],
            ["empty", "session.flac", "nothing", "A", "en", "2.0", "2.0"],
            ["over", "session.flac", "overlapping", "A", "en", rows[0][5], rows[1][6]],
        ]
    with open(root / "segments.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "audio", "text", "speaker", "language", "start", "end"])
        out.writerows(rows)
    return root / "segments.csv"


# -- reading, rows and rejections ---------------------------------------------------------------
def test_a_parquet_export_is_recognised_and_read_without_its_audio_bytes(tmp_path):
    path = write_parquet(tmp_path / "hf" / "data" / "train-00000-of-00001.parquet")
    for given in (path, tmp_path / "hf"):
        corpus = detect_corpus(str(given))
        assert corpus.kind == "parquet"
    read = read_input(detect_corpus(str(tmp_path / "hf"), language="en"))
    assert [r["id"] for r in read.rows] == ["u1", "u2", "u3", "u4", "nul", "junk"]
    assert [r["speaker"] for r in read.rows[:4]] == ["A", "B", "A", "B"]  # from speaker_id
    assert read.rows[3]["locator"] == {"parquet": "audio", "row_group": 1, "index": 1}
    assert unused_columns(corpus) == ["snr"]


def test_a_parquet_export_without_a_language_or_text_column_stops_the_run_until_named(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"audio": [b"x"], "sentence_raw": ["hello"], "lang": ["de"]}), path)
    with pytest.raises(CorpusError, match="no text .*--column text=NAME"):
        check_rows_file(detect_corpus(str(path)))
    corpus = detect_corpus(str(path), columns=["text=sentence_raw"])
    check_rows_file(corpus)  # lang is a language column HF exports use
    assert [(r["text"], r["language"]) for r in read_input(corpus).rows] == [("hello", "de")]
    pq.write_table(pa.table({"audio": [b"x"], "text": ["hello"]}), path)
    with pytest.raises(CorpusError, match="no language .*--language"):
        check_rows_file(detect_corpus(str(path)))


def test_parquet_rows_with_null_or_undecodable_bytes_are_rejected_with_their_reason(tmp_path):
    path = str(write_parquet(tmp_path / "a.parquet"))
    rows = {r["id"]: r for r in LayoutRows.of(packed_clips.parquet_rows(path, 0)).rows}
    cfg = PreprocessConfig()
    assert load_decoded(path, cfg, rows["u2"]["locator"]).size > SR
    with pytest.raises(ClipRejected) as null:
        load_decoded(path, cfg, rows["nul"]["locator"])
    with pytest.raises(ClipRejected) as junk:
        load_decoded(path, cfg, rows["junk"]["locator"])
    assert (null.value.reason, junk.value.reason) == ("missing_audio", "unreadable_audio")
    assert "null" in null.value.detail


def test_parquet_rows_whose_audio_column_holds_no_bytes_are_rejected_not_fatal(tmp_path):
    path = tmp_path / "paths.parquet"  # an export whose audio column holds file names, not the files
    pq.write_table(pa.table({"audio": ["a.wav", "b.wav"], "text": ["hello", "there"]}), path)
    read = LayoutRows.of(packed_clips.parquet_rows(str(path), 0))
    assert read.rows == []
    assert [r["reason"] for r in read.rejected] == ["missing_audio", "missing_audio"]
    assert "column audio holds string, not encoded audio" in read.rejected[0]["detail"]


def test_a_tar_sample_without_its_audio_or_its_json_is_rejected(tmp_path):
    path = str(write_tar(tmp_path / "shards" / "000000.tar"))
    assert detect_corpus(str(tmp_path / "shards")).kind == "webdataset"
    read = LayoutRows.of(packed_clips.tar_rows(path, 0))
    assert [r["id"] for r in read.rows] == ["u1", "u2", "u3", "u4"]
    assert {(r["id"], r["reason"]) for r in read.rejected} == {("lonely", "missing_audio"), ("mute", "missing_text")}
    assert unused_columns(detect_corpus(str(tmp_path / "shards"))) == ["duration", "dnsmos"]
    member = read.rows[1]["locator"]
    assert packed_clips.clip_bytes(path, member)[:4] == b"fLaC"


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_the_tar_scan_finds_the_members_tarfile_finds_at_the_same_offsets(tmp_path, fmt):
    long = "d" * 60 + "/" + "k" * 70  # past ustar's 100-byte name: a pax record, a GNU long name or a prefix
    path = tmp_path / "x.tar"
    with tarfile.open(path, "w", format=fmt) as tar:
        d = tarfile.TarInfo("sub")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        link = tarfile.TarInfo("sub/l.json")
        link.type, link.linkname = tarfile.SYMTYPE, "a.json"
        tar.addfile(link)
        for name, data in (("a.json", b"{}"), ("a.flac", b"x" * 513), (f"{long}.json", b"{}"), ("e.wav", b"")):
            _add(tar, name, data)
    with tarfile.open(path) as tar:
        expected = [(m.name, m.size, m.offset_data) for m in tar if m.isfile()]
    found = [
        (m.name, m.size, m.offset)
        for _key, members, _meta, _problem in packed_clips.tar_samples(str(path))
        for m in members.values()
    ]
    assert found == expected and len(found) == 4


@pytest.fixture
def opened(monkeypatch) -> list:
    """Every `RangedFile` containers opens from here on (its `fetched` bytes and `fetches` counted)."""
    made: list = []

    class Counted(packed_clips.RangedFile):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(packed_clips, "RangedFile", Counted)
    return made


def test_a_batch_of_tar_members_opens_the_tar_once_and_reads_each_members_bytes_alone(tmp_path, opened):
    path = str(write_tar(tmp_path / "000000.tar", bad=False))
    rows = LayoutRows.of(packed_clips.tar_rows(path, 0)).rows
    scan = opened.pop()
    with tarfile.open(path) as tar:
        expected = [tar.extractfile(r["locator"]["member"]).read() for r in rows]  # type: ignore[union-attr]
    got = [packed_clips.clip_bytes(path, r["locator"]) for r in rows]
    packed_clips.release_held()
    got.append(packed_clips.clip_bytes(path, rows[0]["locator"]))  # the next batch opens it again
    packed_clips.release_held()
    assert got == expected + expected[:1] and len(opened) == 2
    assert (opened[0].fetches, opened[0].fetched) == (len(rows), sum(map(len, expected)))  # each member once, alone
    # the scan fetched the headers and `.json` members, a few KB a sample, not the audio
    assert scan.fetched <= len(rows) * (packed_clips.TAR_SCAN_FETCH + 512) < sum(map(len, expected)), scan.fetched


def test_container_rows_go_to_the_workers_in_batches_the_batches_of_a_row_group_together(tmp_path, monkeypatch):
    monkeypatch.setattr(read_stage, "MAX_ROW_GROUP_BATCH", 3)
    parquet = [
        {"id": f"{g}-{i}", "audio": "a.parquet", "locator": {"parquet": "audio", "row_group": g, "index": i}}
        for g, n in ((0, 2), (1, 7), (2, 1))
        for i in range(n)
    ]
    tar = [
        {"id": f"t{k}", "audio": "a.tar", "locator": {"tar_offset": 512 * k, "size": 1, "member": f"{k}.flac"}}
        for k in range(5)
    ]
    grouped = [[(r["locator"]["row_group"], r["locator"]["index"]) for r in b] for b in batches(parquet, 5)]
    # a row group to a batch, even past `size`; one past MAX_ROW_GROUP_BATCH in batches of it
    assert grouped == [[(0, 0), (0, 1)], [(1, 0), (1, 1), (1, 2)], [(1, 3), (1, 4), (1, 5)], [(1, 6)], [(2, 0)]]
    assert [len(b) for b in batches(tar, 2)] == [2, 2, 1]
    # one worker is given the batches of a row group together, in order; other batches alone
    elements = list(read_stage.together(str(tmp_path), batches(parquet + tar, 2)))
    assert [[[r["id"] for r in read_rows(ref)] for ref in e] for e in elements] == [
        [["0-0", "0-1"]],
        [["1-0", "1-1", "1-2"], ["1-3", "1-4", "1-5"], ["1-6"]],
        [["2-0"]],
        [["t0", "t1"]],
        [["t2", "t3"]],
        [["t4"]],
    ]


def test_a_row_groups_audio_is_streamed_forward_a_few_rows_held_and_read_again_only_for_a_row_behind(
    tmp_path, monkeypatch
):
    path = str(tmp_path / "a.parquet")
    values = [f"clip {i}".encode() * 100 for i in range(40)]
    pq.write_table(pa.table({"audio": values, "text": ["t"] * 40}), path, row_group_size=40)
    streams: list = []
    real = packed_clips._GroupAudio
    monkeypatch.setattr(packed_clips, "_GroupAudio", lambda *a: streams.append(real(*a)) or streams[-1])
    rows = [0, 1, 9, 17, 39]  # the rows a worker measures of it, in its batches' order
    got = [packed_clips.clip_bytes(path, {"parquet": "audio", "row_group": 0, "index": i}) for i in rows]
    assert got == [values[i] for i in rows] and len(streams) == 1
    values_held = streams[0].values
    assert values_held is not None and len(values_held) == packed_clips.GROUP_STREAM_ROWS  # a few rows, not the group
    assert packed_clips.clip_bytes(path, {"parquet": "audio", "row_group": 0, "index": 3}) == values[3]
    assert len(streams) == 2  # a row behind the stream: the group read again from its start
    packed_clips.release_held()


def test_the_read_stage_scans_each_container_file_alone_and_reads_the_rows_from_the_scans(tmp_path):
    ds = tmp_path / "ds"
    write_tar(ds / "a.tar")
    write_tar(ds / "b.tar", bad=False)  # its ids repeat a.tar's: duplicate_id, the first tar's kept
    inputs = read_stage.named([detect_corpus(str(ds), language="en")])
    want = read_input(inputs[0])
    files = list(read_stage._ListFiles(inputs).process(None))
    assert files == [(0, 0, str(ds / "a.tar")), (0, 1, str(ds / "b.tar"))]  # one element per file
    (tmp_path / "temp").mkdir()
    scans = [s for f in reversed(files) for s in read_stage._ScanFile(inputs, str(tmp_path / "temp")).process(f)]
    write_tar(ds / "b.tar", fmt="WAV", bad=False)  # changed since its scan: the rows are the scan's
    out = list(read_stage._ReadRows(inputs, str(tmp_path / "temp"), str(tmp_path)).process(None, scans=scans))
    rows = [r for refs in out if isinstance(refs, list) for ref in refs for r in read_rows(ref)]
    rejected = [x.value for x in out if getattr(x, "tag", None) == read_stage.REJECTED]
    assert rows == [dict(r, input=0) for r in want.rows] and rejected == want.rejected
    assert [r["locator"]["member"] for r in rows] == ["u1.flac", "u2.flac", "u3.flac", "u4.flac"]
    assert (tmp_path / "input-rows.txt").read_text() == str(want.input_rows) == "10"  # the progress line's total


def test_a_webdatasets_rows_are_counted_before_the_job_from_its_sizes_and_its_first_samples_alone(tmp_path, opened):
    small = write_tar(tmp_path / "small" / "a.tar", bad=False)  # 4 samples: counted exactly
    assert count_input_rows(detect_corpus(str(small.parent), language="en")) == 4
    opened.clear()
    (tmp_path / "big").mkdir()
    for k in range(3):  # 3 tars of 40 samples of one size: 120, estimated from the first tar's first 32
        with tarfile.open(tmp_path / "big" / f"{k}.tar", "w") as tar:
            for i in range(40):
                _add(tar, f"s{k}-{i}.wav", b"x" * 3000)
                _add(tar, f"s{k}-{i}.json", b'{"text": "t"}')
    estimate = count_input_rows(detect_corpus(str(tmp_path / "big"), language="en"))
    assert 120 <= estimate <= 1.1 * 120  # each tar's end blocks and padding count as a bit more samples
    (f,) = opened  # the first tar alone, its first 33 samples' headers: a few KB each
    assert f.fetched <= 33 * (packed_clips.TAR_SCAN_FETCH + 512) < f.size / 2


def test_a_parquet_rows_audio_bytes_are_read_from_binary_large_binary_or_struct_columns(tmp_path):
    values = [b"one", None, b"", b"four"]
    for name, array in (
        ("binary", pa.array(values, pa.binary())),
        ("large", pa.array(values, pa.large_binary())),
        ("view", pa.array(values, pa.binary_view())),  # no offsets buffer: each row through Arrow's scalar
        (
            "struct",  # a null struct (row 1) and null bytes in a struct are both null
            pa.StructArray.from_arrays(
                [pa.array([b"one", b"x", None, b"four"], pa.binary()), pa.array(["p"] * 4)],
                names=["bytes", "path"],
                mask=pa.array([False, True, False, False]),
            ),
        ),
    ):
        path = str(tmp_path / f"{name}.parquet")
        pq.write_table(pa.table({"audio": array, "text": list("abcd")}), path, row_group_size=2)
        got = []
        for row in range(4):
            locator = {"parquet": "audio", "row_group": row // 2, "index": row % 2}
            try:
                got.append(packed_clips.clip_bytes(path, locator))
            except packed_clips.NoAudio as e:
                got.append(str(e))
        packed_clips.release_held()
        expected_empty = "the row's audio bytes are null" if name == "struct" else "the row's audio bytes are empty"
        assert got == [b"one", "the row's audio bytes are null", expected_empty, b"four"], name


@pytest.fixture
def footer_parses(monkeypatch):
    """The parquet footers parsed from here on (a ParquetFile opened without `metadata=`), with the
    process' kept footers forgotten before and after."""
    parsed: list[str] = []
    real = pq.ParquetFile

    def spy(source, *args, metadata=None, **kwargs):
        if metadata is None:
            parsed.append(str(source))
        return real(source, *args, metadata=metadata, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", spy)
    packed_clips.FOOTERS.clear()
    yield parsed
    packed_clips.FOOTERS.clear()


def _fetch_batch(path: str, group: int, rows: int) -> list[bytes]:
    got = [packed_clips.clip_bytes(path, {"parquet": "audio", "row_group": group, "index": i}) for i in range(rows)]
    packed_clips.release_held()  # the end of a batch, as Measure lets go
    return got


def test_a_worker_parses_a_parquet_footer_once_across_batches_and_again_once_the_file_changes(tmp_path, footer_parses):
    path = str(tmp_path / "a.parquet")
    pq.write_table(pa.table({"audio": [b"a0", b"a1", b"a2", b"a3"], "text": list("abcd")}), path, row_group_size=2)
    assert _fetch_batch(path, 0, 2) + _fetch_batch(path, 1, 2) == [b"a0", b"a1", b"a2", b"a3"]
    assert footer_parses == [path]
    # rewritten in place: other bytes, row groups of 3 (a stale footer would read the wrong rows)
    pq.write_table(pa.table({"audio": [b"b0", b"b1x", b"b2", b"b3"], "text": list("abcd")}), path, row_group_size=3)
    assert _fetch_batch(path, 0, 3) + _fetch_batch(path, 1, 1) == [b"b0", b"b1x", b"b2", b"b3"]
    assert footer_parses == [path, path]


def test_a_parquet_row_gone_from_its_file_since_it_was_listed_is_rejected_not_fatal(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"audio": [b"a0", b"a1", b"a2"], "text": list("abc")}), path, row_group_size=2)
    cfg = PreprocessConfig()
    for group, index in ((5, 0), (1, 1)):  # a row group or a row the file no longer has
        with pytest.raises(ClipRejected) as gone:
            load_decoded(str(path), cfg, {"parquet": "audio", "row_group": group, "index": index})
        packed_clips.release_held()
        assert gone.value.reason == "unreadable_audio" and "the file changed during the run" in gone.value.detail


def test_the_kept_footers_stay_within_their_budget_the_least_recently_used_let_go(tmp_path, footer_parses, monkeypatch):
    paths = [str(tmp_path / f"{name}.parquet") for name in "abc"]
    for p in paths:
        pq.write_table(pa.table({"audio": [p.encode()], "text": ["t"]}), p)
    size = pq.read_metadata(paths[0]).serialized_size
    monkeypatch.setattr(packed_clips, "FOOTER_CACHE_BYTES", 2 * size)  # two of these footers
    for p in (*paths, paths[2], paths[1], paths[0]):
        assert _fetch_batch(p, 0, 1) == [p.encode()]
    assert footer_parses == [*paths, paths[0]]  # c and b were kept; a, the oldest, was let go for c
    monkeypatch.setattr(packed_clips, "FOOTER_CACHE_BYTES", 0)  # below one footer: the last one read is kept
    assert _fetch_batch(paths[2], 0, 1) + _fetch_batch(paths[2], 0, 1) + _fetch_batch(paths[0], 0, 1) == [
        paths[2].encode(),
        paths[2].encode(),
        paths[0].encode(),
    ]
    assert footer_parses == [*paths, paths[0], paths[2], paths[0]]  # c alone kept, then a alone


def test_a_segment_past_its_recording_reversed_or_overlapping_is_rejected(tmp_path):
    manifest = write_long(tmp_path / "long")
    with WorkingSet() as working_set:
        items = packed_clips.refuse_overlaps(
            manifest_rows(manifest.read_text().splitlines(True), str(manifest), str(manifest.parent)), working_set
        )
        read = LayoutRows.of(items)
    assert {(r["id"], r["reason"]) for r in read.rejected} == {
        ("empty", "bad_segment"),
        ("over", "overlapping_segment"),
    }
    past = next(r for r in read.rows if r["id"] == "past")
    with pytest.raises(ClipRejected) as e:
        load_decoded(past["audio"], PreprocessConfig(), past["locator"])
    assert e.value.reason == "bad_segment"


def test_a_segment_decodes_the_same_samples_as_the_clip_alone(tmp_path):
    manifest = write_long(tmp_path / "long", bad=False)
    row = read_input(detect_corpus(str(manifest), language="en")).rows[1]
    cfg = PreprocessConfig()
    got = load_decoded(row["audio"], cfg, row["locator"])
    alone = tmp_path / "u2.wav"
    sf.write(alone, _clip(CLIPS[1][3], CLIPS[1][4]), SR)  # 16-bit, as the FLAC recording holds it
    want = load_decoded(str(alone), cfg)
    assert got.size == want.size
    np.testing.assert_allclose(got, want, atol=1e-4)  # the DC offset removed is the mean of 16-bit samples


@pytest.mark.parametrize("fmt", ["WAV", "FLAC"])
def test_a_batchs_segments_of_one_recording_open_it_once_and_fetch_its_bytes_once(tmp_path, opened, fmt):
    y = np.concatenate([_clip(2.0, 150.0 + 20 * k) for k in range(12)])  # 24 s, a segment every 2 s
    sf.write(tmp_path / f"rec.{fmt.lower()}", y, SR, format=fmt)
    cfg = PreprocessConfig()
    spans = [(2.0 * k + 0.1, 2.0 * k + 1.9) for k in range(3, 9)]  # a batch's segments, in the middle
    for start, end in spans:
        got = load_decoded(str(tmp_path / f"rec.{fmt.lower()}"), cfg, {"start": start, "end": end})
        assert got.size == round((end - start) * cfg.audio.sample_rate)
    packed_clips.release_held()
    (f,) = opened
    size = (tmp_path / f"rec.{fmt.lower()}").stat().st_size
    span_bytes = size * (spans[-1][1] - spans[0][0]) / 24
    # the header, then each segment's bytes in a read or two; about the batch's span, not the recording
    assert f.fetches <= 2 + 2 * len(spans) and f.fetched <= 1.1 * span_bytes + 64 * 1024, (f.fetches, f.fetched)


def test_the_cache_key_tells_rows_members_and_segments_of_one_file_apart(tmp_path):
    parquet = str(write_parquet(tmp_path / "a.parquet", bad=False))
    tar = str(write_tar(tmp_path / "t" / "a.tar", bad=False))
    long = write_long(tmp_path / "long", bad=False)
    rows = [
        *LayoutRows.of(packed_clips.parquet_rows(parquet, 0)).rows,
        *LayoutRows.of(packed_clips.tar_rows(tar, 0)).rows,
        *read_input(detect_corpus(str(long), language="en")).rows,
    ]
    keys = {cache.clip_key(r["audio"], "s", r["locator"]) for r in rows}
    assert len(keys) == len(rows) == 3 * len(CLIPS)
    again = [cache.clip_key(r["audio"], "s", dict(r["locator"])) for r in rows]  # a re-run's rows
    assert again == [cache.clip_key(r["audio"], "s", r["locator"]) for r in rows]
    whole = cache.clip_key(str(long.parent / "session.flac"), "s")
    assert whole not in keys and whole == cache.clip_key(str(long.parent / "session.flac"), "s", None)


# -- field types, names and ids ------------------------------------------------------------------
def _json_tar(path: Path, samples: list[tuple[str, dict]]) -> Path:
    """A tar of KEY.flac (a few bytes: never decoded here) + KEY.json for each (key, json)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for key, meta in samples:
            _add(tar, f"{key}.flac", b"fLaC")
            _add(tar, f"{key}.json", json.dumps(meta).encode())
    return path


def test_a_text_that_is_not_a_string_is_a_rejected_row_never_read_as_its_repr(tmp_path):
    base = {"language": "en", "speaker": "A"}
    path = _json_tar(
        tmp_path / "t.tar",
        [
            ("good", {**base, "text": "fine", "speaker": 19}),  # a number is a label as written
            ("list", {**base, "text": ["a", "b"]}),
            ("number", {**base, "text": 42}),
            ("object", {**base, "text": {"en": "hi"}}),
            ("null", {**base, "text": None}),
            ("speakers", {**base, "text": "two speakers", "speaker": ["A", "B"]}),
            ("ids", {**base, "text": "an id list", "id": ["x"]}),
        ],
    )
    read = LayoutRows.of(packed_clips.tar_rows(str(path), 0))
    assert [(r["id"], r["text"], r["speaker"]) for r in read.rows] == [("good", "fine", "19")]
    got = {r["id"]: (r["reason"], r["detail"]) for r in read.rejected}
    assert {k: reason for k, (reason, _) in got.items()} == {
        "list": "malformed_row",
        "number": "malformed_row",
        "object": "malformed_row",
        "null": "missing_text",
        "speakers": "malformed_row",
        "ids": "malformed_row",
    }
    assert got["list"][1] == f"{path}: list: text (text) is a list, ['a', 'b'], not a string"
    assert "speaker (speaker) is a list" in got["speakers"][1] and "id (id) is a list" in got["ids"][1]
    parquet = tmp_path / "t.parquet"  # a parquet column of lists: every row
    pq.write_table(pa.table({"audio": [b"x", b"y"], "text": [["a", "b"], None]}), parquet)
    assert [r["reason"] for r in LayoutRows.of(packed_clips.parquet_rows(str(parquet), 0)).rejected] == [
        "malformed_row",
        "missing_text",
    ]


def test_parquet_and_tar_inputs_and_their_speaker_are_named_without_the_extension(tmp_path):
    assert [input_name(p) for p in ("/d/binary.parquet", "gs://b/EN-B000000.tar", "/d/x.TAR", "/d/x.tgz")] == [
        "binary",
        "EN-B000000",
        "x",
        "x.tgz",  # not an input this reads
    ]
    pq.write_table(pa.table({"audio": [b"x"], "text": ["hi"]}), tmp_path / "binary.parquet")
    tar = _json_tar(tmp_path / "shard-000.tar", [("k", {"text": "hi"})])
    for path, name in ((tmp_path / "binary.parquet", "binary"), (tar, "shard-000")):
        (r,) = read_input(detect_corpus(str(path), language="en")).rows
        assert r["speaker"] == name  # a corpus without speakers is one, named after the input


def _audio_structs(paths: list[str | None]) -> pa.Array:
    return pa.array(
        [{"bytes": b"x", "path": p} for p in paths], pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    )


def test_parquet_rows_without_an_id_get_unique_stable_ids_from_their_path_else_their_file_and_row(tmp_path):
    paths = ["spkA/001.wav", "spkB/001.wav", "./spkA/002.wav", "001.wav", "001.wav", "/home/me/x/003.wav"]
    (tmp_path / "ds" / "en").mkdir(parents=True)
    (tmp_path / "ds" / "de").mkdir()
    audio = _audio_structs(paths)  # `001.wav` twice: an export that kept base names only
    pq.write_table(pa.table({"audio": audio, "text": ["t"] * 6}), tmp_path / "ds" / "en" / "train.parquet")
    pq.write_table(pa.table({"audio": [b"x", b"y"], "text": ["t"] * 2}), tmp_path / "ds" / "de" / "train.parquet")
    corpus = detect_corpus(str(tmp_path / "ds"), language="en")
    read = read_input(corpus)
    ids = ["de/train-0", "de/train-1", "spkA/001", "spkB/001", "spkA/002", "001", "en/train-4", "003"]
    assert [r["id"] for r in read.rows] == ids and read.rejected == []
    assert [r["id"] for r in read_input(corpus).rows] == ids  # a re-run names each row alike


def _item(n: int, audio: str, span: tuple[float, float] | None = None) -> dict:
    item = make_row(f"r{n}", "t", audio, n)
    if span:
        item["locator"] = {"start": span[0], "end": span[1]}
    return item


def test_a_whole_file_row_overlaps_every_segment_of_its_recording_however_its_path_is_spelt(tmp_path):
    rec, other = str(tmp_path / "rec.wav"), str(tmp_path / "other.wav")
    items = [
        _item(0, rec),  # the whole recording: kept
        _item(1, f"{tmp_path}/./rec.wav", (1.0, 2.0)),  # inside it
        _item(2, other, (0.0, 1.0)),
        _item(3, f"{tmp_path}/sub/../other.wav"),  # the whole of it holds the segment before
        _item(4, rec),  # the same file twice is no overlap: the duplicate rules judge it
        _item(5, other, (1.0, 2.0)),  # touches the segment 0-1: kept
        _item(6, f"{tmp_path}//other.wav", (0.5, 1.5)),
        _item(7, "gs://b/x/r.flac", (0.0, 1.0)),
        _item(8, "gs://b/x/./r.flac", (0.5, 2.0)),  # another object: a URL is compared as written
        _item(9, "gs://b/x/r.flac", (0.9, 2.0)),
    ]
    with WorkingSet() as working_set:
        read = LayoutRows.of(packed_clips.refuse_overlaps(items, working_set))
    assert [r["id"] for r in read.rows] == ["r0", "r2", "r4", "r5", "r7", "r8"]
    assert {r["id"]: r["reason"] for r in read.rejected} == dict.fromkeys(
        ["r1", "r3", "r6", "r9"], "overlapping_segment"
    )
    details = {r["id"]: r["detail"] for r in read.rejected}
    assert details["r1"].endswith("overlaps the whole file, row 1")
    assert (
        details["r3"].startswith(f"row 4: the whole of {tmp_path}/sub/../other.wav")
        and "overlaps 0-1 s" in details["r3"]
    )


# -- container files that cannot be read ---------------------------------------------------------
def _tar_bytes(names: list[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in names:
            _add(tar, name, b'{"text": "hi"}' if name.endswith(".json") else b"x" * 1000)
    return buf.getvalue()


def _zero_row_parquet() -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"audio": pa.array([], pa.binary()), "text": pa.array([], pa.string())}), buf)
    return buf.getvalue()


def _parquet_bytes() -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"audio": [b"x"], "text": ["hi"]}), buf)
    return buf.getvalue()


WHOLE_TAR = _tar_bytes(["a.flac", "a.json", "b.flac", "b.json"])
UNREADABLE = {  # name: (the file's bytes, what the one line says)
    "cut-in-a-member.tar": (WHOLE_TAR[:1000], "cannot be read as a tar (unexpected end of data)"),
    "cut-in-a-header.tar": (WHOLE_TAR[:1700], "cannot be read as a tar (no end-of-archive block at byte 1536)"),
    "cut-at-a-block.tar": (WHOLE_TAR[: 512 * 5], "cannot be read as a tar (no end-of-archive block"),
    "empty.tar": (b"", "cannot be read as a tar (empty file)"),
    "not-a.tar": (b"<html>not found</html>" * 40, "cannot be read as a tar"),
    "out-of-order.tar": (
        _tar_bytes(["a.flac", "b.flac", "a.json", "b.json"]),
        ": the members of sample a are not together (a.json comes after",
    ),
    "cut.parquet": (_parquet_bytes()[:-30], "cannot be read as a parquet file"),
    "empty.parquet": (b"", "cannot be read as a parquet file (Parquet file size is 0 bytes)"),
    "zero-rows.parquet": (_zero_row_parquet(), "holds no rows"),
}


@pytest.mark.parametrize("name", UNREADABLE)
def test_a_container_file_that_cannot_be_read_stops_the_run_in_one_line_naming_it(tmp_path, capsys, name):
    from melshards.commands.preprocess import run

    data, says = UNREADABLE[name]
    path = tmp_path / name
    path.write_bytes(data)
    code = run(["--input", str(path), "--language", "en", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("Error:")]
    assert line.startswith(f"Error: {path}") and says in line, line
    assert not (tmp_path / "out").exists()


def test_an_input_whose_files_hold_no_row_stops_the_run_naming_it(tmp_path, capsys):
    from melshards.commands.preprocess import run

    for name in ("a", "b"):
        (tmp_path / "ds" / name).mkdir(parents=True)
        (tmp_path / "ds" / name / "train.parquet").write_bytes(_zero_row_parquet())
    code = run(["--input", str(tmp_path / "ds"), "--language", "en", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and f"Error: --input {tmp_path / 'ds'}: its 2 .parquet file(s) hold no rows." in err


def test_one_unreadable_parquet_file_of_three_stops_the_run_naming_it(tmp_path, capsys):
    from melshards.commands.preprocess import run

    for name in ("a", "b", "c"):
        (tmp_path / "ds" / name).mkdir(parents=True)
        (tmp_path / "ds" / name / "train.parquet").write_bytes(
            _parquet_bytes()[:-30] if name == "b" else _parquet_bytes()
        )
    code = run(["--input", str(tmp_path / "ds"), "--language", "en", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and f"Error: {tmp_path / 'ds' / 'b' / 'train.parquet'} cannot be read as a parquet file" in err


# -- one run over every form --------------------------------------------------------------------
FORMS = ("wav", "parquet", "tar", "long", "mp3")
CONFIG = """
filter:
  min_duration_s: 0.1
  mel_frames_lower_percentile: 0.0
  mel_frames_upper_percentile: 100.0
  text_len_upper_percentile: 100.0
pad:
  buckets: 1
"""


@pytest.fixture(scope="module")
def every_form(tmp_path_factory):
    """The same utterances as a WAV manifest, a parquet export, a WebDataset tar, segments of one long
    recording and a tar of MP3s, with their bad rows, preprocessed in one run (each an --input: the
    shared ids and speakers are prefixed with the input's name) -> (stats, rejected, records by form)."""
    from melshards.commands.preprocess import run
    from melshards.shards_schema.schema import read_schema
    from melshards.shards_schema.shards import check_shard

    root = tmp_path_factory.mktemp("forms")
    inputs = {
        "wav": write_wav_manifest(root / "wav"),
        "parquet": write_parquet(root / "parquet" / "train.parquet"),
        "tar": write_tar(root / "tar" / "000000.tar").parent,
        "long": write_long(root / "long"),
        "mp3": write_tar(root / "mp3" / "000000.tar", fmt="MP3", bad=False).parent,
    }
    (root / "cfg.yaml").write_text(
        CONFIG + yaml.safe_dump(QUALITY_RULES_OFF)
    )  # the same utterances in five forms: duplicates by design
    args = [a for form in FORMS for a in ("--input", str(inputs[form]))]
    out = root / "out"
    code = run([*args, "--output", str(out), "--config", str(root / "cfg.yaml"), "--workers", "1"])
    assert code == 0
    schema = read_schema(str(out))
    records = []
    for f in sorted(out.glob("*.tfrecord")):
        records += check_shard(str(f), schema, keep=1000)[1]
    stats = json.loads((out / "stats.json").read_text())
    rejected = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
    return stats, rejected, records, out


NAMES = {"wav": "clips", "parquet": "train", "tar": "tar", "long": "segments", "mp3": "mp3"}


def _by_form(records: list[dict]) -> dict[str, dict[str, dict]]:
    names = {n: f for f, n in NAMES.items()}
    out: dict[str, dict[str, dict]] = {}
    for r in records:
        name, clip_id = r["id"].decode().split("/")
        out.setdefault(names[name], {})[clip_id] = r
    return out


def test_every_form_gives_the_records_of_the_wav_manifest(every_form):
    records = every_form[2]
    forms = _by_form(records)
    assert {f: sorted(forms[f]) for f in FORMS} == {f: ["u1", "u2", "u3", "u4"] for f in FORMS}
    for form in FORMS:
        for cid, want in forms["wav"].items():
            got = forms[form][cid]
            assert got["speaker"].decode().split("/")[1] == want["speaker"].decode().split("/")[1]
            assert got["text"] == want["text"]
            np.testing.assert_array_equal(got["text_ids"], want["text_ids"])
            slack = 3 if form == "mp3" else 0  # MP3's encoder delay and padding; the others are lossless
            assert abs(int(got["mel_len"]) - int(want["mel_len"])) <= slack, (form, cid)


def test_every_forms_bad_rows_are_rejected_with_their_reason_and_the_counts_add_up(every_form):
    stats, rejected, records, _ = every_form
    assert {(r["id"].split("/")[-1], r["reason"]) for r in rejected} == {
        ("nul", "missing_audio"),
        ("junk", "unreadable_audio"),
        ("lonely", "missing_audio"),
        ("mute", "missing_text"),
        ("past", "bad_segment"),
        ("empty", "bad_segment"),
        ("over", "overlapping_segment"),
    }
    counts = stats["counts"]
    assert counts["input_rows"] == len(records) + len(rejected) == 4 * 5 + 7


def test_the_summary_names_each_inputs_kind_rows_and_the_columns_it_did_not_read(every_form):
    stats, out = every_form[0], every_form[3]
    got = [(i["format"], i["rows"], i.get("unused_columns", [])) for i in stats["inputs"]]
    assert got == [
        ("manifest", 4, []),
        ("parquet", 6, ["snr"]),
        ("webdataset", 6, ["duration", "dnsmos"]),
        ("manifest", 7, []),
        ("webdataset", 4, ["duration", "dnsmos"]),
    ]
    from melshards.commands.stats import terminal_report
    from melshards.reports.stats_report import build_report, load_run

    shown = terminal_report(build_report(load_run(str(out)), batch_size=8))
    assert "input train (parquet, " in shown
    assert "6 input rows" in shown and "columns not read: snr" in shown
