"""One reader per corpus layout: a pure function from the layout's file listings and file texts to
rows (`melshards.preprocess.rows`). No I/O here: `melshards.preprocess.sources` lists and reads the
files through Beam's FileSystems and calls these; docs/corpora.md describes each layout.

- LJSpeech: `metadata.csv` (`id|text|normalized_text`) + `wavs/<id>.{wav,flac,ogg,mp3}`.
- VCTK 0.92: `txt/pNNN/pNNN_MMM.txt` + `wav48_silence_trimmed/pNNN/pNNN_MMM_mic1.flac`, `speaker-info.txt`.
- LibriTTS / LibriTTS-R: `[SUBSET/]SPEAKER/CHAPTER/UTT.wav` + `UTT.normalized.txt`, `SPEAKERS.txt`.
- Manifests and Common Voice TSVs: `melshards.preprocess.manifests`.
"""
from __future__ import annotations

import posixpath
from typing import Iterable, Mapping

from melshards.preprocess.rows import LayoutRows, drop_duplicate_ids, gender_code, reject, row, split_malformed

FORMATS = ("ljspeech", "manifest", "vctk", "libritts", "commonvoice")  # --format; sources.LAYOUTS reads each
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3")
LJSPEECH_FIELDS = 3  # id|text|normalized_text
VCTK_AUDIO_DIR = "wav48_silence_trimmed"
VCTK_MIC = "mic1"  # the omnidirectional DPA 4035; mic2 (Sennheiser MKH 800) only through a manifest
LIBRITTS_TEXT = ".normalized.txt"  # `.original.txt` (unnormalised, with digits and abbreviations) is ignored


def _stem(path: str) -> str:
    return posixpath.splitext(posixpath.basename(path))[0]


def _dir_name(path: str, up: int = 1) -> str:
    for _ in range(up):
        path = posixpath.dirname(path)
    return posixpath.basename(path)


# -- LJSpeech -------------------------------------------------------------------------------------
def parse_ljspeech_line(line: str, index: int) -> dict:
    """`id|text|normalized_text` -> row; the normalised column wins when present (LJSpeech convention)."""
    fields = line.rstrip("\r\n").split("|")
    if len(fields) < 2 or not fields[0].strip():
        raise ValueError(f"line {index + 1}: expected id|text|normalized_text, got {line.strip()[:80]!r}")
    if len(fields) > LJSPEECH_FIELDS:  # a "|" inside the text: no way to tell which part is the transcript
        raise ValueError(f"line {index + 1}: {len(fields)} |-separated fields, expected at most "
                         f"{LJSPEECH_FIELDS} (id|text|normalized_text); a '|' in the text? {line.strip()[:80]!r}")
    text = fields[2] if len(fields) > 2 and fields[2].strip() else fields[1]
    return row(fields[0].strip(), text, None, index)


def audio_files_by_id(paths: Iterable[str]) -> dict[str, list[str]]:
    """Audio files (paths of one listing of `wavs/`) -> id (the file's stem) -> its files, in the order
    of AUDIO_EXTENSIONS (`.wav`, `.flac`, `.ogg`, `.mp3`), then by path. Other files are ignored."""
    found: dict[str, list[str]] = {}
    for path in paths:
        if posixpath.splitext(path)[1].lower() in AUDIO_EXTENSIONS:
            found.setdefault(_stem(path), []).append(path)
    for files in found.values():
        files.sort(key=lambda p: (AUDIO_EXTENSIONS.index(posixpath.splitext(p)[1].lower()), p))
    return found


def attach_audio(rows: list[dict], files: dict[str, list[str]]) -> tuple[list[dict], list[dict]]:
    """(rows with the audio file of their id, None where there is none (rejected later as
    missing_audio); an `ambiguous_audio` rejection for each row whose id has several files).

    Two files for one id (`c1.wav` beside `c1.flac`) may hold different speech: which one the
    transcript belongs to cannot be known, so no file is picked.
    """
    kept, ambiguous = [], []
    for r in rows:
        found = files.get(r["id"], [])
        if len(found) > 1:
            ambiguous.append(reject(r["id"], "ambiguous_audio",
                                    f"{len(found)} audio files for this id: {', '.join(found)}; keep one"))
        else:
            kept.append(dict(r, audio=found[0] if found else None))
    return kept, ambiguous


def ljspeech_rows(metadata: str, audio_paths: Iterable[str]) -> LayoutRows:
    """metadata.csv's text and the listing of `wavs/` -> rows. Repeated ids are dropped before the
    audio is attached, so an id with two files is one `ambiguous_audio`, not one per row."""
    items = []
    for i, line in enumerate(l for l in metadata.splitlines() if l.strip()):
        try:
            items.append((i, parse_ljspeech_line(line, i)))
        except ValueError as e:
            items.append((i, e))
    read = split_malformed(items)
    rows, dups = drop_duplicate_ids(read.rows)
    rows, ambiguous = attach_audio(rows, audio_files_by_id(audio_paths))
    return LayoutRows(rows, read.rejected + dups + ambiguous)


