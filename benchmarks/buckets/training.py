"""Length buckets: padding share from the shards at K = 1, 2, 4, 8, 16, and training throughput.

Padding (`--padding CORPUS`): preprocesses CORPUS once per K (and `auto`, the default) with
`--config` and measures the padding share of mel frames from the shards themselves: 1 - sum of
mel_len / sum of each record's padded frames (its bucket's max_mel_frames), reading every record.

Training (`--train K1_SHARDS AUTO_SHARDS`): two shard sets of the same corpus and preprocess config,
one made with `--buckets 1` and one with the default buckets (the same records, padded differently).
Trains each `--steps` steps with the same train config (a fresh model dir per run), `--rounds`
times, alternating the two, and reads run_summary.json: steady valid mel frames/s (ratio buckets /
one shape), total compile seconds (first call of each bucket's step), padding share of the frames
run. Pay-back: the extra compile time divided by the time saved per valid frame, in valid frames
and in steps of the bucketed run. `uptime` is printed before and after (the machine is shared).

Run: python -m benchmarks.buckets.training --padding data/ljspeech_tiny --config configs/ljspeech_tiny.yaml
     python -m benchmarks.buckets.training --train OUT1 OUTAUTO --train-config configs/train_tiny.yaml --steps 60
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import emit, preprocess_command

KS = ("1", "2", "4", "8", "16", "auto")


def shard_padding(out: Path) -> dict:
    import tensorflow as tf

    from melshards.shards_schema import read_schema

    schema = read_schema(str(out))
    valid = padded = 0
    for b in schema.buckets:
        for split in ("train", "val"):
            for f in b.shards.get(split, []):
                ds = tf.data.TFRecordDataset(str(out / f["file"])).map(
                    lambda r: tf.io.parse_single_example(r, {"mel_len": tf.io.FixedLenFeature([], tf.int64)})
                )
                for rec in ds:
                    valid += int(rec["mel_len"])
                    padded += b.max_mel_frames
    return {
        "buckets": len(schema.buckets),
        "bounds": [b.max_mel_frames for b in schema.buckets],
        "records": schema.counts,
        "padding": round(1 - valid / padded, 4),
    }


def padding_table(corpus: str, config: str, work: Path) -> list[dict]:
    rows = []
    for k in KS:
        out = work / f"k{k}"
        subprocess.run(
            preprocess_command(corpus, out, "--config", config, "--buckets", k), check=True, stdout=subprocess.DEVNULL
        )
        rows.append({"k": k, **shard_padding(out)})
        r = rows[-1]
        print(f"K={k:>4}  used {r['buckets']:>2}  padding {100 * r['padding']:5.1f}%  bounds {r['bounds']}", flush=True)
    return rows


def train_once(shards: str, cfg: str, steps: int, model_dir: Path) -> dict:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "melshards",
            "train",
            f"{shards}/train-*.tfrecord",
            "--model-dir",
            str(model_dir),
            "--config",
            cfg,
            "--steps",
            str(steps),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    s = json.loads((model_dir / "run_summary.json").read_text())
    st = s["steady_state"]
    return {
        "fps": st["mel_frames_per_second"],
        "sps": st["steps_per_second"],
        "compile_s": s["compile_seconds"],
        "padding": s["padding_fraction"],
        "buckets_used": s["buckets_used"],
        "traces": s["train_step_traces"],
        "batches": [b["batch_size"] for b in s["buckets"]],
    }


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def train_table(one: str, auto: str, cfg: str, steps: int, rounds: int, work: Path) -> dict:
    runs: dict[str, list[dict]] = {"one": [], "auto": []}
    print("load before:", uptime(), flush=True)
    for r in range(rounds):
        for name, shards in (("one", one), ("auto", auto)) if r % 2 == 0 else (("auto", auto), ("one", one)):
            res = train_once(shards, cfg, steps, work / f"{name}-{r}")
            runs[name].append(res)
            print(
                f"round {r} {name:>4}: {res['fps']:8.0f} valid mel frames/s  {res['sps']:.2f} steps/s  "
                f"compile {res['compile_s']:.1f} s ({res['traces']} traces)  padding "
                f"{100 * res['padding']:.1f}%  batches {res['batches']}",
                flush=True,
            )
    load_after = uptime()
    print("load after:", load_after, flush=True)
    med = {
        n: {k: statistics.median(x[k] for x in v) for k in ("fps", "sps", "compile_s", "padding")}
        for n, v in runs.items()
    }
    ratio = med["auto"]["fps"] / med["one"]["fps"]
    extra = med["auto"]["compile_s"] - med["one"]["compile_s"]
    saved_per_frame = 1 / med["one"]["fps"] - 1 / med["auto"]["fps"]
    frames = extra / saved_per_frame if saved_per_frame > 0 else None
    frames_per_step = med["auto"]["fps"] / med["auto"]["sps"]
    payback = None if frames is None else frames / frames_per_step
    print(
        f"valid mel frames/s, buckets / one shape: {ratio:.2f}x; compile {med['auto']['compile_s']:.0f} s vs "
        f"{med['one']['compile_s']:.0f} s; extra compile paid back after "
        f"{'never' if payback is None else f'{payback:.0f} steps'}",
        flush=True,
    )
    return {"runs": runs, "median": med, "ratio": ratio, "payback_steps": payback, "load_after": load_after}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--padding", metavar="CORPUS")
    ap.add_argument("--config", default="configs/ljspeech_tiny.yaml", help="preprocess config for --padding")
    ap.add_argument("--train", nargs=2, metavar=("K1_SHARDS", "AUTO_SHARDS"))
    ap.add_argument("--train-config", default="configs/train_tiny.yaml")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--work", default=None)
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="melshards-buckets-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"benchmark": "train_buckets"}
    if args.padding:
        result["padding"] = padding_table(args.padding, args.config, work / "padding")
    if args.train:
        result["train"] = train_table(*args.train, args.train_config, args.steps, args.rounds, work / "train")
    emit(result)
    return result


if __name__ == "__main__":
    sys.path.insert(0, os.fspath(Path(__file__).resolve().parents[2]))
    main()
