"""The shared text API (`melshards.shards_schema.text`) and the `english` front end's exact output."""

import pytest

from melshards.shards_schema.stats import REJECT_REASONS
from melshards.shards_schema.text import (
    FRONTENDS,
    TEXT_REASONS,
    TextRejected,
    check_text,
    check_texts,
    expand_numbers,
    frontend,
    frontend_record,
    has_speakable_content,
    normalize_text,
    normalizer_for,
)


@pytest.mark.parametrize(
    "raw, expected",
    [
        (
            "Mr. Smith paid $3.50 for 2 cafés in 1984.",
            "mister smith paid three dollars fifty cents for two cafes in nineteen eighty-four.",
        ),
        ("Dr. Who, 1st of 2,000 on the 21st!", "doctor who, first of two thousand on the twenty-first!"),
        (
            "It cost £100 and 5% of $1 in 2005.",
            "it cost one hundred pounds and five percent of one dollar in two thousand five.",
        ),
        ("naïve   Zoë & Co.", "naive zoe and company."),  # the abbreviation's dot ends the sentence
        ('He said: "no"; then left', 'he said: "no", then left'),
        ("1900 and 2.5", "nineteen hundred and two point five"),
        ("3.14 and 1905", "three point one four and nineteen oh five"),
        ("1,500 people in 1500", "one thousand five hundred people in fifteen hundred"),  # a comma: not a year
        ("COVID19 x²", "covid nineteen x two"),
        ("1.٣ and ٣٤", "one point three and thirty-four"),  # digits of another script, in a decimal too
    ],
)
def test_normalize_text_spells_out_numbers_currency_and_abbreviations(raw, expected):
    assert normalize_text(raw) == expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        # times (v1: "ten:thirtypm", "seven:forty-five")
        ("10:30pm", "ten thirty p m"),
        ("7:45", "seven forty-five"),
        ("7:00", "seven o'clock"),
        ("7:00 PM", "seven p m"),
        ("at 7:05 a.m. today", "at seven oh five a m today"),
        ("10:30:15", "ten thirty and fifteen seconds"),
        ("5pm", "five p m"),
        # amounts with scale words (v1: "one dollar fifty cents million")
        ("$1.5 million", "one point five million dollars"),
        ("$3 billion", "three billion dollars"),
        ("1.5 million €", "one point five million euros"),
        # currency symbols before or after (v1: "eurtwenty")
        ("€20", "twenty euros"),
        ("20€", "twenty euros"),
        ("€ 20", "twenty euros"),
        ("20 €", "twenty euros"),
        ("€1", "one euro"),
        ("$0.01", "one cent"),
        ("£2.50", "two pounds fifty pence"),
        ("£1.01", "one pound one penny"),
        ("¥500", "five hundred yen"),
        ("¥2.5", "two point five yen"),
        ("in $ or €", "in dollars or euros"),
        # scientific notation (v1: "oneesix")
        ("1e6", "one times ten to the six"),
        ("1.5e-3", "one point five times ten to the minus three"),
        ("6.02E23", "six point zero two times ten to the twenty-three"),
        # St. by context (v1: "saint paul saint")
        ("St. Paul st.", "saint paul street."),
        ("Main St. is busy", "main street is busy"),
        ("42nd St.", "forty-second street."),
        ("St Paul", "saint paul"),
        ("st. john", "saint john"),
        ("the st. was empty", "the street was empty"),
    ],
)
def test_english_fixes_the_v1_faults(raw, expected):
    assert check_text(raw, "en", "english") == expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        # decades (v2: "nineteen ninety s")
        ("the 1990s", "the nineteen nineties"),
        ("in the '80s, the 1900s and the 2000s", "in the eighties, the nineteen hundreds and the two thousands"),
        ("the 1960's", "the nineteen sixties"),
        # fractions (v2: "three four", "one two")
        ("3/4", "three quarters"),
        ("1/2 of 5/8 and 2/3", "one half of five eighths and two thirds"),
        ("2 1/2 cups", "two and one half cups"),
        ("24/7", "twenty-four seven"),  # not a proper fraction: its numbers
        ("½", "one half"),
        ("¾ and ⅓", "three quarters and one third"),
        ("2½ miles", "two and one half miles"),
        # "No." before a number (v2: "no. five")
        ("No. 5", "number five"),
        ("no.12 and NO. 3", "number twelve and number three"),
        ("No. I said no 2 times", "no. i said no two times"),
        # format characters are not between words (v2: "hel lo")
        ("Hel\u200blo wo\u2060rld\ufeff", "hello world"),
    ],
)
def test_english_fixes_the_v2_faults(raw, expected):
    assert check_text(raw, "en", "english") == expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        # numbers after a comma (v2: "items one,,", "three, to two")
        ("items 1,2,3", "items one, two, three"),
        ("3,5 to 2", "three, five to two"),
        ("1,5000", "one, five thousand"),
        ("1/2,3/4 and 1980s,1990s", "one half, three quarters and nineteen eighties, nineteen nineties"),
        ("1,000 and 12,345.5", "one thousand and twelve thousand three hundred forty-five point five"),
        # more currencies (v2: "rsfive hundred", "rone hundred")
        ("₹500", "five hundred rupees"),
        ("₽100", "one hundred rubles"),
        ("₹2.50 or ₽1", "two rupees fifty paise or one ruble"),
        ("₩1,000 and 50¢", "one thousand won and fifty cents"),
        ("in ₹ or ₽", "in rupees or rubles"),
        # grouped in lakhs and crores, as rupee amounts are written
        ("₹1,50,000", "one hundred fifty thousand rupees"),
        ("1,23,456 people", "one hundred twenty-three thousand four hundred fifty-six people"),
        ("12,34,56,789", "one hundred twenty-three million four hundred fifty-six thousand seven hundred eighty-nine"),
    ],
)
def test_english_reads_numbers_after_a_comma_and_rupees_and_rubles(raw, expected):
    assert check_text(raw, "en", "english") == expected


