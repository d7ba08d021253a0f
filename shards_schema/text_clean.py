"""The cleaning the `characters` and `phonemes` front ends share: pure functions, no state.

Any change to what these functions return changes both front ends' output, so it must bump
`text_characters.VERSION` and `text_phonemes.VERSION` (tests/shards_schema/test_text_frontends.py
pins exact outputs).

- `language_code`: a corpus's code (`en_US`, `zh-CN`) -> lowercase with `-` (`en-us`, `zh-cn`), or
  None if it is not a language tag; `canonical_language`: the code a run names a language by, one
  for every spelling of a tag (`EN`, `en` -> `en`; `en_us` -> `en-US`).
- `clean`: Unicode NFC, full-width ASCII forms to ASCII, quotes / dashes / CJK and other scripts'
  sentence marks unified to `PUNCTUATION`, symbols and controls dropped, the invisible code points
  Unicode says to ignore dropped (`IGNORABLE`: Hangul fillers, variation selectors; not the
  zero-width joiners), whitespace collapsed; no folding of letters to ASCII (the corpus's own code
  points are its symbols).
- `spell_numbers`: digits -> words with num2words in the row's language where num2words has it;
  elsewhere the digits stay.
- `lowercase`: str.lower, except Turkish and Azerbaijani (dotted and dotless i).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from decimal import Decimal, InvalidOperation


class TextRejected(ValueError):
    """A transcript a front end refuses; `reason` is the one preprocess records in rejected.jsonl:
    `empty_text`, `unusable_text` or `unsupported_language`."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail

    def __reduce__(self):  # Beam pickles rejections across workers
        return TextRejected, (self.reason, self.detail)


# --- language codes -------------------------------------------------------------------------------

_TAG = re.compile(r"^[a-z]{2,3}(?:-[a-z0-9]{1,8})*$")


def language_code(code: str) -> str | None:
    """`en_US` / `en-US` -> `en-us`; None for anything that is not a BCP-47-like tag."""
    if not isinstance(code, str):
        return None
    code = code.strip().replace("_", "-").lower()
    return code if _TAG.match(code) else None


def canonical_language(code: str) -> str:
    """A row's language code as the run names it: BCP 47 is case-insensitive, so every spelling of a
    tag is one language: `_` read as `-`, then the tag's conventional case (RFC 5646 2.1.1: the
    language subtag lowercase, a 4-letter script titlecase, a 2-letter or 3-digit region uppercase,
    the rest lowercase): `EN` -> `en`, `en_us` -> `en-US`, `ZH-hant-tw` -> `zh-Hant-TW`. Something that
    is not a language tag (`123`) is returned stripped, as it is (the front ends refuse it)."""
    tag = language_code(code)
    if tag is None:
        return code.strip() if isinstance(code, str) else code
    parts = tag.split("-")
    for i in range(1, len(parts)):
        if len(parts[i - 1]) == 1:  # a singleton (x-, u-) starts an extension: the rest as it is, lowercase
            break
        if len(parts[i]) == 4 and parts[i].isalpha():
            parts[i] = parts[i].title()
        elif len(parts[i]) == 2 and parts[i].isalpha() or len(parts[i]) == 3 and parts[i].isdigit():
            parts[i] = parts[i].upper()
    return "-".join(parts)


def primary_subtag(code: str) -> str:
    return code.split("-")[0]


# --- punctuation and symbols ----------------------------------------------------------------------

# The small punctuation set every cleaned text is written with (plus the space).
PUNCTUATION = "!\"'(),-.:;?¡¿"
# Symbols kept as they are: spoken ("50 %" is "fifty percent" in the row's language), so the
# model can learn them. Currency symbols (category Sc) are kept too.
SPOKEN_SYMBOLS = "%&+@"
# Format characters that are part of the spelling of words (Persian, Indic scripts): kept.
_JOINERS = "\u200c\u200d"
# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt) less the joiners: invisible code
# points that pronounce nothing, some of them letters (U+3164 HANGUL FILLER is Lo) or marks (the
# variation selectors are Mn), so category alone would keep them. Dropped.
IGNORABLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b\u200e\u200f\u202a-\u202e"
    "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff]"
)

