"""The feature cache (`melshards preprocess --cache DIR`): each clip's audio features, kept across runs
so a re-run computes only what changed (docs/preprocess.md, Feature cache).

- **What is kept.** What `clips.analyse_audio` computes from the audio alone, in parts (`part_names`):
  the mel part (the span: decoded samples, trim start, kept samples; the decoded samples' hash; the
  log-mel, float16 as the shards store it, with its float32 per-bin moments), pitch, energy and audio
  where the run computes them, the audio quality measures (the measures, loudness, DNSMOS) and each
  extractor's outputs. Text, durations, the filter, buckets and split are recomputed every run: they
  cost little and change with the config.
- **The key** of a part: the audio file's identity (`file_identity`: a local file's real path, a gs://
  object's name, its size and modification time (local) or object update time (gs://), where in it the
  clip is) and the part's settings (`run_parts`: exactly what the part depends on, this format's
  version and the versions of the libraries that compute it). A changed file, setting or library is a
  new key for the parts that use it, and only those: never served stale, never computed for nothing
  (turning `quality.dnsmos` on computes DNSMOS, not the mel). A clip whose parts are all in the cache
  is not decoded; one that lacks a part is decoded once and only the missing parts are computed. The
  file's identity is its metadata, not a hash of its bytes: a hash would read every file on a warm
  run, which is the cost the cache removes.
- **Batches.** The parts one Measure batch computes go into one file, `entries/<sha1>.npz`, beside
  `entries/<sha1>.keys` (its keys, one per line, the entry holding a clip's span marked `clip`; written
  last): a 100k-clip corpus is a few thousand objects, not a million. In the file each quantity is one
  array over the entries that have it (features concatenated, with offsets): reading it parses a few
  array headers, not five per clip. The files keep the rules of the run's temp files
  (`melshards.preprocess.out_dir.temp_files`): named by the keys they hold, so a retried bundle, or
  two workers computing the same clips, write the same bytes; written whole (a temporary name, then
  a rename); read back by the writer only through the path and key a measured clip carries
  (`"cached"`, `"cached_parts"`). Unlike a temp file they outlive the run, so one may be gone or
  damaged when read: it is recomputed and counted, never a crash.
- **Use.** Each run records the batch files it read or wrote in `runs/<run id>.txt`;
  `melshards cache info DIR` and `melshards cache prune DIR --unused-days N` read those. While it
  runs, a run holds a lease, `runs/<run id>.live` (`Lease`: its holder and a heartbeat renewed every
  minute): `prune` removes no entries file while a live lease is there, and the writer, should a
  file it reads back be gone or damaged all the same, computes those clips again (`read_entry`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import hashlib
import importlib.metadata
import io
import json
import logging
import math
import os
import stat
import struct
import time
import uuid
import warnings
import zipfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.clip import quality
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.inputs import packed_clips
from melshards.preprocess.out_dir import lock
from melshards.preprocess.out_dir.lock import is_local_path
from melshards.shards_schema.atomic import atomic_write
from melshards.shards_schema.stats import Moments

log = logging.getLogger("melshards.preprocess")

FORMAT = 4  # bumped whenever what an entry holds, how it is stored, or how it is computed, changes
ENTRIES, RUNS = "entries", "runs"
LEASE_SUFFIX = ".live"  # runs/<run id>.live: a run using the cache now


class CacheDamaged(IOError):
    """A cache file that does not read back as the entries its name promises."""


# The libraries each part of an entry is computed with (`run_parts`), by the distribution names they
# are installed under. Every part decodes (soundfile, and the libsndfile it loads), resamples (soxr,
# through librosa) and trims (librosa's RMS; webrtcvad with `audio.trim_method: webrtcvad`); an STFT
# takes its window from scipy; loudness (BS.1770: the `loudness` measure, and the gain of
# `audio.loudness_target_lufs`) is pyloudnorm's K-weighting filters (scipy); DNSMOS is speechmos'
# ONNX models run by onnxruntime; pitch is WORLD (pyworld, installed as pyworld-prebuilt) or pyin
# (librosa's, compiled by numba, with scipy's distributions).
LIBRARIES = {
    "numpy": ("numpy",),
    "scipy": ("scipy",),
    "librosa": ("librosa",),
    "soxr": ("soxr",),
    "soundfile": ("soundfile",),
    "webrtcvad": ("webrtcvad-wheels", "webrtcvad"),
    "pyloudnorm": ("pyloudnorm",),
    "speechmos": ("speechmos",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "pyworld": ("pyworld", "pyworld-prebuilt"),
    "numba": ("numba",),
}
DECODE_LIBRARIES = ("numpy", "soundfile", "libsndfile", "soxr", "librosa")
LOUDNESS_LIBRARIES = ("pyloudnorm", "scipy")
PITCH_LIBRARIES = {"dio": ("pyworld",), "pyin": ("numba", "scipy")}


def _installed_version(distributions: Sequence[str]) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def library_versions(names: Iterable[str]) -> dict[str, str | None]:
    """The installed versions of the libraries `names` (keys of `LIBRARIES`, and "libsndfile": the
    one soundfile loads); None: not installed."""
    out: dict[str, str | None] = {}
    for name in sorted(set(names)):
        if name == "libsndfile":
            import soundfile  # decodes every clip: the worker has imported it already

            out[name] = getattr(soundfile, "__libsndfile_version__", None)
        else:
            out[name] = _installed_version(LIBRARIES[name])
    return out


# The parts of a clip's entry. Each is keyed apart, by exactly what it depends on (`run_parts`), so a
# changed setting or library computes again only the parts that use it: turning `quality.dnsmos` on
# computes DNSMOS and reads the mel from the cache.
MEL = "mel"  # the span (samples decoded, trim start, kept samples), the audio hash, the mel and its moments
ENERGY, PITCH, AUDIO = "energy", "pitch", "audio"  # one feature array each
MEASURES = "measures"  # the audio quality measures but loudness (`quality.measures`)
LOUDNESS = "loudness"  # loudness_lufs (`quality.loudness`)
DNSMOS = "dnsmos"  # dnsmos_ovrl (`quality.dnsmos`)
EXTRACTOR = "extractor"  # extractor i's outputs: the part `extractor<i>:<its name>`
# What of an extractor's schema record its part's key holds: all that changes its outputs
EXTRACTOR_KEY = ("name", "version", "fingerprint", "options", "sample_rate", "outputs")
PART_MEASURES = {
    MEASURES: tuple(m for m in quality.AUDIO_MEASURES if m != "loudness_lufs"),
    LOUDNESS: ("loudness_lufs",),
    DNSMOS: ("dnsmos_ovrl",),
}


def part_names(cfg: PreprocessConfig, extractors: Sequence[str] | None = None) -> tuple[str, ...]:
    """The parts of the entries of a run with `cfg` (`extractors`: their names, in order; default: one
    unnamed part per configured extractor, for `clips.analyse_audio`, which tells them apart by prefix)."""
    f, q = cfg.features, cfg.quality
    names = [MEL] + [n for n, on in ((ENERGY, f.energy), (PITCH, f.pitch), (AUDIO, f.audio)) if on]
    names += [MEASURES] * q.measures + [LOUDNESS] * (q.measures and q.loudness) + [DNSMOS] * q.dnsmos
    given = extractors if extractors is not None else [""] * len(cfg.extractors)
    return (*names, *(f"{EXTRACTOR}{i}:{name}" for i, name in enumerate(given)))


def is_extractor_part(name: str) -> bool:
    return name.startswith(EXTRACTOR)


@dataclasses.dataclass(frozen=True)
class Part:
    """A part of a clip's entry (`part_names`): what it holds, and `settings`, the hash of everything it
    depends on besides the audio file (the key of a clip's part is its file's identity and these)."""

    name: str
    settings: str
    arrays: tuple[str, ...] = ()  # the feature arrays it holds
    measures: tuple[str, ...] = ()  # the quality measures it holds
    extractor: int | None = None  # the index of the extractor whose outputs it holds (in `extractors:`)

    @property
    def span(self) -> bool:
        """Whether it holds the clip's span, audio hash and mel moments (the mel part)."""
        return self.name == MEL

    def entry(self, span: dict, arrays: dict, moments: Moments) -> tuple[dict, dict, Moments | None]:
        """What this part holds of a computed clip: (span, arrays, moments) as `write_batch` takes them."""
        kept = {k: span[k] for k in ("samples", "start", "length", "audio_hash")} if self.span else {}
        if self.measures:
            kept["quality"] = {m: span["quality"][m] for m in self.measures}
        return kept, {a: arrays[a] for a in self.arrays}, moments if self.span else None


