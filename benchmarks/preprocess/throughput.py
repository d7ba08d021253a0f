"""Preprocessing throughput: the Beam job against the multiprocessing.Pool script a user would write.

Variants, each a separate process timed from start to exit (imports included), run interleaved in
every round (the machine is shared: compare same-round ratios, not absolutes):
  poolN     `python -m benchmarks.preprocess.pool_baseline --workers N`: decode once, trim, librosa log-mel
            (`librosa.feature.melspectrogram`), one .npy per clip, N processes
  poolmN    the same with `--job-mel`: the job's own log_mel (cached filter bank, matmul), so
            job/poolm is the price of the job itself (runner, statistics, shards)
  jobN      `python -m melshards preprocess --workers N`: the whole job (statistics, filter, pad, shards)
  jobN@1    the same job on a 1-row corpus: the fixed start-up of a run
for N in --workers (default 1,2). Reported: wall (median over rounds), job/pool wall ratio (median
of per-round ratios), CPU seconds and peak RSS of the process tree, and the load average before
each run. Goals (issue 14): 1-row run <= 4 s (1 worker) / <= 6 s (2); job <= 2x pool at 1,000 clips,
<= 1.1x at LJSpeech scale (--clips 13100, with peak RSS <= 3 GiB).

Run: python -m benchmarks.preprocess.throughput [--clips 1000] [--rounds 3] [--workers 1,2]
         [--work-dir /tmp/melshards-bench]
     python -m benchmarks.preprocess.throughput --clips 13100 --rounds 2 --workers 2   (LJSpeech scale)
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from pathlib import Path

from benchmarks.common import emit, preprocess_command
from benchmarks.preprocess.scale import WORK, ensure_corpus
from benchmarks.proctree import run_sampled

LJSPEECH_CLIPS = 13100


def corpus_rows(corpus: str) -> list[dict]:
    """The rows the job would measure (malformed rows and repeated ids dropped, audio resolved)."""
    from melshards.preprocess.inputs.layouts import parse_ljspeech_line

    lines = [line for line in (Path(corpus) / "metadata.csv").read_text(encoding="utf-8").splitlines() if line.strip()]
    rows, seen = [], set()
    for i, line in enumerate(lines):
        try:
            r = parse_ljspeech_line(line, i)
        except ValueError:  # malformed row: the job rejects it too
            continue
        if r["id"] in seen:  # duplicate id: the job keeps the first row
            continue
        seen.add(r["id"])
        wav = os.path.join(corpus, "wavs", r["id"] + ".wav")
        if not os.path.exists(wav):  # the demo corpus also has .flac/.ogg (or nothing)
            wav = next(iter(sorted(Path(corpus, "wavs").glob(r["id"] + ".*"))), None)
        rows.append(dict(r, audio=wav and str(wav), language="en"))  # the job reads LJSpeech as English
    return rows


def one_clip_corpus(src: str, dst: str) -> str:
    """The first row of `src` as its own corpus (the job needs >= 1 good clip to finish)."""
    d = Path(dst)
    if not (d / "metadata.csv").exists():
        (d / "wavs").mkdir(parents=True, exist_ok=True)
        first = (Path(src) / "metadata.csv").read_text(encoding="utf-8").splitlines()[0]
        cid = first.split("|")[0]
        (d / "wavs" / f"{cid}.wav").write_bytes((Path(src) / "wavs" / f"{cid}.wav").read_bytes())
        (d / "metadata.csv").write_text(first + "\n", encoding="utf-8")
    return str(d)


def load() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=1000, help="corpus size: the first N clips of the big corpus")
    ap.add_argument("--corpus", help="an LJSpeech-layout corpus of --clips rows (default: generated under --work-dir)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--work-dir", default=WORK)
    args = ap.parse_args(argv)

    os.makedirs(args.work_dir, exist_ok=True)
    corpus = ensure_corpus(args.corpus or os.path.join(args.work_dir, f"lj{args.clips}"), args.clips)
    tiny = one_clip_corpus(corpus, os.path.join(args.work_dir, "lj1"))
    workers = [int(w) for w in args.workers.split(",") if w]
    variants = [v for w in workers for v in (f"pool{w}", f"poolm{w}", f"job{w}", f"job{w}@1")]

    def command(v: str) -> list[str]:
        w = re.match(r"[a-z]+(\d+)", v).group(1)  # pool4, poolm4, job4, job4@1 -> 4
        out = os.path.join(args.work_dir, f"tp-out-{v.replace('@', '_at')}")
        if v.startswith("pool"):
            return [
                sys.executable,
                "-m",
                "benchmarks.preprocess.pool_baseline",
                "--corpus",
                corpus,
                "--out",
                out,
                "--workers",
                w,
            ] + (["--job-mel"] if v.startswith("poolm") else [])
        return preprocess_command(tiny if v.endswith("@1") else corpus, Path(out), "--workers", w)

    runs = {v: [] for v in variants}
    for rnd in range(args.rounds):
        for v in variants:
            before = load()
            r = run_sampled(command(v), log_path=os.path.join(args.work_dir, f"tp-{v.replace('@', '_at')}.log"))
            if r["rc"] != 0:
                raise RuntimeError(f"{v} failed ({r['rc']}), see {args.work_dir}/tp-{v}.log")
            runs[v].append({"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "rss": r["peak_rss_bytes"], "load": before})
        print(
            f"round {rnd + 1}/{args.rounds}: "
            + ", ".join(f"{v} {runs[v][-1]['wall_s']:.1f}s (load {runs[v][-1]['load']:.1f})" for v in variants),
            flush=True,
        )

    med = statistics.median
    goal = 1.1 if args.clips >= LJSPEECH_CLIPS else 2.0
    result = {
        "benchmark": "preprocess_throughput",
        "clips": args.clips,
        "rounds": args.rounds,
        "wall_s_median": {v: round(med(x["wall_s"] for x in rs), 1) for v, rs in runs.items()},
        "cpu_s_median": {v: round(med(x["cpu_s"] for x in rs), 1) for v, rs in runs.items()},
        "peak_rss_gib_median": {v: round(med(x["rss"] for x in rs) / 2**30, 2) for v, rs in runs.items()},
        "load_range": [
            min(x["load"] for rs in runs.values() for x in rs),
            max(x["load"] for rs in runs.values() for x in rs),
        ],
        "job_over_pool_median": {
            f"{w}{m}": round(med(j["wall_s"] / p["wall_s"] for j, p in zip(runs[f"job{w}"], runs[f"pool{m}{w}"])), 2)
            for w in workers
            for m in ("", "m")
        },
        "per_round": runs,
        "goals": {"job1@1_wall_s": 4.0, "job2@1_wall_s": 6.0, "job_over_pool": goal, "peak_rss_gib": 3.0},
    }
    print(
        f"\n{args.clips} clips, {args.rounds} interleaved rounds, medians; load average "
        f"{result['load_range'][0]:.1f}-{result['load_range'][1]:.1f} on {os.cpu_count()} cores"
    )
    print(f"{'variant':<10} {'wall s':>8} {'CPU s':>8} {'peak RSS GiB':>12}")
    for v in variants:
        print(
            f"{v:<10} {result['wall_s_median'][v]:>8.1f} {result['cpu_s_median'][v]:>8.1f} "
            f"{result['peak_rss_gib_median'][v]:>12.2f}"
        )
    for w in workers:
        for m in ("", "m"):
            print(f"job{w} / pool{m}{w} wall: {result['job_over_pool_median'][f'{w}{m}']:.2f}x (goal <= {goal}x)")
    emit(result)
    return result


if __name__ == "__main__":
    main()
