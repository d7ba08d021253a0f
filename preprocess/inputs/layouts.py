"""One reader per corpus layout: a pure function from the layout's file listings and file texts to
items, rows and rejections in input order (`melshards.preprocess.inputs.rows`), yielded as they are read. No
I/O here: `melshards.preprocess.inputs.sources` lists and reads the files through Beam's FileSystems and
calls these; docs/corpora.md describes each layout.

- LJSpeech: `metadata.csv` (`id|text|normalized_text`) + `wavs/<id>.{wav,flac,ogg,mp3}`.
- VCTK 0.92: `txt/pNNN/pNNN_MMM.txt` + `wav48_silence_trimmed/pNNN/pNNN_MMM_mic1.flac`, `speaker-info.txt`.
- LibriTTS / LibriTTS-R: `[SUBSET/]SPEAKER/CHAPTER/UTT.wav` + `UTT.normalized.txt`, `SPEAKERS.txt`.
- Manifests and Common Voice TSVs: `melshards.preprocess.inputs.manifests`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator, Mapping, MutableMapping

from melshards.preprocess.inputs.rows import (
    bare_lines,
    file_stem,
    gender_code,
    is_rejection,
    reject,
    row,
    split_malformed,
    unique_ids,
)

FORMATS = (
    "ljspeech",
    "manifest",
    "vctk",
    "libritts",
    "commonvoice",
    "parquet",
    "webdataset",
)  # --format; sources.LAYOUTS reads each
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3")
LJSPEECH_FIELDS = 3  # id|text|normalized_text
VCTK_AUDIO_DIR = "wav48_silence_trimmed"
VCTK_MIC = "mic1"  # the omnidirectional DPA 4035; mic2 (Sennheiser MKH 800) only through a manifest
LIBRITTS_TEXT = ".normalized.txt"  # `.original.txt` (unnormalised, with digits and abbreviations) is ignored


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
        raise ValueError(
            f"line {index + 1}: {len(fields)} |-separated fields, expected at most "
            f"{LJSPEECH_FIELDS} (id|text|normalized_text); a '|' in the text? {line.strip()[:80]!r}"
        )
    text = fields[2] if len(fields) > 2 and fields[2].strip() else fields[1]
    return row(fields[0].strip(), text, None, index)


def audio_files(paths: Iterable[str]) -> Iterator[tuple[str, int, str]]:
    """Audio files (paths of one listing of `wavs/`) -> (id: the file's stem, rank: its extension's
    place in AUDIO_EXTENSIONS (`.wav`, `.flac`, `.ogg`, `.mp3`), path); other files are left out.
    `working_set.WorkingSet.lists` turns them into the mapping `attach_audio` takes."""
    for path in paths:
        ext = posixpath.splitext(path)[1].lower()
        if ext in AUDIO_EXTENSIONS:
            yield file_stem(path), AUDIO_EXTENSIONS.index(ext), path


def attach_audio(items: Iterable[dict], files: Mapping[str, list[str]]) -> Iterator[dict]:
    """Rows with the audio file of their id (None where there is none: rejected later as
    missing_audio), or an `ambiguous_audio` rejection for a row whose id has several files;
    rejections pass.

    Two files for one id (`c1.wav` beside `c1.flac`) may hold different speech: which one the
    transcript belongs to cannot be known, so no file is picked.
    """
    for r in items:
        if is_rejection(r):
            yield r
            continue
        found = files.get(r["id"], [])
        if len(found) > 1:
            yield reject(
                r["id"], "ambiguous_audio", f"{len(found)} audio files for this id: {', '.join(found)}; keep one"
            )
        else:
            yield dict(r, audio=found[0] if found else None)


def _parsed_ljspeech(lines: Iterable[str]) -> Iterator[tuple[int, dict | Exception]]:
    for i, line in enumerate(bare_lines(lines)):
        try:
            yield i, parse_ljspeech_line(line, i)
        except ValueError as e:
            yield i, e


def ljspeech_rows(
    lines: Iterable[str], files: Mapping[str, list[str]], first: MutableMapping[str, int]
) -> Iterator[dict]:
    """metadata.csv's lines and its audio files by id (`audio_files` of the listing of `wavs/`, each
    id's files by rank) -> items. Repeated ids are dropped (`first`: as `rows.unique_ids` takes it)
    before the audio is attached, so an id with two files is one `ambiguous_audio`, not one per row."""
    return attach_audio(unique_ids(split_malformed(_parsed_ljspeech(lines)), first), files)


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
        utt, _, mic = file_stem(path).rpartition("_")
        if utt and mic.startswith("mic") and posixpath.splitext(path)[1].lower() in AUDIO_EXTENSIONS:
            found.setdefault(utt, {})[mic] = path
    return found


def vctk_rows(transcripts: Mapping[str, str], audio_paths: Iterable[str], speaker_info: str | None) -> Iterator[dict]:
    """VCTK 0.92: transcripts (`txt/pNNN/pNNN_MMM.txt` path -> its text), the listing of
    `wav48_silence_trimmed/` and speaker-info.txt's text (None: genders unknown) -> one row per
    utterance, with the mic1 recording. Utterances are every id with a transcript or a recording, in
    id order; one with audio and no transcript (all of speaker p315) -> `missing_text`, one with a
    transcript and no mic1 file -> `missing_audio`."""
    texts = {file_stem(p): p for p in transcripts}
    audio = _vctk_audio(audio_paths)
    genders = parse_speaker_info(speaker_info) if speaker_info else {}
    for i, utt in enumerate(sorted(texts.keys() | audio.keys())):
        mics, txt = audio.get(utt, {}), texts.get(utt)
        if txt is None:
            heard = mics.get(VCTK_MIC) or next(iter(sorted(mics.values())))
            yield reject(utt, "missing_text", f"{heard} has no transcript txt/{_dir_name(heard)}/{utt}.txt")
        elif VCTK_MIC not in mics:
            other = f" (only {', '.join(sorted(mics))}: give it through a manifest)" if mics else ""
            yield reject(
                utt, "missing_audio", f"no {VCTK_AUDIO_DIR}/{_dir_name(txt)}/{utt}_{VCTK_MIC}.flac for {txt}{other}"
            )
        else:
            speaker = _dir_name(txt)
            yield row(
                utt,
                transcripts[txt].strip(),
                mics[VCTK_MIC],
                i,
                speaker=speaker,
                language="en",
                gender=genders.get(speaker, ""),
            )


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


def libritts_rows(transcripts: Mapping[str, str], audio_paths: Iterable[str], speakers: str | None) -> Iterator[dict]:
    """LibriTTS: transcripts (`SPEAKER/CHAPTER/UTT.normalized.txt` path -> its text), the listing of
    every file under the input (a subset, or the root of several) and SPEAKERS.txt's text (None:
    genders unknown) -> one row per utterance in path order. A `.wav` pairs with the
    `.normalized.txt` beside it; a `.wav` without one -> `missing_text`, a transcript without its
    `.wav` -> `missing_audio`. The speaker is the directory two levels up (the id's first field)."""
    wavs = {p[: -len(".wav")]: p for p in audio_paths if p.lower().endswith(".wav")}
    txts = {p[: -len(LIBRITTS_TEXT)]: p for p in transcripts}
    genders = parse_libritts_speakers(speakers) if speakers else {}
    for i, key in enumerate(sorted(wavs.keys() | txts.keys())):
        utt, speaker = posixpath.basename(key), _dir_name(key, 2)
        if key not in txts:
            yield reject(utt, "missing_text", f"{wavs[key]} has no transcript {utt}{LIBRITTS_TEXT} beside it")
        elif key not in wavs:
            yield reject(utt, "missing_audio", f"{txts[key]} has no {utt}.wav beside it")
        else:
            yield row(
                utt,
                transcripts[txts[key]].strip(),
                wavs[key],
                i,
                speaker=speaker,
                language="en",
                gender=genders.get(speaker, ""),
            )
