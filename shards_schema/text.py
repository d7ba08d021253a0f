"""The text front ends: raw transcript -> the symbols the model reads, per language, versioned.

Three front ends, each a small module of pure functions with a `NAME` and an integer `VERSION`:

- `characters` (text_characters.py): the transcript's own letters in any language, cleaned (NFC,
  punctuation unified, numbers spoken with num2words in the row's language, lowercase); no ASCII
  folding.
- `phonemes` (text_phonemes.py): espeak-ng IPA (stress marks, word boundaries, punctuation, tones),
  in every language espeak-ng has a voice for.
- `english` (text_english.py): English words in lowercase ASCII, numbers, times, currency and
  abbreviations spelled out; English codes only.
- `alignments`: the phones of forced alignments (`melshards preprocess --alignments DIR`), separated
  by spaces. Preprocess takes them from each clip's TextGrid, not from the transcript; synthesis reads
  phones typed the same way ("HH AH0 L OW1"). Its vocabulary's unit is the phone.

schema.json records the front end (`frontend_record`: name and version) each language's text went
through, and synthesis refuses a name or version this melshards does not have (`normalizer_for`):
text normalised differently maps to other ids than the model was trained on. Any change to a front
end's output bumps its VERSION.

`check_text` / `check_texts` are the one check preprocess and synthesis share: the normalised text,
or `TextRejected` with the reason preprocess records (`TEXT_REASONS`, a part of
`melshards.shards_schema.stats.REJECT_REASONS`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable

from melshards.shards_schema import text_characters, text_english, text_phonemes
from melshards.shards_schema.text_clean import TextRejected, language_code

__all__ = [
    "ALIGNMENTS",
    "FRONTENDS",
    "TEXT_REASONS",
    "Frontend",
    "TextRejected",
    "check_text",
    "check_texts",
    "frontend",
    "frontend_record",
    "has_speakable_content",
    "normalizer_for",
    # the english front end's pieces, also under these names of this module
    "FRONTEND",
    "expand_numbers",
    "expand_abbreviations",
    "normalize_text",
]

TEXT_REASONS = ("empty_text", "unusable_text", "unsupported_language")


class Frontend:
    """A front end: `name`, `version`, `supports(language)`, `normalize(raw, language)` and
    `normalize_many(raws, language)` (one call for a batch of one language's rows)."""

    def __init__(
        self,
        name: str,
        version: int,
        supports: Callable[[str], bool],
        normalize_rows: Callable[[list[str], str], list],
        languages: str,
        unit: str = "character",
    ):
        self.name, self.version, self._supports, self._rows = name, version, supports, normalize_rows
        self.languages = languages  # which languages it reads, for messages
        self.unit = unit  # what a symbol of its output is (`melshards.shards_schema.vocab.UNITS`)

    def __repr__(self) -> str:
        return f"Frontend({self.name!r}, version={self.version})"

    def supports(self, language: str) -> bool:
        try:
            return bool(self._supports(language))
        except (TypeError, AttributeError):
            return False

    def unsupported(self, language: str) -> TextRejected:
        if language_code(language) is None:
            return TextRejected("unsupported_language", not_a_language_code(language))
        return TextRejected(
            "unsupported_language",
            f"the {self.name} text front end does not read language {language!r} (it reads "
            f"{self.languages}); map the language to another front end in the config's "
            "`text.languages`, or fix the row's language code",
        )

    def rows(self, raws: list[str], language: str) -> list:
        """Each raw text's normalised text or TextRejected; the language must be supported."""
        return self._rows(list(raws), language)

    def normalize_many(self, raws: Iterable[str], language: str) -> list[str]:
        """Raw texts of one language -> normalised texts; TextRejected (unsupported_language) if the
        front end does not read the language or a text's script."""
        if not self.supports(language):
            raise self.unsupported(language)
        out = self.rows(list(raws), language)
        for x in out:
            if isinstance(x, TextRejected):
                raise x
        return out

    def normalize(self, raw: str, language: str) -> str:
        return self.normalize_many([raw], language)[0]


def not_a_language_code(language) -> str:
    """Why a row's language is no language code, and what to do."""
    return (
        f"{language!r} is not a language code (a BCP 47 tag: a 2- or 3-letter language, then optional "
        "subtags, e.g. en, en-US, zh-CN); fix the row's language, or the input's --language"
    )


def _script(c: str) -> str:
    """The script of a letter as its Unicode name begins: "cyrillic", "greek", "cjk"."""
    return unicodedata.name(c, "?").split(" ")[0].lower()


def _english_rows(raws: list[str], language: str) -> list:
    out: list[str | TextRejected] = []
    for raw in raws:
        foreign = text_english.foreign_letters(raw)
        if foreign:
            scripts = " and ".join(dict.fromkeys(_script(c) for c in foreign))
            more = f" and {len(foreign) - 8} more" if len(foreign) > 8 else ""
            out.append(
                TextRejected(
                    "unsupported_language",
                    f"{raw[:80]!r} holds letters of the {scripts} script ({''.join(foreign[:8])!r}{more}), not of the "
                    f"Latin script of its language {language!r}, the only one the english front end reads: set the "
                    f"row's language to the text's own, or map {language!r} to the characters front end in the config's "
                    "`text.languages`",
                )
            )
        else:
            out.append(text_english.normalize(raw))
    return out


ALIGNMENTS = "alignments"


def _phone_rows(raws: list[str], language: str) -> list:
    """Phones separated by whitespace -> separated by single spaces."""
    return [" ".join(str(raw).split()) for raw in raws]


FRONTENDS: dict[str, Frontend] = {
    f.name: f
    for f in (
        Frontend(
            text_characters.NAME,
            text_characters.VERSION,
            text_characters.supports,
            text_characters.normalize_many,
            "every language code",
        ),
        Frontend(
            text_phonemes.NAME,
            text_phonemes.VERSION,
            text_phonemes.supports,
            text_phonemes.normalize_many,
            "the languages espeak-ng has a voice for",
        ),
        Frontend(text_english.NAME, text_english.VERSION, text_english.supports, _english_rows, "English: en, en-*"),
        Frontend(
            ALIGNMENTS, 1, lambda language: True, _phone_rows, "every language code (phones of TextGrids)", unit="phone"
        ),
    )
}


def frontend(name: str) -> Frontend:
    """The front end of a name; ValueError naming the known ones otherwise."""
    try:
        return FRONTENDS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown text front end {name!r}; the front ends are: {', '.join(sorted(FRONTENDS))}"
        ) from None


