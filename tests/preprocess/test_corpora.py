"""Corpus layouts read as they ship (LJSpeech, manifests, VCTK 0.92, LibriTTS, Common Voice), their
detection, and several --input merged into one run."""

import json

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from melshards.preprocess.inputs import layouts, manifests
from melshards.preprocess.inputs.merge import MergedInputs, input_name, unique_names
from melshards.preprocess.inputs.read_stage import ReadCorpus
from melshards.preprocess.inputs.rows import CorpusError, LayoutRows, complete_rows, gender_code, reject, row
from melshards.preprocess.inputs.sources import LAYOUTS, check_rows_file, detect_corpus, read_input
from melshards.preprocess.inputs.working_set import WorkingSet
from melshards.preprocess.out_dir.batch_files import read_rows
from tests.conftest import TINY_CONFIG, quality_rules_off
from tests.preprocess.conftest import beam_pipeline, decoded_records, encode, tone

VCTK_INFO = (
    "ID  AGE  GENDER  ACCENTS  REGION COMMENTS \n"
    "p225  23  F    English    Southern  England\n"
    "p226  22  M    English    Surrey\n"
    "p315  23  M    American    Connecticut  (text missing)\n"
)
LIBRITTS_SPEAKERS = (
    ";READER|GENDER|SUBSET|NAME\n"
    "; comment\n"
    "19    | F | train-clean-100  | Kara Shallenberg\n"
    "60    | M | train-clean-100  | |CBW|Simon\n"
    "84    | F | dev-clean        | Christie Nowak\n"
)
CV_HEADER = "client_id\tpath\tsentence\tup_votes\tdown_votes\tage\tgender\taccents\tlocale\tsegment"


def _audio(seconds: float, sr: int, fmt: str, real: bool) -> bytes:
    """A tone in `fmt`, or no bytes at all where only the listing matters (the read stage opens no audio)."""
    return encode(tone(seconds, sr=sr), sr, fmt) if real else b""


def write_vctk(root, real_audio=False):
    """VCTK 0.92 in small: p225 (F) and p226 (M) with mic1 and mic2, p226_002 without mic1, p315 with
    audio and no transcripts (as it ships), and p225_003 with a transcript and no audio."""
    (root / "txt").mkdir(parents=True)
    (root / "speaker-info.txt").write_text(VCTK_INFO)
    utts = {
        "p225_001": "Please call Stella.",
        "p225_002": "Ask her to bring these things.",
        "p225_003": "Six spoons of fresh snow peas.",
        "p226_001": "Please call Stella.",
        "p226_002": "We also need a small plastic snake.",
        "p315_001": None,
        "p315_002": None,
    }
    for n, (utt, text) in enumerate(utts.items()):
        speaker = utt.split("_")[0]
        if text is not None:
            (root / "txt" / speaker).mkdir(exist_ok=True)
            (root / "txt" / speaker / f"{utt}.txt").write_text(text + "\n")
        if utt == "p225_003":
            continue
        audio = root / layouts.VCTK_AUDIO_DIR / speaker
        audio.mkdir(parents=True, exist_ok=True)
        for mic in ("mic1", "mic2") if utt != "p226_002" else ("mic2",):
            (audio / f"{utt}_{mic}.flac").write_bytes(_audio(0.8 + 0.1 * n, 48000, "FLAC", real_audio))
    return root


def write_libritts(root, real_audio=False):
    """LibriTTS in small: SPEAKERS.txt, two subsets, one utterance without its .normalized.txt."""
    (root).mkdir(parents=True)
    (root / "SPEAKERS.txt").write_text(LIBRITTS_SPEAKERS)
    utts = [
        ("train-clean-100", "19", "198", "000000_000000", "Northanger Abbey."),
        ("train-clean-100", "19", "198", "000000_000001", "Chapter one."),
        ("train-clean-100", "60", "121082", "000002_000000", "It was a dark night."),
        ("dev-clean", "84", "121123", "000000_000003", "Go, do you hear?"),
        ("dev-clean", "84", "121123", "000000_000004", None),
    ]
    for n, (subset, speaker, chapter, rest, text) in enumerate(utts):
        d = root / subset / speaker / chapter
        d.mkdir(parents=True, exist_ok=True)
        utt = f"{speaker}_{chapter}_{rest}"
        (d / f"{utt}.wav").write_bytes(_audio(0.9 + 0.1 * n, 24000, "WAV", real_audio))
        if text is not None:
            (d / f"{utt}.normalized.txt").write_text(text)
            (d / f"{utt}.original.txt").write_text(text.upper())
    return root


