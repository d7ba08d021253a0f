"""Preprocessing at LJSpeech scale: wall time, clips/s and peak RSS of the local Beam job.

Runs `python -m melshards preprocess` (the real CLI, FnApiRunner) on an LJSpeech-sized generated corpus
(benchmarks.make_big_corpus: 13,100 clips, ~24 h, 22050 Hz 16-bit WAV; generated if missing) and
samples the job's whole process tree from /proc every 0.2 s (multi_processing workers are child
processes, so RSS is the sum over the tree). Reports per worker setting:
  wall_s        process start to exit (interpreter start, imports, graph build, job, summary)
  job_s         the CLI's own timer: pipeline build + run (excludes interpreter start and imports)
  clips/s       input rows / wall_s and / job_s (a failed run reports wall time, memory and the error)
  peak RSS      summed over the process tree, max over samples; goal <= 3 GiB (PSS also shown:
                RSS counts pages shared by the processes once per process)
  cores busy    CPU seconds of the tree / wall seconds (2.0 = both cores)
and copies the run's stats.json counts and padding figures. The timeline of every run (t, RSS,
processes, cores busy) is written next to the output as timeline-<workers>w[-x<N>].json.

Stages: a watcher lists the run's staging dir every 0.5 s and names the stage the job is in from the
files it finds: start-up (no features file yet), measure (features files, no shard yet), write (shard
files, no schema.json), report+publish (schema.json written). Each timeline sample is given the
stage the watcher saw last, and each stage's seconds, RSS at its start, peak and end are printed.

`--times 1,10` runs the corpus and a corpus 10 times its size, side by side: the 10x corpus is
`<corpus>-x10`, built if missing by hard-linking each wav under 10 new ids
(`benchmarks.make_big_corpus --links-of`; the audio bytes, and so the page cache, stay those of the
1x corpus). It prints wall per clip at each size and the ratio to the first size.

Run: python -m benchmarks.preprocess.scale [--corpus /tmp/melshards-bench/ljbig] [--clips 13100]
         [--workers 2,1] [--times 1] [--work-dir /tmp/melshards-bench]
     python -m benchmarks.preprocess.scale --clips 13100 --workers 2 --times 1,10   (13,100 and 131,000 clips)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import emit
from benchmarks.proctree import run_sampled

GOAL_RSS = 3 * 2**30
WORK = "/tmp/melshards-bench"


def ensure_corpus(path: str, clips: int) -> str:
    meta = Path(path) / "metadata.csv"
    if meta.exists() and sum(1 for _ in meta.open(encoding="utf-8")) == clips:
        return path
    from benchmarks import make_big_corpus

    make_big_corpus.main(["--out", path, "--clips", str(clips)])
    return path


def ensure_times(corpus: str, times: int) -> str:
    """The corpus `times` times over by hard links (`<corpus>-x<times>`); the corpus itself for 1."""
    if times == 1:
        return corpus
    from benchmarks import make_big_corpus

    out = f"{corpus.rstrip('/')}-x{times}"
    make_big_corpus.link_corpus(corpus, out, times)
    return out


STAGES = ("start-up", "measure", "write", "report+publish")


def stage_of(out: Path, before: str) -> str:
    """The job's stage, from the files in its staging dir (see the module docstring); `before` is the
    stage seen last (an output a previous run published holds a schema.json of its own)."""
    stages = [d for d in out.glob(".melshards-run-*") if d.is_dir()]
    if not stages:  # not made yet, or published (renamed into place)
        return STAGES[3] if before in STAGES[1:] else before
    stage = stages[0]
    if (stage / "schema.json").exists():
        return STAGES[3]
    features = shards = 0
    try:
        with os.scandir(stage / ".melshards-tmp") as it:
            for e in it:
                features += e.name.startswith("features-")
                shards += e.name.endswith(".tfrecord")
    except OSError:
        pass
    if shards or any(stage.glob("*.tfrecord")):
        return STAGES[2]
    return STAGES[1] if features else STAGES[0]


class StageWatcher(threading.Thread):
    """[(t, stage)] every `every` s while a run writes into `out`, t from this thread's start."""

    def __init__(self, out: str, every: float = 0.5):
        super().__init__(daemon=True)
        self.out, self.every, self.seen = Path(out), every, []
        self.done, self.t0 = threading.Event(), time.perf_counter()

    def run(self):
        stage = STAGES[0]
        while not self.done.is_set():
            stage = stage_of(self.out, stage)
            if not self.seen or self.seen[-1][1] != stage:
                self.seen.append((round(time.perf_counter() - self.t0, 2), stage))
            self.done.wait(self.every)