def test_synthesis_reads_numbers_after_a_comma_as_the_shards_do():
    normalize = normalizer_for(frontend_record("english"))
    assert normalize("items 1,2,3", "en") == check_texts(["items 1,2,3"], "en", "english")[0] == "items one, two, three"


def test_english_and_characters_remove_format_characters_alike():
    raw = "Hel\u200blo, sh\u00adell\u2060fish\u200e!"
    assert check_text(raw, "en", "english") == check_text(raw, "en", "characters") == "hello, shellfish!"


def test_expand_numbers_reads_large_numbers_as_cardinals():
    assert expand_numbers("12345") == "twelve thousand three hundred forty-five"


def test_english_keeps_no_space_before_punctuation_and_reads_a_lowercase_st_after_a_word_as_street():
    assert normalize_text("At 10:30pm, $1.5 million.") == "at ten thirty p m, one point five million dollars."
    assert normalize_text("St. Paul st. It was late.") == "saint paul street. it was late."
    assert normalize_text("The church of St. Paul on Main St. is old.") == (
        "the church of saint paul on main street is old."
    )


def test_punctuation_only_text_is_not_speakable():
    assert normalize_text("--- !!! ???") == "---!!!???"
    assert not has_speakable_content(normalize_text("--- !!! ???"))
    assert has_speakable_content("a")


@pytest.mark.parametrize(
    "text, speakable",
    [
        ("妈", True),
        ("ʃˈøːn", True),
        ("мама", True),
        ("مرحبا", True),
        ("42", True),
        ("ˈˌː", False),
        ("- ... ?!", False),
        ("", False),
        ("\u0301", False),
    ],
)
def test_speakable_content_is_a_letter_of_any_script_an_ipa_symbol_or_a_digit(text, speakable):
    assert has_speakable_content(text) is speakable


