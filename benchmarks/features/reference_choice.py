"""Reference choice for one speaker: `choose_references` against the per-clip list it replaced, side by side.

One speaker's clips (ids `s-0000000`.., mel frames drawn from 60..1500 with a fixed seed, so 86% are
at least `min_seconds`, 3 s, long), every clip in the training split: the rule the two
implementations share. For each size, the CPU seconds (time.process_time, best of `--rounds`) of

- `before`: the choice as it was, a list of the other clips built for every clip (quadratic), kept
  here verbatim as the baseline; measured up to `--before-max` clips and extrapolated beyond as
  t(largest measured) x (n / that n)^2, marked so;
- `after`: `melshards.preprocess.write.other_clip_references.choose_references` (sorted pools, the asking clip left out
  by index arithmetic: O(n log n));
- `job step`: the whole step a worker runs on the speaker's group (`other_clip_references._choose`: the choice and
  the requests it yields, keyed by measured batch; 100 clips a batch).

Where both ran, the two choices are checked equal (clip for clip, reference and start). Reported: a
table of both and their ratio per size, then one JSON line.

Run: python -m benchmarks.features.reference_choice [--clips 2000,8000,200000] [--before-max 8000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time

from benchmarks.common import emit
from melshards.preprocess.config import PreprocessConfig, ReferenceConfig
from melshards.preprocess.write.other_clip_references import _choose, choose_references

MIN_FRAMES = 259  # 3.0 s at 22,050 Hz and hop 256, as the job derives it from min_seconds
FRAMES = 256


def _draw(seed: int, clip_id: str, what: str, n: int) -> int:
    digest = hashlib.sha256(f"{seed}:{what}:{clip_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % n


def before(clips: list[tuple[str, int]], seed: int, min_frames: int, frames: int) -> dict:
    """The quadratic choice for one (speaker, split) group, as it was (single_clip: own_clip)."""
    ordered = sorted(clips)
    out = {}
    long_ids = [c for c in ordered if c[1] >= min_frames]
    for clip_id, _ in ordered:
        others = [c for c in long_ids if c[0] != clip_id] or [c for c in ordered if c[0] != clip_id]
        if not others:
            others = [c for c in ordered if c[0] == clip_id]
        ref_id, ref_frames = others[_draw(seed, clip_id, "clip", len(others))]
        out[clip_id] = (ref_id, _draw(seed, clip_id, "start", max(0, ref_frames - frames) + 1))
    return out


def speaker(n: int) -> list[tuple[str, int]]:
    rng = random.Random(n)
    return [(f"s-{i:07d}", rng.randrange(60, 1500)) for i in range(n)]


def cpu_seconds(fn, rounds: int) -> tuple[float, dict]:
    best, out = float("inf"), {}
    for _ in range(rounds):
        t = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t)
    return best, out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", default="2000,8000,200000", help="speaker sizes, comma-separated")
    ap.add_argument("--before-max", type=int, default=8000, help="largest size the quadratic baseline runs at")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.clips.split(",")]
    rows, measured = [], None
    cfg = PreprocessConfig(reference=ReferenceConfig(source="other_clip", frames=FRAMES))
    for n in sizes:
        clips = speaker(n)
        after_s, chosen = cpu_seconds(
            lambda clips=clips: choose_references([(i, f, "train") for i, f in clips], 0, MIN_FRAMES, FRAMES),
            args.rounds,
        )
        group = ("s", [(i, f, "train", f"batch-{k // 100}") for k, (i, f) in enumerate(clips)])
        step_s, _ = cpu_seconds(lambda group=group: list(_choose(group, cfg)), args.rounds)
        if n <= args.before_max:
            before_s, old = cpu_seconds(lambda clips=clips: before(clips, 0, MIN_FRAMES, FRAMES), 1)
            if old != chosen:
                raise SystemExit(f"{n} clips: the choices differ")
            measured, extrapolated = (n, before_s), False
        elif measured is not None:
            before_s, extrapolated = measured[1] * (n / measured[0]) ** 2, True
        else:
            before_s, extrapolated = float("nan"), True
        rows.append(
            {
                "clips": n,
                "before_cpu_s": round(before_s, 3),
                "before_extrapolated": extrapolated,
                "after_cpu_s": round(after_s, 3),
                "job_step_cpu_s": round(step_s, 3),
                "ratio": round(before_s / after_s, 1),
                "same_choices": not extrapolated,
            }
        )
    print(
        f"{'clips':>8}  {'before CPU s':>16}  {'after CPU s':>11}  {'before/after':>12}  same choices  job step CPU s"
    )
    for r in rows:
        b = f"{r['before_cpu_s']:.2f}" + (" (extr.)" if r["before_extrapolated"] else "")
        same = "yes" if r["same_choices"] else "-"
        print(
            f"{r['clips']:>8}  {b:>16}  {r['after_cpu_s']:>11.3f}  {r['ratio']:>12.1f}  {same:>12}"
            f"  {r['job_step_cpu_s']:>14.3f}"
        )
    result = {"benchmark": "reference_choice", "sizes": rows}
    emit(result)
    return result


if __name__ == "__main__":
    main()
