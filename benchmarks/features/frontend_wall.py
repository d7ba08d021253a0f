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

from benchmarks import common

VARIANTS = ("characters", "phonemes")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_corpus_args(ap, rounds=3)
    args = ap.parse_args(argv)
    work, corpus = common.work_and_corpus(args)
    configs = common.write_configs(work, "frontend", {v: {"text": {"default": v, "languages": {}}} for v in VARIANTS})
    runs = common.preprocess_rounds(corpus, configs, args.workers, args.rounds, work, "frontend")
    walls = common.figures(runs, "wall_s")
    ratios = common.round_ratios(walls, "phonemes", "characters")
    result = {
        **common.round_medians("frontend_wall", args, runs),
        "phonemes_over_characters": round(statistics.median(ratios), 3),
        "per_round_ratios": [round(x, 3) for x in ratios],
    }
    print(
        f"\nphonemes / characters wall: {result['phonemes_over_characters']:.3f} (median of "
        f"{', '.join(f'{x:.3f}' for x in ratios)}); goal <= 1.15"
    )
    common.emit(result)


if __name__ == "__main__":
    main()