@pytest.mark.parametrize(
    "raw, reason",
    [
        ("", "empty_text"),
        (" \t ", "empty_text"),
        ("--- !!! ???", "unusable_text"),
        ("\u2014 \u2026 ?!", "unusable_text"),
    ],
)
def test_check_text_refuses_with_the_reason_preprocess_records(raw, reason):
    with pytest.raises(TextRejected) as e:
        check_text(raw)
    assert e.value.reason == reason


def test_check_text_returns_the_normalised_text():
    assert check_text("  Dr. Who, 1st!") == "doctor who, first!"


@pytest.mark.parametrize("language", ["en", "en-US", "en_GB", "EN-au"])
def test_english_reads_english_codes(language):
    assert frontend("english").supports(language)
    assert check_text("Hi", language, "english") == "hi"


@pytest.mark.parametrize("language", ["de", "fr", "zh-CN", "eng", ""])
def test_english_refuses_other_languages(language):
    assert not frontend("english").supports(language)
    with pytest.raises(TextRejected) as e:
        check_text("Hallo Welt", language, "english")
    hint = "is not a language code" if language == "" else "text.languages"
    assert e.value.reason == "unsupported_language" and hint in e.value.detail


def test_english_refuses_other_scripts_rather_than_fold_them():
    with pytest.raises(TextRejected) as e:
        check_text("my mother 妈", "en", "english")
    assert e.value.reason == "unsupported_language" and "妈" in e.value.detail
    assert check_text("Café Zoë, 5µm", "en", "english") == "cafe zoe, five um"


def test_check_texts_gives_each_row_its_text_or_its_rejection():
    out = check_texts(["Hi 2", "", "?!", "妈"], "en", "english")
    assert out[0] == "hi two"
    assert [x.reason for x in out[1:]] == ["empty_text", "unusable_text", "unsupported_language"]
    unsupported = check_texts(["a", "b"], "de", "english")
    assert [x.reason for x in unsupported] == ["unsupported_language"] * 2


def test_every_reason_is_one_preprocess_records():
    assert set(TEXT_REASONS) <= set(REJECT_REASONS)


def test_the_registry_names_and_versions():
    assert {n: f.version for n, f in FRONTENDS.items()} == {
        "characters": 2,
        "phonemes": 2,
        "english": 3,
        "alignments": 1,
    }
    assert frontend_record("english") == {"name": "english", "version": 3}
    assert frontend_record("characters") == {"name": "characters", "version": 2}


def test_an_unknown_front_end_is_a_config_error_naming_the_known_ones():
    with pytest.raises(ValueError, match="alignments, characters, english, phonemes"):
        frontend("ascii")
    with pytest.raises(ValueError, match="unknown text front end 'ascii'"):
        check_texts(["a"], "en", "ascii")


def test_normalizer_for_a_recorded_front_end():
    normalize = normalizer_for({"name": "english", "version": 3})
    assert normalize("Dr. Who", "en") == "doctor who"
    assert normalizer_for({"name": "characters", "version": 2})("Schön 2", "de") == "schön zwei"
    with pytest.raises(TextRejected):
        normalize("", "en")


@pytest.mark.parametrize(
    "record",
    [{"name": "english", "version": 2}, {"name": "english", "version": 99}, {"name": "ascii", "version": 1}, {}],
)
def test_normalizer_for_refuses_a_front_end_or_version_this_melshards_does_not_have(record):
    with pytest.raises(ValueError) as e:
        normalizer_for(record)
    message = str(e.value)
    assert "\n" not in message and "english v3" in message and "re-run `melshards preprocess`" in message


# --- text -> ids: one rule for preprocess and synthesis -------------------------------------------


def test_text_ids_refuses_a_text_with_symbols_the_vocabulary_lacks_naming_them_in_order():
    from melshards.shards_schema.vocab import UnknownSymbols, Vocabulary, text_ids

    v = Vocabulary.from_symbols("abc ")
    assert text_ids("ab ca", v) == [3, 4, 2, 5, 3]
    with pytest.raises(UnknownSymbols) as e:
        text_ids("a%b!c%", v)
    assert e.value.symbols == ("%", "!")
    assert str(e.value) == "'a%b!c%' holds symbol(s) the vocabulary lacks: '%', '!'"
    phones = Vocabulary.from_symbols(["HH AH0", "L"], unit="phone")
    assert text_ids("HH L", phones) == [3, 4]
    with pytest.raises(UnknownSymbols, match="lacks: 'OW1'$"):
        text_ids("HH OW1 L", phones)


