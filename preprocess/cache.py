"""The feature cache (`melshards preprocess --cache DIR`): each clip's audio features, kept across runs
so a re-run computes only what changed (docs/preprocess.md, Feature cache).

- **What is kept.** What `clips.analyse_audio` computes from the audio alone: the span (decoded
  samples, trim start, kept samples, the decoded samples' hash and the audio quality measures), the log-mel (float16, as the shards store it) with its float32
  per-bin moments, and pitch, energy and audio where the run computes them. Text, durations, the
  filter, buckets and split are recomputed every run: they cost little and change with the config.
- **The key** of an entry: the audio file's canonical location (`clip_key`: a local file's real
  path, a gs:// object's name), size and modification time (local) or object update time (gs://),
  and every setting the features depend on (`settings_key`: audio, mel,
  features, pitch, this format's version and the versions of the libraries that compute them). A
  changed file, setting or library is a new key: never served stale. The file's identity is its
  metadata, not a hash of its bytes: a hash would read every file on a warm run, which is the cost
  the cache removes.
- **Batches.** The entries one Measure batch computes go into one file, `entries/<sha1>.npz`, beside
  `entries/<sha1>.keys` (its keys, one per line, written last): a 100k-clip corpus is a few thousand
  objects, not a million. In the file each quantity is one array for the whole batch (features
  concatenated, with offsets): reading it parses a few array headers, not five per clip. The name comes from the keys, so a retried bundle, or two workers
  computing the same clips, write the same bytes; each file is written under a temporary name and
  renamed, so no reader sees half of one. A file that does not read back (damaged, truncated) is
  recomputed and counted, never a crash.
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

from melshards.preprocess import containers, lock
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.lock import is_local_path
from melshards.shards_schema.atomic import atomic_write
from melshards.shards_schema.stats import Moments

log = logging.getLogger("melshards.preprocess")

FORMAT = 3  # bumped whenever what an entry holds, how it is stored, or how it is computed, changes
ENTRIES, RUNS = "entries", "runs"
LEASE_SUFFIX = ".live"  # runs/<run id>.live: a run using the cache now


class CacheDamaged(IOError):
    """A cache file that does not read back as the entries its name promises."""


# The libraries that compute an entry, each by the distribution names it is installed under: they
# decode (soundfile, and the libsndfile it loads), resample (soxr), take the STFT and the mel (librosa,
# numpy, scipy); pitch also with WORLD (pyworld, installed as pyworld-prebuilt) or pyin (librosa, numba).
FEATURE_LIBRARIES = {
    "numpy": ("numpy",),
    "scipy": ("scipy",),
    "librosa": ("librosa",),
    "soxr": ("soxr",),
    "soundfile": ("soundfile",),
}
PITCH_LIBRARIES = {"pyworld": ("pyworld", "pyworld-prebuilt"), "numba": ("numba",)}


def _installed_version(distributions: Sequence[str]) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def library_versions(pitch: bool) -> dict[str, str | None]:
    """The installed versions of the libraries that compute an entry's features (None: not installed),
    libsndfile's included; with `pitch`, those of the pitch trackers too."""
    import soundfile  # decodes every clip: the worker has imported it already

    libraries = {**FEATURE_LIBRARIES, **(PITCH_LIBRARIES if pitch else {})}
    return {
        **{name: _installed_version(dists) for name, dists in libraries.items()},
        "libsndfile": getattr(soundfile, "__libsndfile_version__", None),
    }


def settings_key(cfg: PreprocessConfig, extractors: list[dict] | None = None) -> str:
    """Everything an entry's arrays depend on besides the audio file: the settings, this format's
    version and the versions of the libraries that compute them (`library_versions`), so an upgrade
    computes the clips again instead of mixing old and new features; with `extractors` (their schema
    records: name, version, fingerprint of code and weights, outputs), those too, so other weights
    never reuse a clip's entry. Computed where the features are (a worker's libraries, not the launcher's)."""
    parts = {
        "format": FORMAT,
        **{k: dataclasses.asdict(getattr(cfg, k)) for k in ("audio", "mel", "features", "pitch", "quality")},
        "libraries": library_versions(bool(cfg.features.pitch)),
    }
    if extractors:  # absent otherwise: a run without extractors keeps the keys it had
        parts["extractors"] = [
            {k: x[k] for k in ("name", "version", "fingerprint", "sample_rate", "outputs")} for x in extractors
        ]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=4096)
def _real_dir(directory: str) -> str:
    """`os.path.realpath` of an absolute directory, once per directory in a process: a realpath costs
    a stat per path component, several times the key's own stat (docs/performance.md#feature-cache)."""
    return os.path.realpath(directory)


def clip_key(path: str | None, settings: str, locator: Mapping | None = None) -> str | None:
    """The entry key of an audio file: its location, size and modification time, where in it the clip
    is (`locator`: a parquet row, a tar member, a recording's segment), and the settings; None
    when the file cannot be listed (the clip is then computed, and rejected, as without a cache).

    The location is canonical, so one file spelt two ways (relative or absolute, from another working
    directory, with `./`, `..` or a symbolic link on the way) is one key: a local path is the file's
    real path (`os.path.realpath`); a gs:// path is taken as it is, since an object's name is exact
    (`gs://b/a//x` is another object than `gs://b/a/x`)."""
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
    inside = f"\n{containers.locator_key(locator)}" if locator else ""  # a whole file's key is as before
    ident = f"{path}\n{size}\n{updated}{inside}\n{settings}"
    return hashlib.sha256(ident.encode("utf-8")).hexdigest()


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


