"""Reading clips from a Hugging Face parquet export and from WebDataset tars, beside the same clips as
WAV files under a manifest; and the read stage's memory on a parquet input at two sizes.

throughput (`--clips N`, default 1,000): the same N WAV clips (0.5-2.5 s, 22.05 kHz) written as WAV
files with a manifest, as one parquet file (audio {bytes, path}, row groups of 100 rows: what
`datasets` writes for audio), and as tars of 250 samples (KEY.wav + KEY.json). For each form, in
rounds interleaved form by form (`--rounds`), the read stage's rows (`sources.read_input`) and each
clip's audio fetched and decoded as Measure does it (`clips.load_decoded`, in the read stage's
batches, `corpus.batches`: 32 rows, or one parquet row group; the held row group let go after each),
then measured (`clips.analyse_audio`: decode, trim, mel). Printed: ms per clip, median over rounds, and the ratio to
the WAV files. The mel and everything after it are the same for every form and not timed.

memory (`--rows`, default 10000,100000): a parquet export of that many rows (about 1 KB of audio
bytes each, row groups of 100), the read stage's DoFn (`corpus._ReadRows`) drained in a fresh process;
its peak RSS above the RSS before reading (as `benchmarks.read_scale` measures the read stage).

Run: python -m benchmarks.container_read [--clips 1000] [--rounds 3] [--no-mel] [--rows 10000,100000] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from benchmarks.common import emit
from benchmarks.preprocess_scale import WORK

SR = 22050
FORMS = ("wav", "parquet", "webdataset")


def _clip(i: int) -> np.ndarray:
    n = int(SR * (0.5 + (i % 9) * 0.25))
    t = np.arange(n) / SR
    return (0.4 * np.sin(2 * np.pi * (150 + 7 * (i % 40)) * t)).astype(np.float32)


def _wav(y: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, y, SR, format="WAV")
    return buf.getvalue()


def write_forms(root: Path, n: int) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    done = root / "done.json"
    forms = {
        "wav": root / "wav" / "clips.csv",
        "parquet": root / "parquet" / "train.parquet",
        "webdataset": root / "tars",
    }
    if done.exists() and json.loads(done.read_text()) == {"clips": n}:
        return forms
    for d in ("wav/wavs", "parquet", "tars"):
        (root / d).mkdir(parents=True, exist_ok=True)
    datas = [_wav(_clip(i)) for i in range(n)]
    ids = [f"c{i:06d}" for i in range(n)]
    texts = [f"clip number {i}" for i in range(n)]
    with open(forms["wav"], "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", "audio", "text", "speaker", "language"])
        for i, data in enumerate(datas):
            (root / "wav" / "wavs" / f"{ids[i]}.wav").write_bytes(data)
            out.writerow([ids[i], f"wavs/{ids[i]}.wav", texts[i], f"s{i % 4}", "en"])
    audio = pa.array(
        [{"bytes": d, "path": f"{c}.wav"} for c, d in zip(ids, datas)],
        pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
    )
    table = pa.table({"audio": audio, "id": ids, "text": texts, "speaker": [f"s{i % 4}" for i in range(n)]})
    pq.write_table(table, forms["parquet"], row_group_size=100)
    for start in range(0, n, 250):
        with tarfile.open(root / "tars" / f"{start // 250:06d}.tar", "w") as tar:
            for i in range(start, min(n, start + 250)):
                meta = json.dumps({"id": ids[i], "text": texts[i], "speaker": f"s{i % 4}", "language": "en"}).encode()
                for name, data in ((f"{ids[i]}.wav", datas[i]), (f"{ids[i]}.json", meta)):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    done.write_text(json.dumps({"clips": n}))
    return forms


def time_form(path: Path, mel: bool = True) -> tuple[float, float, float, int]:
    """(read stage s, fetch + decode s, fetch + decode + trim + mel s, clips) for one form."""
    from melshards.preprocess import containers
    from melshards.preprocess.clips import analyse_audio, load_decoded
    from melshards.preprocess.config import PreprocessConfig
    from melshards.preprocess.corpus import MAX_BATCH_ROWS, batches
    from melshards.preprocess.sources import detect_corpus, read_input

    cfg = PreprocessConfig()
    start = time.perf_counter()
    rows = read_input(detect_corpus(str(path), language="en")).rows
    read = time.perf_counter() - start
    start = time.perf_counter()
    for batch in batches(rows, MAX_BATCH_ROWS):
        for r in batch:
            load_decoded(r["audio"], cfg, r.get("locator"))
        containers.release_held()
    decode = time.perf_counter() - start
    start = time.perf_counter()
    for batch in batches(rows, MAX_BATCH_ROWS) if mel else []:
        for r in batch:
            analyse_audio(r["audio"], cfg, locator=r.get("locator"))
        containers.release_held()
    return read, decode, time.perf_counter() - start, len(rows)


def throughput(root: Path, clips: int, rounds: int, mel: bool = True) -> dict:
    forms = write_forms(root, clips)
    time_form(forms["wav"])  # warm: librosa's import, the page cache
    per: dict[str, list[tuple[float, float, float]]] = {f: [] for f in FORMS}
    for _ in range(rounds):
        for form in FORMS:  # interleaved: a busy spell on the shared machine falls on every form
            read, decode, measure, n = time_form(forms[form], mel)
            assert n == clips, (form, n)
            per[form].append((1e3 * read / n, 1e3 * decode / n, 1e3 * measure / n))
    med = {f: tuple(statistics.median(x[k] for x in v) for k in range(3)) for f, v in per.items()}
    print(f"\n{clips} clips, {rounds} rounds interleaved; ms per clip (median), ratio to the WAV files")
    print(
        "| form | read stage | fetch + decode | read + fetch + decode (÷ WAV) | measure (decode, trim, mel) "
        "| read + measure (÷ WAV) |\n|---|---:|---:|---:|---:|---:|"
    )
    w_read, w_dec, w_mel = med["wav"]
    out = {}
    for form in FORMS:
        r, d, m = med[form]
        out[form] = {
            "read_ms": r,
            "decode_ms": d,
            "measure_ms": m,
            "read_decode_ratio": (r + d) / (w_read + w_dec),
            "read_measure_ratio": (r + m) / (w_read + w_mel) if mel else None,
        }
        print(
            f"| {form} | {r:.3f} | {d:.3f} | {r + d:.3f} ({out[form]['read_decode_ratio']:.2f}) | "
            + (f"{m:.3f} | " if mel else "- | ")
            + (f"{r + m:.3f} ({out[form]['read_measure_ratio']:.2f}) |" if mel else "- |")
        )
    return out


def write_big_parquet(path: Path, rows: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with pq.ParquetWriter(
        path,
        pa.schema(
            [
                ("audio", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                ("id", pa.string()),
                ("text", pa.string()),
                ("speaker", pa.string()),
            ]
        ),
    ) as w:
        for start in range(0, rows, 10000):
            ids = [f"r{i:07d}" for i in range(start, min(rows, start + 10000))]
            w.write_table(
                pa.table(
                    {
                        "audio": pa.array(
                            [{"bytes": _wav(0.1 * rng.standard_normal(400)), "path": f"{c}.wav"} for c in ids],
                            pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
                        ),
                        "id": ids,
                        "text": [f"the row {c}" for c in ids],
                        "speaker": [f"s{int(c[1:]) % 50}" for c in ids],
                    }
                ),
                row_group_size=100,
            )
    return path


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def child(path: str) -> dict:
    from melshards.preprocess.corpus import _ReadRows, named
    from melshards.preprocess.sources import detect_corpus

    corpora = named([detect_corpus(path, language="en")])
    before = _rss_gib()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="melshards-container-read-") as stash:
        elements = sum(1 for _ in _ReadRows(corpora, stash).process(None))
    return {
        "wall_s": time.perf_counter() - start,
        "rss_growth_mib": 1024 * (_rss_gib() - before),
        "rss_before_mib": 1024 * before,
        "elements": elements,
    }


def memory(root: Path, sizes: list[int]) -> dict:
    runs = {}
    for n in sizes:
        path = write_big_parquet(root / f"parquet-{n}" / "train.parquet", n)
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.container_read", "--child", str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        runs[n] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\nthe read stage on a parquet export ({os.path.getsize(path) / 2**20:.0f} MiB at {sizes[-1]:,} rows)")
    print("| rows | wall s | µs per row | RSS before MiB | RSS growth MiB |\n|---|---:|---:|---:|---:|")
    for n, r in runs.items():
        print(
            f"| {n:,} | {r['wall_s']:.2f} | {1e6 * r['wall_s'] / n:.1f} | {r['rss_before_mib']:.0f} | "
            f"{r['rss_growth_mib']:.1f} |"
        )
    return {str(n): r for n, r in runs.items()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", default="10000,100000")
    ap.add_argument("--no-mel", action="store_true", help="time the read, fetch and decode alone")
    ap.add_argument("--work-dir", default=os.environ.get("MELSHARDS_BENCH_DIR", WORK))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return {}
    root = Path(args.work_dir) / "container-read"
    result = {
        "benchmark": "container_read",
        "throughput": throughput(root / f"clips-{args.clips}", args.clips, args.rounds, not args.no_mel)
        if args.clips
        else {},
        "memory": memory(root, [int(n) for n in args.rows.split(",")]) if args.rows else {},
    }
    emit(result)
    return result


if __name__ == "__main__":
    main()
