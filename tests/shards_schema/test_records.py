"""The record codec: the writer's own Example encoder and TFRecord framing, against TensorFlow's.
TensorFlow is imported by the tests that use it: collecting this file does not pay for it."""

from __future__ import annotations

import numpy as np
import pytest

from melshards.shards_schema import Schema, SchemaError
from melshards.shards_schema.records import decode_parsed, encode_example, frame_record, parse_spec

FEATURES = Schema.feature_table(max_text_len=16, max_mel_frames=24, n_mels=8)


def _values(rng, text="héllo, wörld", text_len=5, mel_len=24) -> dict:
    return {
        "id": "LJ001-0001",
        "speaker": "p225",
        "speaker_id": 7,
        "language": "de",
        "language_id": 1,
        "text": text,
        "text_ids": rng.integers(-3, 40, 16),
        "text_len": text_len,
        "mel": rng.normal(size=(24, 8)),
        "mel_len": mel_len,
    }


def _reference(values) -> bytes:
    """The same record built with TensorFlow's protos, as the writer did before it stopped importing TF."""
    import tensorflow as tf

    def b(raw):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[raw]))

    def i(n):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[n]))

    feats = {
        "id": b(values["id"].encode()),
        "speaker": b(values["speaker"].encode()),
        "speaker_id": i(values["speaker_id"]),
        "language": b(values["language"].encode()),
        "language_id": i(values["language_id"]),
        "text": b(values["text"].encode()),
        "text_ids": b(np.asarray(values["text_ids"]).astype("<i2").tobytes()),
        "text_len": i(values["text_len"]),
        "mel": b(np.asarray(values["mel"]).astype("<f2").tobytes()),
        "mel_len": i(values["mel_len"]),
    }
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString(deterministic=True)


@pytest.mark.parametrize("text_len,mel_len", [(0, 0), (5, 24), (-5, 2**40), (127, 128), (300, 16384)])
def test_encoder_bytes_equal_tensorflows_example_serialisation(text_len, mel_len):
    rng = np.random.default_rng(text_len + mel_len)
    values = _values(rng, text_len=text_len, mel_len=mel_len)
    assert encode_example(FEATURES, values) == _reference(values)


def test_framed_records_read_back_through_tf_data_with_the_schemas_parse_spec(tmp_path):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    values = [_values(rng, text="", mel_len=n) for n in (1, 7, 24)]
    path = tmp_path / "x.tfrecord"
    path.write_bytes(b"".join(frame_record(encode_example(FEATURES, v)) for v in values) + frame_record(b""))
    raws = [r.numpy() for r in tf.data.TFRecordDataset(str(path))]
    assert raws[-1] == b"" and len(raws) == 4  # framing holds for any payload, empty included
    schema = Schema.from_dict(
        _schema_dict([dict(name=f.name, dtype=f.dtype, shape=list(f.shape), storage=f.storage) for f in FEATURES])
    )
    parsed = decode_parsed(schema, tf.io.parse_example(tf.constant(raws[:3]), parse_spec(schema)), 3)
    assert parsed["mel_len"].numpy().tolist() == [1, 7, 24]
    np.testing.assert_array_equal(parsed["mel"].numpy()[1], np.asarray(values[1]["mel"], np.float16))
    np.testing.assert_array_equal(parsed["text_ids"].numpy()[2], values[2]["text_ids"])
    assert parsed["speaker_id"].numpy().tolist() == [7] * 3 and parsed["language"].numpy().tolist() == [b"de"] * 3


def test_a_damaged_frame_is_a_data_loss_error_in_tf_data(tmp_path):
    import tensorflow as tf

    framed = bytearray(frame_record(b"payload"))
    framed[14] ^= 1  # a bit of the payload: its CRC no longer matches
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(bytes(framed))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(path)))


def test_encoder_refuses_wrong_shapes_and_missing_features():
    values = _values(np.random.default_rng(1))
    with pytest.raises(SchemaError, match="mel has shape"):
        encode_example(FEATURES, dict(values, mel=np.zeros((23, 8))))
    with pytest.raises(SchemaError, match="missing features"):
        encode_example(FEATURES, {k: v for k, v in values.items() if k != "text"})


def _schema_dict(features: list) -> dict:
    from melshards.shards_schema import SCHEMA_VERSION

    bucket = {
        "index": 0,
        "max_text_len": 16,
        "max_mel_frames": 24,
        "features": features,
        "counts": {"train": 3, "val": 0},
        "shards": {"train": [], "val": []},
    }
    return {
        "version": SCHEMA_VERSION,
        "buckets": [bucket],
        "audio": {"sample_rate": 22050, "trim_silence": True, "trim_top_db": 40.0},
        "mel": {
            "n_fft": 1024,
            "hop_length": 256,
            "win_length": 1024,
            "n_mels": 8,
            "fmin": 0.0,
            "fmax": 8000.0,
            "log_floor": 1e-5,
            "power": 1.0,
        },
        "vocabulary": ["_", "~", "a"],
        "mel_mean": [0.0] * 8,
        "speakers": [{"id": 0, "name": "p225", "clips": 3, "hours": 0.01, "gender": "F"}],
        "languages": [
            {"id": 0, "code": "de", "clips": 3, "hours": 0.01, "text_frontend": {"name": "characters", "version": 1}}
        ],
        "mel_std": [1.0] * 8,
        "max_text_len": 16,
        "max_mel_frames": 24,
        "pad_multiple": 8,
        "counts": {"train": 3, "val": 0},
    }
