"""schema.json: the contract between the preprocessing job and the trainer.

Declared once, versioned, written beside the shards. The writer encodes records from it
(`melshards.shards_schema.records`), the trainer derives its parse spec and input_signature from it
and refuses shards whose schema differs from the one it was started with.

Length buckets. A run holds K >= 1 buckets; each has its own static shapes (its feature table:
text ids padded to the bucket's `max_text_len`, mel to its `max_mel_frames`), record counts and
shard files. One fixed shape is simply K = 1: there is no second layout. Shards of bucket i are
named `{split}-bNN-SSSSS-of-CCCCC.tfrecord` (`shard_name`), so `DIR/train-*.tfrecord` and
`DIR/val-*.tfrecord` still match every bucket's shards of that split. `Schema.max_text_len`,
`max_mel_frames` and `features` are the largest bucket's (the last; buckets ascend in mel frames),
which with K = 1 is the one shape.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import posixpath
import re
from typing import Any

# 3.x: records carry speaker_id, language and language_id; schema.json holds the speaker and language
# tables (each language with the text front end its text went through) and the corpus's own vocabulary.
# 3.1: the optional per-frame features (OPTIONAL_FEATURES), their statistics (`feature_stats`, and per
# speaker and language), phone vocabularies (`text_unit`); a 3.0 file reads as a run without them.
# 3.2: each bucket's records per speaker and language in each split (`Bucket.groups`: what balanced
# sampling weighs the buckets by), and each shard's size in bytes (`bytes` in its shard list entry, checked
# before training); a 3.1 file reads without them.
# 3.3: `audio.trim_method` (energy or webrtcvad) and `audio.loudness_target_lufs` (the loudness each clip
# was normalised to, null: not normalised); per-clip extractor outputs (`extractors`: each one's name,
# version, fingerprint and declared outputs; their record features after the optional ones;
# `Speaker.centroids`); the run's references (`reference`, and the `reference` optional features);
# a 3.2 file reads as energy-trimmed, not normalised, without extractors or references.
# 3.4: `audio.vad_aggressiveness` (webrtcvad's mode in a run trimmed by it, null otherwise) and each
# extractor's `options` (its factory's keyword arguments), part of the contract; a 3.3 file reads
# without them (and a webrtcvad-trimmed 3.3 run cannot say how aggressively it trimmed).
# 2.x had no ids (one English front end); 1.x one shape and no buckets. Neither is read: re-run preprocess.
SCHEMA_VERSION = "3.4.0"
SCHEMA_FILE = "schema.json"
STATS_FILE = "stats.json"
REJECTED_FILE = "rejected.jsonl"
SPLITS = ("train", "val")
# Present while `melshards preprocess` moves a finished run into the directory (or if that was cut
# short): the directory holds no readable run until the next preprocess run in it finishes the move.
PUBLISH_JOURNAL = ".melshards-publish.json"
SHARD_SUFFIX = ".tfrecord"
# split, then the bucket: `train-*` matches every bucket's training shards and nothing of val
_SHARD_NAME = re.compile(
    r"^(?P<split>[a-z]+)-b(?P<bucket>\d{2,})-(?P<index>\d{5,})-of-(?P<count>\d{5,})" + re.escape(SHARD_SUFFIX) + "$"
)


def shard_name(split: str, bucket: int, index: int, count: int) -> str:
    """`train-b03-00001-of-00004.tfrecord`: shard 1 of the 4 holding bucket 3's training records."""
    return f"{split}-b{bucket:02d}-{index:05d}-of-{count:05d}{SHARD_SUFFIX}"


def parse_shard_name(name: str) -> dict[str, Any] | None:
    """{split, bucket, index, count} of a name `shard_name` made, or None for any other name."""
    m = _SHARD_NAME.match(posixpath.basename(name))
    if m is None:
        return None
    return {"split": m["split"], "bucket": int(m["bucket"]), "index": int(m["index"]), "count": int(m["count"])}


# schema.json `reference` keys that count records (how many fell back to their own clip, per split, or
# took a training clip for a validation record), not settings
REFERENCE_COUNTS = ("own_clip", "val_from_train")


class SchemaError(ValueError):
    """schema.json is missing, malformed, or does not match what the reader expects."""


@dataclasses.dataclass(frozen=True)
class Feature:
    """One record field. `shape` is the decoded, fixed shape; `storage` how it sits in the Example."""

    name: str
    dtype: str  # decoded dtype: string, int32, float32
    shape: tuple[int, ...]
    storage: str  # bytes | int64 | raw_float16 | raw_int16 | raw_float32 | raw_int32
    description: str = ""


