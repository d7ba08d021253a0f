"""The `english` front end: English transcripts to lowercase ASCII words, for English codes only.

Format characters (zero-width space, soft hyphen, direction marks: Unicode category Cf) are removed
first, as the `characters` front end removes them ("Hel\u200blo" -> "hello"). Times, currency amounts
(with scale words, the symbol before or after; digits grouped in thousands, or in lakhs and crores
as in "₹1,50,000"), scientific notation, percentages, ordinals, decades
("the 1990s" -> "the nineteen nineties"), fractions ("3/4" and "¾" -> "three quarters", "2½" -> "two
and one half"), years, decimals and cardinals are spelled out (num2words, English), the
abbreviations expanded ("St." by context: "saint" before a capitalised name, "street" after a word;
"No. 5" -> "number five"), then the Latin letters folded to ASCII (unidecode: "café" -> "cafe") and
lowercased. A letter of
another script is not folded (unidecode would write 妈 as "ma"): `foreign_letters` finds them and
the front end refuses the row (`unsupported_language`).

Symbols: a-z, space and !'"(),-.:;?

Any change to `normalize`'s output must bump VERSION (1: inflect's number words, "St." always
"saint", "10:30" as "ten:thirty", "€20" as "eurtwenty"; 2: "the 1990s" as "nineteen ninety s", "3/4"
and "½" as "three four" and "one two", "No. 5" as "no. five", a zero-width space splitting a word,
the digits after a comma dropped: "items 1,2,3" as "items one,,", "₹500" as "rsfive hundred").
"""

from __future__ import annotations

import functools
import re
import unicodedata

from unidecode import unidecode

NAME = "english"
VERSION = 3


def supports(language: str) -> bool:
    """English codes only: `en` and `en-*` (`en_US` too)."""
    code = language.strip().replace("_", "-").lower() if isinstance(language, str) else ""
    return code == "en" or code.startswith("en-")


# --- number words ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)  # corpora repeat their numbers
def _num2words(n: int, to: str) -> str:
    from num2words import num2words  # imported on first use

    return _plain(num2words(n, lang="en", to=to))


def cardinal(n: int) -> str:
    """12345 -> "twelve thousand three hundred forty-five" (no "and", no commas)."""
    return _num2words(n, "cardinal")


def ordinal(n: int) -> str:
    return _num2words(n, "ordinal")


def year(n: int) -> str:
    """1984 -> "nineteen eighty-four", 1905 -> "nineteen oh five", 2005 -> "two thousand five"."""
    return _num2words(n, "year").replace("oh-", "oh ")


def decimal(number: str) -> str:
    """ "2.5" -> "two point five", "3.14" -> "three point one four"."""
    whole, _, frac = number.partition(".")
    words = cardinal(int(whole))
    return (
        f"{words} point {' '.join(_DIGITS[str(int(d))] for d in frac)}" if frac else words
    )  # "٣": any script's digits


def _plain(words: str) -> str:
    words = words.replace(",", "")
    return re.sub(r"\s+", " ", re.sub(r"\band\b", " ", words)).strip()


