"""Wall and CPU seconds per audio hour of the same `melshards preprocess` job on the same corpus read from local
files and from gs:// on a GCS emulator, side by side, per corpus kind; the basis of docs/performance.md's
Dataflow estimate.

The corpus: `--clips` LJSpeech-like clips of real speech (`make_big_corpus`: 1-4 of the demo corpus's clips
joined, 1-10 s, 22050 Hz mono 16-bit WAV, one speaker), written in three kinds that hold the same clips:

- `wav`: the LJSpeech layout (metadata.csv and wavs/), one file a clip;
- `tars`: WebDataset, `KEY.wav` and `KEY.json` (Emilia's id, text, speaker, language) per sample, `--per-tar` samples a tar
  (more than 16 MiB each at the default: past Beam's 16 MiB read buffer on gs://);
- `parquet`: a Hugging Face-style export (audio {bytes, path}, id, text, speaker_id, language) in one file,
  row groups of 100 rows (as `datasets` writes audio).

Each kind is uploaded once to the emulator (tests/gcs_emulator.py: fake-gcs-server behind a counting
proxy), then run as `python -m melshards preprocess --input INPUT --output OUTPUT --workers N --no_auth`
with no `--config` (the default config: the default quality measures and rules on), locally
(`--output` a local directory) and on gs:// (`--output gs://...`), alternating, `--rounds` times. Each round
also runs the first `--fixed-clips` clips of each kind on both sides: the job's fixed cost (start-up, its
workers' imports, the statistics and report stages over few rows), which `marginal_per_hour` takes out of
the round's run on the same side, leaving what each further audio hour costs, the figure a 1,000-hour job
scales with.

Measured per run:

- wall: from the command's start to its exit (imports included);
- CPU: user + system seconds of the command and every process below it (the job's process and Beam's
  worker processes), from `resource.getrusage(RUSAGE_CHILDREN)` around the run: the kernel's sum over
  every descendant that was waited for; a descendant never waited for would be missed, so the psutil
  sample of the same tree (`worker_memory.PeakWatcher`, every 0.2 s, a process's last 0.2 s unseen) is
  printed beside it as a check;
- the workers' own peak RSS (VmHWM of each `sdk_worker_main` process, `worker_memory.PeakWatcher`);
- the emulator's CPU, apart from the job's: fake-gcs-server's process and this script's own process (the
  proxy's threads; also the sampling thread, whose cost alone is what the local side shows);
- the machine's load average at the run's start.

After each pair of runs the gs:// run's shards are downloaded and compared with the local run's: the script
stops unless each shard file holds the same records (in any order) and stats.json's counts are the same,
and prints whether the files are byte for byte the same too.

Printed per kind: audio hours, then per side the medians over rounds of wall and CPU seconds (whole run;
the fixed-cost run's), wall and CPU per audio hour (whole run, and marginal), the marginal CPU as
vCPU-hours per 1,000 audio hours, the workers' peak, the emulator's CPU, the load; then the gs:// ÷ local
ratios of the per-round figures (median).

Run: python -m benchmarks.remote.wall [--clips 400] [--fixed-clips 8] [--rounds 1] [--workers 2]
         [--kinds wav,tars,parquet] [--per-tar 80] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from benchmarks.common import emit
from benchmarks.preprocess.worker_memory import WORK, PeakWatcher

REPO = Path(__file__).resolve().parents[1]
KINDS = ("wav", "tars", "parquet")
PARQUET_GROUP_ROWS = 100
BUCKET = "bench"


def marginal_per_hour(value: float, hours: float, fixed_value: float, fixed_hours: float) -> float:
    """What each further audio hour costs: the run's `value` (seconds) less the fixed-cost run's, over the audio
    hours between them."""
    if hours <= fixed_hours:
        raise ValueError(f"the run's {hours} h must be more than the fixed-cost run's {fixed_hours} h")
    return (value - fixed_value) / (hours - fixed_hours)


def vcpu_hours_per_1000_hours(cpu_s_per_hour: float) -> float:
    """vCPU-hours to preprocess 1,000 audio hours at `cpu_s_per_hour` CPU seconds an audio hour (one CPU
    second taken as one vCPU second)."""
    return cpu_s_per_hour * 1000 / 3600


def clips(n: int, seed: int = 1) -> list[tuple[str, str, bytes, float]]:
    """(id, text, 16-bit WAV bytes, seconds) of the first `n` clips of `make_big_corpus`'s corpus."""
    import soundfile as sf

    from benchmarks import make_big_corpus as big

    src = big.good_clips()
    durs = [len(y) / big.SR for _, _, y in src]
    out = []
    for i in range(n):
        text, y = big.joined_clip(big.plan_clip(i, seed, durs), src)
        buf = io.BytesIO()
        sf.write(buf, y, big.SR, format="WAV", subtype="PCM_16")
        out.append((f"LJB{i // 1000:03d}-{i % 1000:04d}", text, buf.getvalue(), len(y) / big.SR))
    return out


