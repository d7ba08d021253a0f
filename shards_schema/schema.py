"""schema.json: the contract between the preprocessing job and the trainer.

Declared once, versioned, written beside the shards. The writer encodes records from it
(`shards_schema.records`), the trainer derives its parse spec and input_signature from it
and refuses shards whose schema differs from the one it was started with.
"""
from __future__ import annotations

import dataclasses
import json
import math
import posixpath
from typing import Any

SCHEMA_VERSION = "1.1.0"
SCHEMA_FILE = "schema.json"
STATS_FILE = "stats.json"
REJECTED_FILE = "rejected.jsonl"
SPLITS = ("train", "val")
UNFINISHED_DIR = ".melshards-tmp"  # preprocess writes shards here first; present = run not finished


class SchemaError(ValueError):
    """schema.json is missing, malformed, or does not match what the reader expects."""


@dataclasses.dataclass(frozen=True)
class Feature:
    """One record field. `shape` is the decoded, fixed shape; `storage` how it sits in the Example."""
    name: str
    dtype: str  # decoded dtype: string, int32, float32
    shape: tuple[int, ...]
    storage: str  # bytes | int64 | raw_float16 | raw_int16
    description: str = ""


@dataclasses.dataclass(frozen=True)
class AudioParams:
    sample_rate: int
    trim_silence: bool
    trim_top_db: float


@dataclasses.dataclass(frozen=True)
class MelParams:
    n_fft: int
    hop_length: int
    win_length: int
    n_mels: int
    fmin: float
    fmax: float
    log_floor: float
    power: float

    @property
    def pad_value(self) -> float:
        """Padded frames hold log(floor): the value of digital silence."""
        return math.log(self.log_floor)


@dataclasses.dataclass(frozen=True)
class Schema:
    version: str
    features: tuple[Feature, ...]
    audio: AudioParams
    mel: MelParams
    vocabulary: tuple[str, ...]
    text_frontend: dict[str, Any]  # shards_schema.text.FRONTEND the text was normalised with
    mel_mean: tuple[float, ...]
    mel_std: tuple[float, ...]
    max_text_len: int
    max_mel_frames: int
    pad_multiple: int
    counts: dict[str, int]
    shards: dict[str, list[dict[str, Any]]]  # split -> [{"file": name, "records": n}]

    # -- construction -------------------------------------------------------------------
    @staticmethod
    def feature_table(max_text_len: int, max_mel_frames: int, n_mels: int) -> tuple[Feature, ...]:
        return (
            Feature("id", "string", (), "bytes", "clip id from the corpus"),
            Feature("speaker", "string", (), "bytes", "speaker label, empty when the corpus has none"),
            Feature("text", "string", (), "bytes", "normalised text the ids were made from"),
            Feature("text_ids", "int32", (max_text_len,), "raw_int16",
                    "vocabulary ids, zero-padded (0 is the pad symbol)"),
            Feature("text_len", "int32", (), "int64", "number of valid ids"),
            Feature("mel", "float32", (max_mel_frames, n_mels), "raw_float16",
                    "log-mel frames x bins, padded with log(log_floor)"),
            Feature("mel_len", "int32", (), "int64", "number of valid frames"),
        )

    def feature(self, name: str) -> Feature:
        for f in self.features:
            if f.name == name:
                return f
        raise SchemaError(f"schema has no feature {name!r}; it has {[f.name for f in self.features]}")

    @property
    def n_mels(self) -> int:
        return self.mel.n_mels

    # -- contract checks ------------------------------------------------------------------
    def contract(self) -> dict[str, Any]:
        """The part two shard sets must share to be read by one trainer (not counts or file lists)."""
        d = self.to_dict()
        return {k: d[k] for k in ("version", "features", "audio", "mel", "vocabulary", "text_frontend",
                                   "max_text_len", "max_mel_frames")}

    def check_compatible(self, other: "Schema", here: str, there: str) -> None:
        a, b = self.contract(), other.contract()
        diffs = [k for k in a if a[k] != b[k]]
        if diffs:
            raise SchemaError(
                f"schema {there} differs from {here} in {', '.join(diffs)}; shards from different "
                "preprocessing runs cannot be mixed. Re-run `melshards preprocess` over the combined "
                "corpus, or train on one run's shards.")

    # -- (de)serialisation --------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["features"] = [dict(dataclasses.asdict(f), shape=list(f.shape)) for f in self.features]
        d["vocabulary"] = list(self.vocabulary)
        d["mel_mean"] = list(self.mel_mean)
        d["mel_std"] = list(self.mel_std)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = SCHEMA_FILE) -> "Schema":
        version = str(d.get("version", ""))
        if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise SchemaError(
                f"{where} has schema version {version or '(none)'}, this melshards reads "
                f"{SCHEMA_VERSION.split('.')[0]}.x; re-run `melshards preprocess` with this version.")
        try:
            return cls(
                version=version,
                features=tuple(Feature(**dict(f, shape=tuple(f["shape"]))) for f in d["features"]),
                audio=AudioParams(**d["audio"]),
                mel=MelParams(**d["mel"]),
                vocabulary=tuple(d["vocabulary"]),
                text_frontend=dict(d["text_frontend"]),
                mel_mean=tuple(float(x) for x in d["mel_mean"]),
                mel_std=tuple(float(x) for x in d["mel_std"]),
                max_text_len=int(d["max_text_len"]),
                max_mel_frames=int(d["max_mel_frames"]),
                pad_multiple=int(d["pad_multiple"]),
                counts={k: int(v) for k, v in d["counts"].items()},
                shards={k: list(v) for k, v in d["shards"].items()},
            )
        except (KeyError, TypeError) as e:
            raise SchemaError(f"{where} is malformed ({type(e).__name__}: {e}); it was not written by "
                              "this melshards, re-run `melshards preprocess`.") from e

    @classmethod
    def from_json(cls, text: str, where: str = SCHEMA_FILE) -> "Schema":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise SchemaError(f"{where} is not valid JSON: {e}") from e
        return cls.from_dict(d, where)


def read_text(path: str) -> str:
    """A small text file, local or gs:// (tf.io.gfile: the trainer's IO; imported only when called)."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read().decode("utf-8")


def read_schema(path: str) -> Schema:
    """Read schema.json from a local or gs:// path (a directory or the file itself)."""
    import tensorflow as tf

    if not path.endswith(".json"):
        path = posixpath.join(path, SCHEMA_FILE)
    if not tf.io.gfile.exists(path):
        raise SchemaError(
            f"{path} does not exist: the directory holds no finished preprocessing run "
            "(schema.json is written last). Run `melshards preprocess` to completion.")
    return Schema.from_json(read_text(path), where=path)
