"""`melshards synthesize`: text -> the trained model's mel (melshards.train.synthesize) -> Griffin-Lim -> WAV.

The vocoder is librosa's Griffin-Lim with the schema's own STFT and mel settings: audio is this
command's business, the trainer stops at the mel.
"""

from __future__ import annotations

import io
import os
import posixpath

import click
import numpy as np

from melshards.commands import check_output_file, setup_logging
from melshards.shards_schema import Schema, SchemaError
from melshards.shards_schema.config import ConfigError


def min_frames(schema: Schema) -> int:
    """Fewest mel frames Griffin-Lim can invert: the signal they span must hold one FFT window.

    With centred frames, n frames span (n - 1) * hop_length samples.
    """
    m = schema.mel
    return -(-m.n_fft // m.hop_length) + 1


def check_spoke(frames: int, schema: Schema) -> None:
    """Refuse a mel too short to be speech (an undertrained model's stop token fires at once)."""
    needed = min_frames(schema)
    if frames < needed:
        raise click.ClickException(
            f"the model stopped before speaking: it produced {frames} mel frame{'s' * (frames != 1)}, fewer "
            f"than the {needed} that one FFT window ({schema.mel.n_fft} samples) needs. Train it for more "
            "steps (the stop token has not learned when speech ends), then synthesize again"
        )


def griffin_lim(log_mel: np.ndarray, schema: Schema, n_iter: int) -> np.ndarray:
    """[frames, n_mels] natural-log mel -> waveform, with the schema's STFT and mel parameters."""
    from melshards.preprocess.clip.audio import load_librosa

    librosa = load_librosa()  # numba's caches compiled by one process at a time
    m = schema.mel
    mel = np.exp(log_mel.T.astype(np.float64))  # the shards hold log(max(mel, floor))
    # librosa.feature.inverse.mel_to_audio in two steps, to fix Griffin-Lim's random initial phases:
    # the same mel then gives the same WAV
    stft = librosa.feature.inverse.mel_to_stft(
        mel, sr=schema.audio.sample_rate, n_fft=m.n_fft, power=m.power, fmin=m.fmin, fmax=m.fmax
    )
    y = librosa.griffinlim(
        stft,
        n_iter=n_iter,
        hop_length=m.hop_length,
        win_length=m.win_length,
        n_fft=m.n_fft,
        center=True,
        random_state=0,
    )
    peak = float(np.max(np.abs(y))) if y.size else 0.0
    return (0.95 * y / peak if peak > 0 else y).astype(np.float32)


def check_wav_target(output: str) -> None:
    """Refuse (exit 2), before any work, an -o that is not a .wav path, cannot be written, or holds a file
    this command did not write (`melshards.shards_schema.ownership`): only its own WAVs are written over."""
    from melshards.shards_schema.ownership import WAV, NotOurs, check_may_write

    check_output_file("-o", output, "out.wav")
    if not output.lower().endswith(".wav"):
        raise click.UsageError(f"-o {output}: synthesize writes a WAV file; pass a path ending in .wav")
    try:
        check_may_write("-o", output, WAV)
    except NotOurs as e:
        raise click.UsageError(str(e)) from e


def check_export_target(export_dir: str) -> None:
    """Refuse (exit 2), before any work, an --export that is a file or a directory holding files other
    than a SavedModel this command exported (its `EXPORT_MARK`)."""
    from melshards.shards_schema.ownership import EXPORT_MARK, NotOurs, check_may_fill_dir

    try:
        check_may_fill_dir(
            "--export", export_dir, EXPORT_MARK, "a SavedModel dir `melshards synthesize --export` wrote"
        )
    except NotOurs as e:
        raise click.UsageError(str(e)) from e


def write_wav(output: str, y: np.ndarray, sample_rate: int) -> None:
    """16-bit PCM WAV whose RIFF INFO software entry marks it as this command's (what -o may write over),
    written beside output and moved over it whole: a failed write is exit 2 with the reason and leaves
    output as it was."""
    import soundfile as sf

    from melshards.shards_schema.atomic import atomic_write
    from melshards.shards_schema.ownership import WAV_SOFTWARE

    head, name = os.path.split(os.path.abspath(output))
    partial = os.path.join(head, f".{name}.melshards-{os.getpid()}.partial")  # created with the umask's mode
    try:
        wav = io.BytesIO()  # encoded in memory: a file object's write errors would reach libsndfile through
        with sf.SoundFile(wav, "w", sample_rate, 1, subtype="PCM_16", format="WAV") as f:  # a callback, unseen
            f.software = WAV_SOFTWARE
            f.write(y)
        with atomic_write(output, temp=partial) as out:  # the partial file is removed when this raises
            out.write(wav.getvalue())
            check_wav_target(output)  # again: a file may have been put there while the model spoke
    except (OSError, RuntimeError, click.UsageError) as e:  # RuntimeError: soundfile's LibsndfileError (a full disk)
        if isinstance(e, click.UsageError):
            raise
        raise click.UsageError(f"-o {output}: cannot write it ({e}); pass a writable file path") from e


def reference_from(path: str, schema) -> tuple:
    """`--reference WAV` -> (log-mel [frames, n_mels], valid frames) by the preprocess mel
    (`melshards.preprocess.write.other_clip_references.reference_of_wav`); UsageError for audio it cannot use."""
    from melshards.preprocess.clip.clips import ClipRejected
    from melshards.preprocess.write.other_clip_references import reference_of_wav

    if not schema.reference_frames:
        raise click.UsageError(
            f"--reference {path}: this model's shards have no references, so it reads none; leave out "
            "--reference, or train a model that reads references on a run with reference.source: other_clip "
            "or same_clip"
        )
    try:
        return reference_of_wav(path, schema)
    except ClipRejected as e:
        raise click.UsageError(f"--reference {path}: {e.reason} ({e.detail})") from e


@click.command("synthesize", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("text")
@click.option("--model-dir", required=True, help="A `melshards train` --model-dir (newest checkpoint is used).")
@click.option(
    "-o",
    "--output",
    required=True,
    help="WAV file to write (.wav); an existing file is written over only if synthesize wrote it.",
)
@click.option(
    "--griffin-lim-iters", default=32, show_default=True, type=click.IntRange(min=1), help="Griffin-Lim iterations."
)
@click.option(
    "--speaker", default=None, help="Speaker name, as schema.json's speakers table has it (default: the only speaker)."
)
@click.option(
    "--language",
    default=None,
    help="Language code, as schema.json's languages table has it (default: the only language).",
)
@click.option(
    "--reference",
    default=None,
    help="A WAV to speak in the voice of, for a model that reads references (examples/reference_tts.py); its "
    "log-mel is computed as `melshards preprocess` computes the shards' (the first reference frames).",
)
@click.option(
    "--export",
    "export_dir",
    default=None,
    help="Also save the generator as a SavedModel here (serving signature: text, speaker name, "
    "language code -> mel; for a model that reads references also `serving_with_reference`, taking a "
    "reference log-mel and its valid frames); an existing DIR is written into only if it is empty or an "
    "earlier --export.",
)
def synthesize_command(text, model_dir, output, griffin_lim_iters, speaker, language, reference, export_dir) -> None:
    """Speak TEXT with the model in --model-dir and write a WAV (Griffin-Lim vocoder)."""
    setup_logging()
    from melshards.shards_schema import SCHEMA_FILE, read_schema
    from melshards.shards_schema.text import TextRejected
    from melshards.train.errors import CheckpointError, RestoreError
    from melshards.train.synthesize import (
        REFERENCE_SIGNATURE,
        check_model_dir,
        checkpoint_to_restore,
        load_synthesizer,
        normalise,
        padded_text_ids,
        pick_language,
        pick_speaker,
    )

    # every check that needs no model first, and nothing created before they pass: loading and
    # compiling the model takes a while
    check_wav_target(output)
    if export_dir:
        check_export_target(export_dir)
    try:
        check_model_dir(model_dir)
        schema = read_schema(posixpath.join(model_dir, SCHEMA_FILE))
        who, lang = pick_speaker(schema, speaker), pick_language(schema, language)
        normalised = normalise(text, lang)
        ids, n = padded_text_ids(normalised, schema)
        checkpoint = checkpoint_to_restore(model_dir)
        voice = None if reference is None else reference_from(reference, schema)
    except TextRejected as e:
        raise click.UsageError(
            f"TEXT refused ({e.reason}): {e.detail}. `melshards preprocess` rejects such "
            "transcripts too, so the model never learnt them; pass text with words in it"
        ) from e
    except (SchemaError, ConfigError, CheckpointError) as e:
        raise click.UsageError(str(e)) from e
    out_dir = os.path.dirname(os.path.abspath(output))
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise click.UsageError(f"-o {output}: cannot create its directory {out_dir} ({e})") from e
    try:
        synth = load_synthesizer(model_dir, checkpoint)
    except (SchemaError, ConfigError) as e:
        raise click.UsageError(str(e)) from e
    except RestoreError as e:
        raise click.ClickException(str(e)) from e
    try:
        out = synth.speak(ids, n, who, lang, voice)
    except ValueError as e:
        raise click.UsageError(f"--reference {reference}: {e}") from e
    frames = int(out["mel_len"][0])
    check_spoke(frames, synth.schema)
    mel = out["mel"][0, :frames].numpy()
    y = griffin_lim(mel, synth.schema, griffin_lim_iters)
    write_wav(output, y, synth.schema.audio.sample_rate)
    click.echo(
        f"{normalised!r} ({who.name}, {lang.code}): {frames} mel frames -> {len(y) / synth.schema.audio.sample_rate:.2f} s "
        f"of audio at {synth.schema.audio.sample_rate} Hz -> {output}"
    )
    if export_dir:
        synth.export(export_dir)
        with_reference = (
            f", and {REFERENCE_SIGNATURE} (text, speaker, language, reference_mel, reference_len -> mel, mel_len)"
            if synth.serve_with_reference is not None
            else ""
        )
        click.echo(
            f"SavedModel with a serving signature (text, speaker, language -> mel, mel_len){with_reference} "
            f"-> {export_dir}"
        )
