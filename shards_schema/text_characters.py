"""The `characters` front end: a transcript's own letters, cleaned, in any language.

Unicode NFC, punctuation unified to a small set, numbers spoken with num2words in the row's language
(where num2words has it; elsewhere the digits stay), lowercase (str.lower; Turkish and Azerbaijani
dotted/dotless i). No folding to ASCII: "schön" keeps its "ö", 妈 and 马 stay two characters; the
vocabulary is the corpus's own code points.

Any change to `normalize`'s output (here or in `text_clean`) must bump VERSION.
"""

from __future__ import annotations

from melshards.shards_schema import text_clean

NAME = "characters"
VERSION = 2  # 1 kept the invisible code points Unicode says to ignore (U+3164 HANGUL FILLER, variation selectors)


def supports(language: str) -> bool:
    """Every language: any well-formed language code."""
    return text_clean.language_code(language) is not None


def normalize(raw: str, language: str) -> str:
    text = text_clean.clean(raw)
    text = text_clean.spell_numbers(text, language)
    return text_clean.tidy(text_clean.lowercase(text, language))


def normalize_many(raws: list[str], language: str) -> list[str]:
    return [normalize(raw, language) for raw in raws]