def write_commonvoice(root, real_audio=False, locale=True):
    """A Common Voice locale dir (`cy`): validated.tsv (unquoted: a sentence holds a `"`), clips/*.mp3."""
    (root / "clips").mkdir(parents=True)
    rows = [
        ("a1", "common_voice_cy_1.mp3", 'Mae\'r "ci" yn cysgu.', "female_feminine"),
        ("a1", "common_voice_cy_2.mp3", "Bore da.", "female_feminine"),
        ("b2", "common_voice_cy_3.mp3", "Diolch yn fawr.", "male"),
    ]
    header = CV_HEADER if locale else CV_HEADER.replace("\tlocale", "")
    lines = [header] + [f"{c}\t{p}\t{s}\t2\t0\tthirties\t{g}\t\t" + ("cy\t" if locale else "") for c, p, s, g in rows]
    (root / "validated.tsv").write_text("\n".join(lines) + "\n")
    for n, (_, path, _, _) in enumerate(rows):
        (root / "clips" / path).write_bytes(_audio(1.0 + 0.1 * n, 22050, "MP3", real_audio))
    return root


# -- the pure readers ------------------------------------------------------------------------------
def test_vctk_rows_are_one_per_utterance_with_mic1_and_p315_is_missing_text():
    transcripts = {
        "/c/txt/p225/p225_001.txt": "Please call Stella.\n",
        "/c/txt/p225/p225_002.txt": "Ask her.\n",
        "/c/txt/p226/p226_001.txt": "Six spoons.\n",
    }
    audio = [
        "/c/wav48_silence_trimmed/p225/p225_001_mic1.flac",
        "/c/wav48_silence_trimmed/p225/p225_001_mic2.flac",
        "/c/wav48_silence_trimmed/p226/p226_001_mic2.flac",
        "/c/wav48_silence_trimmed/p315/p315_001_mic2.flac",
        "/c/wav48_silence_trimmed/p315/p315_001_mic1.flac",
        "/c/wav48_silence_trimmed/log.txt",
    ]
    read = LayoutRows.of(layouts.vctk_rows(transcripts, audio, VCTK_INFO))
    assert read.rows == [
        {
            "id": "p225_001",
            "text": "Please call Stella.",
            "speaker": "p225",
            "language": "en",
            "gender": "F",
            "audio": "/c/wav48_silence_trimmed/p225/p225_001_mic1.flac",
            "row": 0,
        }
    ]
    assert read.rejected == [
        reject(
            "p225_002", "missing_audio", "no wav48_silence_trimmed/p225/p225_002_mic1.flac for /c/txt/p225/p225_002.txt"
        ),
        reject(
            "p226_001",
            "missing_audio",
            "no wav48_silence_trimmed/p226/p226_001_mic1.flac for "
            "/c/txt/p226/p226_001.txt (only mic2: give it through a manifest)",
        ),
        reject(
            "p315_001",
            "missing_text",
            "/c/wav48_silence_trimmed/p315/p315_001_mic1.flac has no transcript txt/p315/p315_001.txt",
        ),
    ]
    assert read.input_rows == 4


def test_vctk_speaker_info_gives_genders_for_both_id_spellings():
    assert layouts.parse_speaker_info(VCTK_INFO) == {"p225": "F", "p226": "M", "p315": "M"}
    assert layouts.parse_speaker_info("ID AGE GENDER ACCENTS REGION\n225 23 F English Southern England\n") == {
        "p225": "F"
    }


def test_libritts_rows_pair_each_wav_with_the_normalized_text_beside_it():
    base = "/l/train-clean-100/19/198/19_198_000000_00000"
    transcripts = {f"{base}0.normalized.txt": "Northanger Abbey.", f"{base}2.normalized.txt": "No audio."}
    files = [
        f"{base}0.wav",
        f"{base}0.original.txt",
        f"{base}0.normalized.txt",
        f"{base}1.wav",
        f"{base}2.normalized.txt",
        "/l/SPEAKERS.txt",
        "/l/train-clean-100/19/198/19_198.trans.tsv",
    ]
    read = LayoutRows.of(layouts.libritts_rows(transcripts, files, LIBRITTS_SPEAKERS))
    assert read.rows == [
        row("19_198_000000_000000", "Northanger Abbey.", f"{base}0.wav", 0, speaker="19", language="en", gender="F")
    ]
    assert read.rejected == [
        reject(
            "19_198_000000_000001",
            "missing_text",
            f"{base}1.wav has no transcript 19_198_000000_000001.normalized.txt beside it",
        ),
        reject(
            "19_198_000000_000002", "missing_audio", f"{base}2.normalized.txt has no 19_198_000000_000002.wav beside it"
        ),
    ]


def test_libritts_speakers_skip_comments_and_keep_a_name_with_bars():
    assert layouts.parse_libritts_speakers(LIBRITTS_SPEAKERS) == {"19": "F", "60": "M", "84": "F"}