def run_parts(cfg: PreprocessConfig, extractors: Sequence[dict] = ()) -> tuple[Part, ...]:
    """The parts of a run's entries (`part_names`), each with the hash of what it depends on: this
    format's version, the part's name, the settings that change what it holds and the installed
    versions of the libraries that compute it (`library_versions`, read in the worker that computes).

    Every part depends on the decode and the trim: `audio.sample_rate`, `silence_peak_dbfs` (a clip
    under it is rejected, never cached), `trim_silence` and, when trimming, `trim_method` with
    `trim_top_db` (energy) or `vad_aggressiveness` (webrtcvad). The arrays the model reads (mel,
    energy, pitch, audio, extractor outputs) are made of the normalised audio: they depend on
    `loudness_target_lufs` (and pyloudnorm, when set). Then the mel on `mel`; energy and the
    `measures` (bandwidth) on the STFT (`n_fft`, `hop_length`, `win_length`); the measures on
    `trim_top_db` (pauses); audio and pitch on `hop_length`, pitch on `pitch`; an extractor on its
    schema record (name, version, fingerprint, options, outputs, rate) and `hop_length` (frames
    outputs are checked against the mel's frames). `extractors`: the run's extractor records."""
    a, m = cfg.audio, cfg.mel
    decode: dict = {
        "sample_rate": a.sample_rate,
        "silence_peak_dbfs": a.silence_peak_dbfs,
        "trim_silence": a.trim_silence,
    }
    libraries = list(DECODE_LIBRARIES)
    if a.trim_silence:
        decode["trim_method"] = a.trim_method
        if a.trim_method == "webrtcvad":
            decode["vad_aggressiveness"] = a.vad_aggressiveness
            libraries.append("webrtcvad")
        else:
            decode["trim_top_db"] = a.trim_top_db
    gain = {"loudness_target_lufs": a.loudness_target_lufs}
    gain_libraries = LOUDNESS_LIBRARIES if a.loudness_target_lufs is not None else ()
    stft = {"n_fft": m.n_fft, "hop_length": m.hop_length, "win_length": m.win_length}
    hop = {"hop_length": m.hop_length}
    records = {f"{EXTRACTOR}{i}:{x['name']}": (i, x) for i, x in enumerate(extractors)}
    depends: dict[str, tuple[dict, Sequence[str]]] = {
        MEL: ({**gain, "mel": dataclasses.asdict(m)}, [*gain_libraries, "scipy"]),
        ENERGY: ({**gain, **stft}, [*gain_libraries, "scipy"]),
        PITCH: (
            {**gain, **hop, "pitch": dataclasses.asdict(cfg.pitch)},
            [*gain_libraries, *PITCH_LIBRARIES[cfg.pitch.tracker]],
        ),
        AUDIO: ({**gain, **hop}, gain_libraries),
        MEASURES: ({**stft, "trim_top_db": a.trim_top_db}, ["scipy"]),
        LOUDNESS: ({}, LOUDNESS_LIBRARIES),
        DNSMOS: ({}, ["speechmos", "onnxruntime"]),
        **{
            name: (
                {**gain, **hop, "extractor": {k: x[k] for k in EXTRACTOR_KEY}},
                gain_libraries,
            )
            for name, (_, x) in records.items()
        },
    }
    parts = []
    for name in part_names(cfg, [x["name"] for x in extractors]):
        settings, used = depends[name]
        described = {
            "format": FORMAT,
            "part": name,
            "decode": decode,
            **settings,
            "libraries": library_versions([*libraries, *used]),
        }
        digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]
        if name in records:
            i, x = records[name]
            parts.append(Part(name, digest, arrays=tuple(o["name"] for o in x["outputs"]), extractor=i))
        else:
            arrays = (name,) if name in (MEL, ENERGY, PITCH, AUDIO) else ()
            parts.append(Part(name, digest, arrays=arrays, measures=PART_MEASURES.get(name, ())))
    return tuple(parts)


