"""The `phonemes` front end: espeak-ng IPA in every language espeak-ng has a voice for.

The transcript is cleaned as `characters` cleans it (NFC, punctuation unified, numbers spoken with
num2words in the row's language where num2words has it; no lowercasing: espeak reads "USA" as
letters) and phonemized by espeak-ng through `phonemizer` (the `phonemizer-fork` distribution),
using the espeak-ng library and data shipped inside the `espeakng-loader` wheel: no system package,
so a Dataflow worker needs nothing installed by hand. Phonetic marks that are no letter of an
orthography (`PHONETIC_MARKS`: IPA stress and length, tone letters) are dropped first: espeak-ng
would speak their Unicode names. Output: IPA with stress marks (ˈ ˌ), words
separated by spaces, the punctuation kept (a pause), tones as espeak writes them (Mandarin: digits
after the syllable, so 妈 "mˈɑ5" and 马 "mˈɑ2" differ).

A corpus's language code maps to an espeak voice by `espeak_voice` (see there); the voices are
espeak's own list (`EspeakBackend.supported_languages()`), not a hand list.

A backend (the espeak library loaded, the voice set) is made once per process and voice and kept;
`phonemize_many` phonemizes a batch of rows in one call, which costs less per row than one call per
row (docs/performance.md#text-front-ends).

Any change to the output must bump VERSION: a change here, in `text_clean`, or in the espeak-ng
release the wheel ships (`ESPEAK_VERSION`; tests/shards_schema/test_text_frontends.py checks it).
"""

from __future__ import annotations

import functools
import os
import re
import threading

from melshards.shards_schema import text_clean

NAME = "phonemes"
VERSION = 2  # 1 spoke the names of IPA marks and invisible fillers ("ˈ" -> "stress", U+3164 -> "Chinese letter")
ESPEAK_VERSION = (1, 52, 0)  # the espeak-ng release VERSION's output was made with (espeakng-loader 0.2.4)

# Codes (lowercase, "-") that name no espeak voice themselves nor by their primary subtag, or whose
# primary subtag would pick the wrong voice; consulted after the exact code and before the primary
# subtag (and again for the primary subtag).
VOICE_ALIASES = {
    "zh": "cmn",
    "zh-cn": "cmn",
    "zh-hans": "cmn",
    "zh-sg": "cmn",
    "zh-tw": "cmn",
    "zh-hant": "cmn",
    "zh-hk": "yue",
    "zh-mo": "yue",
    "zh-yue": "yue",
    "en": "en-us",
    "fr": "fr-fr",
    "no": "nb",
}
# The punctuation kept in the output: `text_clean.PUNCTUATION` less the apostrophe (inside words).
PRESERVED_PUNCTUATION = "".join(c for c in text_clean.PUNCTUATION if c != "'")
# Phonetic marks that are no letter of an orthography: the Spacing Modifier Letters (IPA stress,
# length, tone letters, superscripts: ˈ ˌ ː ˥ ʰ) and the Modifier Tone Letters, less the apostrophe-like
# letters of orthographies (ʻ ʼ ʽ ʾ ʿ: Hawaiian ʻokina, transliterated ayin and hamza, and ˮ).
# espeak-ng would speak their Unicode names ("stress", "length"): they are dropped before it.
PHONETIC_MARKS = re.compile("[\u02b0-\u02ba\u02c0-\u02ed\u02ef-\u02ff\ua700-\ua71f]")


@functools.lru_cache(maxsize=1)
def _phonemizer():
    """Import phonemizer on first use only (once per process: docs/performance.md#text-front-ends), pointed
    at the wheel's espeak-ng library and data."""
    import espeakng_loader
    from phonemizer.backend import EspeakBackend
    from phonemizer.backend.espeak.wrapper import EspeakWrapper
    from phonemizer.logger import get_logger
    from phonemizer.separator import Separator

    EspeakWrapper.set_library(espeakng_loader.get_library_path())
    EspeakWrapper.set_data_path(espeakng_loader.get_data_path())
    return EspeakBackend, Separator(phone="", word=" ", syllable=""), get_logger("quiet")