def test_commonvoice_rows_split_on_tabs_alone_and_read_locale_and_gender():
    text = (
        "\n".join(
            [
                CV_HEADER,
                'a1\tx_1.mp3\tHe said "hi".\t2\t0\t\tmale_masculine\t\tzh-CN\t',
                "b2\tx_2.mp3\tHello.\t2\t0\t\t\t\t\t",
                "b2\tx_3.mp3\tToo few fields.",
            ]
        )
        + "\n"
    )
    read = LayoutRows.of(manifests.commonvoice_rows(text.splitlines(keepends=True), "gs://b/cv/validated.tsv"))
    assert read.rows == [
        row("x_1", 'He said "hi".', "gs://b/cv/clips/x_1.mp3", 0, speaker="a1", language="zh-CN", gender="M"),
        row("x_2", "Hello.", "gs://b/cv/clips/x_2.mp3", 1, speaker="b2", language="", gender=""),
    ]
    assert read.rejected == [
        reject(
            "row-3",
            "malformed_row",
            f"row 3: 3 tab-separated fields, the header has 10 ({CV_HEADER.replace(chr(9), ', ')})",
        )
    ]


def test_manifest_rows_read_language_and_gender_columns():
    text = "audio,text,speaker,language,gender\na.wav,Hallo.,s1, de ,Female\nb.wav,Hi.,,,\n"
    read = LayoutRows.of(manifests.manifest_rows(text.splitlines(keepends=True), "/m/x.csv", "/m"))
    assert read.rows == [
        row("a", "Hallo.", "/m/a.wav", 0, speaker="s1", language="de", gender="F"),
        row("b", "Hi.", "/m/b.wav", 1),
    ]
    assert read.rejected == []


@pytest.mark.parametrize("sep,ext", [(",", "csv"), ("\t", "tsv")])
def test_a_stray_quote_rejects_every_line_it_swallows_by_line_number(sep, ext):
    """Line 3 opens a quote that never closes: the 8 rows after it are inside one field. Each of the
    10 lines is the header, a row or a rejection naming its line."""
    lines = (
        ["audio,text,speaker", "a.wav,Hello.,s1", 'b.wav,"Stray quote.,s1']
        + [f"{c}.wav,Row {c}.,s2" for c in "cdefghi"]
        + ["", "j.wav,Last.,s2"]
    )
    text = "\n".join(line.replace(",", sep) for line in lines) + "\n"
    read = LayoutRows.of(manifests.manifest_rows(text.splitlines(keepends=True), f"/m/x.{ext}", "/m"))
    assert [r["id"] for r in read.rows] == ["a"]
    assert [r["id"] for r in read.rejected] == [f"row-{n}" for n in range(2, 11)]
    assert {r["reason"] for r in read.rejected} == {"malformed_row"}
    assert read.rejected[0]["detail"].startswith("row 2: line 3 is inside a quoted field that opens on line 3")
    assert "line 12 is inside a quoted field that opens on line 3" in read.rejected[-1]["detail"]
    assert "(lines 3-12)" in read.rejected[-1]["detail"] and "stray '\"'" in read.rejected[-1]["detail"]
    assert read.input_rows == 10  # every non-blank line after the header, as the progress count has it


def test_a_quoted_field_past_the_csv_size_limit_rejects_its_lines_and_reading_goes_on():
    import csv

    big = "x" * (csv.field_size_limit() + 10)
    text = f'audio,text\na.wav,"{big}\nb.wav,Swallowed.\nc.wav,Hi.\n'
    read = LayoutRows.of(manifests.manifest_rows(text.splitlines(keepends=True), "/m/x.csv", "/m"))
    assert [r["id"] for r in read.rejected] == ["row-1"]
    assert "field larger than field limit" in read.rejected[0]["detail"]
    assert [r["id"] for r in read.rows] == ["b", "c"]


def test_a_quoted_transcript_over_two_lines_without_separators_is_one_row():
    text = 'audio,text\na.wav,"One line\nand the next."\nb.wav,"Hi, there."\n'
    read = LayoutRows.of(manifests.manifest_rows(text.splitlines(keepends=True), "/m/x.csv", "/m"))
    assert [(r["id"], r["text"]) for r in read.rows] == [("a", "One line\nand the next."), ("b", "Hi, there.")]


@pytest.mark.parametrize("on_disk", [False, True])
def test_ljspeech_rows_drop_repeated_ids_before_attaching_audio(on_disk):
    lines = "a|One.|One.\nb|Two.|\nlonely\na|Again.|\n".splitlines(keepends=True)
    with WorkingSet() as working_set:
        files = working_set.lists(
            layouts.audio_files(["/lj/wavs/a.mp3", "/lj/wavs/a.flac", "/lj/wavs/b.txt", "/lj/wavs/a.wav"])
        )
        assert dict(files) == {"a": ["/lj/wavs/a.wav", "/lj/wavs/a.flac", "/lj/wavs/a.mp3"]}
        read = LayoutRows.of(layouts.ljspeech_rows(lines, files, working_set.map() if on_disk else {}))
    assert read.rows == [row("b", "Two.", None, 1)]
    assert [(r["id"], r["reason"]) for r in read.rejected] == [
        ("a", "ambiguous_audio"),
        ("row-3", "malformed_row"),
        ("a", "duplicate_id"),
    ]
    assert "3 audio files for this id: /lj/wavs/a.wav, /lj/wavs/a.flac, /lj/wavs/a.mp3" in read.rejected[0]["detail"]