# The features a run may add to text and log-mel, each with what adds it (error messages say it).
OPTIONAL_FEATURES = {
    "pitch": "features.pitch: true in the preprocess config",
    "energy": "features.energy: true in the preprocess config",
    "audio": "features.audio: true in the preprocess config",
    "durations": "`melshards preprocess --alignments DIR` (Montreal Forced Aligner TextGrids)",
    "reference": "reference.source: other_clip (stored) or same_clip (cut at train time) in the preprocess config",
}


@dataclasses.dataclass(frozen=True)
class AudioParams:
    sample_rate: int
    trim_silence: bool
    trim_top_db: float
    remove_dc: bool = True  # the clip's mean is subtracted before trimming and the mel
    trim_method: str = "energy"  # how the silence was trimmed: energy, or webrtcvad (voice activity)
    loudness_target_lufs: float | None = None  # each clip scaled to this BS.1770 loudness before the mel; None: not
    vad_aggressiveness: int | None = None  # webrtcvad's mode (0-3) when trim_method is webrtcvad; None otherwise


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
class Speaker:
    """A row of the speaker table: `id` is the record's speaker_id; clips and hours are in the shards."""

    id: int
    name: str
    clips: int
    hours: float
    gender: str = ""  # "F" | "M" | "" where the corpus does not say
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)  # feature -> {mean, std, frames} (FeatureStats)
    # vector extractor output -> the mean of this speaker's vectors (training clips; val where it has none)
    centroids: dict[str, list[float]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Language:
    """A row of the language table: `id` is the record's language_id; `text_frontend` ({name, version},
    `melshards.shards_schema.text.frontend_record`) made the text of this language's records."""

    id: int
    code: str
    clips: int
    hours: float
    text_frontend: dict[str, Any]
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)  # feature -> {mean, std, frames}


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One length bucket: its static shapes (feature table), record counts and shard files."""

    index: int
    max_text_len: int
    max_mel_frames: int
    features: tuple[Feature, ...]
    counts: dict[str, int]  # split -> records
    shards: dict[str, list[dict[str, Any]]]  # split -> [{"file": name, "records": n, "bytes": size}]
    # split -> {"speaker": records per speaker id, "language": records per language id}; empty in 3.1 files
    groups: dict[str, dict[str, list[int]]] = dataclasses.field(default_factory=dict)

    def group_counts(self, split: str, kind: str) -> list[int] | None:
        """This bucket's `split` records per speaker (`kind` "speaker") or language id; None when
        schema.json does not say (written before 3.2)."""
        counts = self.groups.get(split, {}).get(kind) if self.groups else None
        return None if counts is None else [int(n) for n in counts]

    def feature(self, name: str) -> Feature:
        for f in self.features:
            if f.name == name:
                return f
        raise SchemaError(f"schema has no feature {name!r}; it has {[f.name for f in self.features]}")

    @property
    def n_mels(self) -> int:
        return self.feature("mel").shape[1]

    @property
    def optional(self) -> tuple[str, ...]:
        """The optional features (OPTIONAL_FEATURES) this bucket's records hold."""
        names = {f.name for f in self.features}
        return tuple(n for n in OPTIONAL_FEATURES if n in names)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["features"] = [dict(dataclasses.asdict(f), shape=list(f.shape)) for f in self.features]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Bucket:
        return cls(
            index=int(d["index"]),
            max_text_len=int(d["max_text_len"]),
            max_mel_frames=int(d["max_mel_frames"]),
            features=tuple(Feature(**dict(f, shape=tuple(f["shape"]))) for f in d["features"]),
            counts={k: int(v) for k, v in d["counts"].items()},
            shards={k: list(v) for k, v in d["shards"].items()},
            groups={
                split: {kind: [int(n) for n in counts] for kind, counts in g.items()}
                for split, g in d.get("groups", {}).items()
            },
        )