# Sentence marks of scripts written without spaces (Chinese, Japanese: "你好，世界") become the ASCII
# mark and a space ("你好, 世界"), so the phrase after them is a word of its own, as in other scripts.
_SPACED_MARKS = {
    **dict.fromkeys("，、﹐﹑､", ", "),
    **dict.fromkeys("。｡﹒", ". "),
    **dict.fromkeys("！﹗", "! "),
    **dict.fromkeys("？﹖", "? "),
    **dict.fromkeys("：﹕", ": "),
    **dict.fromkeys("；﹔", "; "),
    **dict.fromkeys("（［｛【〔〖〘〚", " ("),
    **dict.fromkeys("）］｝】〕〗〙〛", ") "),
}
_PUNCTUATION_MAP = {
    **dict.fromkeys('"“”„‟«»「」『』〝〞〟《》〈〉‹›＂', '"'),
    **dict.fromkeys("‘’‚‛`´′ʼ＇", "'"),
    **dict.fromkeys("‐‑‒–—―−⁃﹘﹣－", "-"),
    **dict.fromkeys("،؍፣", ","),
    **dict.fromkeys("।॥።۔", "."),
    **dict.fromkeys("؟", "?"),
    **dict.fromkeys("፥", ":"),
    **dict.fromkeys("؛፤", ";"),
    **dict.fromkeys("[{", "("),
    **dict.fromkeys("]}", ")"),
    "…": "...",
    "⋯": "...",
    **_SPACED_MARKS,
}
_PUNCTUATION_TABLE = str.maketrans(_PUNCTUATION_MAP)
# French sets its guillemets apart by (narrow no-break) spaces: « oui » -> "oui"
_GUILLEMET_SPACES = re.compile(r"(?<=«)\s+|\s+(?=»)")
_WHITESPACE = re.compile(r"\s+")
_SPACE_BEFORE = re.compile(r" (?=[.,!?;:)])")
_SPACE_AFTER = re.compile(r"(?<=[(¡¿]) ")


def _fullwidth_to_ascii(c: str) -> str:
    o = ord(c)
    return chr(o - 0xFEE0) if 0xFF01 <= o <= 0xFF5E else c


def _keep(c: str) -> str:
    """What a code point becomes: itself, a space, or nothing."""
    if c == " " or c in PUNCTUATION or c in SPOKEN_SYMBOLS or c in _JOINERS:
        return c
    cat = unicodedata.category(c)
    if cat[0] in "LMN" or cat == "Sc":
        return c
    if cat == "Cf":  # soft hyphen, direction marks, BOM: not between words
        return ""
    return " "


def clean(text: str) -> str:
    """NFC; full-width forms to ASCII; punctuation unified; other symbols and controls dropped;
    the `IGNORABLE` code points dropped; whitespace collapsed, no space before closing punctuation or
    after opening. Letters untouched."""
    text = _GUILLEMET_SPACES.sub("", IGNORABLE.sub("", unicodedata.normalize("NFC", text)))
    text = "".join(_fullwidth_to_ascii(c) for c in text.translate(_PUNCTUATION_TABLE))
    return tidy(unicodedata.normalize("NFC", "".join(_keep(c) for c in text)))


def tidy(text: str) -> str:
    """Whitespace collapsed to single spaces, none at the ends, before . , ! ? ; : ) or after ( ¡ ¿."""
    text = _WHITESPACE.sub(" ", text).strip()
    return _SPACE_AFTER.sub("", _SPACE_BEFORE.sub("", text))


# --- case -----------------------------------------------------------------------------------------

_TURKIC = frozenset({"tr", "az", "crh", "gag"})


def lowercase(text: str, language: str) -> str:
    """str.lower; Turkish and Azerbaijani (and Crimean Tatar, Gagauz) map I -> ı and İ -> i."""
    if primary_subtag(language) in _TURKIC:
        text = text.replace("I", "ı").replace("İ", "i")
    return unicodedata.normalize("NFC", text.lower())


# --- numbers --------------------------------------------------------------------------------------