@pytest.mark.parametrize(
    "spelling,code",
    [
        ("F", "F"),
        ("female", "F"),
        (" Female_Feminine ", "F"),
        ("m", "M"),
        ("male_masculine", "M"),
        ("other", ""),
        ("do_not_wish_to_say", ""),
        ("", ""),
        (None, ""),
    ],
)
def test_genders_are_f_m_or_unknown(spelling, code):
    assert gender_code(spelling) == code


def test_rows_get_the_inputs_name_as_speaker_and_its_default_language_unless_they_say():
    rows = [
        row("a", "x", "a.wav", 0, speaker="s1", language="de"),
        row("b", "x", "b.wav", 1),
        row("c", "x", "c.wav", 2, language=" "),
    ]
    assert list(complete_rows(rows, "lj", "en")) == [
        dict(rows[0]),
        dict(rows[1], speaker="lj", language="en"),
        dict(rows[2], speaker="lj", language="en"),
    ]
    read = LayoutRows.of(complete_rows(rows, "lj", None))
    assert [r["id"] for r in read.rows] == ["a"]
    assert [(r["id"], r["reason"]) for r in read.rejected] == [("b", "missing_language"), ("c", "missing_language")]
    assert "--language" in read.rejected[0]["detail"]


# -- several inputs --------------------------------------------------------------------------------
def test_a_label_in_two_inputs_is_prefixed_in_both_and_other_labels_are_not():
    a = [row("p225_001", "x", "1.flac", 0, speaker="p225"), row("p226_001", "x", "2.flac", 1, speaker="p226")]
    b = [row("p225_001", "x", "3.wav", 0, speaker="p225"), row("z", "x", "4.wav", 1, speaker="anna")]
    with WorkingSet() as working_set:
        merged = MergedInputs(
            [
                ("vctk", a + [reject("p315_001", "missing_text", "d")]),
                ("mine", b + [reject("p315_001", "malformed_row", "d")]),
            ],
            working_set,
        )
        assert [(r["id"], r["speaker"], r["input"]) for r in merged.rows()] == [
            ("vctk/p225_001", "vctk/p225", 0),
            ("p226_001", "p226", 0),
            ("mine/p225_001", "mine/p225", 1),
            ("z", "anna", 1),
        ]
        assert [r["id"] for r in merged.rejections()] == ["vctk/p315_001", "mine/p315_001"]
        assert (merged.input_rows, merged.row_count) == ([3, 3], 4)
        assert (merged.prefixed_speakers, merged.prefixed_ids) == ([1, 1], [2, 2])
        alone = MergedInputs([("vctk", a)], working_set)
        assert list(alone.rows()) == [dict(r, input=0) for r in a]
        assert (alone.prefixed_speakers, alone.prefixed_ids) == ([0], [0])


def test_inputs_are_named_after_their_directory_or_file_stem_made_unique():
    assert [input_name(p) for p in ("/d/LJSpeech-1.1/", "gs://b/cv/cy/validated.tsv", "m.JSONL", "/d/x.y")] == [
        "LJSpeech-1.1",
        "validated",
        "m",
        "x.y",
    ]
    assert unique_names(["a", "b", "a", "a", "a-2"]) == ["a", "b", "a-3", "a-4", "a-2"]


# -- detection -------------------------------------------------------------------------------------
def test_each_layout_is_recognised_from_its_telltale_files(tmp_path):
    write_vctk(tmp_path / "VCTK-Corpus-0.92")
    write_libritts(tmp_path / "LibriTTS")
    write_commonvoice(tmp_path / "cv" / "cy")
    (tmp_path / "lj").mkdir()
    (tmp_path / "lj" / "metadata.csv").write_text("a|Hi.|\n")
    (tmp_path / "cv" / "cy" / "mine.tsv").write_text("audio\ttext\na.wav\tHi.\n")
    found = {
        p: detect_corpus(str(tmp_path / p))
        for p in (
            "VCTK-Corpus-0.92",
            "LibriTTS",
            "LibriTTS/dev-clean",
            "cv/cy",
            "cv/cy/validated.tsv",
            "lj",
            "cv/cy/mine.tsv",
        )
    }
    assert {p: (c.kind, c.name, c.language) for p, c in found.items()} == {
        "VCTK-Corpus-0.92": ("vctk", "VCTK-Corpus-0.92", "en"),
        "LibriTTS": ("libritts", "LibriTTS", "en"),
        "LibriTTS/dev-clean": ("libritts", "dev-clean", "en"),
        "cv/cy": ("commonvoice", "cy", "cy"),
        "cv/cy/validated.tsv": ("commonvoice", "validated", "cy"),
        "lj": ("ljspeech", "lj", "en"),
        "cv/cy/mine.tsv": ("manifest", "mine", None),
    }
    assert found["LibriTTS/dev-clean"].speakers_path == str(tmp_path / "LibriTTS" / "SPEAKERS.txt")
    assert set(LAYOUTS) == set(layouts.FORMATS)


