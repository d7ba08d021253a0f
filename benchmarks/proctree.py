"""Run a command and sample its whole process tree with psutil: RSS and CPU over time.

Beam's multi_processing workers are child processes, so the figures are sums over the tree:
  peak_rss_bytes   max over samples of the summed RSS of the root and all its descendants
  cpu_seconds      user+sys of every process seen (last sample per pid; children dying between
                   two samples lose at most one interval)
  cores_busy_mean  cpu_seconds / wall seconds (2.0 = both cores of this machine saturated)
  peak_pss_bytes   the same with PSS (read every 5th sample as it costs more; Linux only):
                   pages shared between processes split between them instead of counted in each
  timeline         [t, rss_bytes, processes, cores_busy over the last interval, pss_bytes], every `interval` s

Used by benchmarks.preprocess.throughput and benchmarks.preprocess.scale.
"""

from __future__ import annotations

import subprocess
import threading
import time

import psutil


def tree(root: int) -> list[psutil.Process]:
    """The root process and all its descendants that are still alive."""
    try:
        proc = psutil.Process(root)
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def pss(proc: psutil.Process) -> int:
    """Proportional set size (shared pages split between the processes sharing them), 0 if unreadable."""
    try:
        return int(getattr(proc.memory_full_info(), "pss", 0))
    except (psutil.Error, OSError):
        return 0


class TreeSampler:
    def __init__(self, root: int, interval: float = 0.2, pss_every: int = 5):
        self.root, self.interval, self.pss_every = root, interval, pss_every
        self.peak_rss = self.peak_pss = self.peak_procs = 0
        self.cmdlines: dict[int, str] = {}
        self.cpu: dict[int, float] = {}
        self.timeline: list[list[float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.perf_counter()

    def _sample(self) -> None:
        rss = pss_sum = n = 0
        self._k = getattr(self, "_k", -1) + 1
        with_pss = self._k % self.pss_every == 0
        for proc in tree(self.root):
            try:
                with proc.oneshot():
                    proc_rss, times = proc.memory_info().rss, proc.cpu_times()
                    if proc.pid not in self.cmdlines:
                        self.cmdlines[proc.pid] = " ".join(proc.cmdline())[:200]
            except psutil.Error:
                continue
            rss += proc_rss
            pss_sum += pss(proc) if with_pss else 0
            n += 1
            self.cpu[proc.pid] = times.user + times.system
        self.peak_rss, self.peak_procs = max(self.peak_rss, rss), max(self.peak_procs, n)
        if with_pss:
            self.peak_pss = max(self.peak_pss, pss_sum)
        t, total = time.perf_counter() - self.t0, sum(self.cpu.values())
        if self.timeline:
            pt, _, _, _, pcpu, _ = self.timeline[-1]
            busy = (total - pcpu) / max(t - pt, 1e-9)
        else:
            busy = 0.0
        self.timeline.append([round(t, 2), rss, n, round(busy, 2), total, pss_sum if with_pss else None])

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def start(self) -> TreeSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_sampled(cmd: list[str], interval: float = 0.2, log_path: str | None = None, env=None) -> dict:
    """Run cmd to completion under a TreeSampler; returns wall time, exit code and the tree figures."""
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL
    try:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        sampler = TreeSampler(proc.pid, interval).start()
        rc = proc.wait()
        wall = time.perf_counter() - t
        sampler.stop()
    finally:
        if log_path:
            out.close()
    cpu = sum(sampler.cpu.values())
    return {
        "rc": rc,
        "wall_s": wall,
        "peak_rss_bytes": sampler.peak_rss,
        "peak_pss_bytes": sampler.peak_pss,
        "peak_processes": sampler.peak_procs,
        "cpu_s": cpu,
        "cores_busy_mean": cpu / wall if wall else 0.0,
        "cpu_s_per_process": {
            f"{pid} {cmd}": round(sampler.cpu.get(pid, 0.0), 1) for pid, cmd in sampler.cmdlines.items()
        },
        "timeline": [row[:4] + row[5:] for row in sampler.timeline],
    }
