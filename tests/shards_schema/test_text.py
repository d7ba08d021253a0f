import pytest

from melshards.shards_schema.text import TextRejected, check_text, expand_numbers, has_speakable_content, normalize_text


@pytest.mark.parametrize("raw, expected", [
    ("Mr. Smith paid $3.50 for 2 cafés in 1984.",
     "mister smith paid three dollars fifty cents for two cafes in nineteen eighty-four."),
    ("Dr. Who, 1st of 2,000 on the 21st!", "doctor who, first of two thousand on the twenty-first!"),
    ("It cost £100 and 5% of $1 in 2005.",
     "it cost one hundred pounds and five percent of one dollar in two thousand five."),
    ("naïve   Zoë & Co.", "naive zoe and company"),
    ("He said: \"no\"; then left", "he said: \"no\", then left"),
    ("1900 and 2.5", "nineteen hundred and two point five"),
])
def test_normalize_text_spells_out_numbers_currency_and_abbreviations(raw, expected):
    assert normalize_text(raw) == expected


def test_expand_numbers_reads_large_numbers_as_cardinals():
    assert expand_numbers("12345") == "twelve thousand three hundred forty-five"


def test_punctuation_only_text_is_not_speakable():
    assert normalize_text("--- !!! ???") == "--- !!! ???"
    assert not has_speakable_content(normalize_text("--- !!! ???"))
    assert has_speakable_content("a")


@pytest.mark.parametrize("raw, reason", [("", "empty_text"), (" \t ", "empty_text"), ("--- !!! ???", "unusable_text"),
                                         ("\u2014 \u2026 ?!", "unusable_text")])
def test_check_text_refuses_with_the_reason_preprocess_records(raw, reason):
    with pytest.raises(TextRejected) as e:
        check_text(raw)
    assert e.value.reason == reason


def test_check_text_returns_the_normalised_text():
    assert check_text("  Dr. Who, 1st!") == "doctor who, first!"