# Languages that write 2,5 for two and a half (and group thousands with "." or a space); every other
# language writes 2.5 and groups with ",".
_DECIMAL_COMMA = frozenset(
    "af az be bg bs ca cs da de el es et eu fi fo fr gl hr hu hy id is it ka kk ky lt lv mk mn nb nl nn "
    "no pl pt ro ru sk sl sq sr sv tk tr uk uz vi".split()
)
# Languages whose num2words reading of a decimal fraction was checked (num2words 0.5.14 reads 2,5
# wrongly in ar, tr and vi, and as "punto" in es, which Spain does not say); elsewhere a decimal
# number keeps its digits.
_DECIMALS_READ = frozenset("cs da de en fi fr he hu id it ja ko nl no pl pt ro ru sk sv th uk".split())
# num2words's own codes where they differ from the language's.
_NUM2WORDS_ALIASES = {"nb": "no", "nn": "no", "kk": "kz"}
# Scripts written without spaces between words: a number's words are not set apart by spaces.
_NO_SPACES = frozenset("zh cmn yue wuu hak nan ja th lo km my bo".split())

_NUMBER = re.compile(r"\d+(?:[.,\u00a0\u202f ]\d+)*")


@functools.cache
def num2words_language(language: str) -> str | None:
    """The num2words language of a code (`pt-BR` -> `pt_BR`, `de-AT` -> `de`), or None if it has none."""
    from num2words import CONVERTER_CLASSES

    code = language_code(language)
    if code is None:
        return None
    parts = code.split("-")
    candidates = ["_".join([parts[0], parts[1].upper()])] if len(parts) > 1 else []
    candidates += [parts[0], _NUM2WORDS_ALIASES.get(parts[0], "")]
    return next((c for c in candidates if c in CONVERTER_CLASSES), None)


@functools.lru_cache(maxsize=4096)  # corpora repeat their numbers (small counts, years)
def _words(value, lang: str) -> str | None:
    from num2words import num2words

    try:
        words = num2words(value, lang=lang)
    except (NotImplementedError, OverflowError, ValueError, TypeError, InvalidOperation, IndexError, KeyError):
        return None
    return _WHITESPACE.sub(" ", words.replace(",", " ")).strip()


_UNPARSED = object()


@functools.lru_cache(maxsize=2)
def _number_patterns(decimal_comma: bool) -> tuple[re.Pattern, re.Pattern]:
    """(grouped, plain): "1,000.5" / "2.5" with a decimal point; "1.000,5" / "1 000" / "2,5" with a comma."""
    decimal, groups = (",", ".\u00a0\u202f ") if decimal_comma else (".", ",")
    grouped = re.compile(rf"(\d{{1,3}}(?:[{re.escape(groups)}]\d{{3}})+)(?:{re.escape(decimal)}(\d+))?")
    return grouped, re.compile(rf"(\d+)(?:{re.escape(decimal)}(\d+))?")


def _read_number(token: str, language: str, lang: str):
    """A number token's words; None to keep its digits (a decimal fraction in a language whose
    reading was not checked, a number num2words cannot read); _UNPARSED if it is not one number."""
    grouped, plain = _number_patterns(primary_subtag(language_code(language) or "") in _DECIMAL_COMMA)
    m = grouped.fullmatch(token)
    if m:
        whole, frac = re.sub(r"\D", "", m.group(1)), m.group(2)
    else:
        m = plain.fullmatch(token)
        if not m:
            return _UNPARSED
        whole, frac = m.group(1), m.group(2)
    if frac is None:
        return _words(int(whole), lang)
    if lang.split("_")[0] not in _DECIMALS_READ:
        return None
    return _words(Decimal(f"{whole}.{frac}"), lang)


def spell_numbers(text: str, language: str) -> str:
    """Digits -> words in the row's language (num2words), where num2words has the language.

    A number is digits with the language's grouping ("1,000" in English, "1.000" or "1 000" in
    German) and decimal mark ("2.5" / "2,5"); one that does not parse (a date "12.05.2024") is read
    as its runs of digits with their separators between. A number that cannot be read whole keeps
    its digits. Words are set apart by spaces except in languages written without them."""
    lang = num2words_language(language)
    if lang is None:
        return text
    pad = "" if primary_subtag(language_code(language) or "") in _NO_SPACES else " "

    def number(m: re.Match) -> str:
        token = m.group(0)
        words = _read_number(token, language, lang)
        if words is _UNPARSED:  # "12.05.2024": each run of digits, the separators between
            return re.sub(r"\d+", number, token)
        return token if words is None else f"{pad}{words}{pad}"

    return tidy(_NUMBER.sub(number, text))
