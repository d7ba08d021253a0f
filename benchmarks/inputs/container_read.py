"""Reading clips from a Hugging Face parquet export and from WebDataset tars, beside the same clips as
WAV files under a manifest; and the read stage's memory on a parquet input at two sizes.

throughput (`--clips N`, default 1,000): the same N WAV clips (0.5-2.5 s, 22.05 kHz) written as WAV
files with a manifest, as one parquet file (audio {bytes, path}, row groups of 100 rows: what
`datasets` writes for audio), and as tars of 250 samples (KEY.wav + KEY.json). For each form, in
rounds interleaved form by form (`--rounds`), the read stage's rows (`sources.read_input`) and each
clip's audio fetched and decoded as Measure does it (`clips.load_decoded`, in the read stage's
batches, `read_stage.batches`: 32 rows, or one parquet row group; what is held let go after each),
then measured (`clips.analyse_audio`: decode, trim, mel); and apart, each clip's bytes fetched alone
(the decode is the same work for every form: the fetch is what the container changes); and the rows
counted before a local job (`sources.count_input_rows`, the worker count's: an estimate for tars). Printed: ms per clip,
median over rounds (the forms' order turned each round), and the ratio to the WAV files.

memory (`--rows`, default 10000,100000,200000): a parquet export of that many rows (about 0.8 KB of
audio bytes each, row groups of 100) in files of `--rows-per-file` rows (default 10,000: `datasets`
shards an export by size, and a file of real clips that size holds about as many row groups; 0: one
file), the read stage's DoFn (`read_stage._ReadRows`) drained in a fresh process; its peak RSS above the
RSS before reading (the process' own peak, from `/proc/self/status`), and the largest file's footer.
With `--footer`, the largest file's footer alone (`pq.read_metadata`), and its rows drained as the read
stage reads them (`packed_clips.parquet_rows`), each in a fresh process: the RSS they take.

worker fetch (`--fetch-row-groups`, e.g. 1000,5000): one parquet file of that many row groups of 100
rows (the memory benchmark's file of as many rows), and a worker's fetch of `--fetch-batches` batches
(row groups spread over the file, every row's bytes, `packed_clips.clip_bytes`), in a fresh process,
with the footers kept across batches (`packed_clips.FOOTERS`, as the worker reads) and forgotten after
every batch (each batch parses the footer: how the worker read before); the two interleaved in
`--rounds` rounds, the order turned each round. Printed: ms per batch and µs per row (medians), the
ratio, and the process' peak RSS growth.

Run: python -m benchmarks.inputs.container_read [--clips 1000] [--rounds 3] [--no-mel] [--rows 10000,100000,200000]
     [--rows-per-file 10000] [--footer] [--fetch-row-groups 1000,5000] [--fetch-batches 40] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
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
from benchmarks.preprocess.scale import WORK

SR = 22050
FORMS: tuple[str, ...] = ("wav", "parquet", "webdataset")


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


def _fetch(row: dict) -> bytes:
    """A clip's encoded bytes as Measure gets them: a file read whole, a tar member or a parquet row."""
    from apache_beam.io.filesystems import FileSystems

    from melshards.preprocess.inputs import packed_clips

    if row.get("locator"):
        return packed_clips.clip_bytes(row["audio"], row["locator"])
    with FileSystems.open(row["audio"]) as f:
        return f.read()


def time_form(path: Path, mel: bool = True) -> tuple[float, float, float, float, float, int]:
    """(read stage s, fetch s, fetch + decode s, fetch + decode + trim + mel s, the local progress line's
    row count s, clips) for one form."""
    from melshards.preprocess.clip.clips import analyse_audio, load_decoded
    from melshards.preprocess.config import PreprocessConfig
    from melshards.preprocess.inputs import packed_clips
    from melshards.preprocess.inputs.read_stage import MAX_BATCH_ROWS, batches
    from melshards.preprocess.inputs.sources import count_input_rows, detect_corpus, read_input

    cfg = PreprocessConfig()
    corpus = detect_corpus(str(path), language="en")
    start = time.perf_counter()
    counted = count_input_rows(corpus)
    count = time.perf_counter() - start
    start = time.perf_counter()
    rows = read_input(corpus).rows
    read = time.perf_counter() - start
    assert counted == len(rows) or path.name == "tars", (path, counted, len(rows))  # tars: an estimate
    start = time.perf_counter()
    for batch in batches(rows, MAX_BATCH_ROWS):
        for r in batch:
            _fetch(r)
        packed_clips.release_held()
    fetch = time.perf_counter() - start
    start = time.perf_counter()
    for batch in batches(rows, MAX_BATCH_ROWS):
        for r in batch:
            load_decoded(r["audio"], cfg, r.get("locator"))
        packed_clips.release_held()
    decode = time.perf_counter() - start
    start = time.perf_counter()
    for batch in batches(rows, MAX_BATCH_ROWS) if mel else []:
        for r in batch:
            analyse_audio(r["audio"], cfg, locator=r.get("locator"))
        packed_clips.release_held()
    return read, fetch, decode, time.perf_counter() - start, count, len(rows)


