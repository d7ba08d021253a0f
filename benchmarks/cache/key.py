"""What identifying an audio file costs: the feature cache's key (size and modification time from one
metadata call) against a content hash (every byte read and hashed), side by side on the same files.

Per `--rounds` round, over the corpus' audio files in order: `metadata` times `cache.clip_key` (the
key the job computes for every row, warm runs included); `content` reads each file through
FileSystems and hashes it (SHA-256, as the key is hashed, and CRC32C, the cheapest hash a TFRecord
reader already links). The files are read once before the first round, so `content` reads from the
page cache: the hash's floor; a warm run on files not in memory (a corpus larger than the RAM, or on
gs://) reads them from disk or the network instead. Prints µs per file, MB/s and the ratios.

Run: python -m benchmarks.cache.key [--corpus DIR] [--clips 13100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from pathlib import Path

import google_crc32c
from apache_beam.io.filesystems import FileSystems

from benchmarks.common import emit
from benchmarks.preprocess.scale import WORK, ensure_corpus
from melshards.preprocess.clip.cache import clip_key


def content_key(path: str, hasher: str) -> str:
    with FileSystems.open(path) as f:
        data = f.read()
    if hasher == "crc32c":
        return f"{google_crc32c.value(data):08x}"
    return hashlib.sha256(data).hexdigest()


def timed(paths: list[str], key) -> float:
    start = time.perf_counter()
    for p in paths:
        key(p)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=f"{WORK}/ljbig")
    ap.add_argument("--clips", type=int, default=13100, help="corpus size (generated if the corpus is missing)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    corpus = ensure_corpus(args.corpus, args.clips)
    paths = sorted(str(p) for p in (Path(corpus) / "wavs").iterdir())
    total_bytes = sum(Path(p).stat().st_size for p in paths)
    variants = {
        "metadata": lambda p: clip_key(p, "settings"),
        "content_sha256": lambda p: content_key(p, "sha256"),
        "content_crc32c": lambda p: content_key(p, "crc32c"),
    }
    timed(paths, variants["content_crc32c"])  # into the page cache: every round then reads from memory
    walls: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, key in variants.items():  # interleaved, so the machine's load falls on every variant alike
            walls[name].append(timed(paths, key))
    median = {name: statistics.median(w) for name, w in walls.items()}
    print(f"{len(paths)} files, {total_bytes / 1e9:.2f} GB, medians of {args.rounds} rounds")
    print("| key | µs per file | MB/s | ÷ metadata |\n|---|---|---|---|")
    for name, wall in median.items():
        print(
            f"| {name} | {1e6 * wall / len(paths):.1f} | {total_bytes / wall / 1e6:.0f} | "
            f"{wall / median['metadata']:.1f} |"
        )
    result = {
        "benchmark": "cache_key",
        "files": len(paths),
        "bytes": total_bytes,
        "rounds": args.rounds,
        "us_per_file": {n: round(1e6 * w / len(paths), 2) for n, w in median.items()},
        "over_metadata": {n: round(w / median["metadata"], 2) for n, w in median.items()},
        "per_round_s": {n: [round(x, 3) for x in w] for n, w in walls.items()},
    }
    emit(result)
    return result


if __name__ == "__main__":
    main()
