"""The read stage's memory at 1x, 10x and 80x LJSpeech's rows: streamed through its sqlite working set, as
the job reads, beside the same rows collected in memory.

For each `--rows` size an LJSpeech-layout corpus of that many rows is written under the work dir
(`read-scale/rows-N`: metadata.csv, and `wavs/` with an empty file for each of the first `--files`
ids: the read stage lists the audio, it never opens it). Each variant runs in a fresh process:
  stream     the read stage's DoFn (`read_stage._ReadRows`) drained: rows to the rows files, rejections out
  in_memory  the same reader's items collected into lists (`sources.read_input`): what holding the
             rows costs, the read stage's design before the working set
and reports its wall, and its peak RSS above the RSS it had before reading (growth). Rows past
`--files` have no audio file: they are read (and would be rejected later as missing_audio).

Run: python -m benchmarks.inputs.read_scale [--rows 13100,131000,1048000] [--files 131000] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import emit
from benchmarks.preprocess.scale import WORK

SENTENCES = (
    "The lighthouse keeper climbed the stairs.",
    "Does the well never run dry?",
    "In nineteen eighty-four, the town built a new library.",
    "The fox ran through the hedge.",
)


def ensure_rows_corpus(root: Path, rows: int, files: int) -> Path:
    """An LJSpeech-layout corpus of `rows` rows and min(rows, files) empty audio files (kept between runs)."""
    done = root / "done.json"
    if done.exists() and json.loads(done.read_text()) == {"rows": rows, "files": files}:
        return root
    (root / "wavs").mkdir(parents=True, exist_ok=True)
    with open(root / "metadata.csv", "w") as f:
        for i in range(rows):
            text = " ".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(1 + i % 3))
            f.write(f"LJR{i // 10000:03d}-{i % 10000:04d}|{text}|{text}\n")
    for i in range(min(rows, files)):
        (root / "wavs" / f"LJR{i // 10000:03d}-{i % 10000:04d}.wav").touch()
    done.write_text(json.dumps({"rows": rows, "files": files}))
    return root


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def child(variant: str, corpus: str) -> dict:
    """One variant in this (fresh) process: wall, and peak RSS above the RSS before reading."""
    from melshards.preprocess.inputs.read_stage import _ReadRows, named
    from melshards.preprocess.inputs.sources import detect_corpus, read_input

    corpora = named([detect_corpus(corpus)])
    before = _rss_gib()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="melshards-read-scale-") as temp:
        if variant == "stream":
            elements = sum(1 for _ in _ReadRows(corpora, temp).process(None))
        else:
            read = read_input(corpora[0])
            elements = len(read.rows) + len(read.rejected)
    return {
        "wall_s": time.perf_counter() - start,
        "rss_before_gib": before,
        "rss_growth_gib": _rss_gib() - before,
        "elements": elements,
    }


def run(variant: str, corpus: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.inputs.read_scale", "--child", variant, str(corpus)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="13100,131000,1048000")
    ap.add_argument("--files", type=int, default=131000, help="audio files listed (the first ids)")
    ap.add_argument("--work-dir", default=os.environ.get("MELSHARDS_BENCH_DIR", WORK))
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return {}
    sizes = [int(n) for n in args.rows.split(",")]
    runs: dict[str, dict[str, dict]] = {}
    for n in sizes:
        corpus = ensure_rows_corpus(Path(args.work_dir) / "read-scale" / f"rows-{n}", n, args.files)
        runs[str(n)] = {v: run(v, corpus) for v in ("stream", "in_memory")}  # side by side, per size
    first = runs[str(sizes[0])]
    print(
        "| rows | variant | wall s | µs per row | RSS growth GiB | ÷ growth at the first size |\n|---|---|---|---|---|---|"
    )
    for n, variants in runs.items():
        for name, r in variants.items():
            print(
                f"| {int(n):,} | {name} | {r['wall_s']:.2f} | {1e6 * r['wall_s'] / int(n):.1f} | "
                f"{r['rss_growth_gib']:.3f} | {r['rss_growth_gib'] / first[name]['rss_growth_gib']:.2f} |"
            )
    result = {
        "benchmark": "read_scale",
        "files": args.files,
        "runs": runs,
        "stream_over_in_memory_growth": {
            n: round(v["stream"]["rss_growth_gib"] / v["in_memory"]["rss_growth_gib"], 3) for n, v in runs.items()
        },
    }
    emit(result)
    return result


if __name__ == "__main__":
    main()