def test_an_unrecognised_input_fails_in_one_line_listing_what_each_layout_looks_for(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(CorpusError) as e:
        detect_corpus(str(tmp_path))
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"--input {tmp_path} is not a corpus: looked for ")
    for telltale in (
        "metadata.csv (ljspeech)",
        "speaker-info.txt and wav48_silence_trimmed/ (vctk)",
        "SPEAKERS.txt in it or in its parent (libritts)",
        "validated.tsv",
        "(commonvoice)",
        "a .csv/.tsv/.jsonl file with columns audio, text (manifest)",
        "--format",
    ):
        assert telltale in message
    with pytest.raises(CorpusError, match="does not exist"):
        detect_corpus(str(tmp_path / "nope"))


def test_one_corpus_spelt_two_ways_is_refused_as_given_twice(tmp_path, monkeypatch):
    """`lj8` and `./lj8/`, a symlink to it, a Common Voice dir and its validated.tsv, a LibriTTS root
    and one of its subsets: each pair would read every clip twice."""
    from melshards.preprocess.job.run import find_corpora

    monkeypatch.chdir(tmp_path)
    (tmp_path / "lj8").mkdir()
    (tmp_path / "lj8" / "metadata.csv").write_text("a|Hi.|\n")
    (tmp_path / "link").symlink_to(tmp_path / "lj8")
    write_commonvoice(tmp_path / "cy")
    write_libritts(tmp_path / "LibriTTS")
    for a, b, says in [
        ("lj8", "./lj8/", f"are one corpus (both {tmp_path / 'lj8' / 'metadata.csv'})"),
        ("lj8", str(tmp_path / "link"), "are one corpus"),
        ("cy", "cy/validated.tsv", "are one corpus"),
        ("LibriTTS", "LibriTTS/dev-clean/", f"{tmp_path / 'LibriTTS' / 'dev-clean'} is inside the other"),
        ("lj8", "lj8", "is given twice"),
    ]:
        with pytest.raises(CorpusError) as e:
            find_corpora([a, b], None, "en", check_remote=False)
        assert says in str(e.value) and "\n" not in str(e.value), (a, b, str(e.value))
    assert len(find_corpora(["lj8", "LibriTTS/dev-clean", "cy"], None, "en", check_remote=False)) == 3


def test_a_gs_corpus_location_has_one_spelling():
    from melshards.preprocess.inputs.sources import Corpus, corpus_location

    assert {corpus_location(Corpus("vctk", None, p)) for p in ("gs://b/vctk", "gs://b//vctk/", "gs://b/vctk/")} == {
        "gs://b/vctk"
    }


def test_a_gs_input_that_cannot_be_reached_is_refused_in_one_line_within_the_bound(monkeypatch):
    """A file system that never answers (a client retrying for ever) stops detection after
    REMOTE_ANSWER_S with one line; one that fails is one line too."""
    import threading

    from melshards.preprocess.inputs import sources
    from melshards.preprocess.job.run import find_corpora

    hung = threading.Event()
    monkeypatch.setattr(sources, "_exists", lambda path: hung.wait(5) and False)
    monkeypatch.setattr(sources, "_list", lambda pattern, limit=None: [])
    monkeypatch.setattr(sources, "REMOTE_ANSWER_S", 0.2, raising=False)
    try:
        with pytest.raises(CorpusError) as e:
            find_corpora(["gs://bucket/lj8"], None, "en", check_remote=True)
    finally:
        hung.set()
    assert str(e.value).startswith("--input gs://bucket/lj8: gs:// gave no answer in 0.2 s; check the network")
    assert "\n" not in str(e.value)

    def refused(path):
        raise PermissionError("403 Forbidden\nmore lines of the client")

    monkeypatch.setattr(sources, "_exists", refused)
    with pytest.raises(
        CorpusError, match=r"^--input gs://bucket/lj8 cannot be read \(PermissionError: 403 Forbidden\);"
    ):
        detect_corpus("gs://bucket/lj8")


def test_a_header_with_a_column_twice_is_refused_before_the_run_naming_it(tmp_path):
    from melshards.preprocess.job.run import find_corpora

    (tmp_path / "m.csv").write_text("audio,text,speaker,text\na.wav,Hi.,s1,Hello.\n")
    with pytest.raises(
        CorpusError,
        match=r"m.csv: its header has the column 'text' twice \(audio, text, speaker, "
        r"text\); rename or remove one of them",
    ):
        find_corpora([str(tmp_path / "m.csv")], None, "en", check_remote=False)
    (tmp_path / "cv.tsv").write_text(CV_HEADER.replace("\tup_votes", "\tpath") + "\n")
    with pytest.raises(CorpusError, match=r"Common Voice TSV .*cv.tsv: its header has the column 'path' twice"):
        find_corpora([str(tmp_path / "cv.tsv")], None, "en", check_remote=False)


