"""The character vocabulary: symbol <-> id. Stored in schema.json so readers never guess it."""
from __future__ import annotations

from typing import Sequence

PAD = "_"  # id 0: padding, so zero-filled text_ids are masked by construction
EOS = "~"  # id 1: reserved end of sequence; nothing appends it (encode skips it, the stop token ends speech)
PUNCTUATION = "!'\"(),-.:;? "
LETTERS = "abcdefghijklmnopqrstuvwxyz"

DEFAULT_SYMBOLS: tuple[str, ...] = (PAD, EOS, *PUNCTUATION, *LETTERS)


class Vocabulary:
    def __init__(self, symbols: Sequence[str] = DEFAULT_SYMBOLS):
        symbols = tuple(symbols)
        if len(set(symbols)) != len(symbols):
            raise ValueError(f"vocabulary has repeated symbols: {symbols}")
        if symbols[:2] != (PAD, EOS):
            raise ValueError(f"vocabulary must start with pad {PAD!r} and eos {EOS!r}, got {symbols[:2]}")
        self.symbols = symbols
        self._ids = {s: i for i, s in enumerate(symbols)}

    @classmethod
    def from_symbols(cls, symbols) -> "Vocabulary":
        """The vocabulary of a corpus: pad, eos, then its symbols sorted (the same on every run)."""
        return cls((PAD, EOS, *sorted(set(symbols) - {PAD, EOS})))

    def __len__(self) -> int:
        return len(self.symbols)

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def eos_id(self) -> int:
        return 1

    def encode(self, text: str) -> tuple[list[int], int]:
        """Map text to ids; returns (ids, number of characters outside the vocabulary, which are skipped)."""
        ids = [self._ids[c] for c in text if c in self._ids and c not in (PAD, EOS)]
        return ids, len(text) - len(ids)

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.symbols[i] for i in ids if i > 1)
