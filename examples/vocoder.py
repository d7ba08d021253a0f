"""A small vocoder training loop on `melshards.audio_segments`: mel -> waveform, XLA-compiled, one trace.

    python -m examples.vocoder --shards 'out/fs2/shards/train-*.tfrecord' --steps 200

The shards must hold audio (`features.audio: true` in the preprocess config). Each step reads random
(mel, audio) segments of `--segment-frames` frames, generates `segment_frames * hop` samples from the
mel with a stack of transposed convolutions (strides whose product is hop_length), and minimises a
multi-resolution STFT magnitude L1 (linear and log magnitude, Yamamoto et al. 2020) over the valid
samples. A loop to start from, not HiFi-GAN: no discriminators. The step is
`tf.function(input_signature=..., jit_compile=True)` over the segments' static specs, so it traces once.
"""

from __future__ import annotations

import argparse
import json

import keras
import tensorflow as tf

import melshards

RESOLUTIONS = ((512, 128), (1024, 256), (256, 64))  # (fft size, hop) of the STFT loss


def strides_for(hop_length: int) -> list[int]:
    """Upsampling strides whose product is hop_length, each at most 8 (256 -> [8, 8, 4])."""
    out, rest = [], hop_length
    while rest > 1:
        s = next(f for f in (8, 4, 2, 3, 5, 7) if rest % f == 0) if rest % 8 else 8
        out.append(s)
        rest //= s
    return out


def generator(n_mels: int, hop_length: int, channels: int = 32) -> keras.Model:
    mel = keras.Input([None, n_mels])
    x = keras.layers.Conv1D(channels, 7, padding="same")(mel)
    for s in strides_for(hop_length):
        channels = max(channels // 2, 8)
        x = keras.layers.LeakyReLU(0.1)(x)
        x = keras.layers.Conv1DTranspose(channels, 2 * s, strides=s, padding="same")(x)
        x = x + keras.layers.Conv1D(channels, 3, padding="same", activation="relu")(x)
    audio = keras.layers.Conv1D(1, 7, padding="same", activation="tanh")(keras.layers.LeakyReLU(0.1)(x))
    return keras.Model(mel, audio[..., 0])


def stft_loss(fake, real, weights):
    """Mean over resolutions of the L1 of STFT magnitudes and log magnitudes, frames weighted by `weights`
    (the share of valid samples each STFT frame covers is approximated by its first sample's)."""
    total = 0.0
    for n_fft, hop in RESOLUTIONS:

        def mag(x, n_fft=n_fft, hop=hop):
            return tf.abs(tf.signal.stft(x, n_fft, hop, n_fft, pad_end=True)) + 1e-5

        f, r = mag(fake), mag(real)
        w = weights[:, ::hop][:, : f.shape[1], None]
        n = tf.maximum(tf.reduce_sum(w) * f.shape[2], 1.0)
        total += (tf.reduce_sum(tf.abs(f - r) * w) + tf.reduce_sum(tf.abs(tf.math.log(f) - tf.math.log(r)) * w)) / n
    return total / len(RESOLUTIONS)


def make_step(model: keras.Model, optimizer, spec: dict, normalise, hop_length: int):
    @tf.function(input_signature=[{k: spec[k] for k in ("mel", "audio", "mask")}], jit_compile=True)
    def step(batch):
        weights = tf.cast(tf.repeat(batch["mask"], hop_length, axis=1), tf.float32)  # [B, S * hop]
        with tf.GradientTape() as tape:
            fake = model(normalise(batch["mel"]), training=True) * weights
            loss = stft_loss(fake, batch["audio"] * weights, weights)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return step


def train(shards: str, steps: int, segment_frames: int = 32, batch_size: int = 4, seed: int = 0) -> dict:
    """Train for `steps` steps; returns {"losses": [...], "traces": n}."""
    data = melshards.audio_segments(shards, segment_frames, batch_size, seed=seed)
    schema = melshards.read_schema(shards.rsplit("/", 1)[0])
    model = generator(schema.n_mels, schema.mel.hop_length)
    optimizer = keras.optimizers.Adam(2e-4)
    optimizer.build(model.trainable_variables)
    step = make_step(model, optimizer, data.element_spec, melshards.normalizer(schema), schema.mel.hop_length)
    losses = [float(step({k: batch[k] for k in ("mel", "audio", "mask")})) for batch in data.take(steps)]
    return {"losses": losses, "traces": step.experimental_get_tracing_count()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", required=True, help="shard glob of a run with audio, e.g. 'DIR/train-*.tfrecord'")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--segment-frames", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = train(args.shards, args.steps, args.segment_frames, args.batch_size, args.seed)
    print(json.dumps({"first_loss": out["losses"][0], "last_loss": out["losses"][-1], "traces": out["traces"]}))


if __name__ == "__main__":
    main()