def test_format_forces_a_layout(tmp_path):
    write_libritts(tmp_path / "LibriTTS")
    (tmp_path / "LibriTTS" / "SPEAKERS.txt").unlink()  # one subset, copied alone
    subset = str(tmp_path / "LibriTTS" / "dev-clean")
    with pytest.raises(CorpusError, match="is not a corpus"):
        detect_corpus(subset)
    forced = detect_corpus(subset, format="libritts")
    assert (forced.kind, forced.speakers_path) == ("libritts", None)
    assert [(r["id"], r["gender"]) for r in read_input(forced).rows] == [("84_121123_000000_000003", "")]
    write_commonvoice(tmp_path / "cy")
    tsv = str(tmp_path / "cy" / "validated.tsv")
    assert detect_corpus(tsv, format="manifest").kind == "manifest"
    with pytest.raises(CorpusError, match="missing audio, text"):
        check_rows_file(detect_corpus(tsv, format="manifest", language="cy"))
    with pytest.raises(CorpusError, match="is not a ljspeech corpus: no metadata.csv"):
        detect_corpus(str(tmp_path / "cy"), format="ljspeech")


def test_language_comes_from_the_rows_then_language_then_the_layout(tmp_path):
    write_vctk(tmp_path / "vctk")
    write_commonvoice(tmp_path / "old" / "clips-of-mine", locale=False)  # no locale column, no code as dir name
    (tmp_path / "lj").mkdir()
    (tmp_path / "lj" / "metadata.csv").write_text("a|Hallo.|\n")
    assert detect_corpus(str(tmp_path / "lj"), language=" de ").language == "de"
    assert detect_corpus(str(tmp_path / "vctk"), language="de").language == "en"  # an English corpus
    old = detect_corpus(str(tmp_path / "old" / "clips-of-mine"))
    assert old.language is None
    with pytest.raises(CorpusError, match=r"no locale, and this input has no default language; give --language"):
        check_rows_file(old)
    check_rows_file(detect_corpus(str(tmp_path / "old" / "clips-of-mine"), language="cy"))
    (tmp_path / "m.csv").write_text("audio,text\na.wav,Hi.\n")
    with pytest.raises(CorpusError, match=r"no language, and this input has no default language; give --language"):
        check_rows_file(detect_corpus(str(tmp_path / "m.csv")))


# -- the read stage --------------------------------------------------------------------------------
def test_read_corpus_merges_inputs_and_prefixes_a_shared_speaker_and_id(tmp_path):
    """VCTK (p315 rejected missing_text, p225_003 missing_audio, p226_002 without mic1) beside a
    manifest that also has a speaker p225 and a clip p225_001: both prefixed, in both inputs."""
    vctk = write_vctk(tmp_path / "vctk")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "m.jsonl").write_text(
        '{"audio": "a.wav", "text": "Hallo.", "speaker": "p225", "id": "p225_001", "language": "de"}\n'
        '{"audio": "b.wav", "text": "Hi.", "gender": "male"}\n'
    )
    corpora = [detect_corpus(str(vctk)), detect_corpus(str(tmp_path / "mine" / "m.jsonl"), language="en")]
    wav = str(vctk / layouts.VCTK_AUDIO_DIR)
    with beam_pipeline() as p:
        out = p | ReadCorpus(corpora, str(tmp_path / "temp"))
        given = {"given_id": "p225_001", "given_speaker": "p225"}  # as the inputs give them (TextGrids' names)
        assert_that(
            out["batches"] | beam.FlatMap(lambda refs: [r for ref in refs for r in read_rows(ref)]),
            equal_to(
                [
                    dict(
                        row(
                            "vctk/p225_001",
                            "Please call Stella.",
                            f"{wav}/p225/p225_001_mic1.flac",
                            0,
                            speaker="vctk/p225",
                            language="en",
                            gender="F",
                        ),
                        **given,
                        input=0,
                    ),
                    dict(
                        row(
                            "p225_002",
                            "Ask her to bring these things.",
                            f"{wav}/p225/p225_002_mic1.flac",
                            1,
                            speaker="vctk/p225",
                            language="en",
                            gender="F",
                        ),
                        given_speaker="p225",
                        input=0,
                    ),
                    dict(
                        row(
                            "p226_001",
                            "Please call Stella.",
                            f"{wav}/p226/p226_001_mic1.flac",
                            3,
                            speaker="p226",
                            language="en",
                            gender="M",
                        ),
                        input=0,
                    ),
                    dict(
                        row(
                            "m/p225_001", "Hallo.", str(tmp_path / "mine" / "a.wav"), 0, speaker="m/p225", language="de"
                        ),
                        **given,
                        input=1,
                    ),
                    dict(
                        row("b", "Hi.", str(tmp_path / "mine" / "b.wav"), 1, speaker="m", language="en", gender="M"),
                        input=1,
                    ),
                ]
            ),
            label="rows",
        )
        assert_that(
            out["rejected"] | beam.Map(lambda r: (r["id"], r["reason"])),
            equal_to(
                [
                    ("p225_003", "missing_audio"),
                    ("p226_002", "missing_audio"),
                    ("p315_001", "missing_text"),
                    ("p315_002", "missing_text"),
                ]
            ),
            label="rejected",
        )
        assert_that(out["input_rows"], equal_to([9]), label="input_rows")
        assert_that(
            out["inputs"],
            equal_to(
                [
                    [
                        {
                            "input": str(vctk),
                            "name": "vctk",
                            "format": "vctk",
                            "rows": 7,
                            "language": "en",
                            "prefixed_speakers": 1,
                            "prefixed_ids": 1,
                        },
                        {
                            "input": str(tmp_path / "mine" / "m.jsonl"),
                            "name": "m",
                            "format": "manifest",
                            "rows": 2,
                            "language": "en",
                            "prefixed_speakers": 1,
                            "prefixed_ids": 1,
                        },
                    ]
                ]
            ),
            label="inputs",
        )


