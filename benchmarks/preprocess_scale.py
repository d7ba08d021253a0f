"""Preprocessing at LJSpeech scale: wall time, clips/s and peak RSS of the local Beam job.

Runs `python -m melshards preprocess` (the real CLI, FnApiRunner) on an LJSpeech-sized generated corpus
(benchmarks.make_big_corpus: 13,100 clips, ~24 h, 22050 Hz 16-bit WAV; generated if missing) and
samples the job's whole process tree from /proc every 0.2 s (multi_processing workers are child
processes, so RSS is the sum over the tree). Reports per worker setting:
  wall_s        process start to exit (interpreter start, imports, graph build, job, summary)
  job_s         the CLI's own timer: pipeline build + run (excludes interpreter start and imports)
  clips/s       input rows / wall_s and / job_s (a failed run reports wall time, memory and the error)
  peak RSS      summed over the process tree, max over samples; goal <= 4 GiB (PSS also shown:
                RSS counts pages shared by the processes once per process)
  cores busy    CPU seconds of the tree / wall seconds (2.0 = both cores)
and copies the run's stats.json counts and padding figures. The timeline of every run (t, RSS,
processes, cores busy) is written next to the output as timeline-<workers>w.json.

Run: python -m benchmarks.preprocess_scale [--corpus /tmp/melshards-bench/ljbig] [--clips 13100]
         [--workers 2,1] [--work-dir /tmp/melshards-bench]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from benchmarks.common import emit
from benchmarks.proctree import run_sampled

GOAL_RSS = 4 * 2 ** 30
WORK = "/tmp/melshards-bench"


def ensure_corpus(path: str, clips: int) -> str:
    meta = Path(path) / "metadata.csv"
    if meta.exists() and sum(1 for _ in meta.open(encoding="utf-8")) == clips:
        return path
    from benchmarks import make_big_corpus
    make_big_corpus.main(["--out", path, "--clips", str(clips)])
    return path


def beam_flags(workers: int) -> list[str]:
    flags = ["--direct_num_workers", str(workers)]
    if workers > 1:
        flags += ["--direct_running_mode", "multi_processing"]
    return flags


def run_job(corpus: str, out: str, workers: int, log_path: str, config: str | None = None) -> dict:
    """One preprocessing run under the /proc sampler, plus the job's own timer and stats.json."""
    cmd = [sys.executable, "-m", "melshards", "preprocess", "--input", corpus, "--output", out, "--overwrite"]
    if config:
        cmd += ["--config", config]
    r = run_sampled(cmd + beam_flags(workers), log_path=log_path)
    log = Path(log_path).read_text(errors="replace")
    if r["rc"] != 0:  # still report time and memory: a failed run is a finding, not a crash of the benchmark
        errors = re.findall(r"^(\w+(?:\.\w+)*(?:Error|Exception)): (.*)$", log, re.M)
        r["error"] = f"{errors[-1][0]}: {errors[-1][1]}" if errors else f"exit code {r['rc']}"
        r["input_rows"], r["job_s"], r["stats"] = None, None, None
        return r
    m = re.search(r"(\d+) input rows in ([\d.]+)s", log)
    r["input_rows"], r["job_s"] = (int(m.group(1)), float(m.group(2))) if m else (None, None)
    r["stats"] = json.loads((Path(out) / "stats.json").read_text())
    return r


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=f"{WORK}/ljbig")
    ap.add_argument("--clips", type=int, default=13100, help="corpus size (generated if the corpus is missing)")
    ap.add_argument("--workers", default="2,1", help="comma-separated --direct_num_workers settings, run in turn")
    ap.add_argument("--work-dir", default=WORK, help="shards and logs go to <work-dir>/scale-out-<N>w")
    ap.add_argument("--keep-shards", action="store_true", help="keep the shards (default: delete, keep stats.json)")
    args = ap.parse_args(argv)

    corpus = ensure_corpus(args.corpus, args.clips)
    runs = {}
    for w in [int(x) for x in args.workers.split(",") if x]:
        out = os.path.join(args.work_dir, f"scale-out-{w}w")
        print(f"running {w} worker(s) on {corpus} -> {out}", flush=True)
        r = run_job(corpus, out, w, os.path.join(args.work_dir, f"scale-{w}w.log"))
        with open(os.path.join(args.work_dir, f"timeline-{w}w.json"), "w") as f:
            json.dump(r.pop("timeline"), f)
        stats = r.pop("stats")
        shard_sizes = sorted(p.stat().st_size for p in Path(out).glob("*.tfrecord"))
        shard_bytes = sum(shard_sizes)
        if not args.keep_shards:
            for p in Path(out).glob("*.tfrecord"):
                p.unlink()
        if stats is None:
            print(f"  FAILED: {r['error']} (log: {args.work_dir}/scale-{w}w.log)", flush=True)
            stats = {"counts": {"in_shards": None}, "padding": {k: None for k in (
                "mel_padding_fraction", "text_padding_fraction", "max_mel_frames", "max_text_len")}}
        c, pad = stats["counts"], stats["padding"]
        rows_in = r["input_rows"] or args.clips
        runs[f"{w}w"] = {
            "workers": w, "error": r.get("error"), "input_rows": rows_in, "in_shards": c["in_shards"],
            "wall_s": round(r["wall_s"], 1), "job_s": r["job_s"],
            "clips_per_s_wall": round(rows_in / r["wall_s"], 2),
            "clips_per_s_job": round(rows_in / r["job_s"], 2) if r["job_s"] else None,
            "peak_rss_gib": round(r["peak_rss_bytes"] / 2 ** 30, 3),
            "peak_pss_gib": round(r["peak_pss_bytes"] / 2 ** 30, 3), "peak_processes": r["peak_processes"],
            "cpu_s_per_process": r["cpu_s_per_process"],
            "cores_busy_mean": round(r["cores_busy_mean"], 2), "cpu_s": round(r["cpu_s"], 1),
            "shard_gib": round(shard_bytes / 2 ** 30, 3), "shards": len(shard_sizes),
            "shard_mb_min_max": [round(shard_sizes[0] / 1e6, 1), round(shard_sizes[-1] / 1e6, 1)] if shard_sizes else None,
            "rss_goal_met": r["peak_rss_bytes"] <= GOAL_RSS,
            "mel_padding_fraction": pad["mel_padding_fraction"], "text_padding_fraction": pad["text_padding_fraction"],
            "padded_mel_frames": pad["max_mel_frames"], "padded_text_len": pad["max_text_len"],
            "stats_json": os.path.join(out, "stats.json"),
        }
    print(f"\n{'run':<4} {'rows':>6} {'shards':>6} {'wall s':>8} {'job s':>8} {'clips/s':>8} {'(job)':>7} "
          f"{'peak RSS GiB':>12} {'PSS GiB':>8} {'procs':>5} {'cores':>5}")
    for k, v in runs.items():
        print(f"{k:<4} {v['input_rows']:>6} {str(v['in_shards']):>6} {v['wall_s']:>8.1f} {str(v['job_s']):>8} "
              f"{v['clips_per_s_wall']:>8.2f} {str(v['clips_per_s_job']):>7} {v['peak_rss_gib']:>12.3f} "
              f"{v['peak_pss_gib']:>8.3f} "
              f"{v['peak_processes']:>5} {v['cores_busy_mean']:>5.2f}"
              + (f"  FAILED: {v['error']}" if v["error"] else ""))
    result = {"benchmark": "preprocess_scale", "corpus": corpus, "clips": args.clips, "runs": runs,
              "goal_peak_rss_gib": 4.0}
    emit(result)
    return result


if __name__ == "__main__":
    main()