def throughput(root: Path, clips: int, rounds: int, mel: bool = True) -> dict:
    forms = write_forms(root, clips)
    time_form(forms["wav"])  # warm: librosa's import, the page cache
    per: dict[str, list[tuple[float, ...]]] = {f: [] for f in FORMS}
    for k in range(rounds):
        # interleaved, the order turned each round: a busy spell or a place in the round falls on every form
        for form in FORMS[k % len(FORMS) :] + FORMS[: k % len(FORMS)]:
            read, fetch, decode, measure, count, n = time_form(forms[form], mel)
            assert n == clips, (form, n)
            per[form].append(
                tuple(1e3 * x / n for x in (read, fetch, decode, measure, read + fetch, read + decode, count))
            )
    med = {f: tuple(statistics.median(x[k] for x in v) for k in range(7)) for f, v in per.items()}
    print(f"\n{clips} clips, {rounds} rounds interleaved; ms per clip (median), ratio to the WAV files")
    print(
        "| form | read stage | fetch | read + fetch (÷ WAV) | fetch + decode | read + fetch + decode (÷ WAV) "
        "| measure (decode, trim, mel) | read + measure (÷ WAV) | row count before the job |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    w = med["wav"]
    out = {}
    for form in FORMS:
        r, f, d, m, rf, rd, c = med[form]
        out[form] = {
            "read_ms": r,
            "fetch_ms": f,
            "decode_ms": d,
            "measure_ms": m,
            "count_ms": c,
            "read_fetch_ratio": rf / w[4],
            "read_decode_ratio": rd / w[5],
            "read_measure_ratio": (r + m) / (w[0] + w[3]) if mel else None,
        }
        print(
            f"| {form} | {r:.3f} | {f:.3f} | {rf:.3f} ({out[form]['read_fetch_ratio']:.2f}) | {d:.3f} | "
            f"{rd:.3f} ({out[form]['read_decode_ratio']:.2f}) | "
            + (f"{m:.3f} | " if mel else "- | ")
            + (f"{r + m:.3f} ({out[form]['read_measure_ratio']:.2f}) | " if mel else "- | ")
            + f"{c:.3f} |"
        )
    return out


def write_big_parquet(root: Path, rows: int, per_file: int) -> Path:
    """A parquet export of `rows` rows under `root` (kept between runs): files of `per_file` rows
    (`train-NNNNN.parquet`, as `datasets` shards an export), or one file when `per_file` is 0."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    done = root / "done.json"
    if done.exists() and json.loads(done.read_text()) == {"rows": rows, "per_file": per_file}:
        return root
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob("*.parquet"):
        old.unlink()
    audio_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("audio", audio_type), ("id", pa.string()), ("text", pa.string()), ("speaker", pa.string())])
    rng = np.random.default_rng(0)
    step = per_file or rows
    for k, first in enumerate(range(0, rows, step)):
        with pq.ParquetWriter(root / f"train-{k:05d}.parquet", schema) as w:
            for start in range(first, min(rows, first + step), 10000):
                ids = [f"r{i:07d}" for i in range(start, min(rows, first + step, start + 10000))]
                audio = [{"bytes": _wav(0.1 * rng.standard_normal(400)), "path": f"{c}.wav"} for c in ids]
                w.write_table(
                    pa.table(
                        {
                            "audio": pa.array(audio, audio_type),
                            "id": ids,
                            "text": [f"the row {c}" for c in ids],
                            "speaker": [f"s{int(c[1:]) % 50}" for c in ids],
                        }
                    ),
                    row_group_size=100,
                )
    done.write_text(json.dumps({"rows": rows, "per_file": per_file}))
    return root


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def _peak_from_here() -> float:
    """This process' RSS now (MiB), its peak reset to it (Linux: `/proc/self/clear_refs`): the peak
    read later (`_peak_mib`) is this process' own from here on. (`getrusage`'s peak is not: a child
    process' starts at its parent's RSS when it was started, and an import's transient peak stays in it.)"""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_mib("VmRSS")


def _peak_mib() -> float:
    return _status_mib("VmHWM")


def child(path: str) -> dict:
    from melshards.preprocess.inputs.read_stage import _ReadRows, named
    from melshards.preprocess.inputs.sources import detect_corpus

    corpora = named([detect_corpus(path, language="en")])
    before = _peak_from_here()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="melshards-container-read-") as temp:
        elements = sum(1 for _ in _ReadRows(corpora, temp).process(None))
    return {
        "wall_s": time.perf_counter() - start,
        "rss_growth_mib": _peak_mib() - before,
        "rss_before_mib": before,
        "elements": elements,
    }


