"""`melshards inspect --show N`: one record as the trainer will see it, as text and as a mel PNG."""

from __future__ import annotations

import re
import textwrap

import numpy as np
from matplotlib.figure import Figure

from melshards.shards_schema import Schema


def _text(v) -> str:
    return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)


def describe(record: dict, schema: Schema) -> list[str]:
    """Id, text, lengths (of its bucket's padded lengths), and whether the text ids decode back to the text."""
    shapes = schema.bucket_of_file(record["_file"]) or schema  # the largest shapes when the file is unknown
    text_len, mel_len = int(record["text_len"]), int(record["mel_len"])
    decoded = schema.vocab().decode([int(i) for i in record["text_ids"][:text_len]])
    text = _text(record["text"])
    mel = np.asarray(record["mel"])[:mel_len]
    lines = [
        f"{_text(record['id'])}  ({record['_file']}, record {record['_index']})",
        f"  speaker   {_text(record['speaker']) or '(none)'}",
        f"  text      {text}",
        f"  text_len  {text_len} of {shapes.max_text_len} ids; mel_len {mel_len} of {shapes.max_mel_frames} frames "
        f"({mel_len * schema.mel.hop_length / schema.audio.sample_rate:.2f} s)",
        f"  mel       {schema.n_mels} bins, valid frames range {mel.min():.2f}..{mel.max():.2f} "
        f"(log magnitude; padding is {schema.mel.pad_value:.2f})",
    ]
    # The writer drops characters outside the vocabulary, so a mismatch is worth seeing, not an error.
    lines.append("  text_ids  decode to the text" if decoded == text else f"  text_ids  decode to: {decoded}")
    return lines + feature_lines(record, schema, text_len, mel_len)


def feature_lines(record: dict, schema: Schema, text_len: int, mel_len: int) -> list[str]:
    """One line per optional feature the record holds (schema.OPTIONAL_FEATURES)."""
    lines = []
    if "pitch" in record:
        f0 = np.asarray(record["pitch"], np.float32)[:mel_len]
        voiced = f0[f0 > 0]
        lines.append(
            f"  pitch     {voiced.size} of {mel_len} frames voiced"
            + (f", f0 {voiced.min():.1f}..{voiced.max():.1f} Hz, median {np.median(voiced):.1f}" if voiced.size else "")
        )
    if "energy" in record:
        e = np.asarray(record["energy"], np.float32)[:mel_len]
        lines.append(f"  energy    {e.min():.2f}..{e.max():.2f}, mean {e.mean():.2f}")
    if "audio" in record:
        n = int(record["audio_len"])
        lines.append(
            f"  audio     {n} samples ({n / schema.audio.sample_rate:.2f} s) of {len(record['audio'])}, "
            f"peak {np.abs(np.asarray(record['audio'][:n], np.int32)).max() / 32767:.3f}"
        )
    if "durations" in record:
        d = [int(x) for x in record["durations"][:text_len]]
        shown = ", ".join(str(x) for x in d[:12]) + (", ..." if len(d) > 12 else "")
        lines.append(f"  durations {shown} (sum {sum(d)} = mel_len {mel_len})")
    return lines


def mel_figure(record: dict, schema: Schema) -> Figure:
    """The whole padded mel (what the model gets), the end of the valid frames marked."""
    mel = np.asarray(record["mel"], np.float32)
    mel_len = int(record["mel_len"])
    fig = Figure(figsize=(10, 3.8), dpi=100, layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(mel.T, origin="lower", aspect="auto", interpolation="nearest", cmap="magma")
    ax.axvline(mel_len - 0.5, color="white", linestyle="--", linewidth=1)
    ax.set_xlabel(f"frame (valid 0..{mel_len - 1}, padded to {mel.shape[0]})", fontsize=9)
    ax.set_ylabel("mel bin", fontsize=9)
    title = f"{_text(record['id'])}: {_text(record['text'])}"
    ax.set_title("\n".join(textwrap.wrap(title, 130)[:2]), fontsize=9)
    fig.colorbar(im, ax=ax, label="log magnitude")
    return fig


def save_png(record: dict, schema: Schema, f) -> None:
    """`mel_figure` as a PNG into the binary file f, marked as inspect's (its tEXt Software entry,
    `melshards.shards_schema.ownership.PNG_SOFTWARE`: what `inspect --out` may write over)."""
    from melshards.shards_schema.ownership import PNG_SOFTWARE

    mel_figure(record, schema).savefig(f, format="png", dpi=100, metadata={"Software": PNG_SOFTWARE})


_KEPT = re.compile(r"[A-Za-z0-9.-]")  # what a PNG's name keeps of a clip id as it is


def png_name(clip_id: str) -> str:
    """A file name (without .png) for a clip id, safe on every filesystem and one to one: letters,
    digits, '.' and '-' stay, every other character (`_` and `/` included) becomes its UTF-8 bytes as
    `_xx` (hex), so `a/b` gives `a_2fb` and `a_b` gives `a_5fb`. An empty id gives `_`, which no other
    id gives."""
    if not clip_id:
        return "_"
    return "".join(c if _KEPT.fullmatch(c) else "".join(f"_{b:02x}" for b in c.encode()) for c in clip_id)


def png_names(records: list[dict]) -> list[str]:
    """`png_name` of each record's id, distinct even on a case-insensitive filesystem: a name already
    taken in the list (the same id twice, e.g. from two runs, or ids that differ in case only) gets
    `_+2`, `_+3`, ..., which no `png_name` holds."""
    taken: set[str] = set()
    names = []
    for record in records:
        base = name = png_name(_text(record["id"]))
        k = 1
        while name.casefold() in taken:
            k += 1
            name = f"{base}_+{k}"
        taken.add(name.casefold())
        names.append(name)
    return names