@dataclasses.dataclass(frozen=True)
class Schema:
    version: str
    audio: AudioParams
    mel: MelParams
    vocabulary: tuple[str, ...]  # the corpus's own symbols after the front ends; pad and eos first
    speakers: tuple[Speaker, ...]  # index i has id i
    languages: tuple[Language, ...]  # index i has id i
    mel_mean: tuple[float, ...]
    mel_std: tuple[float, ...]
    pad_multiple: int
    buckets: tuple[Bucket, ...]  # ascending in max_mel_frames; index i is buckets[i]
    text_unit: str = "character"  # "phone": text_ids are phones of forced alignments (`Vocabulary`)
    # global statistics of the optional features over the training split: feature -> {mean, std, frames}
    # (pitch over voiced frames only); per speaker and language in their tables' `stats`
    feature_stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    # the per-clip extractors whose outputs the records hold: {name, version, fingerprint, factory,
    # options (its keyword arguments), sample_rate, outputs: [ExtractorOutput as a dict]}
    # (`melshards.preprocess.clip.extractor_plugins`)
    extractors: tuple[dict[str, Any], ...] = ()
    # the references the run chose (docs/preprocess.md, References): {source: other_clip | same_clip,
    # frames, min_seconds, seed, single_clip, own_clip: {split: records whose reference is a slice of their
    # own clip}, val_from_train: validation records whose reference is a training clip}; empty when the run
    # has none (and in files written before it)
    reference: dict[str, Any] = dataclasses.field(default_factory=dict)

    # -- construction -------------------------------------------------------------------
    @staticmethod
    def feature_table(
        max_text_len: int,
        max_mel_frames: int,
        n_mels: int,
        optional: tuple[str, ...] = (),
        hop_length: int = 0,
        *,
        extracted: tuple = (),
        sample_rate: int = 0,
        reference_frames: int = 0,
    ) -> tuple[Feature, ...]:
        """A bucket's features: the ten every run has, then the `optional` ones (OPTIONAL_FEATURES) the
        run holds, then the extractors' outputs (`extracted`: `shards_schema.extracted.ExtractorOutput`s,
        token outputs sized from `hop_length` and `sample_rate`); `hop_length` sizes the audio
        (max_mel_frames * hop_length samples), `reference_frames` the reference (its mel's frames, the
        same in every bucket)."""
        unknown = [n for n in optional if n not in OPTIONAL_FEATURES]
        if unknown:
            raise SchemaError(f"unknown optional features {unknown}; they are {list(OPTIONAL_FEATURES)}")
        extra = {
            "pitch": (
                Feature(
                    "pitch",
                    "float32",
                    (max_mel_frames,),
                    "raw_float16",
                    "f0 in Hz per mel frame, 0 where unvoiced (and in padding)",
                ),
            ),
            "energy": (
                Feature(
                    "energy",
                    "float32",
                    (max_mel_frames,),
                    "raw_float16",
                    "L2 norm of each mel frame's magnitude STFT frame, 0 in padding",
                ),
            ),
            "audio": (
                Feature(
                    "audio",
                    "int16",
                    (max_mel_frames * hop_length,),
                    "raw_int16",
                    "the trimmed waveform x 32767; sample i * hop_length is mel frame i's centre; zero after audio_len",
                ),
                Feature("audio_len", "int32", (), "int64", "number of valid samples"),
            ),
            "durations": (
                Feature(
                    "durations",
                    "int32",
                    (max_text_len,),
                    "raw_int16",
                    "mel frames per phone of text_ids (they sum to mel_len), zero-padded",
                ),
            ),
            "reference": (
                Feature("reference_id", "string", (), "bytes", "id of the clip the reference is cut from"),
                Feature(
                    "reference_mel",
                    "float32",
                    (reference_frames, n_mels),
                    "raw_float16",
                    "frames of reference_id's stored log-mel, padded with log(log_floor) after reference_len",
                ),
                Feature("reference_len", "int32", (), "int64", "number of valid reference frames"),
                Feature("reference_start", "int32", (), "int64", "the slice's first frame in reference_id's mel"),
            ),
        }
        table = Schema.base_features(max_text_len, max_mel_frames, n_mels) + tuple(
            f for n in OPTIONAL_FEATURES if n in optional for f in extra[n]
        )
        if extracted:
            from melshards.shards_schema.extracted import output_features

            table += output_features(tuple(extracted), max_mel_frames, hop_length, sample_rate)
        return table

    @staticmethod
    def base_features(max_text_len: int, max_mel_frames: int, n_mels: int) -> tuple[Feature, ...]:
        return (
            Feature("id", "string", (), "bytes", "clip id from the corpus"),
            Feature("speaker", "string", (), "bytes", "speaker name (schema.json speakers)"),
            Feature("speaker_id", "int32", (), "int64", "index of the speaker in schema.json speakers"),
            Feature("language", "string", (), "bytes", "language code (schema.json languages)"),
            Feature("language_id", "int32", (), "int64", "index of the language in schema.json languages"),
            Feature("text", "string", (), "bytes", "normalised text the ids were made from"),
            Feature(
                "text_ids", "int32", (max_text_len,), "raw_int16", "vocabulary ids, zero-padded (0 is the pad symbol)"
            ),
            Feature("text_len", "int32", (), "int64", "number of valid ids"),
            Feature(
                "mel",
                "float32",
                (max_mel_frames, n_mels),
                "raw_float16",
                "log-mel frames x bins, padded with log(log_floor)",
            ),
            Feature("mel_len", "int32", (), "int64", "number of valid frames"),
        )

    @staticmethod
    def make_bucket(
        index: int,
        max_text_len: int,
        max_mel_frames: int,
        n_mels: int,
        shards: list[dict[str, Any]],
        optional: tuple[str, ...] = (),
        hop_length: int = 0,
        groups: dict[str, dict[str, list[int]]] | None = None,
        *,
        extracted: tuple = (),
        sample_rate: int = 0,
        reference_frames: int = 0,
    ) -> Bucket:
        """A bucket from its shapes and its shard list [{split, file, records, bytes}] (any order; `bytes`,
        the file's size, where known); `groups`: its records per speaker and language id in each split."""
        keys = ("file", "records", "bytes")
        return Bucket(
            index,
            max_text_len,
            max_mel_frames,
            Schema.feature_table(
                max_text_len,
                max_mel_frames,
                n_mels,
                optional,
                hop_length,
                extracted=extracted,
                sample_rate=sample_rate,
                reference_frames=reference_frames,
            ),
            counts={s: sum(x["records"] for x in shards if x["split"] == s) for s in SPLITS},
            shards={
                s: sorted(
                    ({k: x[k] for k in keys if k in x} for x in shards if x["split"] == s), key=lambda x: x["file"]
                )
                for s in SPLITS
            },
            groups=groups or {},
        )

    # -- the largest bucket, and the run as a whole ----------------------------------------
    @property
    def largest(self) -> Bucket:
        return self.buckets[-1]

    @property
    def features(self) -> tuple[Feature, ...]:
        """The largest bucket's features (the one shape when K = 1)."""
        return self.largest.features

    @property
    def max_text_len(self) -> int:
        return self.largest.max_text_len

    @property
    def max_mel_frames(self) -> int:
        return self.largest.max_mel_frames

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(b.counts.get(s, 0) for b in self.buckets) for s in SPLITS}

    @property
    def shards(self) -> dict[str, list[dict[str, Any]]]:
        """Every bucket's shard files per split, sorted by name."""
        return {
            s: sorted((f for b in self.buckets for f in b.shards.get(s, [])), key=lambda f: f["file"]) for s in SPLITS
        }

    def feature(self, name: str) -> Feature:
        return self.largest.feature(name)

    def bucket_of_file(self, name: str) -> Bucket | None:
        """The bucket a shard file belongs to: as schema.json lists it, else as its name says
        (a copied or renamed-back file), else the only bucket when there is one; None otherwise."""
        base = posixpath.basename(name)
        for b in self.buckets:
            if any(f["file"] == base for files in b.shards.values() for f in files):
                return b
        parsed = parse_shard_name(base)
        if parsed is not None and parsed["bucket"] < len(self.buckets):
            return self.buckets[parsed["bucket"]]
        return self.buckets[0] if len(self.buckets) == 1 else None

    @property
    def n_mels(self) -> int:
        return self.mel.n_mels

    @property
    def optional(self) -> tuple[str, ...]:
        """The optional features (OPTIONAL_FEATURES) the run's records hold."""
        return self.largest.optional

    @property
    def reference_frames(self) -> int:
        """The frames of the run's references (`reference.frames`: a stored other_clip reference_mel's, or
        the slice same_clip cuts at read time); 0 in a run without references."""
        return int(self.reference.get("frames", 0))

    @property
    def references_cut_at_read_time(self) -> bool:
        """A same_clip run: no reference is stored, the reader cuts one from each record's own mel
        (`melshards.train.references`)."""
        return self.reference.get("source") == "same_clip"

    def require(self, names, who: str) -> None:
        """SchemaError naming the first of `names` the records lack and what adds it."""
        have = {f.name for f in self.features}
        for name in names:
            if name not in have:
                how = OPTIONAL_FEATURES.get(name) or OPTIONAL_FEATURES.get(
                    name.removesuffix("_mel").removesuffix("_len")
                )
                raise SchemaError(
                    f"{who} needs the feature {name!r}, which these shards lack"
                    + (
                        f"; re-run `melshards preprocess` with {how}"
                        if how
                        else f"; the shards hold {', '.join(sorted(have))}"
                    )
                )

    def vocab(self):
        """The `Vocabulary` of the records' text_ids."""
        from melshards.shards_schema.vocab import Vocabulary

        return Vocabulary(self.vocabulary, self.text_unit)

    def speaker(self, name: str) -> Speaker:
        """The speaker called `name`; SchemaError naming a few known ones and the count otherwise."""
        return _lookup(self.speakers, "name", name, "speaker")

    def training_records(self) -> list[int]:
        """Each speaker's training records, in speaker id order (the buckets' `groups`); each one's
        `clips`, records of either split, where schema.json does not say (written before 3.2). A
        speaker whose clips were all filtered or rejected keeps its row and id (the records' speaker_id
        index this table) with 0 records: a model's embedding of it never trained."""
        out = [0] * len(self.speakers)
        for b in self.buckets:
            counts = b.group_counts("train", "speaker")
            if counts is None:
                return [s.clips for s in self.speakers]
            for i, n in enumerate(counts):
                out[i] += n
        return out

    def centroids(self, name: str) -> list[list[float]]:
        """Each speaker's centroid of the vector extractor output `name`, in speaker id order (a table
        a model can gather by speaker_id); zeros for a speaker without clips in the shards.
        SchemaError when the run has no vector output of that name."""
        dims = [o["dim"] for x in self.extractors for o in x["outputs"] if o["name"] == name and o["kind"] == "vector"]
        if not dims:
            vectors = [o["name"] for x in self.extractors for o in x["outputs"] if o["kind"] == "vector"]
            raise SchemaError(
                f"these shards have no vector extractor output {name!r} (they have {first_few(vectors) or 'none'}); "
                "add an extractor that gives it to the preprocess config's `extractors:` and re-run preprocess"
            )
        return [list(s.centroids.get(name, [0.0] * dims[0])) for s in self.speakers]

    def language(self, code: str) -> Language:
        """The language of code `code`; SchemaError naming a few known ones and the count otherwise."""
        return _lookup(self.languages, "code", code, "language")

    # -- contract checks ------------------------------------------------------------------
    def contract(self) -> dict[str, Any]:
        """The part two shard sets must share to be read by one trainer (not counts or file lists)."""
        d = self.to_dict()
        out = {
            k: d[k] for k in ("version", "audio", "mel", "vocabulary", "text_unit", "max_text_len", "max_mel_frames")
        }
        # what the ids mean (not how many clips each has)
        out["speakers"] = [[s["id"], s["name"]] for s in d["speakers"]]
        out["languages"] = [[lang["id"], lang["code"], lang["text_frontend"]] for lang in d["languages"]]
        # extractor outputs of other code, weights or options do not mix (the fingerprint, the options),
        # whatever their shapes
        out["extractors"] = [
            {k: x.get(k) for k in ("name", "version", "fingerprint", "options", "sample_rate", "outputs")}
            for x in d["extractors"]
        ]
        # the references' settings (same_clip's shape is in no bucket's features), not how many fell back
        out["reference"] = {k: v for k, v in d["reference"].items() if k not in REFERENCE_COUNTS}
        out["buckets"] = [
            {k: b[k] for k in ("index", "max_text_len", "max_mel_frames", "features")} for b in d["buckets"]
        ]
        return out

    def check_compatible(self, other: Schema, here: str, there: str) -> None:
        a, b = self.contract(), other.contract()
        diffs = [k for k in a if a[k] != b[k]]
        if diffs:
            raise SchemaError(
                f"schema {there} differs from {here} in {', '.join(diffs)}; shards from different "
                "preprocessing runs cannot be mixed. Re-run `melshards preprocess` over the combined "
                "corpus, or train on one run's shards."
            )

    # -- (de)serialisation --------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = {
            "version": self.version,
            "audio": dataclasses.asdict(self.audio),
            "mel": dataclasses.asdict(self.mel),
            "vocabulary": list(self.vocabulary),
            "text_unit": self.text_unit,
            "feature_stats": self.feature_stats,
            "speakers": [dataclasses.asdict(x) for x in self.speakers],
            "languages": [dataclasses.asdict(x) for x in self.languages],
            "mel_mean": list(self.mel_mean),
            "mel_std": list(self.mel_std),
            "pad_multiple": self.pad_multiple,
            "extractors": [dict(x) for x in self.extractors],
            "reference": dict(self.reference),
        }
        # A readable summary of the buckets; checked against them on reading (an edit is an error).
        d.update(max_text_len=self.max_text_len, max_mel_frames=self.max_mel_frames, counts=self.counts)
        d["buckets"] = [b.to_dict() for b in self.buckets]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = SCHEMA_FILE) -> Schema:
        version = str(d.get("version", ""))
        if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise SchemaError(
                f"{where} has schema version {version or '(none)'}, this melshards reads "
                f"{SCHEMA_VERSION.split('.')[0]}.x; re-run `melshards preprocess` with this version."
            )
        try:
            schema = cls(
                version=version,
                audio=AudioParams(**d["audio"]),
                mel=MelParams(**d["mel"]),
                vocabulary=tuple(d["vocabulary"]),
                speakers=tuple(Speaker(**x) for x in d["speakers"]),
                languages=tuple(Language(**x) for x in d["languages"]),
                mel_mean=tuple(float(x) for x in d["mel_mean"]),
                mel_std=tuple(float(x) for x in d["mel_std"]),
                pad_multiple=int(d["pad_multiple"]),
                buckets=tuple(Bucket.from_dict(b) for b in d["buckets"]),
                text_unit=str(d.get("text_unit", "character")),  # 3.0 files: characters, no optional features
                feature_stats=dict(d.get("feature_stats", {})),
                extractors=tuple(dict(x) for x in d.get("extractors", ())),  # 3.2 files: none
                reference=dict(d.get("reference", {})),  # none before references
            )
            summary = {k: d[k] for k in ("max_text_len", "max_mel_frames", "counts")}
        except (KeyError, TypeError) as e:
            raise SchemaError(
                f"{where} is malformed ({type(e).__name__}: {e}); it was not written by "
                "this melshards, re-run `melshards preprocess`."
            ) from e
        if not schema.buckets or [b.index for b in schema.buckets] != list(range(len(schema.buckets))):
            raise SchemaError(
                f"{where} lists buckets {[b.index for b in schema.buckets]}, not 0..K-1; re-run `melshards preprocess`."
            )
        for what, table in (("speakers", schema.speakers), ("languages", schema.languages)):
            if [x.id for x in table] != list(range(len(table))):
                raise SchemaError(
                    f"{where} lists {what} with ids {[x.id for x in table][:10]}, not 0..N-1 in "
                    "order; re-run `melshards preprocess` or restore the file."
                )
        for key, value in summary.items():
            if value != getattr(schema, key):
                raise SchemaError(
                    f"{where}: {key} {value} is not its buckets' {getattr(schema, key)} (the file "
                    "was edited); re-run `melshards preprocess` or restore the file."
                )
        return schema

    @classmethod
    def from_json(cls, text: str, where: str = SCHEMA_FILE) -> Schema:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise SchemaError(f"{where} is not valid JSON: {e}") from e
        return cls.from_dict(d, where)


