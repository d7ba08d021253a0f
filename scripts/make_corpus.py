#!/usr/bin/env python3
"""Regenerate data/ljspeech_tiny/: a tiny synthetic-speech corpus in LJSpeech layout.

    python scripts/make_corpus.py

Needs espeak-ng and sox on PATH (only to regenerate; the generated files are
committed, so tests and CI do not need either tool).  The output is
deterministic: voices/rates/pitches come from a seeded RNG, sox runs in
repeatable mode without dither, and the garbage file comes from the same RNG.

Layout produced:
    data/ljspeech_tiny/metadata.csv   id|text|normalized_text  (UTF-8, no header)
    data/ljspeech_tiny/wavs/<id>.{wav,flac,ogg}
    data/ljspeech_tiny/README.md

The good clips come first in metadata.csv, followed by deliberately faulty rows
(ids LJT900-*, plus one duplicate id) that exercise a pipeline's rejection paths.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SEED = 20240611
ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "ljspeech_tiny"
WAVS = OUT / "wavs"

VOICES = [
    "en-us",
    "en-gb",
    "en-gb-scotland",
    "en+f3",
    "en+m3",
    "en-us+f2",
    "en-gb-x-rp",
    "en-029",
    "en-us-nyc",
    "en-gb-x-gbcwmd",
    "en+f4",
    "en-us+m4",
]

# (id, text, normalized_text, format)
# format: "wav" (22050 Hz mono s16), "wav16k", "wav44k", "stereo_wav" (22050 Hz, 2 ch),
#         "flac" (22050 Hz), "flac16k", "flac44k", "stereo_flac", "ogg" (Vorbis, 22050 Hz),
#         "ogg16k".
# All WAV/FLAC are 16-bit.  The mix is weighted towards FLAC/OGG/16 kHz to keep the
# committed corpus around 3 MB.
GOOD = [
    ("LJT001-0001", "The lighthouse keeper climbed the stairs.", "The lighthouse keeper climbed the stairs.", "wav"),
    ("LJT001-0002", "Please hand me the blue notebook.", "Please hand me the blue notebook.", "wav"),
    (
        "LJT001-0003",
        "Mr. Hall arrived at the station at 7:45 that morning.",
        "Mister Hall arrived at the station at seven forty-five that morning.",
        "flac16k",
    ),
    ("LJT001-0004", "Rain fell softly on the tin roof.", "Rain fell softly on the tin roof.", "wav"),
    (
        "LJT001-0005",
        "Dr. Patel said the results would be ready by Friday.",
        "Doctor Patel said the results would be ready by Friday.",
        "flac",
    ),
    (
        "LJT001-0006",
        "In 1984, the town built a new library.",
        "In nineteen eighty-four, the town built a new library.",
        "flac16k",
    ),
    (
        "LJT001-0007",
        "A cup of coffee costs $3.50 at the corner café.",
        "A cup of coffee costs three dollars and fifty cents at the corner café.",
        "ogg",
    ),
    ("LJT001-0008", '"Are you coming with us?" she asked.', '"Are you coming with us?" she asked.', "wav"),
    (
        "LJT001-0009",
        "The committee met on March 3rd, 1921.",
        "The committee met on March third, nineteen twenty-one.",
        "ogg",
    ),
    ("LJT001-0010", "Quickly now, before the bridge closes!", "Quickly now, before the bridge closes!", "wav"),
    ("LJT001-0011", "It was a naïve plan, but it worked.", "It was a naïve plan, but it worked.", "wav"),
    ("LJT001-0012", "Sixty-two ships left before dawn.", "Sixty-two ships left before dawn.", "wav16k"),
    ("LJT001-0013", "Mrs. Green keeps bees behind her cottage.", "Missus Green keeps bees behind her cottage.", "wav"),
    (
        "LJT001-0014",
        "The report listed 250 names, many of them misspelled.",
        "The report listed two hundred fifty names, many of them misspelled.",
        "ogg",
    ),
    ("LJT001-0015", "Wait; did anyone lock the door?", "Wait; did anyone lock the door?", "wav"),
    (
        "LJT001-0016",
        "St. Andrew's church stands at the end of Elm St.",
        "Saint Andrew's church stands at the end of Elm Street.",
        "flac16k",
    ),
    ("LJT001-0017", "Snow covered the valley for weeks.", "Snow covered the valley for weeks.", "stereo_wav"),
    (
        "LJT001-0018",
        "He paid £12 for a second-hand bicycle.",
        "He paid twelve pounds for a second-hand bicycle.",
        "ogg",
    ),
    ("LJT001-0019", "The Edinburgh train was late.", "The Edinburgh train was late.", "ogg"),
    (
        "LJT001-0020",
        "Gen. Lee's letters were sold at auction in 1999.",
        "General Lee's letters were sold at auction in nineteen ninety-nine.",
        "ogg",
    ),
    (
        "LJT001-0021",
        "Nobody expected the storm to last three whole days, so the fishermen had left their boats on the open beach.",
        "Nobody expected the storm to last three whole days, so the fishermen had left their boats on the open beach.",
        "ogg",
    ),
    (
        "LJT001-0022",
        "Capt. Morris checked the compass, then the map, then the stars.",
        "Captain Morris checked the compass, then the map, then the stars.",
        "flac16k",
    ),
    ("LJT001-0023", 'She whispered: "Don\'t wake the baby."', 'She whispered: "Don\'t wake the baby."', "wav"),
    (
        "LJT002-0001",
        "About 40% of the seeds sprouted within a week.",
        "About forty percent of the seeds sprouted within a week.",
        "ogg",
    ),
    ("LJT002-0002", "The museum opens at 9 a.m. on weekdays.", "The museum opens at nine a m on weekdays.", "wav"),
    (
        "LJT002-0003",
        "Bread, cheese, apples, and a little wine: that was supper.",
        "Bread, cheese, apples, and a little wine: that was supper.",
        "ogg",
    ),
    (
        "LJT002-0004",
        "The bill came to $1,200, which surprised everyone.",
        "The bill came to one thousand two hundred dollars, which surprised everyone.",
        "ogg",
    ),
    ("LJT002-0005", "Her résumé was two pages long.", "Her résumé was two pages long.", "wav"),
    ("LJT002-0006", "Why would anyone build a house on sand?", "Why would anyone build a house on sand?", "wav16k"),
    (
        "LJT002-0007",
        "The 3 brothers walked 12 miles to the fair.",
        "The three brothers walked twelve miles to the fair.",
        "ogg",
    ),
    (
        "LJT002-0008",
        "Prof. Wu explained the theory in plain words.",
        "Professor Wu explained the theory in plain words.",
        "ogg",
    ),
    ("LJT002-0009", "Lights out at ten, no talking.", "Lights out at ten, no talking.", "wav"),
    (
        "LJT002-0010",
        "The clock on the tower had stopped at 4:15.",
        "The clock on the tower had stopped at four fifteen.",
        "ogg",
    ),
    ("LJT002-0011", "Good morning to you all!", "Good morning to you all!", "wav44k"),
    ("LJT002-0012", "The fox ran through the hedge.", "The fox ran through the hedge.", "stereo_flac"),
    (
        "LJT002-0013",
        "On the 1st of May, the whole village danced in the square until the lanterns burned out.",
        "On the first of May, the whole village danced in the square until the lanterns burned out.",
        "ogg",
    ),
    (
        "LJT002-0014",
        "There were 1,000 reasons to stay, and one to leave.",
        "There were one thousand reasons to stay, and one to leave.",
        "ogg",
    ),
    (
        "LJT002-0015",
        "Lt. Baker signed the order without reading it.",
        "Lieutenant Baker signed the order without reading it.",
        "ogg",
    ),
    ("LJT002-0016", "The river was wide, slow, and cold.", "The river was wide, slow, and cold.", "ogg"),
    (
        "LJT002-0017",
        "Tickets cost $7 for adults and $4 for children.",
        "Tickets cost seven dollars for adults and four dollars for children.",
        "ogg",
    ),
    ("LJT002-0018", "Does the well never run dry?", "Does the well never run dry?", "flac44k"),
    (
        "LJT002-0019",
        "After the war, in 1946, he returned to teaching at the small school where he had once been a pupil.",
        "After the war, in nineteen forty-six, he returned to teaching "
        "at the small school where he had once been a pupil.",
        "ogg",
    ),
    ("LJT002-0020", "The garden smelled of mint and thyme.", "The garden smelled of mint and thyme.", "ogg"),
    ("LJT002-0021", "We'll meet at the mill, I promise.", "We'll meet at the mill, I promise.", "wav"),
]

# Duration outlier (~12-15 s of speech, normal-length-ish text).
LONG_AUDIO = (
    "LJT003-0001",
    "When the expedition finally reached the northern coast, after nearly three months "
    "of walking through forests, marshes and low hills, the men built a small hut of "
    "driftwood and stones, lit a fire, and waited for the ship.",
    "When the expedition finally reached the northern coast, after nearly three months "
    "of walking through forests, marshes and low hills, the men built a small hut of "
    "driftwood and stones, lit a fire, and waited for the ship.",
    "ogg16k",
)

# Text-length outlier: a very long transcript, spoken fast so the audio stays moderate.
LONG_TEXT = (
    "LJT003-0002",
    "The inventory of the old house was long and strange: 14 clocks, none of which agreed "
    "with any other; 3 pianos, one without keys; a trunk of letters from Dr. Ambrose Hale "
    "to his sister in Lyon, dated 1887 to 1893; a stuffed owl, a brass telescope, a box "
    "of buttons sorted by colour, 200 jars of pickled plums, a map of the county drawn "
    "by hand, and, at the very bottom of the cellar stairs, a small locked door that "
    "nobody in the family could remember ever having opened.",
    "The inventory of the old house was long and strange: fourteen clocks, none of which "
    "agreed with any other; three pianos, one without keys; a trunk of letters from Doctor "
    "Ambrose Hale to his sister in Lyon, dated eighteen eighty-seven to eighteen "
    "ninety-three; a stuffed owl, a brass telescope, a box of buttons sorted by colour, "
    "two hundred jars of pickled plums, a map of the county drawn by hand, and, at the "
    "very bottom of the cellar stairs, a small locked door that nobody in the family "
    "could remember ever having opened.",
    "ogg",
)

SOX = ["sox", "-R", "-D", "-V1"]  # repeatable, no dither, quiet


def run(cmd: list[str], **kw) -> None:
    subprocess.run(cmd, check=True, **kw)


def espeak(text: str, dst: Path, voice: str, rate: int, pitch: int) -> None:
    """Synthesize text to a 22050 Hz mono s16 WAV with leading/trailing silence trimmed."""
    raw = dst.with_suffix(".raw.wav")
    run(
        ["espeak-ng", "-b", "1", "-a", "75", "-v", voice, "-s", str(rate), "-p", str(pitch), "-w", str(raw), "--stdin"],
        input=text.encode("utf-8"),
    )
    run(
        SOX
        + [
            str(raw),
            "-b",
            "16",
            str(dst),
            "silence",
            "1",
            "0.02",
            "0.3%",
            "reverse",
            "silence",
            "1",
            "0.02",
            "0.3%",
            "reverse",
            "pad",
            "0.05",
            "0.08",
        ]
    )
    raw.unlink()


def encode(src: Path, out_id: str, fmt: str) -> Path:
    """Convert a 22050 Hz mono WAV into the requested container/rate/channels."""
    if fmt == "wav":
        dst = WAVS / f"{out_id}.wav"
        shutil.copyfile(src, dst)
    elif fmt == "flac":
        dst = WAVS / f"{out_id}.flac"
        run(SOX + [str(src), "-C", "8", str(dst)])
    elif fmt == "flac16k":
        dst = WAVS / f"{out_id}.flac"
        run(SOX + [str(src), "-r", "16000", "-C", "8", str(dst), "rate", "-v"])
    elif fmt == "flac44k":
        dst = WAVS / f"{out_id}.flac"
        run(SOX + [str(src), "-r", "44100", "-C", "8", str(dst), "rate", "-v"])
    elif fmt == "ogg":
        dst = WAVS / f"{out_id}.ogg"
        run(SOX + [str(src), "-C", "1", str(dst)])
    elif fmt == "ogg16k":
        dst = WAVS / f"{out_id}.ogg"
        run(SOX + [str(src), "-r", "16000", "-C", "1", str(dst), "rate", "-v"])
    elif fmt == "wav16k":
        dst = WAVS / f"{out_id}.wav"
        run(SOX + [str(src), "-r", "16000", "-b", "16", str(dst), "rate", "-v"])
    elif fmt == "wav44k":
        dst = WAVS / f"{out_id}.wav"
        run(SOX + [str(src), "-r", "44100", "-b", "16", str(dst), "rate", "-v"])
    elif fmt in ("stereo_wav", "stereo_flac"):
        # Right channel = left attenuated by 3 dB and delayed by 1.5 ms (slightly different).
        right = src.with_suffix(".right.wav")
        run(SOX + [str(src), str(right), "gain", "-3", "delay", "0.0015", "trim", "0", "-0.0015"])
        ext = "wav" if fmt == "stereo_wav" else "flac"
        dst = WAVS / f"{out_id}.{ext}"
        extra = ["-C", "8"] if ext == "flac" else ["-b", "16"]
        run(SOX + ["-M", str(src), str(right)] + extra + [str(dst)])
        right.unlink()
    else:
        raise ValueError(fmt)
    return dst


def soxi(path: Path, flag: str) -> str:
    return subprocess.run(["soxi", flag, str(path)], check=True, capture_output=True, text=True).stdout.strip()


FAULTS = [
    ("LJT900-0001", "missing audio: no file `wavs/LJT900-0001.*` exists", "missing-audio rejection"),
    (
        "LJT900-0002",
        "truncated WAV: the first 1000 bytes of a ~3 s WAV; the header still claims "
        "the full data chunk. libsndfile/soundfile does NOT raise: it clamps to the bytes present "
        "and returns 478 frames (0.022 s) of leading silence; Python's `wave` reports the header's "
        "frame count, which is far larger than what can be read",
        "truncated/corrupt-audio detection, or at the latest the too-short/silent filters",
    ),
    (
        "LJT900-0003",
        "4096 random bytes with a `.wav` name; soundfile raises `LibsndfileError: Format not recognised`",
        "decode-error rejection",
    ),
    (
        "LJT900-0004",
        "empty transcript (row is `LJT900-0004` followed by two empty fields), valid 22050 Hz speech",
        "empty-text rejection",
    ),
    (
        "LJT900-0005",
        "transcript is only `--- !!! ???`, valid 22050 Hz speech",
        "text that is empty after normalisation",
    ),
    ("LJT900-0006", "1.5 s of digital silence (all-zero samples), 22050 Hz", "silence / low-energy rejection"),
    ("LJT900-0007", "0.15 s of speech, 22050 Hz", "minimum-duration rejection"),
    (
        "LJT001-0003 (2nd row)",
        "duplicate id: a second row reusing good clip `LJT001-0003` with a different text (same audio file)",
        "duplicate-id handling (keep first / reject both)",
    ),
    (
        "LJT900-0009",
        "malformed row: a single field, no pipe separators (its audio file `wavs/LJT900-0009.wav` is valid speech)",
        "CSV/row-parse rejection",
    ),
    (
        "LJT900-0010",
        "WAV cut to its first 40 bytes (ends right after the `data` marker); "
        "soundfile raises `LibsndfileError: Error in WAV file. No 'data' chunk marker.`",
        "decode-error rejection for a truncated header",
    ),
]


def write_readme(clips: list[dict], n_rows: int, n_files: int) -> None:
    total = sum(c["dur"] for c in clips)
    dur = {c["id"]: c["dur"] for c in clips}
    by_fmt: dict[str, int] = {}
    for c in clips:
        key = f"{c['ext']} {c['sr']} Hz {'stereo' if c['ch'] == 2 else 'mono'}"
        by_fmt[key] = by_fmt.get(key, 0) + 1
    lines = [
        "# ljspeech_tiny",
        "",
        "A tiny speech corpus in [LJSpeech](https://keithito.com/LJ-Speech-Dataset/) layout, "
        "used by the melshards tests and examples. It holds speech synthesised by espeak-ng "
        "(intelligible English, no human voice) and a handful of deliberately broken rows "
        "so that a pipeline can demonstrate its rejection paths.",
        "",
        "**Generated file — do not edit by hand.** Regenerate with",
        "",
        "```",
        "python scripts/make_corpus.py",
        "```",
        "",
        "which needs `espeak-ng` and `sox` on PATH (tests and CI only read the committed files). "
        "The script deletes and recreates this directory; output is deterministic "
        f"(seed {SEED}; sox in repeatable mode without dither).",
        "",
        "## Layout",
        "",
        "- `metadata.csv`: UTF-8, no header, one row per clip: `id|text|normalized_text`. "
        "`text` is the written form (digits, `$3.50`, `Mr.`, quotes, `café`, `naïve`, `£12`, "
        "...); "
        "`normalized_text` has numbers, currency and abbreviations spelled out, as in LJSpeech. "
        "Audio was synthesized from `normalized_text`.",
        "- `wavs/<id>.<ext>`: audio, with `ext` one of `wav`, `flac`, `ogg` "
        "(exactly one file per id). "
        "Unlike real LJSpeech (always `.wav`), a reader must look for each extension.",
        "",
        "## Contents",
        "",
        f"- {n_rows} rows in `metadata.csv`, {n_files} audio files.",
        f"- {len(clips)} good clips, total {total:.1f} s of speech "
        f"({min(c['dur'] for c in clips):.2f}–{max(c['dur'] for c in clips):.2f} s).",
        f"- Outliers among the good clips: `{LONG_AUDIO[0]}` is a duration outlier "
        f"({dur[LONG_AUDIO[0]]:.1f} s; {len(LONG_AUDIO[2])}-character text), `{LONG_TEXT[0]}` "
        f"has a very long text ({len(LONG_TEXT[2])} characters normalized, "
        f"{len(LONG_TEXT[2].split())} words, spoken fast: {dur[LONG_TEXT[0]]:.1f} s).",
        "- Formats of the good clips (all WAV/FLAC are 16-bit PCM; OGG is Vorbis):",
    ]
    for k in sorted(by_fmt):
        lines.append(f"  - {k}: {by_fmt[k]}")
    lines += [
        "- Stereo clips have a right channel that is the left one attenuated by 3 dB and delayed by 1.5 ms.",
        "- Voices: espeak-ng "
        + ", ".join(f"`{v}`" for v in VOICES)
        + "; rates 140–190 wpm (the long-text clip 380), pitch 30–70.",
        "- The mix leans on FLAC/OGG/16 kHz rather than 22050 Hz WAV to keep the directory around 3 MB.",
        "",
        "## Faulty rows",
        "",
        "They come after the good rows in `metadata.csv`.",
        "",
        "| id | fault | meant to trigger |",
        "|---|---|---|",
    ]
    for fid, what, trig in FAULTS:
        lines.append(f"| `{fid}` | {what} | {trig} |")
    lines += [
        "",
        "## Good clips",
        "",
        "| id | file | sample rate | channels | duration (s) | voice | rate | pitch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in clips:
        lines.append(
            f"| `{c['id']}` | `{c['file']}` | {c['sr']} | {c['ch']} | {c['dur']:.2f} | "
            f"`{c['voice']}` | {c['rate']} | {c['pitch']} |"
        )
    lines += [
        "",
        "## License",
        "",
        "The sentences were written for this project and the audio is synthetic speech "
        "produced with espeak-ng (GPL-3.0-or-later software; its output audio is not "
        "covered by the GPL). No recordings of real people are included. The corpus "
        "may be used under the same license as the rest of this repository.",
        "",
    ]
    (OUT / "README.md").write_text("\n".join(lines), encoding="utf-8")


def main() -> int:
    for tool in ("espeak-ng", "sox", "soxi"):
        if shutil.which(tool) is None:
            print(f"error: {tool} not found on PATH", file=sys.stderr)
            return 1
    rng = random.Random(SEED)
    if OUT.exists():
        shutil.rmtree(OUT)
    WAVS.mkdir(parents=True)
    rows: list[str] = []
    clips: list[dict] = []

    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        counter = iter(range(10**6))

        def synth(text: str, voice=None, rate=None, pitch=None) -> tuple[Path, dict]:
            voice = voice or rng.choice(VOICES)
            rate = rate or rng.randint(140, 190)
            pitch = pitch if pitch is not None else rng.randint(30, 70)
            dst = tmp / f"s{next(counter):04d}.wav"
            espeak(text, dst, voice, rate, pitch)
            return dst, {"voice": voice, "rate": rate, "pitch": pitch}

        def good_clip(cid, text, norm, fmt, **kw) -> None:
            src, params = synth(norm, **kw)
            dst = encode(src, cid, fmt)
            rows.append(f"{cid}|{text}|{norm}")
            clips.append(
                {
                    "id": cid,
                    "file": f"wavs/{dst.name}",
                    "ext": dst.suffix[1:],
                    "sr": int(soxi(dst, "-r")),
                    "ch": int(soxi(dst, "-c")),
                    "dur": float(soxi(dst, "-D")),
                    **params,
                }
            )

        # ---- good clips ----
        for cid, text, norm, fmt in GOOD:
            good_clip(cid, text, norm, fmt)
        good_clip(*LONG_AUDIO, voice="en-gb", rate=150, pitch=50)
        good_clip(*LONG_TEXT, voice="en-us", rate=380, pitch=50)

        # ---- faulty rows ----
        # 1. missing audio file
        rows.append("LJT900-0001|This row has no audio file at all.|This row has no audio file at all.")
        # 2. truncated WAV: valid header claiming ~3 s of data, file cut to 1000 bytes
        good, _ = synth("This recording was cut off in the middle of a sentence.", voice="en-us", rate=160, pitch=50)
        (WAVS / "LJT900-0002.wav").write_bytes(good.read_bytes()[:1000])
        rows.append(
            "LJT900-0002|This recording was cut off in the middle of a sentence.|"
            "This recording was cut off in the middle of a sentence."
        )
        # 3. garbage bytes with a .wav extension
        (WAVS / "LJT900-0003.wav").write_bytes(bytes(rng.getrandbits(8) for _ in range(4096)))
        rows.append("LJT900-0003|The audio for this row is random bytes.|The audio for this row is random bytes.")
        # 4. empty transcript, valid audio
        encode(synth("Nothing written.")[0], "LJT900-0004", "wav")
        rows.append("LJT900-0004||")
        # 5. punctuation-only transcript, valid audio
        encode(synth("Symbols only.")[0], "LJT900-0005", "wav")
        rows.append("LJT900-0005|--- !!! ???|--- !!! ???")
        # 6. digital silence, 1.5 s
        run(SOX + ["-n", "-r", "22050", "-c", "1", "-b", "16", str(WAVS / "LJT900-0006.wav"), "trim", "0", "1.5"])
        rows.append("LJT900-0006|This clip is completely silent.|This clip is completely silent.")
        # 7. too short: 0.15 s of speech
        short, _ = synth("Yes.", voice="en-gb", rate=170, pitch=50)
        run(SOX + [str(short), str(WAVS / "LJT900-0007.wav"), "trim", "0.08", "0.15"])
        rows.append("LJT900-0007|Yes.|Yes.")
        # 8. duplicate id of a good clip, different text, same audio file
        rows.append("LJT001-0003|A second row that reuses an existing id.|A second row that reuses an existing id.")
        # 9. malformed row: a single field, no pipes (its audio file is valid)
        encode(synth("No separators.")[0], "LJT900-0009", "wav")
        rows.append("LJT900-0009")
        # 10. WAV truncated inside its header (stops right after the 'data' marker):
        #     libsndfile/soundfile raises on open.
        (WAVS / "LJT900-0010.wav").write_bytes(good.read_bytes()[:40])
        rows.append("LJT900-0010|This file stops inside its own header.|This file stops inside its own header.")

    (OUT / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    n_files = len(list(WAVS.iterdir()))
    write_readme(clips, len(rows), n_files)
    total = sum(c["dur"] for c in clips)
    print(f"wrote {len(rows)} rows, {n_files} audio files, {len(clips)} good clips ({total:.1f} s) to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
