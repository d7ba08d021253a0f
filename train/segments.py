"""Random fixed-length (audio, mel) segments for vocoder training, in pure TF ops (`melshards.audio_segments`).

Mel frame i of a record is centred on its audio sample i * hop_length (preprocess: librosa's
`center=True`), so mel frames [a, a + k) pair with samples [a * hop, (a + k) * hop): HiFi-GAN's
convention. Each record gives one segment of `segment_frames` frames whose start is drawn uniformly
from 0 .. max(mel_len - segment_frames, 0); a record shorter than the segment is taken whole and
padded (mel with the schema's pad value, audio, pitch and energy with 0), its `mask` marking the
valid frames.

The draws come from `tf.data.Dataset.random(seed)`, zipped into each bucket's stream: they are part
of the iterator's state, so a `tf.train.Checkpoint` of the iterator resumes on exactly the segments
an uninterrupted run would have seen, as the trainer's data position does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from melshards.shards_schema import Schema
from melshards.train.config import DataConfig
from melshards.train.input_pipeline import _options, train_dataset
from melshards.train.tf_quiet import tf

PER_FRAME = ("pitch", "energy")  # cropped with the mel where the shards hold them


def uniform(draws):
    """int64 draws of Dataset.random -> float32 in [0, 1), exactly (24 bits)."""
    return tf.cast(draws % (1 << 24), tf.float32) / float(1 << 24)


def crop(batch: dict, u, segment_frames: int, hop_length: int, pad_value: float) -> dict:
    """A batch of one bucket's records [B, F, ...] + uniforms u [B] -> one segment per record:
    {"mel" [B, S, n_mels], "audio" float32 [B, S * hop] in [-1, 1], "mask" bool [B, S], "start" int32
    [B] (the first frame), "speaker_id" [B], and pitch/energy [B, S] where present}."""
    s = segment_frames
    mel, mel_len = batch["mel"], batch["mel_len"]
    b, frames = mel.shape[0], mel.shape[1]
    room = tf.maximum(mel_len - s, 0)
    start = tf.minimum(tf.cast(tf.floor(u * tf.cast(room + 1, tf.float32)), tf.int32), room)
    idx = start[:, None] + tf.range(s)[None, :]  # [B, S] frame indices, < F + S

    def take(x, value):  # [B, F, ...] -> [B, S, ...], frames past F read `value`
        pad = [[0, 0], [0, s]] + [[0, 0]] * (len(x.shape) - 2)
        return tf.gather(tf.pad(x, pad, constant_values=value), idx, batch_dims=1)

    audio = tf.reshape(batch["audio"], [b, frames, hop_length])  # frame i's hop samples start at i * hop
    out = {
        "mel": take(mel, pad_value),
        "audio": tf.reshape(tf.cast(take(audio, 0), tf.float32) / 32767.0, [b, s * hop_length]),
        "mask": tf.sequence_mask(tf.clip_by_value(mel_len - start, 0, s), s),
        "start": start,
        "speaker_id": batch["speaker_id"],
    }
    for name in PER_FRAME:
        if name in batch:
            out[name] = take(batch[name], 0.0)
    return out


def segment_dataset(
    files_by_bucket: Mapping[int, Sequence[str]],
    records: dict[int, int],
    schema: Schema,
    segment_frames: int,
    batch_size: int,
    cfg: DataConfig,
    shuffle: bool,
    repeat: bool,
) -> tf.data.Dataset:
    """Every bucket's records read with its own shapes (the trainer's chain), cropped to segments of
    one shape, the buckets drawn in proportion to their records, batched [batch_size, ...]."""
    schema.require(("audio",), who="audio_segments")
    names = ("mel", "mel_len", "audio", "speaker_id", *(n for n in PER_FRAME if n in schema.optional))
    hop, pad = schema.mel.hop_length, schema.mel.pad_value
    streams = []
    for i, files in sorted(files_by_bucket.items()):
        records_ds = train_dataset(files, schema.buckets[i], cfg, names, None, shuffle=shuffle, repeat=repeat)
        draws = tf.data.Dataset.random(seed=cfg.seed + 7919 * i).batch(cfg.batch_size, drop_remainder=True)
        streams.append(
            tf.data.Dataset.zip(records_ds, draws)
            # one segment per record, the same shape for every bucket
            .map(
                lambda batch, r: crop(batch, uniform(r), segment_frames, hop, pad),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=cfg.deterministic,
            )
            .unbatch()
        )
    weights = [float(records[i]) for i in sorted(files_by_bucket)]
    mixed = (
        streams[0]
        if len(streams) == 1
        else tf.data.Dataset.sample_from_datasets(
            streams, weights=[w / sum(weights) for w in weights], seed=cfg.seed, stop_on_empty_dataset=False
        )
    )
    # static batch dim for a signature-bound step; overlap input with the step
    return mixed.batch(batch_size, drop_remainder=True).prefetch(cfg.prefetch).with_options(_options(cfg))
