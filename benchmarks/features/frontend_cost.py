"""The cost per row of each text front end, and of phonemes per row vs in batches.

~1,000 real-ish transcripts are generated from a fixed list of phrases (numbers, times, currency,
abbreviations, punctuation; the same list every run) in English, plus the same count in German and
Mandarin for the language-neutral front ends. Every variant normalises every row once per round,
the variants interleaved in each round (the machine is shared: compare same-round ratios):

  english            frontend("english").normalize_many(rows, "en"), batches of --batch rows
  characters         frontend("characters"), batches of --batch
  phonemes_batched   frontend("phonemes"), batches of --batch (what preprocess does: one call per
                     language of a batch)
  phonemes_per_row   frontend("phonemes"), one call per row

Reported: microseconds per row (median over rounds) and ratios of the medians of per-round ratios:
phonemes_per_row / phonemes_batched, and each front end / characters. Also the one-off costs a
process pays first: importing phonemizer and loading espeak-ng, and making a language's backend.

Run: python -m benchmarks.features.frontend_cost [--rows 1000] [--rounds 5] [--batch 32] [--language en]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from benchmarks.common import emit, interleaved, median_ratio

_EN = [
    "Mr. Smith paid $3.50 for 2 coffees at 7:45 this morning.",
    "The meeting is at 10:30pm on St. Paul st.",
    "Revenue rose 12% to $1.5 million in 2019, the report said.",
    "It was the 21st of June, 1984; nobody came.",
    "\u201cWhere are you going?\u201d she asked \u2014 quietly.",
    "Dr. Jones measured 6.02e23 molecules, roughly.",
    "A ticket costs \u20ac20 or 18\u00a3, depending on the day.",
    "The train leaves at 7:00 from platform 9.",
    "He counted 1,234 sheep before falling asleep.",
    "Printing and binding took three weeks, etc.",
]
_DE = [
    "Der Zug fährt um 7 Uhr von Gleis 9 ab.",
    "Schön, dass du da bist \u2013 wirklich!",
    "Das kostet 2,50 \u20ac und nicht 3.",
    "Am 3. Mai kamen 1.000 Leute zum Fest.",
    "\u201eWohin gehst du?\u201c, fragte sie leise.",
]
_ZH = [
    "妈妈骂马吗？",
    "我们明天上午十点在北京见面。",
    "这本书一共有 300 页，很好看！",
    "他说：\u201c你好，世界。\u201d",
    "今天天气很好。",
]
_PHRASES = {"en": _EN, "de": _DE, "zh-CN": _ZH}


def rows_for(language: str, n: int, seed: int = 0) -> list[str]:
    """n transcripts of 1-3 phrases of the language's list (fixed seed: the same rows every run)."""
    phrases, rng = _PHRASES[language], random.Random(seed)
    return [" ".join(rng.choice(phrases) for _ in range(rng.randint(1, 3))) for _ in range(n)]


def batches(rows: list[str], size: int) -> list[list[str]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def one_off_costs(language: str) -> dict:
    """First use in a process: phonemizer's import with espeak-ng located, then a backend."""
    from melshards.shards_schema import text_phonemes

    t = time.perf_counter()
    text_phonemes._phonemizer()
    t_import = time.perf_counter() - t
    t = time.perf_counter()
    text_phonemes.backend_for(language)
    return {"phonemizer_import_s": round(t_import, 3), "backend_start_s": round(time.perf_counter() - t, 4)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32, help="rows per front-end call (preprocess: up to 32)")
    ap.add_argument("--language", default="all", choices=["all", *_PHRASES])
    args = ap.parse_args(argv)

    from melshards.shards_schema.text import frontend

    languages = list(_PHRASES) if args.language == "all" else [args.language]
    first = one_off_costs(languages[0])
    result = {
        "benchmark": "frontend_cost",
        "rows": args.rows,
        "rounds": args.rounds,
        "batch": args.batch,
        **first,
        "languages": {},
    }
    print(
        f"one-off, per process: phonemizer import + espeak-ng located {first['phonemizer_import_s']:.3f} s, "
        f"a language's backend {1000 * first['backend_start_s']:.1f} ms"
    )
    for language in languages:
        rows = rows_for(language, args.rows)
        chunks = batches(rows, args.batch)
        names = ["characters", "phonemes"] + (["english"] if language == "en" else [])
        for name in names:  # warm: backends made, num2words imported
            frontend(name).normalize_many(chunks[0], language)

        def batched(name, language=language, chunks=chunks):
            f = frontend(name)
            return lambda: sum(len(f.normalize_many(c, language)) for c in chunks)

        fns = {name: batched(name) for name in names if name != "phonemes"}
        fns["phonemes_batched"] = batched("phonemes")
        ph = frontend("phonemes")
        fns["phonemes_per_row"] = lambda ph=ph, language=language, rows=rows: sum(
            len(ph.normalize_many([r], language)) for r in rows
        )
        rates = interleaved(fns, args.rounds)
        us = {k: round(1e6 / statistics.median(v), 1) for k, v in rates.items()}
        ratios = {
            "phonemes_per_row/phonemes_batched": round(median_ratio(rates, "phonemes_batched", "phonemes_per_row"), 2)
        }
        for k in fns:
            if k != "characters":
                ratios[f"{k}/characters"] = round(median_ratio(rates, "characters", k), 2)
        mean_len = statistics.mean(len(r) for r in rows)
        print(
            f"\n{language}: {len(rows)} rows of {mean_len:.0f} characters on average, {args.rounds} interleaved rounds, "
            f"batches of {args.batch}"
        )
        print(f"  {'front end':<18} {'us/row':>9}")
        for k, v in us.items():
            print(f"  {k:<18} {v:>9.1f}")
        for k, v in ratios.items():  # a ratio of costs = the inverse ratio of rates, per round
            print(f"  {k:<34} x{v:.2f}")
        result["languages"][language] = {"us_per_row": us, "ratios": ratios}
    emit(result)


if __name__ == "__main__":
    main()
