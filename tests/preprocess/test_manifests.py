"""The table readers on inputs a new user brings: quoting the csv reader used to read silently, rows
files in another encoding, `--column` where it names nothing, segment rows no recording has, and one
recording spelt two ways. Pure readers (`melshards.preprocess.inputs.manifests`) and the checks run before
the job (`melshards.preprocess.inputs.sources`); no pipeline runs."""

from __future__ import annotations

import codecs

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from melshards.preprocess.inputs import manifests, packed_clips, sources
from melshards.preprocess.inputs.rows import CorpusError, LayoutRows
from melshards.preprocess.inputs.sources import (
    check_rows_file,
    count_input_rows,
    detect_corpus,
    read_input,
    unused_columns,
)
from melshards.preprocess.inputs.working_set import WorkingSet


def _read(text: str, path: str = "/m/x.csv", root: str = "/m", named: dict | None = None) -> LayoutRows:
    lines = text.splitlines(keepends=True)
    return LayoutRows.of(
        manifests.manifest_rows(lines, path, root, named) if named else manifests.manifest_rows(lines, path, root)
    )


# -- quoting ----------------------------------------------------------------------------------------
def test_a_quote_inside_a_quoted_field_is_a_malformed_row_naming_its_line_not_a_mangled_text():
    """Read leniently, the row's text was `the definition, submitted""`."""
    text = (
        "audio,text,language\n"
        'x.wav,"the definition, "submitted"",en\n'
        'y.wav,"a ""doubled"" quote, kept",en\n'
        'z.wav,say "hi" unquoted,en\n'
    )
    read = _read(text)
    assert [(r["id"], r["text"]) for r in read.rows] == [("y", 'a "doubled" quote, kept'), ("z", 'say "hi" unquoted')]
    assert [(r["id"], r["reason"]) for r in read.rejected] == [("row-1", "malformed_row")]
    assert read.rejected[0]["detail"].startswith("row 1: line 2: the csv reader cannot read it")
    assert 'must be written twice ("a ""quoted"" word"); fix the quoting' in read.rejected[0]["detail"]
    assert read.input_rows == 3  # every line after the header is a row or a rejection


def test_a_quote_never_closed_at_the_end_of_the_file_rejects_each_line_it_holds():
    """No separator in the swallowed lines, so it was one row whose text ran to the end of the file."""
    read = _read('audio\ttext\na.wav\tHi.\nb.wav\t"Open\nc.wav\n', path="/m/x.tsv")
    assert [r["id"] for r in read.rows] == ["a"]
    assert [r["id"] for r in read.rejected] == ["row-2", "row-3"]
    assert read.rejected[1]["detail"].startswith(
        "row 3: line 4 is inside a quoted field that opens on line 3 and cannot be read by the csv reader "
        "(unexpected end of data) (lines 3-4): a stray '\"'"
    )


# -- --column -----------------------------------------------------------------------------------------
def _ljspeech(root):
    root.mkdir()
    (root / "metadata.csv").write_text("a|Hi.|Hi.\n")
    return detect_corpus(str(root), columns=["text=foo"])


def test_column_is_refused_when_no_input_has_columns_to_name(tmp_path):
    lj = _ljspeech(tmp_path / "lj")
    with pytest.raises(CorpusError) as e:
        sources.check_named_columns([lj])
    assert str(e.value).startswith("--column text=foo: no input has columns to name (")
    assert "is ljspeech" in str(e.value) and "Leave it out" in str(e.value)
    (tmp_path / "m.csv").write_text("audio,text,foo\na.wav,,Hello.\n")
    manifest = detect_corpus(str(tmp_path / "m.csv"), language="en", columns=["text=foo"])
    sources.check_named_columns([lj, manifest])  # it names the manifest's column; the LJSpeech input has none


def test_column_naming_no_column_of_a_manifest_is_refused_listing_the_columns_it_has(tmp_path):
    (tmp_path / "m.csv").write_text("audio,caption,language\na.wav,Hello.,en\n")
    corpus = detect_corpus(str(tmp_path / "m.csv"), columns=["text=captoin"])
    with pytest.raises(CorpusError) as e:
        check_rows_file(corpus)
    assert str(e.value) == (
        f"--column text=captoin: manifest {tmp_path}/m.csv: its header has columns audio, caption, language, "
        "no 'captoin'; name one of these (column names are case-sensitive)"
    )
    with pytest.raises(CorpusError, match="--column text=captoin: "):  # a remote input, checked as it is read
        _read("audio,caption\na.wav,Hello.\n", named={"text": "captoin"})


def test_column_names_the_manifest_column_a_field_is_read_from(tmp_path):
    (tmp_path / "m.jsonl").write_text('{"wav": "a.wav", "text": "old", "caption": "Hello.", "lang": "de"}\n')
    corpus = detect_corpus(str(tmp_path / "m.jsonl"), columns=["text=caption", "audio=wav", "language=lang"])
    check_rows_file(corpus)  # the language column is named: no --language needed
    (r,) = read_input(corpus).rows
    assert (r["text"], r["audio"], r["language"]) == ("Hello.", f"{tmp_path}/a.wav", "de")
    assert unused_columns(corpus) == ["text"]


def test_column_naming_no_column_of_a_parquet_export_is_refused_not_ignored(tmp_path):
    """An optional field (speaker) misspelt: the run would have made one speaker of every row."""
    pq.write_table(pa.table({"audio": [b"x"], "text": ["hi"], "spkr": ["A"]}), tmp_path / "t.parquet")
    with pytest.raises(
        CorpusError, match=r"--column speaker=spk: .*t.parquet: its columns are audio, text, spkr, no 'spk'"
    ):
        check_rows_file(detect_corpus(str(tmp_path / "t.parquet"), language="en", columns=["speaker=spk"]))
    check_rows_file(detect_corpus(str(tmp_path / "t.parquet"), language="en", columns=["speaker=spkr"]))


