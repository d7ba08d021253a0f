"""What a per-clip extractor (`melshards.preprocess.clip.extractor_plugins`) declares, and how its outputs sit in a
record: pure functions shared by the job (check, pad) and the readers (the bucket's feature table).

An extractor's output is one of three kinds, each with a dtype (float32, float16, int32, int16):

- `vector`: a fixed-size vector per clip, `[dim]` (a speaker embedding). Stored as it is; its
  per-speaker means are the schema's centroids (`Speaker.centroids`).
- `frames`: values per mel frame, `[mel_frames]` or `[mel_frames, dim]`; a clip's output must have
  exactly the clip's mel frames. Padded like pitch, to the bucket's `max_mel_frames`.
- `tokens`: a sequence at the extractor's own `frame_rate` (frames per second: codec tokens),
  `[T]` or `[T, dim]` (dim codebooks). A bucket holds `token_capacity(max_mel_frames, ...)` of them
  and the record gains `NAME_len` (the valid tokens); a clip's output may not exceed the capacity of
  its own mel frames, so it fits every bucket it can land in.

Padding is `pad` (0 unless declared: a codec's pad token). float16 and int16 are stored as 2 bytes,
float32 and int32 as 4: a stored value is the extractor's value exactly (byte for byte).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

import numpy as np

from melshards.shards_schema.schema import Feature, SchemaError

KINDS = ("vector", "frames", "tokens")
# declared dtype -> (decoded dtype, record storage)
DTYPES = {
    "float32": ("float32", "raw_float32"),
    "float16": ("float32", "raw_float16"),
    "int32": ("int32", "raw_int32"),
    "int16": ("int32", "raw_int16"),
}


def token_capacity(mel_frames: int, hop_length: int, sample_rate: int, frame_rate: float) -> int:
    """Tokens at `frame_rate` per second that cover `mel_frames` mel frames (`mel_frames * hop_length`
    samples at `sample_rate`): ceil(seconds * frame_rate), in exact rational arithmetic (a float
    product can land a hair above an integer and give one token more)."""
    seconds = Fraction(mel_frames * hop_length, sample_rate)
    exact = seconds * Fraction(str(frame_rate))
    return -(-exact.numerator // exact.denominator)


@dataclasses.dataclass(frozen=True)
class ExtractorOutput:
    """One declared output of an extractor; `name` is the record feature's name."""

    name: str
    kind: str  # vector | frames | tokens
    dtype: str = "float32"
    dim: int = 0  # vector: its size (required); frames and tokens: channels per frame, 0 for one value
    frame_rate: float = 0.0  # tokens: frames per second
    pad: float = 0.0
    description: str = ""

    def __post_init__(self):
        problem = self.problem()
        if problem:
            raise SchemaError(f"extractor output {self.name!r}: {problem}")

    def problem(self) -> str | None:
        if not self.name.isidentifier():
            return "the name must be an identifier (letters, digits, _)"
        if self.kind not in KINDS:
            return f"kind {self.kind!r} is not one of {', '.join(KINDS)}"
        if self.dtype not in DTYPES:
            return f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}"
        if self.dim < 0 or (self.kind == "vector" and self.dim < 1):
            return f"dim {self.dim}: a vector needs dim >= 1, frames and tokens dim >= 0"
        if (self.kind == "tokens") != (self.frame_rate > 0):
            return f"frame_rate {self.frame_rate}: tokens need one > 0, other kinds none"
        return None

    def _tail(self) -> tuple[int, ...]:
        return (self.dim,) if self.dim else ()

    def length(self, mel_frames: int, hop_length: int, sample_rate: int) -> int:
        """Rows (axis 0) this output has room for in a bucket of `mel_frames`."""
        if self.kind == "vector":
            return self.dim
        if self.kind == "frames":
            return mel_frames
        return token_capacity(mel_frames, hop_length, sample_rate, self.frame_rate)

    def shape(self, mel_frames: int, hop_length: int, sample_rate: int) -> tuple[int, ...]:
        if self.kind == "vector":
            return (self.dim,)
        return (self.length(mel_frames, hop_length, sample_rate), *self._tail())

    def features(self, max_mel_frames: int, hop_length: int, sample_rate: int) -> tuple[Feature, ...]:
        """The record features of this output in a bucket of `max_mel_frames`: the output, and
        `NAME_len` for tokens."""
        decoded, storage = DTYPES[self.dtype]
        what = self.description or f"{self.kind} output of an extractor"
        out: tuple[Feature, ...] = (
            Feature(self.name, decoded, self.shape(max_mel_frames, hop_length, sample_rate), storage, what),
        )
        if self.kind == "tokens":
            out += (Feature(f"{self.name}_len", "int32", (), "int64", f"number of valid {self.name} frames"),)
        return out

    def check(self, value: Any, mel_frames: int, hop_length: int, sample_rate: int) -> tuple[np.ndarray, str | None]:
        """A clip's output -> (it as the declared dtype, None), or (anything, what is wrong with it): a
        wrong rank or channel count, a vector of another size, frames other than the clip's mel
        frames, more tokens than its mel frames hold, a value the dtype cannot hold."""
        arr = np.asarray(value)
        want_rank = 1 if self.kind == "vector" else 1 + bool(self.dim)
        if arr.ndim != want_rank or (arr.ndim == 2 and arr.shape[1] != self.dim):
            return arr, f"{self.name}: shape {arr.shape}, declared {self.kind} {self._declared()}"
        n = arr.shape[0]
        room = self.length(mel_frames, hop_length, sample_rate)
        if self.kind == "vector" and n != self.dim:
            return arr, f"{self.name}: {n} values, declared {self.dim}"
        if self.kind == "frames" and n != mel_frames:
            return arr, f"{self.name}: {n} frames, the clip has {mel_frames} mel frames"
        if self.kind == "tokens" and n > room:
            return arr, f"{self.name}: {n} tokens, {mel_frames} mel frames hold {room} at {self.frame_rate}/s"
        target = np.dtype(self.dtype)
        if target.kind == "i":
            if arr.dtype.kind not in "iu" and not (arr.size == 0 or np.array_equal(arr, np.round(arr))):
                return arr, f"{self.name}: non-integer values for dtype {self.dtype}"
            info = np.iinfo(target)
            if arr.size and (arr.min() < info.min or arr.max() > info.max):
                return arr, f"{self.name}: values outside {self.dtype} [{info.min}, {info.max}]"
        elif not np.all(np.isfinite(arr)):
            return arr, f"{self.name}: non-finite values"
        return arr.astype(target), None

    def _declared(self) -> str:
        if self.kind == "vector":
            return f"[{self.dim}]"
        rows = "mel_frames" if self.kind == "frames" else "T"
        return f"[{rows}, {self.dim}]" if self.dim else f"[{rows}]"

    def padded(self, arr: np.ndarray, max_mel_frames: int, hop_length: int, sample_rate: int) -> dict[str, Any]:
        """A checked output -> {feature name: value} padded to a bucket of `max_mel_frames` with `pad`."""
        if self.kind == "vector":
            return {self.name: arr}
        rows = self.length(max_mel_frames, hop_length, sample_rate)
        out = np.full((rows, *arr.shape[1:]), self.pad, arr.dtype)
        out[: len(arr)] = arr
        values: dict[str, Any] = {self.name: out}
        if self.kind == "tokens":
            values[f"{self.name}_len"] = len(arr)
        return values

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def output_features(
    outputs: tuple[ExtractorOutput, ...], max_mel_frames: int, hop_length: int, sample_rate: int
) -> tuple[Feature, ...]:
    """Every output's record features in a bucket, in the order declared."""
    return tuple(f for o in outputs for f in o.features(max_mel_frames, hop_length, sample_rate))


def outputs_of(records) -> tuple[ExtractorOutput, ...]:
    """The outputs of the schema's extractor records (`Schema.extractors`), in order."""
    return tuple(ExtractorOutput(**o) for r in records for o in r["outputs"])
