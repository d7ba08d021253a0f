"""The `characters` and `phonemes` front ends' exact output, the language -> voice rule, and the
corpus vocabulary. The phonemes use the espeak-ng inside the espeakng-loader wheel: no system espeak."""

import subprocess
import sys

import pytest

from melshards.shards_schema import text_characters, text_clean, text_phonemes
from melshards.shards_schema.text import TextRejected, check_text, check_texts, frontend
from melshards.shards_schema.vocab import EOS, PAD, Vocabulary

MINIMAL_PAIRS = [
    ("schön", "schon", "de"),
    ("pêche", "péché", "fr"),
    ("papá", "papa", "es"),
    ("妈", "马", "zh-CN"),
    ("妈", "马", "cmn"),
]


# --- characters -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, language, expected",
    [
        ("Schön!", "de", "schön!"),
        ("Péché « oui » — dit-il…", "fr", 'péché "oui" - dit-il...'),
        ("¿Papá?", "es", "¿papá?"),
        ("妈妈骂马。", "zh-CN", "妈妈骂马."),
        (
            "你好，世界！２０２４年（测试）。「好」",
            "zh-CN",
            '你好, 世界! 2024年 (测试). "好"',
        ),  # num2words has no zh: digits
        ("2024年に", "ja", "二千二十四年に"),
        ("Am 3. Mai: 2,50 € für 1.000 Leute", "de", "am drei. mai: zwei komma fünf € für eintausend leute"),
        ("1 000 000 Euro", "de", "eine million euro"),
        ("The 1,000 “cats” cost 2.5 — really", "en-US", 'the one thousand "cats" cost two point five - really'),
        ("2,5 kg", "es", "2,5 kg"),  # a decimal num2words reads wrongly in Spanish keeps its digits
        ("12.05.2024", "de", "zwölf. fünf. zweitausendvierundzwanzig"),
        ("İSTANBUL ISPARTA", "tr", "istanbul ısparta"),
        ("ΟΔΟΣ", "el", "οδος"),
        ("x_y ~z #tag 🙂 a\u00adb", "en", "x y z tag ab"),
        ("  Tab\there\nnew ", "en", "tab here new"),
        ("می\u200cخواهم 12", "fa", "می\u200cخواهم دوازده"),  # the zero-width non-joiner is spelling
        ("Cafe\u0301", "fr", "café"),  # NFC
        ("50 % & 3 + 4 @ $", "en", "fifty % & three + four @ $"),
    ],
)
def test_characters_output(raw, language, expected):
    assert text_characters.normalize(raw, language) == expected


@pytest.mark.parametrize("a, b, language", MINIMAL_PAIRS)
def test_minimal_pairs_differ_under_characters(a, b, language):
    x, y = check_texts([a, b], language, "characters")
    assert x != y and x == a.lower() and y == b.lower()


def test_characters_reads_every_language_code_and_refuses_a_malformed_one():
    f = frontend("characters")
    assert all(f.supports(c) for c in ("de", "zh-CN", "pt_BR", "xx", "cmn"))
    for code in ("", "not a code", "1"):
        with pytest.raises(TextRejected) as e:
            check_text("hallo", code, "characters")
        assert e.value.reason == "unsupported_language"


@pytest.mark.parametrize(
    "language, expected",
    [
        ("pt-BR", "pt_BR"),
        ("pt", "pt"),
        ("de-AT", "de"),
        ("en_IN", "en_IN"),
        ("nb", "no"),
        ("zh-CN", None),
        ("xx", None),
    ],
)
def test_num2words_language(language, expected):
    assert text_clean.num2words_language(language) == expected