def write_batch(cache_dir: str, entries: list[tuple[str, dict, dict, Moments]]) -> str:
    """[(key, span, arrays, mel moments)] -> one entries file and its keys file; returns the .npz path.

    The file holds each quantity of the batch as one array: `span` [n, 3], `audio_hash` [n] (S64),
    `quality/<measure>` [n] float64 for each audio quality measure, the moments' `moments_n`
    [n], `moments_mean` and `moments_m2` [n, n_mels], and each feature's arrays concatenated along
    their first axis with `<name>/offsets` [n + 1] (clip i is rows offsets[i]:offsets[i + 1]). Reading a
    batch then parses a few array headers, however many clips it holds."""
    keys = [e[0] for e in entries]
    base = FileSystems.join(cache_dir, ENTRIES, batch_name(keys))
    names = sorted(entries[0][2]) if entries else []
    if any(sorted(e[2]) != names for e in entries):
        raise ValueError(
            f"the entries of one batch hold different features: {sorted({tuple(sorted(e[2])) for e in entries})}"
        )
    arrays = {
        "span": np.array([[e[1]["samples"], e[1]["start"], e[1]["length"]] for e in entries], np.int64).reshape(-1, 3),
        "moments_n": np.array([e[3].n for e in entries], np.int64),
        "audio_hash": np.array([e[1].get("audio_hash", "") for e in entries], "S64"),
    }
    measures = sorted(entries[0][1].get("quality", {})) if entries else []
    for name in measures:  # a span without measures (a caller of its own) stores none
        arrays[f"quality/{name}"] = np.array([e[1]["quality"][name] for e in entries], np.float64)
    if entries:
        arrays["moments_mean"] = np.stack([e[3].mean for e in entries])
        arrays["moments_m2"] = np.stack([e[3].m2 for e in entries])
    for name in names:
        values = [e[2][name].astype("<f2") if name == "mel" else e[2][name] for e in entries]
        arrays[f"{name}/offsets"] = np.cumsum([0] + [len(v) for v in values], dtype=np.int64)
        arrays[name] = np.concatenate(values)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # mypy matches **arrays with savez's allow_pickle: bool too (numpy >= 2.1); no array has that name
    with atomic_write(base + ".npz", fs=FILES) as out:
        out.write(buffer.getvalue())
    with atomic_write(base + ".keys", fs=FILES) as out:  # last: an index entry has its data
        out.write("".join(k + "\n" for k in keys).encode())
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


def read_batch(npz_path: str) -> dict[str, tuple[dict, dict, Moments]]:
    """An entries file -> {key: (span, arrays, mel moments)}; CacheDamaged if it does not read back.
    The arrays are read-only views of the file's bytes."""
    try:
        keys = _keys(npz_path[:-4] + ".keys")
        with FileSystems.open(npz_path) as f:
            data = f.read()
        out: dict[str, tuple[dict, dict, Moments]] = {}
        batch = npz_arrays(data)
        for name in ("moments_mean", "moments_m2"):  # a clip's moments outlive the batch: not views of the file
            if name in batch:
                batch[name] = batch[name].copy()
        spans, counts, hashes = batch["span"], batch["moments_n"], batch["audio_hash"]
        measures = sorted(n.removeprefix("quality/") for n in batch if n.startswith("quality/"))
        # mel, pitch, energy, audio and the extractors' outputs: every array with its offsets
        features = sorted(n for n in batch if f"{n}/offsets" in batch)
        if (
            len(spans) != len(keys)
            or len(counts) != len(keys)
            or len(hashes) != len(keys)
            or any(len(batch[f"quality/{m}"]) != len(keys) for m in measures)
            or any(
                len(batch[f"{n}/offsets"]) != len(keys) + 1 or batch[f"{n}/offsets"][-1] != len(batch[n])
                for n in features
            )
        ):
            raise CacheDamaged(f"{npz_path}: its arrays do not hold {len(keys)} clips")
        for i, key in enumerate(keys):
            samples, start, length = (int(x) for x in spans[i])
            arrays = {n: batch[n][batch[f"{n}/offsets"][i] : batch[f"{n}/offsets"][i + 1]] for n in features}
            moments = Moments(int(counts[i]), batch["moments_mean"][i], batch["moments_m2"][i])
            span = {
                "samples": samples,
                "start": start,
                "length": length,
                "audio_hash": hashes[i].decode("ascii"),
                "quality": {m: float(batch[f"quality/{m}"][i]) for m in measures},
            }
            out[key] = (span, arrays, moments)
    except CacheDamaged:
        raise
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


def key_files(cache_dir: str) -> list[str]:
    """Every complete entries file of the cache (its .keys file is written last)."""
    try:
        return sorted(m.path for m in files_in(FileSystems.join(cache_dir, ENTRIES), ".keys"))
    except Exception:  # noqa: BLE001 (an empty or new cache: nothing matches)
        return []


def _keys(keys_path: str) -> list[str]:
    with FileSystems.open(keys_path) as f:
        return f.read().decode("utf-8").split()


def keys_in(keys_path: str) -> list[str]:
    """The keys of one keys file; none if it cannot be read (its clips are recomputed)."""
    try:
        return _keys(keys_path)
    except Exception:  # noqa: BLE001
        return []


def _key_bits(keys: Sequence[str]) -> np.ndarray:
    """The first 128 bits of each (hex) key, as [n, 2] uint64. ValueError for a key that is not hex."""
    return np.frombuffer(bytes.fromhex("".join(k[:32].rjust(32, "0") for k in keys)), ">u8").reshape(-1, 2)


@dataclasses.dataclass(frozen=True)
class CacheIndex:
    """Which entries file holds each key, in 20 bytes a clip: the keys' first 128 bits (`hi`, `lo`,
    sorted) and each one's file, an index into `files` (an entries file per 32 clips or so). Every
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
    entries: int  # clips
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
    entries = sum(len(keys_in(m.path[:-4] + ".keys")) for m in files)
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