# -- VCTK 0.92 --------------------------------------------------------------------------------------
def parse_speaker_info(text: str) -> dict[str, str]:
    """speaker-info.txt (`ID AGE GENDER ACCENTS REGION COMMENTS`, whitespace-separated) -> speaker ->
    "F"/"M". IDs are `p225` in 0.92 and `225` in older releases; both map to `p225`."""
    genders = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[0].upper() == "ID":
            continue
        speaker = f"p{fields[0]}" if fields[0].isdigit() else fields[0]
        genders[speaker] = gender_code(fields[2])
    return genders


def _vctk_audio(paths: Iterable[str]) -> dict[str, dict[str, str]]:
    """`.../pNNN/pNNN_MMM_micK.flac` -> utterance `pNNN_MMM` -> {"micK": path}."""
    found: dict[str, dict[str, str]] = {}
    for path in paths:
        utt, _, mic = _stem(path).rpartition("_")
        if utt and mic.startswith("mic") and posixpath.splitext(path)[1].lower() in AUDIO_EXTENSIONS:
            found.setdefault(utt, {})[mic] = path
    return found


def vctk_rows(transcripts: Mapping[str, str], audio_paths: Iterable[str], speaker_info: str | None) -> LayoutRows:
    """VCTK 0.92: transcripts (`txt/pNNN/pNNN_MMM.txt` path -> its text), the listing of
    `wav48_silence_trimmed/` and speaker-info.txt's text (None: genders unknown) -> one row per
    utterance, with the mic1 recording. Utterances are every id with a transcript or a recording, in
    id order; one with audio and no transcript (all of speaker p315) -> `missing_text`, one with a
    transcript and no mic1 file -> `missing_audio`."""
    texts = {_stem(p): p for p in transcripts}
    audio = _vctk_audio(audio_paths)
    genders = parse_speaker_info(speaker_info) if speaker_info else {}
    rows, rejected = [], []
    for i, utt in enumerate(sorted(texts.keys() | audio.keys())):
        mics, txt = audio.get(utt, {}), texts.get(utt)
        if txt is None:
            heard = mics.get(VCTK_MIC) or next(iter(sorted(mics.values())))
            rejected.append(reject(utt, "missing_text", f"{heard} has no transcript txt/{_dir_name(heard)}/{utt}.txt"))
        elif VCTK_MIC not in mics:
            other = f" (only {', '.join(sorted(mics))}: give it through a manifest)" if mics else ""
            rejected.append(reject(utt, "missing_audio", f"no {VCTK_AUDIO_DIR}/{_dir_name(txt)}/{utt}_{VCTK_MIC}.flac "
                                                         f"for {txt}{other}"))
        else:
            speaker = _dir_name(txt)
            rows.append(row(utt, transcripts[txt].strip(), mics[VCTK_MIC], i, speaker=speaker, language="en",
                            gender=genders.get(speaker, "")))
    return LayoutRows(rows, rejected)


# -- LibriTTS, LibriTTS-R ---------------------------------------------------------------------------
def parse_libritts_speakers(text: str) -> dict[str, str]:
    """SPEAKERS.txt (`;` comments, `READER|GENDER|SUBSET|NAME` with ` | ` separators) -> reader -> "F"/"M"."""
    genders = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|", 2)]  # a NAME may hold a "|" ("|CBW|Simon")
        if line.lstrip().startswith(";") or len(fields) < 2 or not fields[0]:
            continue
        genders[fields[0]] = gender_code(fields[1])
    return genders


def libritts_rows(transcripts: Mapping[str, str], audio_paths: Iterable[str], speakers: str | None) -> LayoutRows:
    """LibriTTS: transcripts (`SPEAKER/CHAPTER/UTT.normalized.txt` path -> its text), the listing of
    every file under the input (a subset, or the root of several) and SPEAKERS.txt's text (None:
    genders unknown) -> one row per utterance in path order. A `.wav` pairs with the
    `.normalized.txt` beside it; a `.wav` without one -> `missing_text`, a transcript without its
    `.wav` -> `missing_audio`. The speaker is the directory two levels up (the id's first field)."""
    wavs = {p[:-len(".wav")]: p for p in audio_paths if p.lower().endswith(".wav")}
    txts = {p[:-len(LIBRITTS_TEXT)]: p for p in transcripts}
    genders = parse_libritts_speakers(speakers) if speakers else {}
    rows, rejected = [], []
    for i, key in enumerate(sorted(wavs.keys() | txts.keys())):
        utt, speaker = posixpath.basename(key), _dir_name(key, 2)
        if key not in txts:
            rejected.append(reject(utt, "missing_text",
                                   f"{wavs[key]} has no transcript {utt}{LIBRITTS_TEXT} beside it"))
        elif key not in wavs:
            rejected.append(reject(utt, "missing_audio", f"{txts[key]} has no {utt}.wav beside it"))
        else:
            rows.append(row(utt, transcripts[txts[key]].strip(), wavs[key], i, speaker=speaker, language="en",
                            gender=genders.get(speaker, "")))
    return LayoutRows(rows, rejected)