@functools.lru_cache(maxsize=1)
def voices() -> frozenset[str]:
    """The espeak-ng voices (language codes) of the shipped espeak-ng, lowercase."""
    backend, _, _ = _phonemizer()
    return frozenset(code.lower() for code in backend.supported_languages())


def espeak_version() -> tuple[int, ...]:
    backend, _, _ = _phonemizer()
    return tuple(backend.version())


def espeak_voice(language: str) -> str | None:
    """A corpus's language code -> an espeak-ng voice, or None when espeak-ng has none for it.

    The code is lowercased with `_` read as `-` (`en_US`, `en-US` -> `en-us`), then the first of these
    that is a voice: the code itself (`en-us`, `pt-br`, `cmn`), its `VOICE_ALIASES` entry (`zh-cn` ->
    `cmn`), its primary subtag (`de-at` -> `de`), the primary subtag's alias (`en-au` -> `en-us`,
    `fr-ca` -> `fr-fr`)."""
    code = text_clean.language_code(language)
    if code is None:
        return None
    known = voices()
    primary = text_clean.primary_subtag(code)
    for candidate in (code, VOICE_ALIASES.get(code), primary, VOICE_ALIASES.get(primary)):
        if candidate in known:
            return candidate
    return None


def supports(language: str) -> bool:
    return espeak_voice(language) is not None


class _Backend:
    """One espeak-ng backend and the lock its calls take: the library is not thread-safe, and Beam
    runs bundles on several threads of one process."""

    def __init__(self, voice: str):
        backend, self.separator, logger = _phonemizer()
        self.backend = backend(
            voice,
            punctuation_marks=PRESERVED_PUNCTUATION,
            preserve_punctuation=True,
            with_stress=True,
            language_switch="remove-flags",
            logger=logger,
        )
        self.lock = threading.Lock()

    def phonemize(self, texts: list[str]) -> list[str]:
        with self.lock:
            return self.backend.phonemize(texts, separator=self.separator, strip=True)


@functools.cache
def _backend(pid: int, voice: str) -> _Backend:
    return _Backend(voice)


def backend_for(language: str) -> _Backend:
    """The process's backend for a language (made on first use, then kept); ValueError if none."""
    voice = espeak_voice(language)
    if voice is None:
        raise ValueError(f"espeak-ng has no voice for language {language!r}")
    return _backend(os.getpid(), voice)  # keyed by process: a forked worker makes its own


def phonemize_many(texts: list[str], language: str) -> list[str]:
    """Cleaned texts -> their phonemes, in one espeak call for the batch.

    A text with nothing to pronounce (no letter or digit: empty, punctuation only) is returned as it
    is, without phonemizing: phonemizer misaligns a batch's outputs after an empty line."""
    out = list(texts)
    idx = [i for i, t in enumerate(texts) if any(c.isalnum() for c in t)]
    if idx:
        phones = backend_for(language).phonemize([texts[i] for i in idx])
        if len(phones) != len(idx):  # never seen; one call per text rather than misaligned rows
            phones = [backend_for(language).phonemize([texts[i]])[0] for i in idx]
        for i, p in zip(idx, phones):
            out[i] = text_clean.tidy(p)
    return out


def espeak_input(raw: str, language: str) -> str:
    """What espeak is given: `characters`' cleaning and numbers, not lowercased, without the
    `PHONETIC_MARKS` (a text of nothing else is `unusable_text`, as under `characters`)."""
    return text_clean.tidy(text_clean.spell_numbers(PHONETIC_MARKS.sub("", text_clean.clean(raw)), language))


def normalize_many(raws: list[str], language: str) -> list[str]:
    return phonemize_many([espeak_input(raw, language) for raw in raws], language)


def normalize(raw: str, language: str) -> str:
    return normalize_many([raw], language)[0]