def child_footer(path: str) -> dict:
    """The RSS one file's footer takes parsed (`pq.read_metadata`), and its serialized size."""
    import pyarrow.parquet as pq

    before = _peak_from_here()
    metadata = pq.read_metadata(path)
    return {
        "rss_growth_mib": _peak_mib() - before,
        "serialized_kib": metadata.serialized_size / 1024,
        "row_groups": metadata.num_row_groups,
    }


def child_rows(path: str) -> dict:
    """The peak RSS of draining one file's rows as the read stage reads them (`packed_clips.parquet_rows`,
    without the working set and the batches after it): its footer, one batch of its columns, one row."""
    from melshards.preprocess.inputs import packed_clips

    before = _peak_from_here()
    rows = sum(1 for _ in packed_clips.parquet_rows(path, 0))
    return {"rss_growth_mib": _peak_mib() - before, "rows": rows}


def child_fetch(path: str, groups: int, batches: int, keep: bool) -> dict:
    """A worker's fetch of `batches` row groups spread over one file of `groups` row groups of 100 rows
    (`write_big_parquet`'s; not read from its footer here, which would be in the RSS before), each
    row's bytes as Measure fetches them; the footers kept across batches (`keep`) or forgotten after each."""
    from melshards.preprocess.inputs import packed_clips

    chosen = sorted({g * groups // batches for g in range(batches)})
    packed_clips.FOOTERS.clear()
    before = _peak_from_here()
    start = time.perf_counter()
    for g in chosen:
        for i in range(100):
            packed_clips.clip_bytes(path, {"parquet": "audio", "row_group": g, "index": i})
        packed_clips.release_held()
        if not keep:
            packed_clips.FOOTERS.clear()
    wall = time.perf_counter() - start
    return {
        "ms_per_batch": 1e3 * wall / len(chosen),
        "us_per_row": 1e6 * wall / (100 * len(chosen)),
        "rss_growth_mib": _peak_mib() - before,
    }


def _in_child(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.inputs.container_read", *args], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fetch(root: Path, row_groups: list[int], batches: int, rounds: int) -> dict:
    modes = ("kept", "parsed per batch")
    out = {}
    print(
        f"\na worker's fetch of {batches} batches (row groups of 100) spread over one file; medians of {rounds} rounds"
    )
    print(
        "| row groups | footer KiB | footer kept: ms per batch | µs per row | parsed per batch: ms per batch "
        "| µs per row | ratio (per batch ÷ kept) | peak RSS growth MiB (kept / per batch) |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for groups in row_groups:
        path = write_big_parquet(root / f"parquet-{100 * groups}-per-0", 100 * groups, 0)
        file = str(next(path.glob("*.parquet")))
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for k in range(rounds):
            for mode in modes[k % 2 :] + modes[: k % 2]:
                args = ["--child-fetch", file, "--groups", str(groups), "--fetch-batches", str(batches)] + (
                    ["--keep"] if mode == "kept" else []
                )
                runs[mode].append(_in_child(*args))
        med = {m: {key: statistics.median(r[key] for r in v) for key in v[0]} for m, v in runs.items()}
        kept, each = med["kept"], med["parsed per batch"]
        footer_kib = _in_child("--child-footer", file)["serialized_kib"]
        out[str(groups)] = {"footer_kib": footer_kib, **{m: med[m] for m in modes}}
        print(
            f"| {groups:,} | {footer_kib:.0f} | {kept['ms_per_batch']:.1f} | {kept['us_per_row']:.1f} | "
            f"{each['ms_per_batch']:.1f} | {each['us_per_row']:.1f} | {each['ms_per_batch'] / kept['ms_per_batch']:.1f} | "
            f"{kept['rss_growth_mib']:.1f} / {each['rss_growth_mib']:.1f} |"
        )
    return out


def memory(root: Path, sizes: list[int], per_file: int, footer: bool = False) -> dict:
    import pyarrow.parquet as pq

    runs = {}
    for n in sizes:
        path = write_big_parquet(root / f"parquet-{n}-per-{per_file}", n, per_file)
        files = sorted(path.glob("*.parquet"))
        largest = max(files, key=lambda f: pq.read_metadata(f).serialized_size)
        runs[n] = {
            **_in_child("--child", str(path)),
            "footer_rss_mib": _in_child("--child-footer", str(largest))["rss_growth_mib"] if footer else None,
            "rows_rss_mib": _in_child("--child-rows", str(largest))["rss_growth_mib"] if footer else None,
            "files": len(files),
            "mib": sum(f.stat().st_size for f in files) / 2**20,
            "largest_footer_kib": max(pq.ParquetFile(f).metadata.serialized_size for f in files) / 1024,
        }
    shards = f"files of {per_file:,} rows" if per_file else "one file"
    print(f"\nthe read stage on a parquet export ({shards}, row groups of 100)")
    print(
        "| rows | files | MiB | largest footer KiB | its footer parsed alone: RSS MiB | its rows drained: RSS MiB "
        "| wall s | µs per row | RSS before MiB | RSS growth MiB |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for n, r in runs.items():
        alone = f"{r['footer_rss_mib']:.1f} | {r['rows_rss_mib']:.1f}" if footer else "- | -"
        print(
            f"| {n:,} | {r['files']} | {r['mib']:.0f} | {r['largest_footer_kib']:.0f} | {alone} | {r['wall_s']:.2f} | "
            f"{1e6 * r['wall_s'] / n:.1f} | {r['rss_before_mib']:.0f} | {r['rss_growth_mib']:.1f} |"
        )
    return {str(n): r for n, r in runs.items()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", default="10000,100000,200000")
    ap.add_argument("--rows-per-file", type=int, default=10000, help="the export's files' rows (0: one file)")
    ap.add_argument("--no-mel", action="store_true", help="time the read, fetch and decode alone")
    ap.add_argument("--work-dir", default=os.environ.get("MELSHARDS_BENCH_DIR", WORK))
    ap.add_argument("--footer", action="store_true", help="also the RSS of the largest footer parsed alone")
    ap.add_argument("--fetch-row-groups", default="", help="a worker's fetch from one file of these many row groups")
    ap.add_argument("--fetch-batches", type=int, default=40)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-footer", help=argparse.SUPPRESS)
    ap.add_argument("--child-fetch", help=argparse.SUPPRESS)
    ap.add_argument("--child-rows", help=argparse.SUPPRESS)
    ap.add_argument("--keep", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--groups", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child or args.child_footer or args.child_fetch or args.child_rows:
        if args.child:
            print(json.dumps(child(args.child)))
        elif args.child_rows:
            print(json.dumps(child_rows(args.child_rows)))
        elif args.child_footer:
            print(json.dumps(child_footer(args.child_footer)))
        else:
            print(json.dumps(child_fetch(args.child_fetch, args.groups, args.fetch_batches, args.keep)))
        return {}
    root = Path(args.work_dir) / "container-read"
    result = {
        "benchmark": "container_read",
        "throughput": throughput(root / f"clips-{args.clips}", args.clips, args.rounds, not args.no_mel)
        if args.clips
        else {},
        "memory": memory(root, [int(n) for n in args.rows.split(",")], args.rows_per_file, args.footer)
        if args.rows
        else {},
        "fetch": fetch(root, [int(n) for n in args.fetch_row_groups.split(",")], args.fetch_batches, args.rounds)
        if args.fetch_row_groups
        else {},
    }
    emit(result)
    return result


if __name__ == "__main__":
    main()
