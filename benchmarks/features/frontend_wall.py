"""The price of the phoneme front end in the whole job: preprocess wall with `phonemes` vs `characters`.

The same 1,000-clip corpus (benchmarks/make_big_corpus.py, English) is preprocessed with a config whose
`text.default` is `phonemes` and one whose default is `characters` (`text.languages` emptied so English
goes to the default too), each run a separate `python -m melshards preprocess` process timed from start
to exit, the two interleaved in every round (the machine is shared: compare same-round ratios).
Reported: wall per variant (median over rounds) and the phonemes/characters wall ratio (median of the
per-round ratios). Goal (issue 20): <= 1.15.

Run: python -m benchmarks.features.frontend_wall [--clips 1000] [--rounds 3] [--workers 2]
         [--work-dir /tmp/melshards-bench]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import yaml

from benchmarks.common import emit
from benchmarks.preprocess.scale import WORK, beam_flags, ensure_corpus
from benchmarks.proctree import run_sampled

VARIANTS = ("characters", "phonemes")


def config_for(frontend: str, work: Path) -> str:
    path = work / f"frontend-{frontend}.yaml"
    path.write_text(yaml.safe_dump({"text": {"default": frontend, "languages": {}}}))
    return str(path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work-dir", default=WORK)
    args = ap.parse_args(argv)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    corpus = ensure_corpus(str(work / f"ljbig-{args.clips}"), args.clips)
    walls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for v in VARIANTS:
            out = work / f"frontend-out-{v}"
            cmd = [
                sys.executable,
                "-m",
                "melshards",
                "preprocess",
                "--input",
                corpus,
                "--output",
                str(out),
                "--overwrite",
                "--config",
                config_for(v, work),
                *beam_flags(args.workers),
            ]
            res = run_sampled(cmd, log_path=str(work / f"frontend-{v}.log"))
            if res["rc"] != 0:
                raise SystemExit(f"{v}: preprocess exited {res['rc']}; see {work / f'frontend-{v}.log'}")
            walls[v].append(res["wall_s"])
            print(f"round {r + 1} {v:<11} wall {res['wall_s']:6.1f} s  cpu {res.get('cpu_s', 0):6.1f} s", flush=True)
    ratios = [p / c for p, c in zip(walls["phonemes"], walls["characters"])]
    result = {
        "benchmark": "frontend_wall",
        "clips": args.clips,
        "workers": args.workers,
        "rounds": args.rounds,
        **{f"wall_s_{v}": round(statistics.median(walls[v]), 2) for v in VARIANTS},
        "phonemes_over_characters": round(statistics.median(ratios), 3),
        "per_round_ratios": [round(x, 3) for x in ratios],
    }
    print(
        f"\nphonemes / characters wall: {result['phonemes_over_characters']:.3f} (median of "
        f"{', '.join(f'{x:.3f}' for x in ratios)}); goal <= 1.15"
    )
    emit(result)


if __name__ == "__main__":
    main()
