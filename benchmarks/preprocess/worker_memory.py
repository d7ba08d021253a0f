"""Each Beam worker's own peak memory as the corpus grows: `melshards preprocess --workers 2` on a manifest of
N very short distinct clips, N = 20,000 and 200,000 by default.

The corpus: N distinct WAVs of `--seconds` (0.3 s) of a tone in noise, each with its own frequency, level and
noise (so every quality measure and the audio hash differ from clip to clip), and a transcript of 2-9 letters
(so the speaking rate differs too, 7-30 symbols/s), dealt round-robin to `--speakers` speakers (50) of one language. A run of
fewer rows reads the first rows of the corpus's manifest (a corpus made for more rows is reused). The config keeps the default quality
measures, the speaking-rate rule and the duplicates rule; the absolute quality rules are off (a tone in noise
trips them) and `filter.min_duration_s` is 0.1 s.

While the job runs, every 0.2 s, each process below it is listed, and for Beam's worker processes
(`apache_beam.runners.worker.sdk_worker_main`) and for the launcher (the `melshards` process) the kernel's
high-water mark of its resident memory (`VmHWM` in /proc/<pid>/status) is read. VmHWM only grows, so the last
reading before a process exits is its peak up to then (a worker's last 0.2 s are not seen: the job is over by
then). Reported per size: the largest worker's peak, every worker's, the launcher's (the `melshards` command;
the job itself runs in a child of it, whose memory is the runner's, not a worker's), wall and CPU seconds of
the process tree, the largest worker RSS seen in each stage of the job (`scale.stage_of`: the
files in the run's staging dir), and at the end the ratio of each size's largest worker peak to the first
size's.

Run: python -m benchmarks.preprocess.worker_memory [--rows 20000,200000] [--speakers 50] [--seconds 0.3] [--workers 2]
         [--work-dir /tmp/melshards-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common import emit
from benchmarks.preprocess.scale import STAGES, stage_of

WORK = os.environ.get("MELSHARDS_BENCH_DIR", "/tmp/melshards-bench")
SR = 22050
LETTERS = list("abcdefghijklmnopqrstuvwxyz")
FILES_PER_DIR = 1000
WORKER_MODULE = b"apache_beam.runners.worker.sdk_worker_main"
CONFIG = {
    "filter": {"min_duration_s": 0.1},
    "quality_rules": {  # the rate rule and the duplicates rule on; the absolute rules off (a tone in noise trips them)
        "max_clipped_fraction": None,
        "min_bandwidth_share": None,
        "min_snr_db": None,
        "max_pause_s": None,
        "max_cer": None,
    },
}


def clip(i: int, seconds: float) -> np.ndarray:
    """Clip i: a tone in noise, its frequency, level and noise drawn from i (int16 samples)."""
    rng = np.random.default_rng(i)
    t = np.arange(int(seconds * SR)) / SR
    y = rng.uniform(0.05, 0.5) * np.sin(2 * np.pi * rng.uniform(100, 400) * t)
    y += rng.uniform(0.001, 0.05) * rng.standard_normal(t.size)
    return (np.clip(y, -1, 1) * 32767).astype(np.int16)


def make_corpus(root: Path, rows: int, speakers: int, seconds: float) -> Path:
    """`root`/manifest.jsonl of `rows` distinct clips or more (made once; kept while its speakers and seconds
    are the same and it has rows enough)."""
    import soundfile as sf

    stamp = root / "made.json"
    want = {"rows": rows, "speakers": speakers, "seconds": seconds}
    made = json.loads(stamp.read_text()) if stamp.exists() else {}
    if made.get("rows", 0) >= rows and dict(made, rows=rows) == want:  # the first rows of a larger one
        return root / "manifest.jsonl"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    with (root / "manifest.jsonl").open("w", encoding="utf-8") as out:
        for i in range(rows):
            path = root / "wavs" / f"{i // FILES_PER_DIR:04d}" / f"c{i:07d}.wav"
            if i % FILES_PER_DIR == 0:
                path.parent.mkdir(parents=True)
            sf.write(path, clip(i, seconds), SR, subtype="PCM_16")
            text = "".join(np.random.default_rng((i, 1)).choice(LETTERS, size=2 + i % 8))
            row = {"id": f"c{i:07d}", "audio": str(path), "text": text}
            out.write(json.dumps(dict(row, speaker=f"s{i % speakers:03d}", language="en")) + "\n")
    stamp.write_text(json.dumps(want))
    return root / "manifest.jsonl"


def first_rows(manifest: Path, rows: int, dest: Path) -> Path:
    """The first `rows` lines of `manifest`, as `dest`."""
    with manifest.open(encoding="utf-8") as f, dest.open("w", encoding="utf-8") as out:
        for _, line in zip(range(rows), f):
            out.write(line)
    return dest


def _status_kib(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _is_worker(cmdline: bytes) -> bool:
    """A Beam worker process (Python running sdk_worker_main), not the shell that starts it."""
    argv = cmdline.split(b"\0")
    return WORKER_MODULE in argv and os.path.basename(argv[0]).startswith(b"python")


class PeakWatcher:
    """Reads VmHWM of the root process and of every Beam worker process below it, every `interval` s; and
    each worker's VmRSS with the job's stage then (`scale.stage_of` on the output's staging dir)."""

    def __init__(self, root: int, out: Path, interval: float = 0.2):
        import psutil

        self.psutil, self.root, self.out, self.interval = psutil, root, out, interval
        self.workers: dict[int, int] = {}  # pid -> VmHWM KiB, last read
        self.launcher = 0
        self.cpu: dict[int, float] = {}
        self.stage = STAGES[0]
        self.peak_in: dict[str, dict[int, int]] = {}  # stage -> pid -> largest VmRSS KiB seen in it
        self.t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        try:
            procs = [self.psutil.Process(self.root)]
            procs += procs[0].children(recursive=True)
        except self.psutil.NoSuchProcess:
            return
        self.stage = stage_of(self.out, self.stage)
        for p in procs:
            hwm = _status_kib(p.pid, "VmHWM")
            try:
                t = p.cpu_times()
                self.cpu[p.pid] = t.user + t.system
            except self.psutil.Error:
                pass
            if hwm is None:
                continue
            if p.pid == self.root:
                self.launcher = max(self.launcher, hwm)
            elif _is_worker(_cmdline(p.pid)):
                self.workers[p.pid] = max(self.workers.get(p.pid, 0), hwm)
                rss = _status_kib(p.pid, "VmRSS") or 0
                seen = self.peak_in.setdefault(self.stage, {})
                seen[p.pid] = max(seen.get(p.pid, 0), rss)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_once(manifest: Path, out: Path, config: Path, workers: int, log: Path) -> dict:
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "melshards", "preprocess", "--input", str(manifest), "--output", str(out)]
    cmd += ["--config", str(config), "--workers", str(workers)]
    with log.open("wb") as f:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        with PeakWatcher(p.pid, out) as w:
            rc = p.wait()
        wall = time.perf_counter() - t
    if rc:
        raise SystemExit(f"{' '.join(cmd)} failed (rc {rc}); see {log}")
    stats = json.loads((out / "stats.json").read_text())
    mib = 1 / 1024
    return {
        "rows": stats["counts"]["input_rows"],
        "in_shards": stats["counts"]["in_shards"],
        "worker_peak_mib": round(max(w.workers.values()) * mib, 1),
        "worker_peaks_mib": sorted(round(v * mib, 1) for v in w.workers.values()),
        "launcher_peak_mib": round(w.launcher * mib, 1),
        "worker_rss_peak_by_stage_mib": {
            stage: round(max(w.peak_in[stage].values()) * mib, 1) for stage in STAGES if stage in w.peak_in
        },
        "wall_s": round(wall, 1),
        "cpu_s": round(sum(w.cpu.values()), 1),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="20000,200000", help="corpus sizes, comma-separated")
    ap.add_argument("--speakers", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=0.3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work-dir", default=WORK)
    args = ap.parse_args(argv)
    import yaml

    sizes = [int(x) for x in args.rows.split(",")]
    work = Path(args.work_dir) / "worker-memory"
    work.mkdir(parents=True, exist_ok=True)
    full = make_corpus(work / "corpus", max(sizes), args.speakers, args.seconds)
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    results = []
    for n in sizes:
        manifest = first_rows(full, n, work / f"manifest-{n}.jsonl")
        r = run_once(manifest, work / f"out-{n}", config, args.workers, work / f"log-{n}.txt")
        results.append(r)
        print(
            f"{n:>9,} rows: largest worker peak {r['worker_peak_mib']:8.1f} MiB (workers {r['worker_peaks_mib']}), "
            f"launcher {r['launcher_peak_mib']:8.1f} MiB, wall {r['wall_s']} s, CPU {r['cpu_s']} s; "
            f"largest worker RSS by stage {r['worker_rss_peak_by_stage_mib']}",
            flush=True,
        )
    base = results[0]["worker_peak_mib"]
    for r in results:
        r["worker_peak_ratio"] = round(r["worker_peak_mib"] / base, 3)
        print(f"{r['rows']:>9,} rows: largest worker peak / the first size's = {r['worker_peak_ratio']}")
    result = {"benchmark": "worker_memory", "speakers": args.speakers, "seconds": args.seconds, "sizes": results}
    emit(result)
    return result


if __name__ == "__main__":
    main()