# -- encodings ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 1 << 20])
def test_a_latin1_rows_file_stops_the_read_naming_the_file_and_the_line(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(sources, "_CHUNK", chunk)
    (tmp_path / "metadata.csv").write_bytes("a|One.|\r\nb|Two.|\r\n\r\nc|Caf\u00e9.|\nd|x|\n".encode("latin-1"))
    lines = sources._lines(str(tmp_path / "metadata.csv"))
    with pytest.raises(CorpusError) as e:
        list(lines)
    assert str(e.value).startswith(f"{tmp_path}/metadata.csv: line 4 is not UTF-8 (byte 0xe9: ")
    assert "re-save the file as UTF-8" in str(e.value)


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_a_utf16_rows_file_with_its_byte_order_mark_is_read_as_its_utf8_copy(tmp_path, monkeypatch, codec, chunk):
    """What Notepad and Excel save as "Unicode": UTF-16 with a byte-order mark."""
    monkeypatch.setattr(sources, "_CHUNK", chunk)
    text = "audio\ttext\r\na.wav\tCaf\u00e9 \u4f60\u597d.\r\nb.wav\tTwo.\r\n"
    bom = codecs.BOM_UTF16_LE if codec.endswith("le") else codecs.BOM_UTF16_BE
    (tmp_path / "m.tsv").write_bytes(bom + text.encode(codec))
    assert list(sources._lines(str(tmp_path / "m.tsv"))) == text.splitlines(keepends=True)
    corpus = detect_corpus(str(tmp_path / "m.tsv"), language="en")
    check_rows_file(corpus)
    assert [r["text"] for r in read_input(corpus).rows] == ["Caf\u00e9 \u4f60\u597d.", "Two."]


def test_a_rows_file_that_cannot_be_decoded_stops_the_run_before_the_job(tmp_path):
    """UTF-16 without its byte-order mark decodes as UTF-8 with a NUL after each letter; a Latin-1
    byte far down a local file stops the count of rows, which a local run makes before the job."""
    (tmp_path / "m.csv").write_bytes("audio,text\na.wav,Hi.\n".encode("utf-16-le"))
    with pytest.raises(CorpusError, match=r"m.csv: line 1 holds a NUL character.*Re-save the file as UTF-8"):
        check_rows_file(detect_corpus(str(tmp_path / "m.csv"), language="en"))
    (tmp_path / "lj").mkdir()
    rows = [f"r{i}|Row {i}.|" for i in range(2999)] + ["last|Caf\u00e9.|"]
    (tmp_path / "lj" / "metadata.csv").write_bytes("\n".join(rows).encode("latin-1"))
    corpus = detect_corpus(str(tmp_path / "lj"))
    with pytest.raises(CorpusError, match=r"lj/metadata.csv: line 3000 is not UTF-8"):
        count_input_rows(corpus)


def test_a_transcript_file_that_is_not_utf8_is_named_not_a_traceback(tmp_path):
    (tmp_path / "p225_001.txt").write_bytes("Caf\u00e9.\n".encode("latin-1"))
    with pytest.raises(CorpusError, match=r"p225_001.txt: line 1 is not UTF-8"):
        sources._read_text(str(tmp_path / "p225_001.txt"))


# -- segments ------------------------------------------------------------------------------------------
def test_a_segment_ending_at_infinity_is_a_bad_segment_with_an_id_of_its_own():
    """`inf` and `1e309` (a float's infinity) passed the read and overflowed the sample index later,
    killing the job; the read-time rejections of one recording all had the id `long`."""
    text = (
        "audio,text,start,end\n"
        "long.wav,a,0,inf\n"
        "long.wav,b,1,1e309\n"
        "long.wav,c,2,1e308\n"
        "long.wav,d,5,\n"
        "long.wav,e,3,4\n"
    )
    read = _read(text)
    assert [r["id"] for r in read.rows] == ["long-3-4"]
    assert [(r["id"], r["reason"]) for r in read.rejected] == [
        ("long-row-1", "bad_segment"),
        ("long-row-2", "bad_segment"),
        ("long-row-3", "bad_segment"),
        ("long-row-4", "bad_segment"),
    ]
    assert read.rejected[1]["detail"] == (
        "row 2: end '1e309' is not a time in a recording (at most 1,000,000,000 s); give the segment's end in seconds"
    )


# -- audio paths -----------------------------------------------------------------------------------------
def test_a_rows_audio_path_is_spelt_one_way_per_file():
    assert manifests.audio_path(".", "./rec.wav") == manifests.audio_path(".", "rec.wav") == "rec.wav"
    assert manifests.audio_path("/m", "a/../rec.wav") == manifests.audio_path("/m", "/m/./rec.wav") == "/m/rec.wav"
    assert manifests.audio_path("gs://b/m", "./rec.wav") == "gs://b/m/rec.wav"
    assert manifests.audio_path("/m", "gs://b//x/./rec.wav") == "gs://b//x/./rec.wav"  # a URL as written


def test_segments_of_one_recording_spelt_two_ways_are_checked_for_overlap_as_one():
    text = "audio,text,start,end\n./long.wav,a,0,2\nlong.wav,b,1,3\n"
    with WorkingSet() as working_set:
        read = LayoutRows.of(
            packed_clips.refuse_overlaps(manifests.manifest_rows(text.splitlines(True), "m.csv", "."), working_set)
        )
    assert [r["audio"] for r in read.rows] == ["long.wav"]
    assert [r["reason"] for r in read.rejected] == ["overlapping_segment"]
