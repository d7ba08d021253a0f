"""The symbol vocabulary: symbol <-> id. Stored in schema.json so readers never guess it.

A symbol is one code point of the normalised text (unit "character"; the synthesizer splits text with
tf.strings.unicode_split), or one phone of a forced alignment (unit "phone": the text is the phones
separated by single spaces, e.g. "HH AH0 L OW1 sil"). Ids 0 and 1 are reserved: 0 pads (zero-filled text_ids are masked by
construction), 1 is the end of sequence (reserved; nothing appends it, the stop token ends speech).
Their symbols are control code points, U+0000 and U+0003, which no front end writes (they drop
controls), so every printable character a corpus's text holds, "_" and "~" included, gets an id of
its own. Vocabularies written before (pad "_", eos "~") still read: `LEGACY_RESERVED`.

`text_ids` is the one rule that maps a normalised text to ids, for preprocess's records and for
synthesis alike: every symbol has its id, or the text is refused (`UnknownSymbols`) naming the
symbols the vocabulary lacks; nothing is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

PAD = "\x00"  # id 0: padding
EOS = "\x03"  # id 1: end of sequence (U+0003 END OF TEXT), reserved
LEGACY_RESERVED = ("_", "~")  # pad and eos of the vocabularies of schema.json files before 3.x's text front ends
PUNCTUATION = "!'\"(),-.:;? "
LETTERS = "abcdefghijklmnopqrstuvwxyz"

DEFAULT_SYMBOLS: tuple[str, ...] = (PAD, EOS, *PUNCTUATION, *LETTERS)
UNITS = ("character", "phone")


def tokens(text: str, unit: str) -> list[str]:
    """A text's symbols: its code points, or its space-separated phones."""
    return list(text) if unit == "character" else text.split()


class UnknownSymbols(ValueError):
    """A text holding symbols a vocabulary lacks. `symbols`: those symbols, in order of first
    appearance, each once; the message is one line naming them (the first ten and the count)."""

    def __init__(self, text: str, symbols: Sequence[str]):
        self.text, self.symbols = text, tuple(symbols)
        super().__init__(f"{text[:80]!r} holds symbol(s) the vocabulary lacks: {self.named}")

    @property
    def named(self) -> str:
        """The symbols as a message names them: "'%', '!'" (the first ten, then how many more)."""
        more = f" and {len(self.symbols) - 10} more" if len(self.symbols) > 10 else ""
        return ", ".join(repr(s) for s in self.symbols[:10]) + more

    def __reduce__(self):  # Beam pickles errors across workers
        return UnknownSymbols, (self.text, self.symbols)


class Vocabulary:
    def __init__(self, symbols: Sequence[str] = DEFAULT_SYMBOLS, unit: str = "character"):
        if unit not in UNITS:
            raise ValueError(f"vocabulary unit {unit!r} is not one of {UNITS}")
        self.unit = unit
        symbols = tuple(symbols)
        if len(set(symbols)) != len(symbols):
            raise ValueError(f"vocabulary has repeated symbols: {symbols}")
        if symbols[:2] not in ((PAD, EOS), LEGACY_RESERVED):
            raise ValueError(
                f"vocabulary must start with pad {PAD!r} and eos {EOS!r} (or, written by an older "
                f"melshards, {LEGACY_RESERVED[0]!r} and {LEGACY_RESERVED[1]!r}), got {symbols[:2]}"
            )
        if unit == "character" and any(len(s) != 1 for s in symbols):
            raise ValueError(f"vocabulary symbols must be single code points: {[s for s in symbols if len(s) != 1]}")
        if unit == "phone" and any(not s or s.split() != [s] for s in symbols[2:]):
            raise ValueError(
                f"phones must be non-empty and hold no whitespace: "
                f"{[s for s in symbols[2:] if not s or s.split() != [s]]}"
            )
        self.symbols = symbols
        self._ids = {s: i for i, s in enumerate(symbols) if i > 1}

    @classmethod
    def from_symbols(cls, symbols: Iterable[str], unit: str = "character") -> Vocabulary:
        """The vocabulary of a corpus: pad, eos, then its symbols sorted by code point, each once: the
        same symbols give the same ids on every run, in any order. A string adds each of its symbols
        (`tokens`: code points, or space-separated phones)."""
        found = {t for s in symbols for t in tokens(s, unit)}
        return cls((PAD, EOS, *sorted(found - {PAD, EOS})), unit)

    def __len__(self) -> int:
        return len(self.symbols)

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def eos_id(self) -> int:
        return 1

    def encode(self, text: str) -> tuple[list[int], int]:
        """Map text to ids; returns (ids, number of symbols outside the vocabulary, which are skipped;
        the reserved pad and eos symbols are never encoded)."""
        symbols = tokens(text, self.unit)
        ids = [self._ids[c] for c in symbols if c in self._ids]
        return ids, len(symbols) - len(ids)

    def unknown(self, text: str) -> list[str]:
        """The symbols of `text` this vocabulary has no id for (pad and eos included), in order of
        first appearance, each once."""
        return list(dict.fromkeys(t for t in tokens(text, self.unit) if t not in self._ids))

    def decode(self, ids: Sequence[int]) -> str:
        return ("" if self.unit == "character" else " ").join(self.symbols[i] for i in ids if i > 1)


def text_ids(text: str, vocab: Vocabulary) -> list[int]:
    """The ids of every symbol of a normalised text, in order; `UnknownSymbols` (a ValueError) naming
    the symbols `vocab` lacks, if any (pad and eos are never a text's symbols). The one rule of
    preprocess's `text_ids` records and of synthesis: a symbol is never skipped."""
    ids, skipped = vocab.encode(text)
    if skipped:
        raise UnknownSymbols(text, vocab.unknown(text))
    return ids