_DIGITS = dict(zip("0123456789", "zero one two three four five six seven eight nine".split()))
_SCALE = r"(?:thousand|million|billion|trillion)"
# grouped in lakhs and crores ("1,50,000", "12,34,56,789"), in thousands ("1,000"), or not at all
_GROUPED = r"\d{1,2}(?:,\d{2})+,\d{3}|\d{1,3}(?:,\d{3})+"
_AMOUNT = rf"(?:{_GROUPED})(?:\.\d+)?|\d+(?:\.\d+)?"
# symbol -> (unit, units, subunit, subunits); subunit None: amounts are read as decimals
_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "€": ("euro", "euros", "cent", "cents"),
    "¥": ("yen", "yen", None, None),
    "₹": ("rupee", "rupees", "paisa", "paise"),
    "₽": ("ruble", "rubles", "kopeck", "kopecks"),
    "₩": ("won", "won", None, None),
    "₺": ("lira", "lira", "kurus", "kurus"),
    "₪": ("shekel", "shekels", "agora", "agorot"),
    "₦": ("naira", "naira", "kobo", "kobo"),
    "₱": ("peso", "pesos", "centavo", "centavos"),
    "₴": ("hryvnia", "hryvnias", "kopiyka", "kopiykas"),
    "₫": ("dong", "dong", None, None),
    "₿": ("bitcoin", "bitcoins", None, None),
    "¢": ("cent", "cents", None, None),
}
_SYMBOL = "[" + re.escape("".join(_CURRENCIES)) + "]"
_CURRENCY_BEFORE = re.compile(rf"(?P<sym>{_SYMBOL})\s?(?P<amount>{_AMOUNT})(?:\s?(?P<scale>{_SCALE})\b)?")
_CURRENCY_AFTER = re.compile(rf"(?<![\d.,])(?P<amount>{_AMOUNT})(?:\s?(?P<scale>{_SCALE}))?\s?(?P<sym>{_SYMBOL})")
_LONE_SYMBOL = re.compile(_SYMBOL)
_SCIENTIFIC = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[eE]([+-]?)(\d+)\b")
_AM_PM = r"(?:\s?(?P<ampm>[AaPp])\.?\s?[Mm]\b\.?)"
_TIME = re.compile(rf"\b(?P<h>[01]?\d|2[0-4]):(?P<m>[0-5]\d)(?::(?P<s>[0-5]\d))?(?![\d:]){_AM_PM}?")
_HOUR_AM_PM = re.compile(rf"\b(?P<h>1[0-2]|0?[1-9]){_AM_PM}")
_PERCENT = re.compile(r"(\d)\s?%")
_ORDINAL = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
# "1,000" and "1,50,000" are grouped; "1,2,3" and "3,5" are lists of numbers (English has no decimal comma)
_NUMBER = re.compile(rf"(?<!\d)((?:{_GROUPED})(?!\d)|\d+)(?:\.(\d+))?")
# "1990s", "1990's", "'90s", "90s": a number ending in 0, then s
_DECADE = re.compile(r"(?<!\d)(?<!\d\.)['’]?(\d{0,3}[1-9]0|[1-9]\d{0,2}00)['’]?s\b")
# "3/4", "2 1/2" (a proper fraction, not a date "12/05/2024" nor "24/7"); U+2044 is the fraction slash
_FRACTION = re.compile(r"(?<![\d/⁄])(?<!\d\.)(?:(?P<whole>\d+) )?(?P<num>\d+)[/⁄](?P<den>\d+)(?![\d/⁄]|\.\d)")
# the vulgar fraction characters (½ ¾ ⅓ ...) -> "1⁄2": their compatibility decomposition
_VULGAR = {
    chr(o): "".join(chr(int(h, 16)) for h in unicodedata.decomposition(chr(o)).split()[1:])
    for o in (0xBC, 0xBD, 0xBE, *range(0x2150, 0x215F), 0x2189)
}
_VULGAR_CHAR = re.compile(f"(\\d)?([{''.join(_VULGAR)}])")


def _amount_words(amount: str) -> str:
    return decimal(amount.replace(",", ""))


def _plural(words: str) -> str:
    """ "nineteen ninety" -> "nineteen nineties", "two thousand" -> "two thousands"."""
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def _number_words(digits: str) -> str:
    """Digits without separators: a year for 1001-2999 written in four digits, a cardinal otherwise."""
    n = int(digits)
    return year(n) if len(digits) == 4 and 1000 < n < 3000 else cardinal(n)


def _decade(m: re.Match) -> str:
    """ "1990s" -> "nineteen nineties", "1900s" -> "nineteen hundreds", "'80s" -> "eighties"."""
    return f" {_plural(_number_words(m.group(1)))} "


_DENOMINATORS = {2: ("half", "halves"), 4: ("quarter", "quarters")}


def _fraction(m: re.Match) -> str:
    """ "3/4" -> "three quarters", "1/2" -> "one half", "5/8" -> "five eighths", "2 1/2" -> "two and
    one half"; an improper one ("24/7", "12/5") is left to be read as its numbers."""
    num, den = int(m["num"]), int(m["den"])
    if not 0 < num < den:
        return m.group(0)
    one, many = _DENOMINATORS.get(den) or (ordinal(den), ordinal(den) + "s")
    words = f"{cardinal(num)} {one if num == 1 else many}"
    return f" {cardinal(int(m['whole']))} and {words} " if m["whole"] else f" {words} "


def _vulgar(m: re.Match) -> str:
    """ "½" -> "1⁄2", "2½" -> "2 1⁄2" (a mixed number)."""
    return (f"{m.group(1)} " if m.group(1) else "") + _VULGAR[m.group(2)]