# --- phonemes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "language, voice",
    [
        ("en", "en-us"),
        ("en-US", "en-us"),
        ("en_GB", "en-gb"),
        ("en-AU", "en-us"),
        ("de", "de"),
        ("de-AT", "de"),
        ("fr", "fr-fr"),
        ("fr-CA", "fr-fr"),
        ("pt-BR", "pt-br"),
        ("pt", "pt"),
        ("zh", "cmn"),
        ("zh-CN", "cmn"),
        ("cmn", "cmn"),
        ("zh-HK", "yue"),
        ("nb-NO", "nb"),
        ("es-419", "es-419"),
        ("xx", None),
        ("klingon", None),
        ("", None),
    ],
)
def test_language_codes_map_to_espeak_voices(language, voice):
    assert text_phonemes.espeak_voice(language) == voice


def test_the_voices_are_espeaks_own_list():
    assert {"de", "cmn", "en-us", "fr-fr", "pt-br", "yue", "ja"} <= text_phonemes.voices()
    assert len(text_phonemes.voices()) > 100


def test_the_espeak_release_is_the_one_the_version_was_made_with():
    """espeak-ng's output changes between releases: a new release needs the outputs checked and
    text_phonemes.VERSION bumped (with ESPEAK_VERSION)."""
    assert text_phonemes.espeak_version() == text_phonemes.ESPEAK_VERSION


@pytest.mark.parametrize(
    "raw, language, expected",
    [
        ("schön", "de", "ʃˈøːn"),
        ("Schon", "de", "ʃˈoːn"),
        ("pêche", "fr", "pˈɛʃ"),
        ("péché", "fr", "peʃˈe"),
        ("papá", "es", "papˈa"),
        ("papa", "es", "pˈapa"),
        ("妈", "zh-CN", "mˈɑ5"),
        ("马", "cmn", "mˈɑ2"),
        ("你好，世界！", "zh", "ni2χˈɑu2, s.ˈi.5 tɕˈiɛ5!"),
        ('He said "no", then left.', "en-US", 'hiː sˈɛd "nˈoʊ", ðˈɛn lˈɛft.'),
        ("It costs 2.5 — USA", "en", "ɪt kˈɔsts tˈuː pˈɔɪnt fˈaɪv - jˌuːˌɛsˈeɪ"),  # num2words, then espeak
        ("Olá, tudo bem? 3 vezes", "pt-BR", "olˈa, tˈudʊ bˈeɪŋ? trˈez vˈezys"),
    ],
)
def test_phonemes_output(raw, language, expected):
    assert check_text(raw, language, "phonemes") == expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("hello ˈworld", "həlˈoʊ wˈɜːld"),  # v1: "həlˈoʊ stɹˈɛswˈɜːld" ("stress")
        ("a\u3164b", "ˈæb"),  # v1: "ɐ tʃˈaɪniːzlˌɛɾɚ bˈiː" ("Chinese letter": U+3164 HANGUL FILLER)
        ("ma˥˩ nuː", "mˈɑː nˈuː"),
        ("a\ufe0fb", "ˈæb"),  # a variation selector
        ("ʻokina", "ɑːkˈiːnə"),  # an orthography's letter stays
    ],
)
def test_phonemes_drop_phonetic_marks_and_invisible_fillers_rather_than_speak_their_names(raw, expected):
    assert check_text(raw, "en", "phonemes") == expected


@pytest.mark.parametrize("raw", ["ˈˌː", "\u3164", "ˈ \u3164 ː"])
def test_a_text_of_nothing_but_marks_is_unusable_under_phonemes_as_under_characters(raw):
    for name in ("phonemes", "characters"):
        with pytest.raises(TextRejected) as e:
            check_text(raw, "en", name)
        assert e.value.reason == "unusable_text", name


def test_characters_drops_the_code_points_unicode_says_to_ignore_and_keeps_the_joiners():
    assert text_characters.normalize("a\u3164b \u2764\ufe0f c\u034fd \u115fe", "ko") == "ab cd e"
    assert text_characters.normalize("می\u200cخواهم", "fa") == "می\u200cخواهم"