def rss_by_stage(timeline: list, seen: list) -> dict:
    """Each stage's seconds and RSS (GiB) at its start, its peak and its end, from the timeline."""
    out: dict[str, dict] = {}
    for t, rss, *_ in timeline:
        stage = STAGES[0]
        for ts, name in seen:
            if ts <= t:
                stage = name
        s = out.setdefault(stage, {"from_s": t, "to_s": t, "rss_start_gib": rss / 2**30, "rss_peak_gib": 0.0})
        s["to_s"], s["rss_end_gib"] = t, rss / 2**30
        s["rss_peak_gib"] = max(s["rss_peak_gib"], rss / 2**30)
    return {k: {n: round(v, 3) for n, v in s.items()} for k, s in out.items()}


def beam_flags(workers: int) -> list[str]:
    flags = ["--direct_num_workers", str(workers)]
    if workers > 1:
        flags += ["--direct_running_mode", "multi_processing"]
    return flags


def run_job(corpus: str, out: str, workers: int, log_path: str, config: str | None = None) -> dict:
    """One preprocessing run under the /proc sampler and the stage watcher, plus the job's own timer
    and stats.json."""
    cmd = [sys.executable, "-m", "melshards", "preprocess", "--input", corpus, "--output", out, "--overwrite"]
    if config:
        cmd += ["--config", config]
    watcher = StageWatcher(out)
    load_before = os.getloadavg()
    watcher.start()
    try:
        r = run_sampled(cmd + beam_flags(workers), log_path=log_path)
    finally:
        watcher.done.set()
        watcher.join()
    r["load_before"], r["load_after"] = [round(x, 2) for x in load_before], [round(x, 2) for x in os.getloadavg()]
    r["stages"] = rss_by_stage(r["timeline"], watcher.seen)
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
    ap.add_argument(
        "--times",
        default="1",
        help="comma-separated corpus multiples to run side by side "
        "(1,10: the corpus and 10x it by hard links, see the module docstring)",
    )
    ap.add_argument("--work-dir", default=WORK, help="shards and logs go to <work-dir>/scale-out-<N>w[-x<T>]")
    ap.add_argument("--keep-shards", action="store_true", help="keep the shards (default: delete, keep stats.json)")
    args = ap.parse_args(argv)

    base = ensure_corpus(args.corpus, args.clips)
    times = [int(x) for x in args.times.split(",") if x]
    corpora = {k: ensure_times(base, k) for k in times}
    workers = [int(x) for x in args.workers.split(",") if x]
    runs = {}
    for k, w in [(k, w) for k in times for w in workers]:
        corpus = corpora[k]
        tag = f"{w}w" + (f"-x{k}" if k != 1 else "")
        out = os.path.join(args.work_dir, f"scale-out-{tag}")
        print(f"running {w} worker(s) on {corpus} -> {out}", flush=True)
        r = run_job(corpus, out, w, os.path.join(args.work_dir, f"scale-{tag}.log"))
        with open(os.path.join(args.work_dir, f"timeline-{tag}.json"), "w") as f:
            json.dump({"timeline": r.pop("timeline"), "stages": r["stages"]}, f)
        stats = r.pop("stats")
        shard_sizes = sorted(p.stat().st_size for p in Path(out).glob("*.tfrecord"))
        shard_bytes = sum(shard_sizes)
        if not args.keep_shards:
            for p in Path(out).glob("*.tfrecord"):
                p.unlink()
        if stats is None:
            print(f"  FAILED: {r['error']} (log: {args.work_dir}/scale-{tag}.log)", flush=True)
            stats = {
                "counts": {"in_shards": None},
                "padding": {
                    n: None for n in ("mel_padding_fraction", "text_padding_fraction", "max_mel_frames", "max_text_len")
                },
            }
        c, pad = stats["counts"], stats["padding"]
        rows_in = r["input_rows"] or args.clips * k
        runs[tag] = {
            "workers": w,
            "times": k,
            "corpus": corpus,
            "error": r.get("error"),
            "input_rows": rows_in,
            "in_shards": c["in_shards"],
            "wall_s": round(r["wall_s"], 1),
            "job_s": r["job_s"],
            "wall_ms_per_clip": round(1000 * r["wall_s"] / rows_in, 3),
            # the wall after start-up (from the first features file on), per clip
            "after_startup_ms_per_clip": round(
                1000 * (r["wall_s"] - r["stages"].get("measure", {}).get("from_s", 0)) / rows_in, 3
            ),
            "load_before": r["load_before"],
            "load_after": r["load_after"],
            "stages": r["stages"],
            "clips_per_s_wall": round(rows_in / r["wall_s"], 2),
            "clips_per_s_job": round(rows_in / r["job_s"], 2) if r["job_s"] else None,
            "peak_rss_gib": round(r["peak_rss_bytes"] / 2**30, 3),
            "peak_pss_gib": round(r["peak_pss_bytes"] / 2**30, 3),
            "peak_processes": r["peak_processes"],
            "cpu_s_per_process": r["cpu_s_per_process"],
            "cores_busy_mean": round(r["cores_busy_mean"], 2),
            "cpu_s": round(r["cpu_s"], 1),
            "shard_gib": round(shard_bytes / 2**30, 3),
            "shards": len(shard_sizes),
            "shard_mb_min_max": [round(shard_sizes[0] / 1e6, 1), round(shard_sizes[-1] / 1e6, 1)]
            if shard_sizes
            else None,
            "rss_goal_met": r["peak_rss_bytes"] <= GOAL_RSS,
            "mel_padding_fraction": pad["mel_padding_fraction"],
            "text_padding_fraction": pad["text_padding_fraction"],
            "padded_mel_frames": pad["max_mel_frames"],
            "padded_text_len": pad["max_text_len"],
            "stats_json": os.path.join(out, "stats.json"),
        }
    print(
        f"\n{'run':<8} {'rows':>6} {'shards':>6} {'wall s':>8} {'job s':>8} {'ms/clip':>8} {'ratio':>6} "
        f"{'after start-up':>14} {'ratio':>6} {'clips/s':>8} {'peak RSS GiB':>12} {'PSS GiB':>8} {'procs':>5} {'cores':>5}  load before/after"
    )
    for key, v in runs.items():
        first = next(u for u in runs.values() if u["workers"] == v["workers"])
        v["wall_per_clip_ratio"] = round(v["wall_ms_per_clip"] / first["wall_ms_per_clip"], 3)
        v["after_startup_ratio"] = round(v["after_startup_ms_per_clip"] / first["after_startup_ms_per_clip"], 3)
        print(
            f"{key:<8} {v['input_rows']:>6} {str(v['in_shards']):>6} {v['wall_s']:>8.1f} {str(v['job_s']):>8} "
            f"{v['wall_ms_per_clip']:>8.3f} {v['wall_per_clip_ratio']:>6.3f} "
            f"{v['after_startup_ms_per_clip']:>14.3f} {v['after_startup_ratio']:>6.3f} {v['clips_per_s_wall']:>8.2f} "
            f"{v['peak_rss_gib']:>12.3f} {v['peak_pss_gib']:>8.3f} {v['peak_processes']:>5} "
            f"{v['cores_busy_mean']:>5.2f}  {v['load_before'][0]:.2f}/{v['load_after'][0]:.2f}"
            + (f"  FAILED: {v['error']}" if v["error"] else "")
        )
    print(f"\n{'run':<8} {'stage':<15} {'from s':>8} {'to s':>8} {'RSS start':>10} {'peak':>7} {'end':>7} (GiB)")
    for key, v in runs.items():
        for name, st in v["stages"].items():
            print(
                f"{key:<8} {name:<15} {st['from_s']:>8.1f} {st['to_s']:>8.1f} {st['rss_start_gib']:>10.3f} "
                f"{st['rss_peak_gib']:>7.3f} {st.get('rss_end_gib', 0):>7.3f}"
            )
    result = {
        "benchmark": "preprocess_scale",
        "corpus": corpus,
        "clips": args.clips,
        "runs": runs,
        "goal_peak_rss_gib": GOAL_RSS / 2**30,
    }
    emit(result)
    return result


if __name__ == "__main__":
    main()
