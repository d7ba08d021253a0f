"""Preprocessing fixtures: small audio files in the formats libsndfile reads, made from a numpy tone."""
from __future__ import annotations

import io

import numpy as np
import soundfile as sf

# Bytes after the 4-byte frame header where the Xing/Info tag sits: MPEG-2 mono (libsndfile's MP3
# writer at 22.05 or 16 kHz), MPEG-2 stereo / MPEG-1 mono, MPEG-1 stereo.
_TAG_OFFSETS = (13, 21, 36)


def tone(seconds: float, sr: int = 22050, hz: float = 220.0, lead_silence_s: float = 0.0) -> np.ndarray:
    """A 0.5-amplitude sine, after `lead_silence_s` of digital silence."""
    t = np.arange(int(seconds * sr)) / sr
    y = 0.5 * np.sin(2 * np.pi * hz * t) * (1 + 0.3 * np.sin(2 * np.pi * 3 * t))
    return np.concatenate([np.zeros(int(lead_silence_s * sr)), y]).astype(np.float32)


def encode(y: np.ndarray, sr: int, fmt: str) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, y, sr, format=fmt)
    return buf.getvalue()


def mpeg2_layer3_frame_length(header: bytes) -> int:
    """Bytes in one MPEG-2 Layer III frame (the kind libsndfile writes at 22.05/16 kHz)."""
    assert header[0] == 0xFF and (header[1] >> 3) & 3 == 2 and (header[1] >> 1) & 3 == 1, header[:2].hex()
    kbps = (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)[header[2] >> 4]
    sr = (22050, 24000, 16000)[(header[2] >> 2) & 3]
    return 72000 * kbps // sr + ((header[2] >> 1) & 1)


def mp3_without_length_tag(y: np.ndarray, sr: int = 22050) -> bytes:
    """An MP3 with no Xing/Info header, as many encoders and stream rips write it.

    libsndfile's writer puts the length in a Xing tag in the first frame; dropping that frame leaves
    mpg123 to estimate the length from the bitrate of the first audio frame. After leading silence
    (a low-bitrate frame) the estimate is several times the real length.
    """
    data = encode(y, sr, "MP3")
    assert any(data[o:o + 4] in (b"Xing", b"Info") for o in _TAG_OFFSETS), "expected a Xing tag to strip"
    return data[mpeg2_layer3_frame_length(data[:4]):]