def _lookup(table, key: str, value: str, what: str):
    found = next((x for x in table if getattr(x, key) == value), None)
    if found is None:
        raise SchemaError(
            f"unknown {what} {value!r}; the shards have {len(table)}: {first_few(getattr(x, key) for x in table)}"
        )
    return found


def first_few(names, n: int = 8, quote=repr) -> str:
    """The first n names, quoted, then ", ..." if there are more: how messages list a table's entries."""
    names = list(names)
    return ", ".join(quote(x) for x in names[:n]) + (", ..." if len(names) > n else "")


def read_text(path: str) -> str:
    """A small text file, local or gs:// (tf.io.gfile: the trainer's IO; imported only when called)."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read().decode("utf-8")


def read_schema(path: str | os.PathLike) -> Schema:
    """The `Schema` of a preprocessing run: its schema.json, or the directory holding it (local or gs://);
    SchemaError when there is none. Public as `melshards.read_schema` (docs/api.md).

    `schema.buckets[i].features` are bucket i's static shapes; `melshards.shards_schema.records.tensor_specs(
    schema or bucket, batch_size)` gives `tf.TensorSpec`s for your own `input_signature`.
    """
    import tensorflow as tf

    path = os.fspath(path)
    if not path.endswith(".json"):
        path = posixpath.join(path, SCHEMA_FILE)
    if not tf.io.gfile.exists(path):
        raise SchemaError(
            f"{path} does not exist: the directory holds no finished preprocessing run "
            "(schema.json is written last). Run `melshards preprocess` to completion."
        )
    return Schema.from_json(read_text(path), where=path)
