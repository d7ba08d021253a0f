"""Phone durations from Montreal Forced Aligner TextGrids, as pure functions (docs/preprocess.md,
Durations from forced alignments).

- **Where.** `DIR/<clip id>.TextGrid`, else `DIR/<speaker>/<clip id>.TextGrid` (MFA's output mirrors
  its input's speaker folders); local or gs:// (Beam FileSystems).
- **Reading.** praatio parses the text (`praatio.utilities.textgrid_io.parseTextgridStr`, long or
  short format, UTF-8 or UTF-16); tiers `words` and `phones` must both be there.
- **Silence.** MFA writes silence as unlabelled stretches (gaps between intervals, or empty labels),
  and older versions as `sil` or `sp`. Each becomes the one symbol `sil`; neighbouring silences merge.
  `spn` (spoken noise: a word the dictionary lacks) stays a phone of its own. A silence at either
  end that gets no frame once the clip is trimmed is dropped; an internal one is kept. A phones tier
  of silence alone (the aligner found no speech) is unusable: AlignmentError.
- **Zero-length phones.** A phone interval whose start is its end stays in the sequence, with 0
  frames: dropping it would change the clip's phones (the words' pronunciation) without a word, and
  the frames are the aligner's to give. A zero-length silence is no phone and is dropped.
- **Durations.** Mel frame i is centred on sample `trim_start + i * hop` of the untrimmed clip
  (librosa's `center=True`); it belongs to the phone whose interval holds that sample. With phone k
  ending at sample `e_k = round(end_k * sr)`, its frames end at
  `b_k = clamp(ceil((e_k - trim_start) / hop), 0, frames)`, and the last boundary is `frames`, so the
  durations `b_k - b_(k-1)` sum to the mel's frame count exactly. Every boundary is rounded on its
  own from absolute times, so the error never accumulates over a long clip (at most one frame each).
- **Mismatch.** A TextGrid whose end differs from the untrimmed audio's by more than the tolerance
  belongs to other audio (`alignment_mismatch`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from apache_beam.io.filesystems import FileSystems

SIL = "sil"
SILENCES = frozenset({"", "sil", "sp", "<eps>"})
TIERS = ("words", "phones")


class AlignmentError(ValueError):
    """The TextGrid cannot be used: not a TextGrid, a tier missing, intervals overlapping."""


@dataclasses.dataclass(frozen=True)
class Alignment:
    """The phones tier, gaps filled as silence and silences merged: (start_s, end_s, label) covering
    [0, end_s] without holes."""

    phones: tuple[tuple[float, float, str], ...]
    end_s: float


def textgrid_path(alignments_dir: str, clip_id: str, speaker: str) -> str | None:
    """The clip's TextGrid: DIR/ID.TextGrid, else DIR/SPEAKER/ID.TextGrid; None if neither exists."""
    candidates = [FileSystems.join(alignments_dir, f"{clip_id}.TextGrid")]
    if speaker:
        candidates.append(FileSystems.join(alignments_dir, speaker, f"{clip_id}.TextGrid"))
    return next((p for p in candidates if FileSystems.exists(p)), None)


def _decode(data: bytes) -> str:
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):  # Praat writes UTF-16 with a byte-order mark
        return data.decode("utf-16")
    return data.decode("utf-8-sig")


def _filled(entries, end: float) -> list[tuple[float, float, str]]:
    """Intervals with the gaps between them (and at both ends) as silence, consecutive silences merged."""
    out: list[list] = []

    def add(start: float, stop: float, label: str) -> None:
        if stop < start or stop == start and label == SIL:  # a zero-length phone stays (module docstring)
            return
        if label == SIL and out and out[-1][2] == SIL:
            out[-1][1] = stop
        else:
            out.append([start, stop, label])

    t = 0.0
    for start, stop, label in entries:
        if start < t - 1e-9:
            raise AlignmentError(f"the phones tier's intervals overlap at {start:.3f} s")
        add(t, start, SIL)
        add(start, stop, SIL if label.strip() in SILENCES else label.strip())
        t = stop
    add(t, end, SIL)
    return [tuple(x) for x in out]


def read_phones(data: bytes, where: str = "TextGrid") -> Alignment:
    """TextGrid bytes -> its phones (see the module docstring); AlignmentError if unusable."""
    from praatio.utilities.textgrid_io import parseTextgridStr

    try:
        parsed = parseTextgridStr(_decode(data), includeEmptyIntervals=False)
        tiers = {t["name"]: t for t in parsed["tiers"]}
        end = float(parsed["xmax"])
    except AlignmentError:
        raise
    except Exception as e:  # noqa: BLE001 (praatio raises IndexError, ValueError, ... on text it cannot read)
        raise AlignmentError(f"{where} is not a TextGrid praatio can read ({type(e).__name__}: {e})") from e
    missing = [name for name in TIERS if name not in tiers]
    if missing:
        raise AlignmentError(
            f"{where} has no {' or '.join(repr(m) for m in missing)} tier (it has "
            f"{sorted(tiers)}); give the TextGrids Montreal Forced Aligner writes"
        )
    if tiers["phones"].get("class") != "IntervalTier":
        raise AlignmentError(f"{where}: the phones tier is not an interval tier")
    entries = sorted((float(s), float(e), str(label)) for s, e, label in tiers["phones"]["entries"])
    phones = _filled(entries, end)
    if all(label == SIL for _, _, label in phones):
        labels = ", ".join(repr(label) for label in sorted({label for _, _, label in entries})) or "no interval"
        raise AlignmentError(
            f"{where}: the phones tier holds only silence ({labels}): the aligner found no "
            "speech in this clip; re-run it, or leave the clip out"
        )
    return Alignment(tuple(phones), end)


def phone_durations(
    alignment: Alignment, trim_start: int, trimmed_samples: int, sample_rate: int, hop_length: int
) -> tuple[tuple[str, ...], np.ndarray]:
    """(phones, mel frames per phone, int32) of the trimmed clip: durations sum to
    `1 + trimmed_samples // hop_length`, the mel's frame count (rule in the module docstring)."""
    frames = 1 + trimmed_samples // hop_length
    phones = list(alignment.phones)
    ends = np.array([int(round(end * sample_rate)) for _, end, _ in phones], np.int64) - trim_start
    bounds = np.clip(-(-ends // hop_length), 0, frames)  # ceil division on integers: exact
    bounds[-1] = frames
    durations = np.diff(np.concatenate([[0], bounds]))
    keep = np.ones(len(phones), bool)
    for i in (0, len(phones) - 1):  # an edge silence trimmed away entirely
        if phones[i][2] == SIL and durations[i] == 0:
            keep[i] = False
    if not keep.any():
        raise AlignmentError("no phone of the TextGrid falls in the trimmed audio")
    return tuple(p[2] for p, k in zip(phones, keep) if k), durations[keep].astype(np.int32)


def mismatch(alignment: Alignment, untrimmed_samples: int, sample_rate: int, tolerance_ms: float) -> str | None:
    """None if the TextGrid ends within `tolerance_ms` of the untrimmed audio, else what differs."""
    audio_s = untrimmed_samples / sample_rate
    if abs(alignment.end_s - audio_s) * 1000 <= tolerance_ms:
        return None
    return (
        f"the TextGrid ends at {alignment.end_s:.3f} s, the audio at {audio_s:.3f} s (tolerance "
        f"{tolerance_ms:g} ms): it aligns other audio; re-run the aligner on this corpus"
    )
