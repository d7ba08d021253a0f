"""The text front end: English normalisation for TTS, pure functions unit-tested for exact output.

Versioned: schema.json records the front end the shards were made with, and synthesis refuses a
version it does not know, because text normalised differently maps to other ids than the model
was trained on. Any change to the output of `normalize_text` must bump `FRONTEND["version"]`.

ASCII folding is unidecode's, number words are inflect's; only the abbreviation list and the
currency/ordinal patterns are ours (no library covers them for TTS).
"""
from __future__ import annotations

import functools
import re

from unidecode import unidecode

FRONTEND = {"name": "english", "version": 1}

_ABBREVIATIONS = [(re.compile(rf"\b{abbr}\.", re.IGNORECASE), full) for abbr, full in [
    ("mrs", "misess"), ("mr", "mister"), ("dr", "doctor"), ("st", "saint"), ("co", "company"),
    ("jr", "junior"), ("maj", "major"), ("gen", "general"), ("drs", "doctors"), ("rev", "reverend"),
    ("lt", "lieutenant"), ("hon", "honorable"), ("sgt", "sergeant"), ("capt", "captain"),
    ("esq", "esquire"), ("ltd", "limited"), ("col", "colonel"), ("ft", "fort"), ("etc", "et cetera"),
    ("vs", "versus"),
]]
_COMMA_NUMBER = re.compile(r"(\d[\d,]+\d)")
_POUNDS = re.compile(r"£([\d,]*\d+)")
_DOLLARS = re.compile(r"\$(\d+(?:\.\d+)?)")
_DECIMAL = re.compile(r"(\d+\.\d+)")
_ORDINAL = re.compile(r"\b(\d+)(st|nd|rd|th)\b")
_NUMBER = re.compile(r"\d+")
_PERCENT = re.compile(r"(\d)\s*%")
_WHITESPACE = re.compile(r"\s+")
_KEEP = re.compile(r"[^a-z!'\"(),\-.:;? ]")


@functools.lru_cache(maxsize=1)
def _engine():
    import inflect  # 4 s to import (typeguard): paid by workers on first use, not by every CLI call

    return inflect.engine()


def _words(n: int) -> str:
    return _engine().number_to_words(n, andword="").replace(",", "")


def _dollars(m: re.Match) -> str:
    dollars, _, cents = m.group(1).partition(".")
    d, c = int(dollars), int(cents.ljust(2, "0")[:2]) if cents else 0
    parts = []
    if d or not c:
        parts.append(f"{_words(d)} dollar{'' if d == 1 else 's'}")
    if c:
        parts.append(f"{_words(c)} cent{'' if c == 1 else 's'}")
    return " ".join(parts)


def _number(m: re.Match) -> str:
    n = int(m.group(0))
    if 1000 < n < 3000 and len(m.group(0)) == 4:  # read 4-digit numbers in this range as years
        if n == 2000:
            return "two thousand"
        if 2000 < n < 2010:
            return "two thousand " + _words(n % 100)
        if n % 100 == 0:
            return _words(n // 100) + " hundred"
        return _engine().number_to_words(n, andword="", zero="oh", group=2).replace(",", "")
    return _words(n)


def expand_numbers(text: str) -> str:
    text = _COMMA_NUMBER.sub(lambda m: m.group(1).replace(",", ""), text)
    text = _POUNDS.sub(lambda m: f"{m.group(1)} pounds", text)
    text = _DOLLARS.sub(_dollars, text)
    text = _PERCENT.sub(lambda m: f"{m.group(1)} percent", text)
    text = _DECIMAL.sub(lambda m: m.group(1).replace(".", " point "), text)
    text = _ORDINAL.sub(lambda m: _engine().number_to_words(_engine().ordinal(int(m.group(1)))), text)
    return _NUMBER.sub(_number, text)


def expand_abbreviations(text: str) -> str:
    for pattern, full in _ABBREVIATIONS:
        text = pattern.sub(full, text)
    return text


def normalize_text(text: str) -> str:
    """Raw transcript -> lowercase ASCII with numbers, currency and abbreviations spelled out."""
    text = expand_numbers(text)  # before folding: unidecode would turn "£" into "PS"
    text = unidecode(text).lower()
    text = expand_numbers(text)  # digits unidecode produced (e.g. from superscripts)
    text = expand_abbreviations(text)
    text = text.replace("&", " and ").replace(";", ",")
    text = _KEEP.sub(" ", text)
    return _WHITESPACE.sub(" ", text).strip()


def has_speakable_content(normalized: str) -> bool:
    """A transcript is usable only if something in it is pronounced."""
    return any("a" <= c <= "z" for c in normalized)


class TextRejected(ValueError):
    """A transcript the front end refuses; `reason` is the one preprocess records in rejected.jsonl."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def frontend_record(name: str) -> dict:
    return dict(FRONTEND)


def check_text(raw: str, language: str = "en", frontend_name: str = "english") -> str:
    """Raw transcript -> normalised text, or TextRejected: the one check preprocess and synthesize share."""
    if not language.startswith("en"):
        raise TextRejected("unsupported_language", language)
    if not raw.strip():
        raise TextRejected("empty_text", "transcript is empty")
    text = normalize_text(raw)
    if not has_speakable_content(text):
        raise TextRejected("unusable_text", f"nothing speakable after normalisation: {raw[:80]!r}")
    return text


def check_texts(raws, language: str, frontend_name: str) -> list:
    out = []
    for raw in raws:
        try:
            out.append(check_text(raw, language, frontend_name))
        except TextRejected as e:
            out.append(e)
    return out


def normalizer_for(frontend: dict):
    """The normalise function of the front end recorded in a schema; ValueError when it is unknown."""
    if frontend != FRONTEND:
        raise ValueError(
            f"the shards were made with text front end {frontend}, this melshards has {FRONTEND}; "
            "use the melshards version that made them, or re-run `melshards preprocess` and retrain")
    return normalize_text