def test_preprocess_and_synthesis_map_text_to_ids_by_the_same_rule(shards_dir):
    import dataclasses

    from melshards.shards_schema import read_schema
    from melshards.shards_schema.config import ConfigError
    from melshards.shards_schema.vocab import UnknownSymbols
    from melshards.shards_schema.vocab import text_ids as record_ids
    from melshards.train.synthesize import padded_text_ids as synthesis_ids

    schema = read_schema(str(shards_dir))
    schema = dataclasses.replace(schema, vocabulary=tuple(s for s in schema.vocabulary if s not in "%!"))
    ids, n = synthesis_ids("stop", schema)
    assert list(ids[0, :n]) == list(record_ids("stop", schema.vocab())) and n == 4
    with pytest.raises(UnknownSymbols):
        record_ids("stop! fifty %", schema.vocab())
    with pytest.raises(ConfigError) as e:
        synthesis_ids("stop! fifty %", schema)
    assert str(e.value) == (
        "TEXT, normalised to 'stop! fifty %', holds '!', '%', which this model's vocabulary lacks (no transcript "
        "it was trained on had them): leave them out or spell them out in words"
    )


def test_the_serving_signature_refuses_symbols_the_vocabulary_lacks_rather_than_skip_them(shards_dir):
    import dataclasses

    from melshards.shards_schema import read_schema
    from melshards.train.synthesize import Synthesizer
    from melshards.train.tf_quiet import tf

    class Echo:  # speaks as many frames as it reads symbols
        variables = []

        def generate(self, text_ids, text_len, speaker_id, language_id):
            return {"mel": tf.zeros([1, 4, 2]), "mel_len": text_len}

    schema = read_schema(str(shards_dir))
    schema = dataclasses.replace(schema, vocabulary=tuple(s for s in schema.vocabulary if s != "!"))
    synth = Synthesizer(Echo(), schema)
    who, lang = tf.constant(schema.speakers[0].name), tf.constant(schema.languages[0].code)
    assert int(synth.serve(text=tf.constant("stop it"), speaker=who, language=lang)["mel_len"][0]) == 7
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        synth.serve(text=tf.constant("stop it!"), speaker=who, language=lang)
    assert "the text holds symbols the vocabulary of this model lacks" in e.value.message
    assert "they are:] [!]" in e.value.message


