"""Run every benchmark in sequence (`make bench`); each prints its table and one JSON line.

Default: the full documented run (docs/performance.md, which gives its duration):
  train.record_encoding        --records 1024 --rounds 5
  train.input_headroom         --steps 120 --rounds 3
  train.before_after           --steps 24 --rounds 1   (all four variants; "before" retraces, ~5 s each)
  train.before_after           --steps 60 --rounds 3 --variants fixed_nosig,sig_noxla,melshards
  preprocess.startup           --rounds 3
  preprocess.throughput        --clips 1000 --rounds 2
  preprocess.throughput        --clips 13100 --rounds 2 --workers 2   (on the scale corpus, generated if missing)
  preprocess.scale             --clips 13100 --workers 2,1   (generates the 13,100-clip corpus if missing)
  buckets.padding_waste        on the 2-worker scale run's stats.json (measures the corpus if the run left none)
  features.pitch_trackers      --rounds 3
  features.feature_wall        --clips 1000 --rounds 3 --workers 2
  features.extractor_cost      --clips 1000 --rounds 3 --workers 2
  features.reference_wall      --clips 1000 --rounds 2 --workers 2
  features.reference_choice    --clips 2000,8000,16000,200000 --before-max 16000 --rounds 3
  train.audio_headroom         --steps 120 --rounds 2
  train.reference_headroom     --steps 120 --rounds 2
  cache.wall                   --clips 13100 --rounds 2
  preprocess.stats_scale       --rounds 3   (on the cache.wall run's stats.json)
  preprocess.html_render       --rounds 3
  cache.key                    --clips 13100 --rounds 3   (on the scale corpus)
  inputs.read_scale            --rows 13100,131000,1048000
  preprocess.combine_sizes     --clips 20000,200000 --pitch
  preprocess.worker_memory     --rows 20000,200000   (makes a 200,000-clip corpus, 2.6 GB, once)
  remote.wall                  --clips 1000 --rounds 2   (local files against gs:// on the GCS emulator)
  train.synthesize_wall        --rounds 3
Quick mode (`python -m benchmarks.run_all --quick`, or env MELSHARDS_BENCH_QUICK=1): small sizes,
a few minutes, for checking the benchmarks still run; its figures are not the documented ones.

Generated corpora and job outputs go under --work-dir (default /tmp/melshards-bench, env
MELSHARDS_BENCH_DIR); nothing is written inside the repository. `--only a,b` runs a subset.
The final line is one JSON object {"benchmark": "run_all", "results": {name: result or error}}.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
import traceback

from benchmarks.common import emit

WORK = os.environ.get("MELSHARDS_BENCH_DIR", "/tmp/melshards-bench")


def plan(quick: bool, work: str) -> list[tuple[str, list[str]]]:
    if quick:
        return [
            ("train.record_encoding", ["--records", "128", "--rounds", "2"]),
            ("train.input_headroom", ["--steps", "20", "--rounds", "1", "--work", f"{work}/train-input"]),
            ("train.before_after", ["--steps", "4", "--rounds", "1", "--work", f"{work}/before-after"]),
            ("preprocess.startup", ["--rounds", "1", "--work-dir", work]),
            ("preprocess.throughput", ["--clips", "60", "--rounds", "1", "--work-dir", work]),
            ("preprocess.scale", ["--clips", "300", "--corpus", f"{work}/lj300", "--workers", "2", "--work-dir", work]),
            (
                "buckets.padding_waste",
                [
                    "--stats",
                    f"{work}/scale-out-2w/stats.json",
                    "--corpus-fallback",
                    f"{work}/lj300",
                    "--work-dir",
                    work,
                ],
            ),
            ("features.pitch_trackers", ["--rounds", "1", "--seconds", "5"]),
            ("features.feature_wall", ["--clips", "60", "--rounds", "1", "--profile-clips", "10", "--work-dir", work]),
            ("features.extractor_cost", ["--clips", "60", "--rounds", "1", "--work-dir", work]),
            ("features.reference_wall", ["--clips", "60", "--rounds", "1", "--work-dir", work]),
            ("features.reference_choice", ["--clips", "2000,20000", "--before-max", "2000", "--rounds", "1"]),
            ("train.audio_headroom", ["--steps", "20", "--rounds", "1", "--work", f"{work}/audio-headroom"]),
            (
                "train.reference_headroom",
                ["--steps", "20", "--rounds", "1", "--frames", "64", "--work", f"{work}/reference-headroom"],
            ),
            ("cache.wall", ["--clips", "60", "--rounds", "1", "--work-dir", work]),
            (
                "preprocess.stats_scale",
                ["--stats", f"{work}/cache-wall/out-plain/stats.json", "--clips", "10000", "--rounds", "1"],
            ),
            ("preprocess.html_render", ["--rounds", "1", "--run", f"{work}/demo-shards"]),
            ("cache.key", ["--clips", "300", "--corpus", f"{work}/lj300", "--rounds", "1"]),
            ("inputs.read_scale", ["--rows", "1000,4000", "--files", "1000", "--work-dir", work]),
            ("preprocess.combine_sizes", ["--clips", "2000,4000"]),
            (
                "preprocess.worker_memory",
                ["--rows", "300,600", "--work-dir", f"{work}/quick"],
            ),  # not the full run's corpus
            (
                "remote.wall",
                [
                    "--clips",
                    "12",
                    "--fixed-clips",
                    "4",
                    "--rounds",
                    "1",
                    "--per-tar",
                    "8",
                    "--work-dir",
                    f"{work}/quick",
                ],
            ),
            ("train.synthesize_wall", ["--rounds", "1", "--steps", "4"]),
            ("train.step_device", ["--quick"]),
            ("train.compile_wall", ["--clips", "200", "--rounds", "1"]),
        ]
    return [
        ("train.record_encoding", ["--records", "1024", "--rounds", "5"]),
        ("train.input_headroom", ["--steps", "120", "--rounds", "3", "--work", f"{work}/train-input"]),
        ("train.before_after", ["--steps", "24", "--rounds", "1", "--work", f"{work}/before-after"]),
        (
            "train.before_after",
            [
                "--steps",
                "60",
                "--rounds",
                "3",
                "--variants",
                "fixed_nosig,sig_noxla,melshards",
                "--work",
                f"{work}/before-after",
            ],
        ),
        ("preprocess.startup", ["--rounds", "3", "--work-dir", work]),
        ("preprocess.throughput", ["--clips", "1000", "--rounds", "2", "--work-dir", work]),
        (
            "preprocess.throughput",
            ["--clips", "13100", "--rounds", "2", "--workers", "2", "--corpus", f"{work}/ljbig", "--work-dir", work],
        ),
        ("preprocess.scale", ["--clips", "13100", "--corpus", f"{work}/ljbig", "--workers", "2,1", "--work-dir", work]),
        (
            "buckets.padding_waste",
            ["--stats", f"{work}/scale-out-2w/stats.json", "--corpus-fallback", f"{work}/ljbig", "--work-dir", work],
        ),
        ("features.pitch_trackers", ["--rounds", "3"]),
        ("features.feature_wall", ["--clips", "1000", "--rounds", "3", "--workers", "2", "--work-dir", work]),
        ("features.extractor_cost", ["--clips", "1000", "--rounds", "3", "--workers", "2", "--work-dir", work]),
        ("features.reference_wall", ["--clips", "1000", "--rounds", "2", "--workers", "2", "--work-dir", work]),
        ("features.reference_choice", ["--clips", "2000,8000,16000,200000", "--before-max", "16000", "--rounds", "3"]),
        ("train.audio_headroom", ["--steps", "120", "--rounds", "2", "--work", f"{work}/audio-headroom"]),
        ("train.reference_headroom", ["--steps", "120", "--rounds", "2", "--work", f"{work}/reference-headroom"]),
        ("cache.wall", ["--clips", "13100", "--rounds", "2", "--work-dir", work]),
        ("preprocess.stats_scale", ["--stats", f"{work}/cache-wall/out-plain/stats.json", "--rounds", "3"]),
        ("preprocess.html_render", ["--rounds", "3", "--run", f"{work}/demo-shards"]),
        ("cache.key", ["--clips", "13100", "--corpus", f"{work}/ljbig", "--rounds", "3"]),
        ("inputs.read_scale", ["--rows", "13100,131000,1048000", "--work-dir", work]),
        ("preprocess.combine_sizes", ["--clips", "20000,200000", "--pitch"]),
        ("preprocess.worker_memory", ["--rows", "20000,200000", "--work-dir", work]),
        ("remote.wall", ["--clips", "1000", "--rounds", "2", "--work-dir", work]),
        ("train.synthesize_wall", ["--rounds", "3"]),
        ("train.step_device", ["--steps", "120", "--rounds", "1"]),  # train_base sizes: meant for a GPU machine
        ("train.compile_wall", ["--clips", "800", "--rounds", "2"]),
    ]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", default=os.environ.get("MELSHARDS_BENCH_QUICK") == "1")
    ap.add_argument("--work-dir", default=WORK)
    ap.add_argument(
        "--only", default="", help="comma-separated benchmarks to run, as group.name (preprocess.startup; default: all)"
    )
    args = ap.parse_args(argv)
    only = {x for x in args.only.split(",") if x}
    results = {}
    for name, bench_args in plan(args.quick, args.work_dir):
        if only and name not in only:
            continue
        module = f"benchmarks.{name}"
        key = name if name not in results else f"{name} {' '.join(bench_args)}"
        print(f"\n== {name} {' '.join(bench_args)}", flush=True)
        t = time.perf_counter()
        try:
            results[key] = importlib.import_module(module).main(bench_args)
        except Exception as e:  # one broken benchmark must not hide the others' figures
            traceback.print_exc()
            results[key] = {"error": f"{type(e).__name__}: {e}"}
        print(f"== {name}: {time.perf_counter() - t:.0f} s", flush=True)
    emit({"benchmark": "run_all", "quick": args.quick, "results": results})
    return results


if __name__ == "__main__":
    main()