def _currency(m: re.Match) -> str:
    unit, units, sub, subs = _CURRENCIES[m["sym"]]
    amount, scale = m["amount"].replace(",", ""), m["scale"]
    whole, _, frac = amount.partition(".")
    if scale:  # "$1.5 million" -> "one point five million dollars"
        return f" {decimal(amount)} {scale} {units} "
    if sub is None or len(frac) > 2:  # "¥2.5" -> "two point five yen"
        return f" {decimal(amount)} {unit if amount == '1' else units} "
    d, c = int(whole), int(frac.ljust(2, "0")) if frac else 0
    parts = []
    if d or not c:
        parts.append(f"{cardinal(d)} {unit if d == 1 else units}")
    if c:
        parts.append(f"{cardinal(c)} {sub if c == 1 else subs}")
    return " " + " ".join(parts) + " "


def _scientific(m: re.Match) -> str:
    """ "1e6" -> "one times ten to the six", "1.5e-3" -> "... to the minus three"."""
    sign = "minus " if m.group(2) == "-" else ""
    return f" {decimal(m.group(1))} times ten to the {sign}{cardinal(int(m.group(3)))} "


def _ampm(m: re.Match) -> str:
    return f" {m['ampm'].lower()} m" if m["ampm"] else ""


def _time(m: re.Match) -> str:
    """ "10:30pm" -> "ten thirty p m", "7:45" -> "seven forty-five", "7:05" -> "seven oh five",
    "7:00" -> "seven o'clock" ("seven p m" with am/pm)."""
    h, mins = int(m["h"]), int(m["m"])
    words = cardinal(h)
    if mins == 0:
        words += "" if m["ampm"] else " o'clock"
    else:
        words += f" oh {cardinal(mins)}" if mins < 10 else f" {cardinal(mins)}"
    if m["s"] is not None:
        secs = int(m["s"])
        words += f" and {cardinal(secs)} second{'' if secs == 1 else 's'}"
    return f" {words}{_ampm(m)} "


def _number(m: re.Match) -> str:
    whole, frac = m.group(1), m.group(2)
    if frac is not None:
        words = decimal(f"{whole.replace(',', '')}.{frac}")
    elif "," not in whole and len(whole) == 4 and 1000 < int(whole) < 3000:  # a year
        words = year(int(whole))
    else:
        words = cardinal(int(whole.replace(",", "")))
    # set apart from a letter it touches: "COVID19" -> "COVID nineteen", and from the comma of a list
    # ("1,2,3" -> "one, two, three")
    before = " " if m.start() > 0 and (m.string[m.start() - 1].isalpha() or m.string[m.start() - 1] == ",") else ""
    after = " " if m.end() < len(m.string) and m.string[m.end()].isalpha() else ""
    return before + words + after


# Every pattern of expand_numbers needs a digit, a currency symbol or a fraction character: text
# without one is left as it is
_NUMERIC = re.compile(rf"\d|{_SYMBOL}|{_VULGAR_CHAR.pattern}")


def expand_numbers(text: str) -> str:
    """Times, currency, scientific notation, percentages, ordinals, decades, fractions, years, decimals
    and numbers -> words. Case and other text as they are."""
    if not _NUMERIC.search(text):
        return text
    text = _VULGAR_CHAR.sub(_vulgar, text)
    text = _SCIENTIFIC.sub(_scientific, text)
    text = _TIME.sub(_time, text)
    text = _HOUR_AM_PM.sub(lambda m: f" {cardinal(int(m['h']))}{_ampm(m)} ", text)
    text = _CURRENCY_BEFORE.sub(_currency, text)
    text = _CURRENCY_AFTER.sub(_currency, text)
    text = _LONE_SYMBOL.sub(lambda m: f" {_CURRENCIES[m.group(0)][1]} ", text)
    text = _PERCENT.sub(lambda m: f"{m.group(1)} percent", text)
    text = _ORDINAL.sub(lambda m: ordinal(int(m.group(1))), text)
    text = _DECADE.sub(_decade, text)
    text = _FRACTION.sub(_fraction, text)
    return _NUMBER.sub(_number, text)


# --- abbreviations --------------------------------------------------------------------------------

_ABBREVIATED = [
    ("mrs", "misess"),
    ("mr", "mister"),
    ("dr", "doctor"),
    ("co", "company"),
    ("jr", "junior"),
    ("maj", "major"),
    ("gen", "general"),
    ("drs", "doctors"),
    ("rev", "reverend"),
    ("lt", "lieutenant"),
    ("hon", "honorable"),
    ("sgt", "sergeant"),
    ("capt", "captain"),
    ("esq", "esquire"),
    ("ltd", "limited"),
    ("col", "colonel"),
    ("ft", "fort"),
    ("etc", "et cetera"),
    ("vs", "versus"),
]
_ABBREVIATIONS = [(re.compile(rf"\b{abbr}\.", re.IGNORECASE), full) for abbr, full in _ABBREVIATED]
# Any of them: text without one skips the patterns (none of their words brings a new one in)
_ANY_ABBREVIATION = re.compile(rf"\b(?:{'|'.join(abbr for abbr, _ in _ABBREVIATED)})\.", re.IGNORECASE)
# "No. 5", "No.12": "number" before a number (with its dot: "no 2 people" is not one)
_NO = re.compile(r"\b(?:No|NO|no)\. ?(?=\d)")
# "St." / "st." / "ST." (and "St" without its dot), not inside a word ("1st", "first")
_ST = re.compile(r"\b(?:St|ST|st)\b\.?")
_NEXT_WORD = re.compile(r"\s*(\w+)")
_PREVIOUS_WORD = re.compile(r"(\w+)[\s,]*$")