def _sample_json(cid: str, text: str) -> bytes:
    return json.dumps({"id": cid, "text": text, "speaker": "LJ", "language": "en"}).encode()


def write_kind(kind: str, root: Path, rows: list[tuple[str, str, bytes, float]], per_tar: int) -> str:
    """The corpus of `rows` as `kind` under `root`; what `--input` names, relative to `root` ("" for `root`)."""
    root.mkdir(parents=True)
    if kind == "wav":
        (root / "wavs").mkdir()
        for cid, _, data, _ in rows:
            (root / "wavs" / f"{cid}.wav").write_bytes(data)
        (root / "metadata.csv").write_text("".join(f"{cid}|{text}|{text}\n" for cid, text, _, _ in rows))
        return ""
    if kind == "tars":
        for k in range(0, len(rows), per_tar):
            with tarfile.open(root / f"{k // per_tar:06d}.tar", "w") as tar:
                for cid, text, data, _ in rows[k : k + per_tar]:
                    for name, member in ((f"{cid}.wav", data), (f"{cid}.json", _sample_json(cid, text))):
                        info = tarfile.TarInfo(name)
                        info.size = len(member)
                        tar.addfile(info, io.BytesIO(member))
        return ""
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        audio = [{"bytes": data, "path": f"{cid}.wav"} for cid, _, data, _ in rows]
        table = pa.table(
            {
                "audio": pa.array(audio, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                "id": [cid for cid, _, _, _ in rows],
                "text": [text for _, text, _, _ in rows],
                "speaker_id": ["LJ"] * len(rows),
                "language": ["en"] * len(rows),
            }
        )
        pq.write_table(table, root / "train.parquet", row_group_size=PARQUET_GROUP_ROWS)
        return "train.parquet"
    raise SystemExit(f"unknown kind {kind}; choose from {', '.join(KINDS)}")


def corpora(work: Path, kinds: list[str], sizes: dict[str, int], per_tar: int) -> dict[str, tuple[Path, str, float]]:
    """{f"{kind}-{size name}": (root, input relative to it, audio hours)}, written once under `work` (kept while
    its clips and tar size are the same)."""
    stamp, want = work / "corpora.json", {"sizes": sizes, "per_tar": per_tar, "kinds": sorted(kinds)}
    made = json.loads(stamp.read_text()) if stamp.exists() else {}
    if made.get("want") != want:
        stamp.unlink(missing_ok=True)
        shutil.rmtree(work / "corpus", ignore_errors=True)
        rows = clips(max(sizes.values()))
        made = {"want": want, "corpora": {}}
        for size_name, n in sizes.items():
            for kind in kinds:
                name = f"{kind}-{size_name}"
                rel = write_kind(kind, work / "corpus" / name, rows[:n], per_tar)
                made["corpora"][name] = [rel, sum(seconds for *_, seconds in rows[:n]) / 3600]
        stamp.write_text(json.dumps(made))
    return {name: (work / "corpus" / name, rel, hours) for name, (rel, hours) in made["corpora"].items()}


def tfrecords(data: bytes) -> list[bytes]:
    """The records of a TFRecord file's bytes (each framed as a length, its CRC, the record, its CRC)."""
    out, at = [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        out.append(data[at + 12 : at + 12 + length])
        at += 12 + length + 4
    return out


def shard_contents(out: Path) -> tuple[dict[str, str], dict[str, list[str]]]:
    """A run's shard files: {name: SHA-256 of its bytes}, and {name: the SHA-256 of each record, sorted}."""
    files, records = {}, {}
    for p in sorted(out.glob("*.tfrecord")):
        data = p.read_bytes()
        files[p.name] = hashlib.sha256(data).hexdigest()
        records[p.name] = sorted(hashlib.sha256(r).hexdigest() for r in tfrecords(data))
    return files, records


def run_once(cmd: list[str], env: dict, stage_dir: Path, server_pid: int) -> dict:
    """One preprocess command: wall, the tree's CPU (rusage; psutil's sample), the workers' peaks, the
    emulator's CPU, the load average at the start. Exits on failure."""
    import psutil

    server = psutil.Process(server_pid)
    load = os.getloadavg()[0]
    children, own, served = (
        resource.getrusage(resource.RUSAGE_CHILDREN),
        resource.getrusage(resource.RUSAGE_SELF),
        server.cpu_times(),
    )
    t = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with PeakWatcher(p.pid, stage_dir) as watcher:
        log, _ = p.communicate()
    wall = time.perf_counter() - t
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed (rc {p.returncode}):\n{log.decode(errors='replace')[-3000:]}")
    children_after, own_after, served_after = (
        resource.getrusage(resource.RUSAGE_CHILDREN),
        resource.getrusage(resource.RUSAGE_SELF),
        server.cpu_times(),
    )

    def cpu(before, after) -> float:
        return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime

    return {
        "wall_s": wall,
        "cpu_s": cpu(children, children_after),
        "cpu_s_sampled": sum(watcher.cpu.values()),
        "worker_peak_mib": max(watcher.workers.values(), default=0) / 1024,
        "server_cpu_s": served_after.user + served_after.system - served.user - served.system,
        "this_process_cpu_s": cpu(own, own_after),
        "load_1min": load,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clips", type=int, default=400, help="clips per corpus kind (6.6 s on average)")
    ap.add_argument("--fixed-clips", type=int, default=8, help="clips of the fixed-cost run")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the two sides, alternating which goes first")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--per-tar", type=int, default=80, help="samples a tar (about 290 KB each)")
    ap.add_argument("--work-dir", default=WORK)
    args = ap.parse_args(argv)
    if args.fixed_clips >= args.clips:
        raise SystemExit(f"--fixed-clips ({args.fixed_clips}) must be fewer than --clips ({args.clips})")
    sys.path.insert(0, str(REPO))
    from tests.gcs_emulator import download_tree, running_emulator, upload_tree

    kinds = [k for k in args.kinds.split(",") if k]
    work = Path(args.work_dir) / "remote-wall"
    sizes = {"run": args.clips, "fixed": args.fixed_clips}
    made = corpora(work, kinds, sizes, args.per_tar)
    runs: dict[str, dict[str, list[dict]]] = {name: {"local": [], "gs": []} for name in made}
    same: dict[str, list[dict]] = {name: [] for name in made}
    with running_emulator() as emulator:
        emulator.make_bucket(BUCKET)
        for name, (root, _, _) in made.items():
            upload_tree(emulator, root, f"gs://{BUCKET}/corpus/{name}")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        plan = [(r, f"{kind}-{size}") for r in range(args.rounds) for kind in kinds for size in ("run", "fixed")]
        for r, name in plan:
            root, rel, _ = made[name]
            local_out, gs_out = work / "out" / f"{name}-local", f"gs://{BUCKET}/out/{name}-{r}"
            shutil.rmtree(local_out, ignore_errors=True)
            sides = {
                "local": (str(root / rel) if rel else str(root), str(local_out)),
                "gs": (f"gs://{BUCKET}/corpus/{name}" + (f"/{rel}" if rel else ""), gs_out),
            }
            order = ("local", "gs") if r % 2 == 0 else ("gs", "local")
            for side in order:
                src, dest = sides[side]
                cmd = [sys.executable, "-m", "melshards", "preprocess", "--input", src, "--output", dest]
                cmd += ["--workers", str(args.workers), "--no_auth"]
                fig = run_once(cmd, env, local_out if side == "local" else work / "none", emulator.server_pid)
                runs[name][side].append(fig)
                print(f"round {r} {name:16s} {side:5s} " + _cells(fig), flush=True)
            remote = work / "out" / f"{name}-gs"
            shutil.rmtree(remote, ignore_errors=True)
            download_tree(emulator, gs_out, remote)
            records = {"records": sum(len(r) for r in shard_contents(local_out)[1].values())}
            records["byte_identical"] = _same_records(local_out, remote)
            same[name].append(records)
            print(f"round {r} {name:16s} the same records from both sides: {records}", flush=True)
    result = {
        "benchmark": "remote_wall",
        "clips": args.clips,
        "fixed_clips": args.fixed_clips,
        "workers": args.workers,
        "rounds": args.rounds,
        "kinds": {},
    }
    for kind in kinds:
        result["kinds"][kind] = summary = _summary(
            runs[f"{kind}-run"], runs[f"{kind}-fixed"], made[f"{kind}-run"][2], made[f"{kind}-fixed"][2]
        )
        summary["records"] = same[f"{kind}-run"]
        _print_summary(kind, summary)
    emit(result)
    return result


def _cells(fig: dict) -> str:
    return (
        f"wall {fig['wall_s']:6.1f} s, CPU {fig['cpu_s']:6.1f} s (sampled {fig['cpu_s_sampled']:6.1f}), "
        f"workers' peak {fig['worker_peak_mib']:6.1f} MiB, fake-gcs-server {fig['server_cpu_s']:5.1f} s, "
        f"this process {fig['this_process_cpu_s']:5.1f} s, load {fig['load_1min']:.1f}"
    )


def _same_records(local: Path, remote: Path) -> bool:
    """Whether the two runs' shard files are byte for byte the same; stop unless each file holds the same
    records (in any order) and stats.json's counts are the same."""
    (files_a, records_a), (files_b, records_b) = shard_contents(local), shard_contents(remote)
    if not records_a or records_a != records_b:
        raise SystemExit(f"the records of {remote} differ from {local}'s (per shard file)")
    counts = [json.loads((d / "stats.json").read_text())["counts"] for d in (local, remote)]
    if counts[0] != counts[1]:
        raise SystemExit(f"stats.json counts differ: local {counts[0]}, gs:// {counts[1]}")
    return files_a == files_b


def _summary(run: dict[str, list[dict]], fixed: dict[str, list[dict]], hours: float, fixed_hours: float) -> dict:
    """Per side: medians over rounds, per-hour figures (whole run, and marginal to the same round's fixed-cost
    run on the same side); gs:// ÷ local of each round's pair, median."""
    med = statistics.median

    def marginal(side: str, key: str) -> list[float]:
        return [marginal_per_hour(f[key], hours, b[key], fixed_hours) for f, b in zip(run[side], fixed[side])]

    out: dict = {"audio_hours": round(hours, 4), "fixed_audio_hours": round(fixed_hours, 4)}
    for side in ("local", "gs"):
        out[side] = {
            "wall_s": round(med(f["wall_s"] for f in run[side]), 1),
            "cpu_s": round(med(f["cpu_s"] for f in run[side]), 1),
            "cpu_s_sampled": round(med(f["cpu_s_sampled"] for f in run[side]), 1),
            "fixed_wall_s": round(med(f["wall_s"] for f in fixed[side]), 1),
            "fixed_cpu_s": round(med(f["cpu_s"] for f in fixed[side]), 1),
            "wall_s_per_hour": round(med(f["wall_s"] / hours for f in run[side]), 1),
            "cpu_s_per_hour": round(med(f["cpu_s"] / hours for f in run[side]), 1),
            "marginal_wall_s_per_hour": round(med(marginal(side, "wall_s")), 1),
            "marginal_cpu_s_per_hour": round(med(marginal(side, "cpu_s")), 1),
            "vcpu_hours_per_1000_hours": round(vcpu_hours_per_1000_hours(med(marginal(side, "cpu_s"))), 2),
            "worker_peak_mib": round(max(f["worker_peak_mib"] for f in run[side]), 1),
            "fake_gcs_server_cpu_s": round(med(f["server_cpu_s"] for f in run[side]), 1),
            "this_process_cpu_s": round(med(f["this_process_cpu_s"] for f in run[side]), 1),
            "load_1min": [round(f["load_1min"], 1) for f in run[side]],
        }
    out["gs_over_local"] = {
        key: round(med(g[key] / loc[key] for g, loc in zip(run["gs"], run["local"])), 3) for key in ("wall_s", "cpu_s")
    }
    out["gs_over_local"]["marginal_cpu_s"] = round(
        med(g / loc for g, loc in zip(marginal("gs", "cpu_s"), marginal("local", "cpu_s"))), 3
    )
    return out


def _print_summary(kind: str, s: dict) -> None:
    print(f"\n{kind}: {s['audio_hours']:.3f} audio h (fixed-cost run {s['fixed_audio_hours']:.4f} h)")
    for side in ("local", "gs"):
        f = s[side]
        print(
            f"  {side:5s} wall {f['wall_s']:6.1f} s, CPU {f['cpu_s']:6.1f} s (fixed {f['fixed_wall_s']} / "
            f"{f['fixed_cpu_s']} s); per audio hour: wall {f['wall_s_per_hour']} s, CPU {f['cpu_s_per_hour']} s, "
            f"marginal wall {f['marginal_wall_s_per_hour']} s, CPU {f['marginal_cpu_s_per_hour']} s "
            f"({f['vcpu_hours_per_1000_hours']} vCPU-h per 1,000 h); workers' peak "
            f"{f['worker_peak_mib']} MiB; emulator CPU: fake-gcs-server {f['fake_gcs_server_cpu_s']} s, "
            f"this process {f['this_process_cpu_s']} s; load {f['load_1min']}"
        )
    g = s["gs_over_local"]
    print(f"  gs:// ÷ local: wall {g['wall_s']}, CPU {g['cpu_s']}, marginal CPU {g['marginal_cpu_s']}", flush=True)


if __name__ == "__main__":
    main()
