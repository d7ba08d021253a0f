"""Issue 46's goal on merged corpora: every pair of copies keeps one whenever a copy passes the other
rules, and no language is judged by another's speaking rates.

`build_second_input` writes a second manifest (`b.jsonl`) beside the fault corpus of
benchmarks/quality/faults.py (input a, by default two speakers, `calm` and `brisk`, so that the English
rates are close together, as one corpus's are):

- a copy of each `transcript` fault clip's audio with its right text (the bad copy comes first by input
  order: the copy in b must be kept);
- a copy of `--clean-copies` clean clips' audio with another clip's text (the bad copy comes second: the
  copy in a must be kept);
- 8 Mandarin clips of two speakers and 6 French clips of one (their texts over the demo speech: Mandarin
  at 1.5-4 characters/s, far below English letters per second), too few for rate bounds of their own.

The two inputs are preprocessed with the default config and scored from rejected.jsonl: input a as
`faults.score` scores it (the planted faults kept out, its own pairs, its clean clips lost), the
pairs with exactly the right copy left (a pair none of whose copies passes the other rules is counted apart), the
`duplicate_audio` rows naming a copy that was not kept, and per language the clips lost to the quality
rules. Goal: every pair with a passing copy keeps it, no row names a copy not kept, no Mandarin or
French clip lost.

Run: python -m benchmarks.quality.merged [--clean 25] [--per-fault 3] [--workers 2] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections import Counter
from pathlib import Path

import soundfile

from benchmarks.common import emit, preprocess_command, preprocess_rejected
from benchmarks.preprocess.scale import beam_flags
from benchmarks.quality import faults
from melshards.shards_schema.stats import QUALITY_REASONS

ZH = (
    "今天天气很好。",
    "我们明天去北京。",
    "这本书非常有意思。",
    "他每天早上跑步。",
    "请把窗户打开。",
    "你吃饭了吗？",
    "火车晚点了十分钟。",
    "我喜欢听音乐。",
)
FR = (
    "Bonjour tout le monde.",
    "Il fait très beau aujourd'hui.",
    "Nous allons à la plage demain.",
    "Le train est en retard.",
    "J'aime beaucoup la musique.",
    "Ouvrez la fenêtre, s'il vous plaît.",
)


def build_second_input(corpus: Path, rows: list[dict], clean_copies: int) -> tuple[list[dict], list[tuple]]:
    """Write `corpus`/b.jsonl and its WAVs; returns its rows and the copy pairs (id in a, id in b, the
    input whose copy must stay)."""
    from benchmarks.make_big_corpus import good_clips

    out, pairs = [], []

    def copy(r: dict, text: str, keep: str) -> None:
        cid = f"b_{r['id']}"
        shutil.copy(corpus / r["audio"], corpus / "wavs" / f"{cid}.wav")
        out.append({"id": cid, "audio": f"wavs/{cid}.wav", "text": text, "asr_text": r["asr_text"]})
        out[-1].update(speaker=f"b_{r['speaker']}", language="en")
        pairs.append((r["id"], cid, keep))

    for r in rows:
        if r.get("fault") == "transcript":
            copy(r, r["asr_text"], "b")
    clean = [r for r in rows if r.get("fault") is None]
    for r, other in zip(clean[:clean_copies], clean[clean_copies:]):
        copy(r, other["text"], "a")
    demo = good_clips()
    spoken = [(t, "cmn", "zh1" if i < 4 else "zh2") for i, t in enumerate(ZH)] + [(t, "fr", "fr1") for t in FR]
    for i, (text, language, speaker) in enumerate(spoken):
        soundfile.write(corpus / "wavs" / f"m_{i}.wav", demo[i][2], faults.SR, subtype="PCM_16")
        out.append({"id": f"m_{i}", "audio": f"wavs/m_{i}.wav", "text": text, "speaker": speaker, "language": language})
    (corpus / "b.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out), encoding="utf-8")
    return out, pairs


def score(second: list[dict], pairs: list[tuple], rejected: list[dict]) -> dict:
    why = {r["id"]: r for r in rejected}
    right = {"a": 0, "b": 0}
    none_passes = 0
    for a, b, keep in pairs:
        left = [i for i in (a, b) if i not in why]
        if not left and all(why[i]["reason"] != "duplicate_audio" for i in (a, b)):
            none_passes += 1  # each copy broke a rule of its own
        right[keep] += left == [a if keep == "a" else b]
    lost: Counter = Counter()
    clips: Counter = Counter()
    for r in second:
        if r["language"] != "en":
            clips[r["language"]] += 1
            lost[r["language"]] += r["id"] in why and why[r["id"]]["reason"] in QUALITY_REASONS
    return {
        "pairs_bad_copy_first": sum(k == "b" for *_, k in pairs),
        "pairs_bad_copy_first_second_kept": right["b"],
        "pairs_bad_copy_second": sum(k == "a" for *_, k in pairs),
        "pairs_bad_copy_second_first_kept": right["a"],
        "pairs_no_copy_passing": none_passes,
        "duplicate_rows_naming_a_copy_not_kept": sum(
            r["reason"] == "duplicate_audio" and r["detail"].split()[-1] in why for r in rejected
        ),
        "languages": {code: {"clips": clips[code], "lost_to_quality_rules": lost[code]} for code in clips},
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    faults.add_fault_args(ap)
    ap.add_argument("--clean-copies", type=int, default=12)
    args = ap.parse_args(argv)
    work = Path(args.work_dir) / f"merged-{args.clean}-{args.per_fault}"
    corpus = work / "corpus"
    rows = faults.build_fault_corpus(corpus, args.clean, args.per_fault, speakers=("calm", "brisk"))
    second, pairs = build_second_input(corpus, rows, args.clean_copies)
    out = work / "out"
    cmd = preprocess_command(
        corpus / "manifest.jsonl", out, "--input", str(corpus / "b.jsonl"), *beam_flags(args.workers)
    )
    rejected = preprocess_rejected(cmd, out)
    result = {
        "benchmark": "quality_merged",
        "input_a": faults.score(rows, rejected),
        **score(second, pairs, rejected),
    }
    print(
        f"bad copy first, the second kept: {result['pairs_bad_copy_first_second_kept']}/"
        f"{result['pairs_bad_copy_first']}; bad copy second, the first kept: "
        f"{result['pairs_bad_copy_second_first_kept']}/{result['pairs_bad_copy_second']}; "
        f"pairs with no copy passing the other rules: {result['pairs_no_copy_passing']}"
    )
    print(f"duplicate_audio rows naming a copy not kept: {result['duplicate_rows_naming_a_copy_not_kept']}")
    a = result["input_a"]
    kept_out = ", ".join(f"{kind} {f['kept_out']}/{f['clips']}" for kind, f in a["faults"].items())
    print(
        f"input a: faults kept out: {kept_out}; its duplicate pairs with one left: {a['duplicate_pairs_one_left']}/"
        f"{a['duplicate_pairs']}; clean clips lost to the quality rules: {a['clean_rejected_quality']}/{a['clean_clips']}"
    )
    for code, x in result["languages"].items():
        print(f"{code}: {x['lost_to_quality_rules']}/{x['clips']} clips lost to the quality rules")
    emit(result)
    return result


if __name__ == "__main__":
    main()