def _sentence_end(m: re.Match) -> str:
    """The abbreviation's dot, kept as the sentence's full stop when nothing follows it."""
    return "." if m.group(0).endswith(".") and not m.string[m.end() :].strip() else ""


def _saint_or_street(text: str, m: re.Match) -> str:
    """ "street" for a lowercase "st." after a word ("Paul st. It was": the next sentence's capital
    does not make it a saint, and its dot stays the full stop); "saint" before a capitalised name
    ("St. Paul"); "street" after a word of the same sentence ("Main St.", "42nd St."); "saint"
    otherwise (a sentence's first word)."""
    after = _NEXT_WORD.match(text, m.end())
    before = _PREVIOUS_WORD.search(text, 0, m.start())
    if m.group(0).startswith("st") and m.group(0).endswith(".") and before:
        return "street" + ("." if after is None or after.group(1)[0].isupper() else "")
    if after and after.group(1)[0].isupper():
        return "saint"
    if _PREVIOUS_WORD.search(text, 0, m.start()):
        return "street" + _sentence_end(m)
    if not m.group(0).endswith(".") and m.group(0) == "st":  # a lone lowercase "st" stays as it is
        return m.group(0)
    return "saint"


def expand_abbreviations(text: str) -> str:
    """Title and other abbreviations with their dot -> words; "St." by context. Needs the original
    case (run before lowercasing). "No." before a number is "number"."""
    text = _NO.sub("number ", text)
    text = _ST.sub(lambda m: _saint_or_street(text, m), text)
    if not _ANY_ABBREVIATION.search(text):
        return text
    for pattern, full in _ABBREVIATIONS:
        text = pattern.sub(lambda m, full=full: full + _sentence_end(m), text)  # type: ignore[misc]  # mypy cannot type a lambda with a default (which binds the loop's `full`)
    return text


# --- the whole front end --------------------------------------------------------------------------

_WHITESPACE = re.compile(r"\s+")
_SPACE_BEFORE_PUNCTUATION = re.compile(r" ([,.!?;:])")  # left where a symbol before it was spelled out
_KEEP = re.compile(r"[^a-z!'\"(),\-.:;? ]")
# Letters outside the Latin script that English text still uses, folded by unidecode
_LATIN_LIKE = {"MICRO SIGN", "FEMININE ORDINAL INDICATOR", "MASCULINE ORDINAL INDICATOR"}


def foreign_letters(text: str) -> list[str]:
    """The letters of `text` that are not Latin script, each once, in order of first appearance:
    English does not read them."""
    if text.isascii():  # its letters are a-z and A-Z
        return []
    found = {}
    for c in text:
        if c not in found and unicodedata.category(c) in ("Lu", "Ll", "Lt", "Lo"):
            name = unicodedata.name(c, "")
            found[c] = "LATIN" not in name and name not in _LATIN_LIKE
    return [c for c, foreign in found.items() if foreign]


def normalize(raw: str) -> str:
    """Raw English transcript -> lowercase ASCII with numbers, currency and abbreviations spelled out.
    Letters of other scripts are folded by unidecode here; the front end refuses such rows first
    (`foreign_letters`)."""
    text = unicodedata.normalize("NFC", raw)
    if not text.isascii():  # format characters are not between words: "Hel\u200blo" is "hello"
        text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    text = expand_abbreviations(text)  # needs the case: "St. Paul" / "Paul st."
    text = expand_numbers(text)  # before folding: unidecode would turn "£" into "PS"
    text = unidecode(text).lower()
    text = expand_numbers(text)  # digits unidecode produced (e.g. from superscripts)
    text = text.replace("&", " and ").replace(";", ",")
    text = _KEEP.sub(" ", text)
    return _SPACE_BEFORE_PUNCTUATION.sub(r"\1", _WHITESPACE.sub(" ", text)).strip()