@pytest.mark.parametrize("a, b, language", MINIMAL_PAIRS)
def test_minimal_pairs_differ_under_phonemes(a, b, language):
    x, y = check_texts([a, b], language, "phonemes")
    assert isinstance(x, str) and isinstance(y, str) and x != y


def test_phonemes_for_an_unknown_language_is_unsupported_language():
    assert not frontend("phonemes").supports("xx")
    out = check_texts(["hello", ""], "xx", "phonemes")
    assert [x.reason for x in out] == ["unsupported_language"] * 2
    with pytest.raises(TextRejected) as e:
        frontend("phonemes").normalize("hello", "qq-ZZ")
    assert e.value.reason == "unsupported_language"


def test_a_batch_is_phonemized_as_each_row_alone():
    """Empty and punctuation-only rows are not given to phonemizer, which misaligns a batch after an
    empty line."""
    rows = ["Hello there.", "", "--- !!!", "   ", "forty-five (maybe)", "¿Qué?", "It's 10 o'clock", "a"]
    batch = check_texts(rows, "en", "phonemes")
    alone = [check_texts([r], "en", "phonemes")[0] for r in rows]
    assert [str(x) for x in batch] == [str(x) for x in alone]
    assert [x.reason for x in batch if isinstance(x, TextRejected)] == ["empty_text", "unusable_text", "empty_text"]
    assert text_phonemes.phonemize_many(["hello", "", "world"], "en") == ["həlˈoʊ", "", "wˈɜːld"]


def test_a_backend_is_made_once_per_process_and_voice():
    a = text_phonemes.backend_for("en")
    assert text_phonemes.backend_for("en-US") is a and text_phonemes.backend_for("de") is not a


def test_importing_the_front_ends_imports_no_phonemizer_and_no_inflect():
    code = (
        "import sys, melshards.shards_schema.text\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('phonemizer', 'espeakng_loader', 'inflect')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- the vocabulary -------------------------------------------------------------------------------


def test_vocabulary_from_symbols_is_sorted_and_the_same_in_any_order():
    symbols = ["妈", "a", "ö", "ʃ", " ", "ˈ", "a", "5"]
    v = Vocabulary.from_symbols(symbols)
    assert v.symbols == (PAD, EOS, " ", "5", "a", "ö", "ʃ", "ˈ", "妈")
    assert Vocabulary.from_symbols(reversed(symbols)).symbols == v.symbols
    assert Vocabulary.from_symbols({"ʃˈøːn", "a"}).symbols == (
        PAD,
        EOS,
        "a",
        "n",
        "ø",
        "ʃ",
        "ˈ",
        "ː",
    )  # strings: their code points


def test_underscore_and_tilde_in_a_corpus_are_symbols_like_any_other():
    v = Vocabulary.from_symbols("a_b~c")
    ids, skipped = v.encode("a_~")
    assert skipped == 0 and v.decode(ids) == "a_~" and 0 not in ids and 1 not in ids
    assert v.pad_id == 0 and v.eos_id == 1 and v.symbols[:2] == ("\x00", "\x03")


def test_the_reserved_symbols_are_never_encoded_and_no_front_end_writes_them():
    v = Vocabulary.from_symbols(["a", PAD, EOS])
    assert v.symbols == (PAD, EOS, "a") and v.encode(f"a{PAD}{EOS}") == ([2], 2)
    for name in ("characters", "english"):
        assert check_text(f"a{PAD}b{EOS}c", "en", name) == "a b c"


def test_a_vocabulary_written_before_still_reads():
    v = Vocabulary(["_", "~", "a", "b"])
    assert v.encode("ab_~") == ([2, 3], 2) and v.decode([0, 1, 2, 3]) == "ab"
    with pytest.raises(ValueError, match="must start with pad"):
        Vocabulary(["a", "b"])
    with pytest.raises(ValueError, match="single code points"):
        Vocabulary([PAD, EOS, "ab"])