def test_a_rows_file_is_read_a_chunk_at_a_time_into_the_lines_splitlines_gives(tmp_path, monkeypatch):
    from melshards.preprocess.inputs import sources

    text = "a|Hi.|\r\nb|Tw\u00f6.|\r\n\r\nc|Th\u2028ree|\rd|x\u00e9\u00e9|"  # chunks split "\r\n" and "é"
    (tmp_path / "m.csv").write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    for chunk in (1, 2, 3, 5, 1 << 20):
        monkeypatch.setattr(sources, "_CHUNK", chunk)
        assert list(sources._lines(str(tmp_path / "m.csv"))) == text.splitlines(keepends=True), chunk


@pytest.mark.parametrize("chunk", [3, 1 << 20])
def test_a_line_longer_than_any_row_stops_the_read_naming_it_instead_of_filling_memory(tmp_path, monkeypatch, chunk):
    from melshards.preprocess.inputs import sources

    monkeypatch.setattr(sources, "_CHUNK", chunk)
    (tmp_path / "m.csv").write_text("a|One.|\nb|Two.|\n" + "x" * 50 + "\nc|Three.|\n")
    lines = sources._lines(str(tmp_path / "m.csv"), max_line=40)
    assert next(lines) == "a|One.|\n" and next(lines) == "b|Two.|\n"
    with pytest.raises(CorpusError, match=r"m.csv: line 3 is longer than 40 characters"):
        next(lines)
    (tmp_path / "m.csv").write_text("x" * 50)  # no line break at all
    with pytest.raises(CorpusError, match="line 1 is longer"):
        list(sources._lines(str(tmp_path / "m.csv"), max_line=40))


def test_an_ljspeech_corpus_without_wavs_reads_every_row_without_audio(tmp_path):
    (tmp_path / "metadata.csv").write_text("a|One.|\nb|Two.|\n")
    assert [(r["id"], r["audio"]) for r in read_input(detect_corpus(str(tmp_path))).rows] == [("a", None), ("b", None)]