def frontend_record(name: str) -> dict:
    """What schema.json records for a language: {"name", "version"} of the front end."""
    f = frontend(name)
    return {"name": f.name, "version": f.version}


# Marks that are letters to Unicode (Lm) but pronounce nothing by themselves: IPA stress and length.
_SILENT_MODIFIERS = frozenset("ˈˌːˑ")


def has_speakable_content(text: str) -> bool:
    """Whether anything in a normalised text is pronounced: a letter of any script (Unicode category
    L: Latin, Han, IPA symbols...), not counting IPA stress and length marks alone, or a digit."""
    for c in text:
        cat = unicodedata.category(c)
        if (cat[0] == "L" and c not in _SILENT_MODIFIERS) or cat[0] == "N":
            return True
    return False


def check_texts(raws: Iterable[str], language: str, frontend_name: str) -> list:
    """Raw transcripts of one language -> for each, its normalised text or its TextRejected (never
    raised): `empty_text`, `unsupported_language` (the front end does not read the language, or the
    text's script), `unusable_text` (nothing speakable after normalisation). The texts go through
    the front end in one call. ValueError for an unknown front end name (a config error)."""
    f = frontend(frontend_name)
    raws = list(raws)
    if not f.supports(language):
        return [f.unsupported(language) for _ in raws]
    out: list = [None] * len(raws)
    todo = []
    for i, raw in enumerate(raws):
        if raw is None or not str(raw).strip():
            out[i] = TextRejected("empty_text", "transcript is empty")
        else:
            todo.append(i)
    for i, text in zip(todo, f.rows([raws[i] for i in todo], language)):
        if not isinstance(text, TextRejected) and not has_speakable_content(text):
            text = TextRejected("unusable_text", f"nothing speakable after normalisation: {raws[i][:80]!r}")
        out[i] = text
    return out


def check_text(raw: str, language: str = "en", frontend_name: str = "english") -> str:
    """Raw transcript -> normalised text, or TextRejected: the one check preprocess and synthesize share."""
    out = check_texts([raw], language, frontend_name)[0]
    if isinstance(out, TextRejected):
        raise out
    return out


def normalizer_for(record: dict) -> Callable[[str, str], str]:
    """The `(raw, language) -> normalised text` function of the front end a schema records
    ({"name", "version"}): `check_text` with that front end (TextRejected for a text preprocess would
    have rejected). ValueError when this melshards has no such front end or version."""
    name = record.get("name") if isinstance(record, dict) else None
    version = record.get("version") if isinstance(record, dict) else None
    f = FRONTENDS.get(name) if isinstance(name, str) else None
    if f is None or str(version) != str(f.version):
        have = ", ".join(f"{x.name} v{x.version}" for x in FRONTENDS.values())
        raise ValueError(
            f"the shards were made with text front end {record!r}, this melshards has {have}; "
            "synthesize with the melshards version that made them, or re-run `melshards preprocess` and retrain"
        )

    def normalize(raw: str, language: str) -> str:
        return check_text(raw, language, f.name)

    return normalize


# --- the english front end's pieces, also under these names of this module ------------------------

FRONTEND = frontend_record("english")
expand_numbers = text_english.expand_numbers
expand_abbreviations = text_english.expand_abbreviations
normalize_text = text_english.normalize
