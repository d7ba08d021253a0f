"""How many times a corpus on gs:// is downloaded by a preprocessing run: the media bytes a GCS emulator
serves, against the corpus' own bytes, per corpus kind; this checkout against another (`--before DIR`).

The emulator is tests/gcs_emulator.py (fake-gcs-server on loopback behind a proxy that counts the bytes
of every object download). Each corpus kind is uploaded under its own prefix, and each tree runs
`python -m melshards preprocess --input gs://BUCKET/KIND --output LOCAL --no_auth` in a child process
(its PYTHONPATH the tree), one kind at a time; the bytes served under the prefix during that run are
the run's reads of the corpus (the output and its temp files are local).

The kinds (`--scale 1`: the issue's sizes; clips are 16 kHz mono 16-bit WAV, a sine and noise):

- `tars`: WebDataset, two tars of 200 samples (KEY.wav + KEY.json), about 37 MB each;
- `parquet`: a Hugging Face-style export (audio {bytes, path}), 400 rows in row groups of 100;
- `parquet_one_group`: 2,000 rows of about 44 KB in one row group (pyarrow's and pandas' default row
  group holds up to 1 Mi rows);
- `wav`: 200 WAV files under a manifest;
- `segments`: two 10-minute recordings (a WAV and a FLAC) cut into segments of 3-9 s by a manifest.

Printed: per kind, the corpus' MB, and per tree the MB served (the ratio to the corpus' bytes), the
media requests, the run's wall seconds.

Run: python -m benchmarks.remote.read [--before DIR] [--kinds tars,parquet,...] [--scale 1.0] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from benchmarks.common import emit
from benchmarks.preprocess.scale import WORK

REPO = Path(__file__).resolve().parents[2]
SR = 16000
KINDS = ("tars", "parquet", "parquet_one_group", "wav", "segments")
# the demo's config, every quality rule and length cut-off off: every row's clip is read and measured
CONFIG_SECTIONS = {
    "filter": {"min_duration_s": 0.1, "mel_frames_upper_percentile": 100.0, "text_len_upper_percentile": 100.0}
}


def clip(i: int, seconds: float, sr: int = SR) -> np.ndarray:
    """A clip that is neither silent nor a pure tone: a sine whose pitch depends on `i`, with noise."""
    rng = np.random.default_rng(i)
    t = np.arange(int(seconds * sr)) / sr
    y = 0.3 * np.sin(2 * np.pi * (120 + 5 * (i % 60)) * t) + 0.05 * rng.standard_normal(t.size)
    return y.astype(np.float32)


def wav_bytes(y: np.ndarray, sr: int = SR, subtype: str | None = None) -> bytes:
    """A WAV file's bytes (`subtype`: soundfile's, e.g. FLOAT; default 16-bit PCM)."""
    buf = io.BytesIO()
    sf.write(buf, y, sr, format="WAV", subtype=subtype)
    return buf.getvalue()


def _text(i: int) -> str:
    return f"clip number {i} reads a sentence of some words"


def write_tars(root: Path, tars: int, per_tar: int, seconds: float, sr: int = SR, subtype: str | None = None) -> Path:
    """WebDataset shards `root/NNNNNN.tar` of `per_tar` samples (KEY.wav, then KEY.json) of `seconds` each."""
    root.mkdir(parents=True, exist_ok=True)
    n = 0
    for k in range(tars):
        with tarfile.open(root / f"{k:06d}.tar", "w") as tar:
            for _ in range(per_tar):
                key = f"s{n:05d}"
                meta = {"id": key, "text": _text(n), "speaker": f"spk{n % 4}", "language": "en"}
                for name, data in (
                    (f"{key}.wav", wav_bytes(clip(n, seconds, sr), sr, subtype)),
                    (f"{key}.json", json.dumps(meta).encode()),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                n += 1
    return root


def write_parquet(
    path: Path, rows: int, group_rows: int, seconds: float, sr: int = SR, subtype: str | None = None
) -> Path:
    """A Hugging Face-style export: audio {bytes, path}, id, text, speaker_id, language; row groups of `group_rows`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    audio = [{"bytes": wav_bytes(clip(i, seconds, sr), sr, subtype), "path": f"c{i:05d}.wav"} for i in range(rows)]
    table = pa.table(
        {
            "audio": pa.array(audio, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            "id": [f"c{i:05d}" for i in range(rows)],
            "text": [_text(i) for i in range(rows)],
            "speaker_id": [f"spk{i % 4}" for i in range(rows)],
            "language": ["en"] * rows,
        }
    )
    pq.write_table(table, path, row_group_size=group_rows)
    return path


def write_wavs(root: Path, files: int, seconds: float, sr: int = SR, subtype: str | None = None) -> Path:
    """`files` WAV files under `root/wavs` and a manifest `root/clips.csv` naming them."""
    (root / "wavs").mkdir(parents=True, exist_ok=True)
    with open(root / "clips.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "audio", "text", "speaker", "language"])
        for i in range(files):
            (root / "wavs" / f"w{i:05d}.wav").write_bytes(wav_bytes(clip(i, seconds, sr), sr, subtype))
            out.writerow([f"w{i:05d}", f"wavs/w{i:05d}.wav", _text(i), f"spk{i % 4}", "en"])
    return root / "clips.csv"


def write_segments(root: Path, minutes: float, formats: tuple[str, ...] = ("WAV", "FLAC"), sr: int = SR) -> Path:
    """One recording per format of `minutes` (`root/rec0.wav`, `root/rec1.flac`, ...; 16-bit) and a
    manifest `root/segments.csv` cutting each into segments of 3-9 s, 0.2-1 s apart, in time order."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for r, fmt in enumerate(formats):
        name = f"rec{r}.{fmt.lower()}"
        total = minutes * 60
        sf.write(root / name, clip(1000 + r, total, sr), sr, format=fmt)
        t = 0.5
        while True:
            seconds = float(rng.uniform(3, 9))
            if t + seconds > total - 0.5:
                break
            n = len(rows)
            rows.append([f"seg{n:05d}", name, _text(n), f"spk{r}", "en", f"{t:.3f}", f"{t + seconds:.3f}"])
            t += seconds + float(rng.uniform(0.2, 1.0))
    with open(root / "segments.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "audio", "text", "speaker", "language", "start", "end"])
        out.writerows(rows)
    return root / "segments.csv"


def write_kind(kind: str, root: Path, scale: float) -> Path:
    """The corpus of one kind under `root` (its own directory); what `--input` names, relative to `root`."""
    s = scale
    if kind == "tars":
        write_tars(root, 2, max(2, int(200 * s)), 5.8)
        return Path(".")
    if kind == "parquet":
        return write_parquet(root / "train.parquet", max(2, int(400 * s)), 100, 5.8).relative_to(root)
    if kind == "parquet_one_group":
        rows = max(2, int(2000 * s))
        return write_parquet(root / "train.parquet", rows, rows, 1.37).relative_to(root)
    if kind == "wav":
        return write_wavs(root, max(2, int(200 * s)), 5.8).relative_to(root)
    if kind == "segments":
        return write_segments(root, max(0.5, 10 * s)).relative_to(root)
    raise SystemExit(f"unknown kind {kind}; choose from {', '.join(KINDS)}")


def _run(tree: Path, emulator, url: str, out: Path, config: Path) -> float:
    cmd = [sys.executable, "-m", "melshards", "preprocess", "--input", url, "--output", str(out)]
    cmd += ["--config", str(config), "--no_auth"]
    env = {**os.environ, **emulator.environ, "PYTHONPATH": str(tree)}
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env)
    wall = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} (in {tree}) failed:\n{proc.stderr[-3000:]}")
    return wall


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=None, help="another checkout to compare with")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--scale", type=float, default=1.0, help="corpus size against the issue's (1.0)")
    ap.add_argument("--work-dir", default=os.path.join(WORK, "remote_read"))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from tests.conftest import TINY_CONFIG, quality_rules_off
    from tests.gcs_emulator import running_emulator, upload_tree

    kinds = [k for k in args.kinds.split(",") if k]
    trees = {"after": REPO} | ({"before": Path(args.before).resolve()} if args.before else {})
    work = Path(args.work_dir) / f"scale-{args.scale:g}"
    result: dict = {"scale": args.scale, "kinds": {}}
    work.mkdir(parents=True, exist_ok=True)
    config = quality_rules_off(work, TINY_CONFIG, **CONFIG_SECTIONS)
    with running_emulator() as emulator:
        emulator.make_bucket("bench")
        for kind in kinds:
            root, done = work / kind / "corpus", work / kind / "written"
            if not done.exists():
                shutil.rmtree(root, ignore_errors=True)
                done.write_text(str(write_kind(kind, root, args.scale)))
            rel = Path(done.read_text())
            corpus_bytes = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
            upload_tree(emulator, root, f"gs://bench/{kind}")
            url = f"gs://bench/{kind}" + ("" if str(rel) == "." else f"/{rel}")
            figures: dict = {"corpus_mb": round(corpus_bytes / 1e6, 2)}
            for name, tree in trees.items():
                emulator.reset_counts()
                out = work / "out" / f"{kind}-{name}"
                shutil.rmtree(out, ignore_errors=True)
                wall = _run(tree, emulator, url, out, config)
                prefix = f"/bench/o/{kind}/"
                served = emulator.media_bytes(prefix)
                requests = sum(1 for s in emulator.served if s.media_bytes and prefix in _unquoted(s.path))
                figures[name] = {
                    "served_mb": round(served / 1e6, 2),
                    "ratio": round(served / corpus_bytes, 3),
                    "requests": requests,
                    "wall_s": round(wall, 1),
                }
            result["kinds"][kind] = figures
            _print_row(kind, figures, list(trees))
    emit(result)
    return result


def _unquoted(path: str) -> str:
    import urllib.parse

    return urllib.parse.unquote(path)


def _print_row(kind: str, figures: dict, trees: list[str]) -> None:
    cells = [f"{kind:18s} corpus {figures['corpus_mb']:8.2f} MB"]
    for name in trees:
        f = figures[name]
        cells.append(
            f"{name}: {f['served_mb']:8.2f} MB ({f['ratio']:.2f}x), {f['requests']:5d} requests, {f['wall_s']:6.1f} s"
        )
    print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