def test_the_read_stage_holds_no_row_in_memory_whatever_the_corpus_size(tmp_path):
    """The read DoFn drained on 1,000 and on 4,000 rows of 3.4 kB transcripts: its Python heap peaks
    alike (rows wait in the sqlite working set and the rows files). Holding the rows would add some 13 MB for
    the 3,000 more."""
    import tracemalloc

    from melshards.preprocess.inputs.read_stage import _ReadRows, named

    text = "The lighthouse keeper climbed the stairs. " * 80  # long rows: bytes to hold, few rows to time
    peaks = []
    for n in (1_000, 4_000):
        root = tmp_path / f"lj{n}"
        (root / "wavs").mkdir(parents=True)
        (root / "wavs" / "c0.wav").write_bytes(b"")
        (root / "metadata.csv").write_text("".join(f"c{i}|{text}{i}|\n" for i in range(n)))
        fn = _ReadRows(named([detect_corpus(str(root))]), str(tmp_path / f"temp{n}"))
        tracemalloc.start()
        try:
            assert sum(1 for _ in fn.process(None)) == 2 + -(-n // 32)  # input_rows, inputs, the batches
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert peaks[1] - peaks[0] < 4 << 20, peaks


def test_count_rows_counts_every_inputs_rows_without_reading_transcripts(tmp_path):
    from melshards.preprocess.inputs.progress import count_rows

    corpora = [
        detect_corpus(str(write_vctk(tmp_path / "vctk"))),
        detect_corpus(str(write_libritts(tmp_path / "lt"))),
        detect_corpus(str(write_commonvoice(tmp_path / "cy"))),
    ]
    assert [read_input(c).input_rows for c in corpora] == [7, 5, 3]
    assert count_rows(corpora) == 15
    libritts = read_input(corpora[1])
    assert [(r["id"], r["reason"]) for r in libritts.rejected] == [("84_121123_000000_000004", "missing_text")]
    assert [(r["speaker"], r["gender"], r["text"]) for r in libritts.rows][:2] == [
        ("84", "F", "Go, do you hear?"),
        ("19", "F", "Northanger Abbey."),
    ]  # .normalized.txt, not .original.txt


# -- through the command ---------------------------------------------------------------------------
def test_several_inputs_through_the_cli_are_one_run_whose_counts_add_up(capsys, tmp_path):
    """VCTK (FLAC), LibriTTS (WAV), Common Voice (MP3) and a manifest sharing VCTK's speaker label p225."""
    from melshards.commands.preprocess import run

    write_vctk(tmp_path / "vctk", real_audio=True)
    write_libritts(tmp_path / "LibriTTS", real_audio=True)
    write_commonvoice(tmp_path / "cv" / "cy", real_audio=True)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.wav").write_bytes(encode(tone(1.3), 22050, "WAV"))
    (tmp_path / "mine" / "mine.csv").write_text("audio,text,speaker\na.wav,Good morning.,p225\n")
    out = tmp_path / "o"
    code = run(
        [
            "--input",
            str(tmp_path / "vctk"),
            "--input",
            str(tmp_path / "LibriTTS"),
            "--input",
            str(tmp_path / "cv" / "cy"),
            "--input",
            str(tmp_path / "mine" / "mine.csv"),
            "--language",
            "en",
            "--output",
            str(out),
            "--config",
            str(quality_rules_off(tmp_path, TINY_CONFIG)),  # "mine" is a tone: narrowband
            "--buckets",
            "1",
            "--workers",
            "1",
        ]
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]
    stats = json.loads((out / "stats.json").read_text())
    c = stats["counts"]
    assert c["input_rows"] == 7 + 5 + 3 + 1 == c["in_shards"] + c["filtered"] + c["rejected"]
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert len(rejected) == c["filtered"] + c["rejected"]
    assert {r["id"]: r["reason"] for r in rejected if r["reason"] in ("missing_text", "missing_audio")} == {
        "p315_001": "missing_text",
        "p315_002": "missing_text",
        "84_121123_000000_000004": "missing_text",
        "p225_003": "missing_audio",
        "p226_002": "missing_audio",
    }
    assert sum(i["rows"] for i in stats["inputs"]) == c["input_rows"]
    assert [(i["name"], i["format"], i["rows"], i["language"], i["prefixed_speakers"]) for i in stats["inputs"]] == [
        ("vctk", "vctk", 7, "en", 1),
        ("LibriTTS", "libritts", 5, "en", 0),
        ("cy", "commonvoice", 3, "en", 0),
        ("mine", "manifest", 1, "en", 1),
    ]
    assert "input vctk (vctk, " in printed.out and "1 speaker label(s) prefixed with 'vctk/'" in printed.out

    _, records = decoded_records(out)
    speakers = {r["id"].numpy()[0].decode(): r["speaker"].numpy()[0].decode() for r in records}
    assert speakers.get("a") == "mine/p225" and speakers.get("p225_001") == "vctk/p225"
    assert speakers.get("common_voice_cy_3") == "b2"


def test_a_bad_input_among_several_stops_the_run_naming_it(capsys, tmp_path):
    from melshards.commands.preprocess import run

    write_vctk(tmp_path / "vctk")
    code = run(["--input", str(tmp_path / "vctk"), "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "o")])
    assert code == 2
    assert f"--input {tmp_path / 'nope'} does not exist" in capsys.readouterr().err
    twice = ["--input", str(tmp_path / "vctk"), "--input", f"{tmp_path / 'vctk'}/", "--output", str(tmp_path / "o")]
    assert run(twice) == 2
    assert f"--input {tmp_path / 'vctk'} is given twice" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_dataflow_dry_run_builds_with_several_inputs(capsys, tmp_path):
    from melshards.commands.preprocess import run
    from tests.preprocess.test_job import DATAFLOW_DRY_RUN

    write_vctk(tmp_path / "vctk")
    write_commonvoice(tmp_path / "cy")
    code = run(
        [
            "--input",
            str(tmp_path / "vctk"),
            "--input",
            str(tmp_path / "cy"),
            "--format",
            "commonvoice",
            "--output",
            "gs://melshards-test/out",
            *DATAFLOW_DRY_RUN,
        ]
    )
    assert code == 2 and "is not a commonvoice corpus" in capsys.readouterr().err  # --format applies to every input
    code = run(
        [
            "--input",
            str(tmp_path / "vctk"),
            "--input",
            str(tmp_path / "cy"),
            "--output",
            "gs://melshards-test/out",
            *DATAFLOW_DRY_RUN,
        ]
    )
    assert code == 0 and "dry run: the job graph was built" in capsys.readouterr().out