@functools.lru_cache(maxsize=4096)
def _real_dir(directory: str) -> str:
    """`os.path.realpath` of an absolute directory, once per directory in a process: a realpath costs
    a stat per path component, several times the key's own stat (docs/performance.md#feature-cache)."""
    return os.path.realpath(directory)


def file_identity(path: str | None, locator: Mapping | None = None) -> str | None:
    """The identity of an audio file in the keys: its location, size and modification time, and where
    in it the clip is (`locator`: a parquet row, a tar member, a recording's segment); None when the
    file cannot be listed (the clip is then computed, and rejected, as without a cache).

    The location is canonical, so one file spelt two ways (relative or absolute, from another working
    directory, with `./`, `..` or a symbolic link on the way) is one identity: a local path is the
    file's real path (`os.path.realpath`); a gs:// path is taken as it is, since an object's name is
    exact (`gs://b/a//x` is another object than `gs://b/a/x`)."""
    if not path:
        return None
    try:
        if is_local_path(path):  # one lstat (what Beam's LocalFileSystem.metadata reads with three)
            path = os.path.join(_real_dir(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):  # a link: the file it names
                path = os.path.realpath(path)
                st = os.stat(path)
            size, updated = st.st_size, st.st_mtime
        else:  # the file system's own metadata call, not a glob (docs/performance.md#feature-cache)
            m = FileSystems.get_filesystem(path).metadata(path)
            size, updated = m.size_in_bytes, getattr(m, "last_updated_in_seconds", 0)
    except Exception:  # noqa: BLE001 (a missing or unreadable path: measured without the cache)
        return None
    inside = f"\n{packed_clips.locator_key(locator)}" if locator else ""  # a whole file's is as before
    return f"{path}\n{size}\n{updated}{inside}"


def part_key(identity: str, settings: str) -> str:
    """The key of a clip's part: its file's `file_identity` and the part's `settings`."""
    return hashlib.sha256(f"{identity}\n{settings}".encode()).hexdigest()


def clip_key(path: str | None, settings: str, locator: Mapping | None = None) -> str | None:
    """`part_key` of the file `path` (`file_identity`) and `settings`; None when the file cannot be listed."""
    identity = file_identity(path, locator)
    return None if identity is None else part_key(identity, settings)


def _reason(e: BaseException) -> str:
    """The innermost OSError's words (Beam wraps a file system's errors), else the exception's."""
    while not isinstance(e, OSError) and (inner := e.__cause__ or e.__context__) is not None:
        e = inner
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return f"{type(e).__name__}: {e}"


# -- the cache's files, their paths read as spelt --------------------------------------------------
# Beam's FileSystems.match, and its delete (which matches each path), read `*`, `?` and `[` in a path as
# a pattern: a cache in `dir [x]` would find none of its files and remove none. Here a listing is of
# one directory's files, the directory's path literal, and a removal takes each path as it is. Local
# paths go through os; a gs:// path goes to Beam escaped (`glob.escape`: each such character a class
# of one, which Beam's matcher reads as that character).


@contextlib.contextmanager
def _escaped_paths():
    with warnings.catch_warnings():  # Beam's regex of the class `[[]`: re's "possible nested set"
        warnings.simplefilter("ignore", FutureWarning)
        yield


def files_in(directory: str, suffix: str) -> list[FileMetadata]:
    """The files directly in `directory` whose names end with `suffix`; none where it does not exist.
    BeamIOError (gs://) or OSError (local) if it cannot be listed."""
    if not is_local_path(directory):
        with _escaped_paths():
            return FileSystems.match([glob.escape(directory.rstrip("/")) + "/*" + suffix])[0].metadata_list
    found = []
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    if entry.name.endswith(suffix) and entry.is_file():
                        st = entry.stat()
                        found.append(FileMetadata(entry.path, st.st_size, st.st_mtime))
                except FileNotFoundError:  # removed since the listing
                    continue
    except (FileNotFoundError, NotADirectoryError):
        return []
    return found


def delete(paths: Sequence[str]) -> None:
    """Remove each file, its path as it is spelt (an error, as Beam's delete, if one is not there)."""
    for path in paths:
        if is_local_path(path):
            os.remove(path)
    remote = [glob.escape(p) for p in paths if not is_local_path(p)]
    if remote:
        with _escaped_paths():
            FileSystems.delete(remote)


class CacheFiles:
    """Beam's FileSystems for the cache's `atomic_write`s, with `delete` taking paths as spelt."""

    create = staticmethod(FileSystems.create)
    rename = staticmethod(FileSystems.rename)
    delete = staticmethod(delete)


FILES = CacheFiles()


def not_a_cache_dir(cache_dir: str) -> str | None:
    """Why `cache_dir` is no directory to read a cache from (missing, a file), or None."""
    if is_local_path(cache_dir):
        if not os.path.exists(cache_dir):
            return "no such directory"
        return None if os.path.isdir(cache_dir) else "a file, not a cache directory"
    with _escaped_paths():
        found = FileSystems.match([glob.escape(cache_dir.rstrip("/")) + "/**"], [1])[0].metadata_list
    return None if found else "no such directory (nothing is stored under it)"


def check_writable(cache_dir: str) -> None:
    """OutputError, before any work, for a cache a run cannot use: a path that is a file, or a
    directory where a run cannot write its entries and its records (read-only, not ours). A run
    writes in both from its first batch to its last (`write_batch`, `Lease`, `record_use`), so a
    cache it can only read is refused here, not found out after the job has done its work. Writes
    and removes one small file in `entries/` and `runs/` (making them where missing): never left
    there, however the check ends."""
    fix = "give a directory you can write (made if missing), or run without --cache"
    if is_local_path(cache_dir) and os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
        raise lock.OutputError(f"--cache {cache_dir} is a file, not a directory; {fix}")
    for sub in (ENTRIES, RUNS):
        probe = FileSystems.join(cache_dir, sub, f".probe-{uuid.uuid4().hex}")
        try:
            try:
                with atomic_write(probe, fs=FILES):
                    pass  # an empty file
            finally:
                if FileSystems.exists(probe):
                    delete([probe])
        except Exception as e:  # noqa: BLE001 (whatever the file system says, the run cannot use it)
            raise lock.OutputError(
                f"--cache {cache_dir} cannot be written ({FileSystems.join(cache_dir, sub)}: {_reason(e)}); {fix}"
            ) from e


def batch_name(keys: list[str]) -> str:
    return hashlib.sha1("\n".join(keys).encode()).hexdigest()


def write_batch(cache_dir: str, entries: list[tuple[str, dict, dict, Moments | None]]) -> str:
    """[(key, span, arrays, mel moments or None)] -> one entries file and its keys file; returns the .npz
    path. The entries are the parts of clips (`Part.entry`): each holds what its part holds.

    The file holds each quantity as one array over the entries that have it, with `<quantity>/rows`
    [k] int32, the indices (in the keys' order) of those entries: `span` [k, 3] (samples, start,
    length) with `audio_hash` [k] (S64) on the rows of `span/rows`; `quality/<measure>` [k] float64;
    the moments' `moments_n` [k], `moments_mean` and `moments_m2` [k, n_mels] on `moments/rows`; and
    each feature's arrays concatenated along their first axis with `<name>/offsets` [k + 1] (its j-th
    entry is rows offsets[j]:offsets[j + 1]). Reading a batch then parses a few array headers,
    however many clips it holds."""
    keys = [e[0] for e in entries]
    base = FileSystems.join(cache_dir, ENTRIES, batch_name(keys))
    arrays: dict[str, np.ndarray] = {}

    def rows(name: str, have: list[int]) -> None:
        arrays[f"{name}/rows"] = np.array(have, np.int32)

    spans = [i for i, e in enumerate(entries) if "samples" in e[1]]
    rows("span", spans)
    arrays["span"] = np.array(
        [[entries[i][1]["samples"], entries[i][1]["start"], entries[i][1]["length"]] for i in spans], np.int64
    ).reshape(-1, 3)
    arrays["audio_hash"] = np.array([entries[i][1].get("audio_hash", "") for i in spans], "S64")
    measures = sorted({m for e in entries for m in e[1].get("quality", {})})
    for m in measures:
        have = [i for i, e in enumerate(entries) if m in e[1].get("quality", {})]
        rows(f"quality/{m}", have)
        arrays[f"quality/{m}"] = np.array([entries[i][1]["quality"][m] for i in have], np.float64)
    moments = [i for i, e in enumerate(entries) if e[3] is not None]
    if moments:
        rows("moments", moments)
        arrays["moments_n"] = np.array([entries[i][3].n for i in moments], np.int64)  # type: ignore[union-attr]  # not None on these rows
        arrays["moments_mean"] = np.stack([entries[i][3].mean for i in moments])  # type: ignore[union-attr]
        arrays["moments_m2"] = np.stack([entries[i][3].m2 for i in moments])  # type: ignore[union-attr]
    for name in sorted({n for e in entries for n in e[2]}):
        have = [i for i, e in enumerate(entries) if name in e[2]]
        values = [entries[i][2][name].astype("<f2") if name == "mel" else entries[i][2][name] for i in have]
        rows(name, have)
        arrays[f"{name}/offsets"] = np.cumsum([0] + [len(v) for v in values], dtype=np.int64)
        arrays[name] = np.concatenate(values)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # mypy matches **arrays with savez's allow_pickle: bool too (numpy >= 2.1); no array has that name
    with atomic_write(base + ".npz", fs=FILES) as out:
        out.write(buffer.getvalue())
    with atomic_write(base + ".keys", fs=FILES) as out:  # last: an index entry has its data
        marked = set(spans)  # one a clip: what `info` counts
        out.write("".join(k + (f" {CLIP}" if i in marked else "") + "\n" for i, k in enumerate(keys)).encode())
    return base + ".npz"


_NPY_HEADER_BYTES = 10_100  # an .npy header's magic, length and dict fit here (numpy reads at most 10,000)
_NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def npz_arrays(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of an uncompressed .npz (`np.savez`'s) held in `data`: read-only views of `data`,
    each member's CRC-32 checked. ValueError (or zipfile's BadZipFile) if it does not read back.

    `np.load` copies each member out of the zip twice, and a warm re-run reads the whole cache twice
    (Measure, then the writer): see docs/performance.md#feature-cache. The zip's directory is read by
    `zipfile`, each .npy header by `np.lib.format`."""
    view, out = memoryview(data), {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for info in z.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"{info.filename} is compressed")
            start = info.header_offset  # the member's local header: 30 bytes, its name, its extra field
            if data[start : start + 4] != b"PK\x03\x04":
                raise ValueError(f"{info.filename}: no local header at {start}")
            name_len, extra_len = struct.unpack_from("<HH", data, start + 26)
            begin = start + 30 + name_len + extra_len
            member = view[begin : begin + info.file_size]
            if len(member) != info.file_size or zlib.crc32(member) != info.CRC:
                raise ValueError(f"{info.filename}: its bytes do not match the zip's CRC-32")
            head = io.BytesIO(member[:_NPY_HEADER_BYTES].tobytes())
            version = np.lib.format.read_magic(head)
            if version not in _NPY_HEADER_READERS:
                raise ValueError(f"{info.filename}: .npy version {version}")
            shape, fortran, dtype = _NPY_HEADER_READERS[version](head)
            count = math.prod(shape)
            if dtype.hasobject or len(member) - head.tell() != count * dtype.itemsize:
                raise ValueError(f"{info.filename}: {len(member) - head.tell()} bytes for {shape} {dtype}")
            array = np.frombuffer(member, dtype, count, head.tell())
            out[info.filename.removesuffix(".npy")] = array.reshape(shape, order="F" if fortran else "C")
    return out


def _positions(batch: dict[str, np.ndarray], name: str, n: int, size: int) -> dict[int, int]:
    """{entry index: its position in the quantity `name`} from `name/rows`; ValueError unless the rows
    are `size` distinct entries of the `n`."""
    found = batch[f"{name}/rows"]
    if len(found) != size or len(set(found.tolist())) != size or (size and not 0 <= found.min() <= found.max() < n):
        raise ValueError(f"{name}: {size} values for the rows {found.tolist()} of {n} entries")
    return {int(i): j for j, i in enumerate(found)}


def read_batch(npz_path: str) -> dict[str, tuple[dict, dict, Moments | None]]:
    """An entries file -> {key: (span, arrays, mel moments or None)}, each entry with what its part holds
    (`write_batch`): span {"samples", "start", "length", "audio_hash"} where it has them and
    "quality" {measure: value} (empty where it has none). CacheDamaged if it does not read back. The
    arrays are read-only views of the file's bytes."""
    try:
        keys = _keys(npz_path[:-4] + ".keys")
        with FileSystems.open(npz_path) as f:
            data = f.read()
        batch = npz_arrays(data)
        n = len(keys)
        spans = _positions(batch, "span", n, len(batch["span"]))
        if len(batch["audio_hash"]) != len(spans):
            raise ValueError(f"{len(batch['audio_hash'])} audio hashes for {len(spans)} spans")
        measures = {
            name.removeprefix("quality/"): _positions(batch, name, n, len(batch[name]))
            for name in batch
            if name.startswith("quality/") and not name.endswith("/rows")
        }
        moments = _positions(batch, "moments", n, len(batch["moments_n"])) if "moments_n" in batch else {}
        for name in ("moments_mean", "moments_m2"):  # a clip's moments outlive the batch: not views of the file
            if name in batch:
                batch[name] = batch[name].copy()
                if len(batch[name]) != len(moments):
                    raise ValueError(f"{name}: {len(batch[name])} rows for {len(moments)} moments")
        # mel, pitch, energy, audio and the extractors' outputs: every array with its offsets
        features = {}
        for name in sorted(x for x in batch if f"{x}/offsets" in batch):
            offsets = batch[f"{name}/offsets"]
            if len(offsets) < 1 or offsets[-1] != len(batch[name]):
                raise ValueError(f"{name}: its offsets do not end at its {len(batch[name])} rows")
            features[name] = _positions(batch, name, n, len(offsets) - 1)
        out: dict[str, tuple[dict, dict, Moments | None]] = {}
        for i, key in enumerate(keys):
            span: dict = {"quality": {m: float(batch[f"quality/{m}"][at[i]]) for m, at in measures.items() if i in at}}
            if i in spans:
                samples, start, length = (int(x) for x in batch["span"][spans[i]])
                span.update(samples=samples, start=start, length=length)
                span["audio_hash"] = batch["audio_hash"][spans[i]].decode("ascii")
            arrays = {}
            for name, at in features.items():
                if i in at:
                    offsets = batch[f"{name}/offsets"]
                    arrays[name] = batch[name][offsets[at[i]] : offsets[at[i] + 1]]
            j = moments.get(i)
            m = (
                None
                if j is None
                else Moments(int(batch["moments_n"][j]), batch["moments_mean"][j], batch["moments_m2"][j])
            )
            out[key] = (span, arrays, m)
    except Exception as e:  # noqa: BLE001 (a truncated zip, a missing member, bad bytes: all are damage)
        raise CacheDamaged(f"{npz_path}: {type(e).__name__}: {e}") from e
    if batch_name(keys) != npz_path.rsplit("/", 1)[-1][:-4]:
        raise CacheDamaged(f"{npz_path}: its keys file does not match its name")
    return out


def read_entry(npz_path: str, key: str, loaded: dict[str, dict]) -> dict | None:
    """The arrays of `key` in the entries file `npz_path` (each file read once, into `loaded`); None,
    logged, when the file is gone (a prune, a user), damaged, or does not hold the key: the caller
    computes the clip again."""
    if npz_path not in loaded:
        try:
            loaded[npz_path] = read_batch(npz_path)
        except CacheDamaged as e:
            log.warning("feature cache: %s; its clips are computed again", e)
            loaded[npz_path] = {}
    found = loaded[npz_path].get(key)
    return None if found is None else found[1]


def read_entries(where: Sequence[Sequence[str]], loaded: dict[str, dict]) -> dict | None:
    """The arrays of a clip's parts, `where` [(entries file, key)] (`read_entry`), in one dict; None
    when one of them cannot be read back: the caller computes the clip again."""
    out: dict = {}
    for npz_path, key in where:
        found = read_entry(npz_path, key, loaded)
        if found is None:
            return None
        out.update(found)
    return out


def key_files(cache_dir: str) -> list[str]:
    """Every complete entries file of the cache (its .keys file is written last)."""
    try:
        return sorted(m.path for m in files_in(FileSystems.join(cache_dir, ENTRIES), ".keys"))
    except Exception:  # noqa: BLE001 (an empty or new cache: nothing matches)
        return []


CLIP = "clip"  # a keys file's mark of the entry that holds a clip's span: one per clip (the mel part)


def _key_lines(keys_path: str) -> list[list[str]]:
    with FileSystems.open(keys_path) as f:
        return [line.split() for line in f.read().decode("utf-8").splitlines() if line.strip()]


def _keys(keys_path: str) -> list[str]:
    return [line[0] for line in _key_lines(keys_path)]


def keys_in(keys_path: str) -> list[str]:
    """The keys of one keys file; none if it cannot be read (its clips are recomputed)."""
    try:
        return _keys(keys_path)
    except Exception:  # noqa: BLE001
        return []


def clips_in(keys_path: str) -> int:
    """The clips one keys file holds the span of (`CLIP`); 0 if it cannot be read."""
    try:
        return sum(line[1:] == [CLIP] for line in _key_lines(keys_path))
    except Exception:  # noqa: BLE001
        return 0


def _key_bits(keys: Sequence[str]) -> np.ndarray:
    """The first 128 bits of each (hex) key, as [n, 2] uint64. ValueError for a key that is not hex."""
    return np.frombuffer(bytes.fromhex("".join(k[:32].rjust(32, "0") for k in keys)), ">u8").reshape(-1, 2)


@dataclasses.dataclass(frozen=True)
class CacheIndex:
    """Which entries file holds each key, in 20 bytes a key (a key per part of a clip): the keys' first
    128 bits (`hi`, `lo`, sorted) and each one's file, an index into `files` (an entries file per 32
    clips or so). Every
    worker holds it, so it is packed arrays, not a dict of key and path strings
    (docs/performance.md#feature-cache).
    Two keys sharing 128 bits (of a sha256) is not a concern at any corpus size."""

    hi: np.ndarray  # uint64, sorted
    lo: np.ndarray  # uint64, sorted within equal `hi`
    file: np.ndarray  # int32: files[file[i]] holds key i
    files: tuple[str, ...]

    @classmethod
    def of(cls, parts: Iterable[tuple[str, np.ndarray]]) -> CacheIndex:
        """From (entries file, its keys' `_key_bits`) parts (`index_part`)."""
        parts = [p for p in parts if len(p[1])]
        bits = np.concatenate([p[1] for p in parts]) if parts else np.zeros((0, 2), np.uint64)
        file = np.repeat(np.arange(len(parts), dtype=np.int32), [len(p[1]) for p in parts])
        order = np.lexsort((bits[:, 1], bits[:, 0]))  # stable: of two files with a key, the first part's
        return cls(
            bits[order, 0].astype(np.uint64), bits[order, 1].astype(np.uint64), file[order], tuple(p[0] for p in parts)
        )

    def __len__(self) -> int:
        return len(self.hi)

    def get(self, key: str | None) -> str | None:
        """The entries file holding `key`, or None."""
        if not key:
            return None
        try:
            ((hi, lo),) = _key_bits([key])
        except ValueError:
            return None
        i = int(np.searchsorted(self.hi, hi))
        while i < len(self.hi) and self.hi[i] == hi:
            if self.lo[i] == lo:
                return self.files[self.file[i]]
            i += 1
        return None


def index_part(keys_path: str) -> tuple[str, np.ndarray]:
    """(entries file, its keys' first 128 bits) of one keys file, for `CacheIndex.of`; no keys if it
    cannot be read (the clips are recomputed)."""
    try:
        bits = _key_bits(keys_in(keys_path))
    except ValueError:  # not a keys file this module wrote
        bits = _key_bits([])
    return keys_path[:-5] + ".npz", bits


_INDEX_READERS = 16  # keys files read at once: small reads, on gs:// each mostly waiting


def read_index(cache_dir: str) -> CacheIndex:
    """The cache's index, from every keys file (one listing, the files read 16 at a time). One
    worker reads it for the run: a 100,000-clip cache is about 3,000 small files."""
    with ThreadPoolExecutor(_INDEX_READERS) as pool:
        return CacheIndex.of(pool.map(index_part, key_files(cache_dir)))


def record_use(cache_dir: str, run_id: str, files) -> str:
    """The entries files a run read or wrote, as runs/<run_id>.txt (what `cache prune` keeps)."""
    path = FileSystems.join(cache_dir, RUNS, f"{run_id}.txt")
    with atomic_write(path, fs=FILES) as out:
        out.write("".join(sorted(f.rsplit("/", 1)[-1] + "\n" for f in set(files))).encode())
    return path


@dataclasses.dataclass(frozen=True)
class CacheInfo:
    files: int  # entries files (.npz)
    entries: int  # clips (the entries holding a clip's span, `CLIP`)
    bytes: int
    runs: int  # runs recorded in runs/
    unused_files: int  # entries files no recorded run used


def _used_by_runs(cache_dir: str, newer_than: float | None = None) -> tuple[set[str], list[str], list[str]]:
    """(entries files the recorded runs used, run records kept, run records older than `newer_than`)."""
    try:
        records = files_in(FileSystems.join(cache_dir, RUNS), ".txt")
    except Exception:  # noqa: BLE001
        records = []
    used, kept, old = set(), [], []
    for m in records:
        if newer_than is not None and getattr(m, "last_updated_in_seconds", 0) < newer_than:
            old.append(m.path)
            continue
        kept.append(m.path)
        with FileSystems.open(m.path) as f:
            used.update(f.read().decode("utf-8").split())
    return used, kept, old


def _entries_files(cache_dir: str) -> list:
    try:
        return files_in(FileSystems.join(cache_dir, ENTRIES), ".npz")
    except Exception:  # noqa: BLE001
        return []


def info(cache_dir: str) -> CacheInfo:
    """What the cache holds, and how much of it no recorded run used."""
    files = _entries_files(cache_dir)
    entries = sum(clips_in(m.path[:-4] + ".keys") for m in files)
    used, kept, _ = _used_by_runs(cache_dir)
    return CacheInfo(
        len(files),
        entries,
        sum(m.size_in_bytes for m in files),
        len(kept),
        sum(1 for m in files if m.path.rsplit("/", 1)[-1] not in used),
    )


class Lease:
    """A run's hold on the cache while it runs: `runs/<run id>.live`, holding the run id, its process
    (`lock.machine_identity`, pid) and a heartbeat rewritten every `lock.HEARTBEAT_S` by a daemon
    thread; `release` removes it. `prune` removes no entries file while a lease is live (`live_leases`)."""

    def __init__(self, cache_dir: str, run_id: str):
        self.path = FileSystems.join(cache_dir, RUNS, run_id + LEASE_SUFFIX)
        now = time.time()
        self.info = {"run_id": run_id, **lock.machine_identity(), "pid": os.getpid(), "started": now, "heartbeat": now}
        self.heartbeat = lock.Heartbeat(self.path, self._write)

    def _write(self) -> None:
        self.info["heartbeat"] = time.time()
        with atomic_write(self.path, fs=FILES) as out:
            out.write(json.dumps(self.info, sort_keys=True).encode())

    def start(self, every: float = lock.HEARTBEAT_S) -> Lease:
        """Write the lease (an OSError if the cache cannot take it) and keep it fresh."""
        self._write()
        self.heartbeat.start(every)
        return self

    def release(self) -> None:
        self.heartbeat.stop()
        try:
            delete([self.path])
        except Exception as e:  # noqa: BLE001 (left behind, it goes stale and prune removes it)
            log.warning("could not remove %s (%s)", self.path, e)


def live_leases(cache_dir: str, now: float) -> tuple[list[dict], list[str]]:
    """(the holders of the live leases, the paths of the stale ones). A lease is stale as a lock is
    (`lock.is_stale`: no heartbeat for `lock.STALE_AFTER_S`, or its process gone from this process
    table); one that does not parse is judged by its file's modification time."""
    try:
        found = files_in(FileSystems.join(cache_dir, RUNS), LEASE_SUFFIX)
    except Exception:  # noqa: BLE001 (no runs/ yet)
        found = []
    here, live, stale = lock.machine_identity(), [], []
    for m in found:
        try:
            with FileSystems.open(m.path) as f:
                holder = json.loads(f.read())
            if not isinstance(holder, dict):
                raise ValueError("not a lease")
        except FileNotFoundError:  # released since the listing
            continue
        except Exception:  # noqa: BLE001 (half a lease, or not ours: judged by its age alone)
            holder = {
                "run_id": m.path.rsplit("/", 1)[-1][: -len(LEASE_SUFFIX)],
                "heartbeat": getattr(m, "last_updated_in_seconds", 0),
            }
        if lock.is_stale(holder, now, here):
            stale.append(m.path)
        else:
            live.append(holder)
    return live, stale


@dataclasses.dataclass(frozen=True)
class Pruned:
    files: int  # entries files removed
    bytes: int
    live: list  # the holders of live leases: while there is one, no entries file is removed


def prune(cache_dir: str, unused_days: float, now: float) -> Pruned:
    """Remove the run records older than `unused_days` and the stale leases, then every entries file
    (and its keys file) that no remaining record names and that is itself older than `unused_days`.
    While a run holds a live lease (`live_leases`), no entries file is removed: a run records the
    files it used only when it finishes, and its writer reads back what Measure read or wrote. Only
    files of this cache's own naming are touched (`entries/<sha1>.npz|.keys`, `runs/*.txt|.live`)."""
    cutoff = now - unused_days * 86400
    live, stale = live_leases(cache_dir, now)
    used, _, old = _used_by_runs(cache_dir, newer_than=cutoff)
    if old or stale:
        delete(old + stale)
    if live:
        return Pruned(0, 0, live)
    doomed = [
        m
        for m in _entries_files(cache_dir)
        if m.path.rsplit("/", 1)[-1] not in used
        and getattr(m, "last_updated_in_seconds", 0) < cutoff
        and len(m.path.rsplit("/", 1)[-1]) == 44
    ]  # <40 hex digits>.npz: a name this module wrote
    paths = [p for m in doomed for p in (m.path, m.path[:-4] + ".keys")]
    if paths:
        delete([p for p in paths if FileSystems.exists(p)])
    return Pruned(len(doomed), sum(m.size_in_bytes for m in doomed), [])