def test_synthesize_refuses_text_with_symbols_the_models_vocabulary_lacks_with_exit_2(shards_dir, tmp_path):
    import json

    from click.testing import CliRunner

    from melshards.commands.synthesize import synthesize_command

    model = tmp_path / "m"
    model.mkdir()
    schema = json.loads((shards_dir / "schema.json").read_text())
    schema["vocabulary"] = [s for s in schema["vocabulary"] if s != "!"]
    (model / "schema.json").write_text(json.dumps(schema))
    (model / "train_config.json").write_text("{}")
    out = tmp_path / "new" / "out.wav"
    result = CliRunner().invoke(synthesize_command, ["Stop it!", "--model-dir", str(model), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert "TEXT, normalised to 'stop it!', holds '!', which this model's vocabulary lacks" in result.output
    assert "Traceback" not in result.output and not out.parent.exists()


# --- language codes: one language for every spelling of a tag -------------------------------------


@pytest.mark.parametrize(
    "written, code",
    [
        ("EN", "en"),
        (" en ", "en"),
        ("en", "en"),
        ("en_us", "en-US"),
        ("EN-us", "en-US"),
        ("en-US", "en-US"),
        ("ZH-hant-tw", "zh-Hant-TW"),
        ("zh-cn", "zh-CN"),
        ("es-419", "es-419"),
        ("CMN", "cmn"),
        ("de-DE-x-Ab", "de-DE-x-ab"),
        ("123", "123"),
        (" 123 ", "123"),
    ],
)
def test_canonical_language_folds_case_and_underscores_to_the_tags_conventional_spelling(written, code):
    from melshards.shards_schema.text_clean import canonical_language

    assert canonical_language(written) == code


def test_rows_in_en_and_EN_are_one_language_read_by_the_english_front_end_and_the_summary_names_the_fold():
    from melshards.commands.preprocess import input_lines
    from melshards.preprocess.config import TextConfig
    from melshards.preprocess.inputs.rows import complete_rows, row

    rows = [
        row("a", "2024", "a.wav", 0, language="en"),
        row("b", "2024", "b.wav", 1, language="EN"),
        row("c", "2024", "c.wav", 2, language="en_gb"),
        row("d", "2024", "d.wav", 3),
    ]
    folded = {}
    assert [r["language"] for r in complete_rows(rows, "lj", "EN-us", folded)] == ["en", "en", "en-GB", "en-US"]
    assert folded == {"EN": "en", "en_gb": "en-GB", "EN-us": "en-US"}
    assert {TextConfig().frontend_for(code) for code in ("en", "EN", "en-GB", "En_us")} == {"english"}
    assert TextConfig(languages={"ZH_cn": "phonemes"}).frontend_for("zh-CN") == "phonemes"
    summary = {
        "input": "m.csv",
        "name": "m",
        "format": "manifest",
        "rows": 4,
        "language": "EN-us",
        "prefixed_speakers": 0,
        "prefixed_ids": 0,
        "language_codes_folded": dict(sorted(folded.items())),
    }
    assert input_lines([summary]) == [
        "input m (manifest, m.csv): 4 input rows, default language EN-us; language codes folded (BCP 47 ignores "
        "case): 'EN' -> 'en', 'EN-us' -> 'en-US', 'en_gb' -> 'en-GB'"
    ]


def test_the_read_stage_lists_each_inputs_folded_language_codes_in_stats_inputs(tmp_path, corpus_dir):
    import shutil

    from melshards.preprocess.inputs.read_stage import _ReadRows, detect_corpus, named

    shutil.copy(next((corpus_dir / "wavs").glob("*.wav")), tmp_path / "a.wav")
    (tmp_path / "m.csv").write_text("id,audio,text,language\na,a.wav,Hello,EN\nb,a.wav,Hi,en\nc,a.wav,Hey,en_gb\n")
    read = _ReadRows(named([detect_corpus(str(tmp_path / "m.csv"))]), str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    inputs = [x.value for x in read.process(None) if getattr(x, "tag", None) == "inputs"]
    assert [i["language_codes_folded"] for i in inputs[0]] == [{"EN": "en", "en_gb": "en-GB"}]


# --- messages that say what is wrong and what to do -----------------------------------------------


@pytest.mark.parametrize("name", ["characters", "english", "phonemes"])
def test_a_language_that_is_no_language_code_is_refused_as_such_by_every_front_end(name):
    out = check_texts(["hello"], "123", name)[0]
    assert out.reason == "unsupported_language"
    assert out.detail == (
        "'123' is not a language code (a BCP 47 tag: a 2- or 3-letter language, then optional "
        "subtags, e.g. en, en-US, zh-CN); fix the row's language, or the input's --language"
    )


def test_english_shows_another_scripts_letters_in_order_of_appearance_with_a_hint_that_fits():
    out = check_texts(["Привет мир, как дела"], "en", "english")[0]
    assert out.reason == "unsupported_language"
    assert out.detail == (
        "'Привет мир, как дела' holds letters of the cyrillic script ('Приветмк' and 3 more), not of the Latin "
        "script of its language 'en', the only one the english front end reads: set the row's language to the "
        "text's own, or map 'en' to the characters front end in the config's `text.languages`"
    )
    assert "greek and cyrillic script ('Ωμέγαи')" in check_texts(["Ωμέγα и"], "en", "english")[0].detail
