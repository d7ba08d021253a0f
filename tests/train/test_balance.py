"""Balanced sampling (`data.balance`, train/balance.py): the shares it aims at, the shares it gives on
a corpus of two very unequal speakers, and an iterator that resumes on the same records."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from melshards.shards_schema import AudioParams, Language, MelParams, Schema, Speaker
from melshards.shards_schema.config import ConfigError
from melshards.shards_schema.records import encode_example
from melshards.train import balance
from melshards.train.config import DataConfig, config_from_dict
from melshards.train.input_pipeline import python_ops_in, train_dataset

BIG, SMALL = 200, 20  # records of speaker 0 and speaker 1


def test_shares_follow_count_to_the_alpha_and_accept_is_their_ratio_to_the_corpus():
    assert np.allclose(balance.target_shares([200, 20], 0.0), [0.5, 0.5])
    assert np.allclose(balance.target_shares([200, 20], 1.0), [200 / 220, 20 / 220])
    assert np.allclose(balance.target_shares([400, 100], 0.5), [2 / 3, 1 / 3])  # sqrt: 20 and 10
    assert np.allclose(balance.accept_probs([200, 20], 0.0), [0.1, 1.0])
    # reads per record kept: max target / corpus share = 0.5 / (20 / 220)
    assert balance.reads_per_kept([200, 20], balance.accept_probs([200, 20], 0.0)) == pytest.approx(5.5)
    # a group without clips gets no share (alpha 0 would otherwise give it one) and is never kept
    assert np.allclose(balance.target_shares([10, 0, 5], 0.0), [0.5, 0.0, 0.5])
    assert np.allclose(balance.accept_probs([10, 0, 5], 0.0), [0.5, 0.0, 1.0])
    # nothing to drop: the corpus as it is, one group, equal groups
    assert balance.accept_probs([200, 20], 1.0) is None
    assert balance.accept_probs([7], 0.0) is None
    assert balance.accept_probs([5, 5], 0.0) is None


def test_balance_keys_are_checked_naming_the_choices_and_bounds():
    with pytest.raises(ConfigError, match=r"data.balance is 'gender'; choose one of none, speaker, language"):
        config_from_dict({"data": {"balance": "gender"}})
    with pytest.raises(ConfigError, match=r"data.balance_alpha is 1.5, must be >= 0 and <= 1"):
        config_from_dict({"data": {"balance_alpha": 1.5}})
    assert config_from_dict({"data": {"balance": "language", "balance_alpha": 1}}).data.balance_alpha == 1.0


def _schema(n_big: int, n_small: int, shard: str) -> Schema:
    """A one-bucket schema of tiny shapes (text 8, mel 8 x 4) with two speakers of n_big and n_small clips."""
    bucket = Schema.make_bucket(0, 8, 8, 4, [{"split": "train", "file": shard, "records": n_big + n_small}])
    english = {"name": "english", "version": 1}
    return Schema(
        version="3.0.0",
        audio=AudioParams(16000, False, 60.0),
        mel=MelParams(64, 16, 64, 4, 0.0, 8000.0, 1e-5, 2.0),
        vocabulary=("_", "~", "a"),
        speakers=(Speaker(0, "big", n_big, 0.1), Speaker(1, "small", n_small, 0.01)),
        languages=(Language(0, "en", n_big + n_small, 0.11, english),),
        mel_mean=(0.0,) * 4,
        mel_std=(1.0,) * 4,
        pad_multiple=8,
        buckets=(bucket,),
    )


@pytest.fixture(scope="module")
def unequal(tmp_path_factory):
    """BIG records of speaker 0 and SMALL of speaker 1 (every 11th), in two shard files."""
    out = tmp_path_factory.mktemp("unequal")
    schema = _schema(BIG, SMALL, "train-b00-00000-of-00001.tfrecord")
    (out / "schema.json").write_text(schema.to_json())
    files = [str(out / "train-b00-00000-of-00002.tfrecord"), str(out / "train-b00-00001-of-00002.tfrecord")]
    writers = [tf.io.TFRecordWriter(f) for f in files]
    for i in range(BIG + SMALL):
        speaker = int(i % 11 == 10)
        writers[i % 2].write(
            encode_example(
                schema.features,
                {
                    "id": f"clip{i}",
                    "speaker": schema.speakers[speaker].name,
                    "speaker_id": speaker,
                    "language": "en",
                    "language_id": 0,
                    "text": "a",
                    "text_ids": np.full(8, 2),
                    "text_len": 1,
                    "mel": np.zeros((8, 4)),
                    "mel_len": 8,
                },
            )
        )
    for w in writers:
        w.close()
    return schema, files


def _stream(schema, files, alpha, names=("speaker_id",), batch=10, k=None):
    cfg = DataConfig(batch_size=batch, shuffle_buffer=32, cycle_length=2, balance="speaker", balance_alpha=alpha)
    plan = balance.balancing(schema, cfg.balance, cfg.balance_alpha)
    return train_dataset(files, schema, cfg, names, k, balance=plan)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_a_balanced_stream_gives_each_speaker_its_count_to_the_alpha(unequal, alpha):
    schema, files = unequal
    ids = np.concatenate([b["speaker_id"].numpy() for b in _stream(schema, files, alpha).take(400)])
    expected = SMALL**alpha / (BIG**alpha + SMALL**alpha)  # 0.5, 0.240, 0.091
    assert len(ids) == 4000 and abs((ids == 1).mean() - expected) < 0.025, (ids == 1).mean()


def test_a_balanced_stream_still_has_static_shapes_and_no_python_ops(unequal):
    schema, files = unequal
    ds = _stream(schema, files, 0.0, names=("speaker_id", "mel"), batch=4, k=2)
    assert ds.element_spec["mel"].shape.as_list() == [2, 4, 8, 4]
    assert python_ops_in(ds) == []


def test_a_restored_balanced_iterator_keeps_the_records_an_uninterrupted_one_keeps(unequal, tmp_path):
    """The draws come from a dataset (Dataset.random), so the iterator checkpoint holds their position."""
    schema, files = unequal

    def stream():
        return iter(_stream(schema, files, 0.0, names=("id",), batch=4, k=2))

    it = stream()
    for _ in range(7):
        next(it)
    path = tf.train.Checkpoint(iterator=it).save(str(tmp_path / "ckpt"))
    after = [next(it)["id"].numpy().tolist() for _ in range(40)]  # 320 records: over a repeat of the 220
    restored = stream()
    tf.train.Checkpoint(iterator=restored).restore(path).assert_consumed()
    assert [next(restored)["id"].numpy().tolist() for _ in range(40)] == after
    fresh = stream()  # the restore did move the iterator: a fresh one gives other records
    assert [next(fresh)["id"].numpy().tolist() for _ in range(40)] != after


# -- speakers in different length buckets ------------------------------------------------------------
SHORT, LONG = 300, 100  # training records of speaker 0 (all in bucket 0, 8 frames) and 1 (bucket 1, 16 frames)


def _two_bucket_schema(held_out: int = 0) -> Schema:
    """Two buckets (8 and 16 mel frames), speaker 0 'short' only in bucket 0 and speaker 1 'long' only
    in bucket 1 (schema.json 3.2's per-bucket counts); `held_out` val records of a speaker 2 'held'
    who has no training record."""
    from melshards.shards_schema import SCHEMA_VERSION, shard_name

    def bucket(i, frames, records, speakers):
        shards = [{"split": "train", "file": shard_name("train", i, 0, 1), "records": records}]
        if held_out:
            shards.append({"split": "val", "file": shard_name("val", i, 0, 1), "records": held_out})
        groups = {
            "train": {"speaker": speakers, "language": [records]},
            "val": {"speaker": [0, 0, held_out], "language": [held_out]},
        }
        return Schema.make_bucket(i, 8, frames, 4, shards, groups=groups)

    english = {"name": "english", "version": 1}
    return Schema(
        version=SCHEMA_VERSION,
        audio=AudioParams(16000, False, 60.0),
        mel=MelParams(64, 16, 64, 4, 0.0, 8000.0, 1e-5, 2.0),
        vocabulary=("_", "~", "a"),
        speakers=(
            Speaker(0, "short", SHORT, 0.1),
            Speaker(1, "long", LONG, 0.1),
            Speaker(2, "held", 2 * held_out, 0.01),
        ),
        languages=(Language(0, "en", SHORT + LONG + 2 * held_out, 0.2, english),),
        mel_mean=(0.0,) * 4,
        mel_std=(1.0,) * 4,
        pad_multiple=8,
        buckets=(bucket(0, 8, SHORT, [SHORT, 0, 0]), bucket(1, 16, LONG, [0, LONG, 0])),
    )


def test_buckets_are_drawn_by_what_they_keep_so_speakers_of_different_lengths_get_their_target():
    schema = _two_bucket_schema()
    per_bucket = balance.bucket_counts(schema, "speaker")
    assert per_bucket.tolist() == [[SHORT, 0, 0], [0, LONG, 0]]
    plan = balance.balancing(schema, "speaker", 0.0)
    assert np.allclose(plan.accept, [1 / 3, 1.0, 0.0])
    assert np.allclose(plan.bucket_kept, [1 / 3, 1.0])  # bucket 0 keeps a third of its records
    accept = np.asarray(plan.accept)
    # drawn by their records, the buckets give 75/25 whatever the filter does: the fault
    assert np.allclose(balance.realised_shares(per_bucket, accept, [SHORT, LONG]), [0.75, 0.25, 0.0])
    # drawn by what they keep: the target
    drawn = balance.bucket_weights({0: SHORT, 1: LONG}, plan)
    assert drawn == pytest.approx({0: 100.0, 1: 100.0})
    assert np.allclose(balance.realised_shares(per_bucket, accept, [drawn[0], drawn[1]]), [0.5, 0.5, 0.0])
    # the trainer's schedule: bucket 0 (batch 20 of 8 frames) and bucket 1 (batch 10 of 16 frames) get
    # equal records per schedule epoch, so equal shares, and the log line says so
    from melshards.train.buckets import trainer_buckets

    files = [f"/d/{f['file']}" for f in schema.shards["train"]]
    tbs = trainer_buckets(files, [], schema, 10, False, 1, kept=plan.bucket_kept)
    records = [tb.calls_per_epoch * tb.batch_size for tb in tbs]
    assert [tb.batch_size for tb in tbs] == [20, 10] and records == [100, 100]
    line = balance.describe(schema, "speaker", 0.0, records)
    assert "short 75.0% -> 50.0% (drawn 50.0%), long 25.0% -> 50.0% (drawn 50.0%)" in line
    unweighted = trainer_buckets(files, [], schema, 10, False, 1)
    assert [tb.calls_per_epoch * tb.batch_size for tb in unweighted] == [300, 100]
    assert "(drawn 75.0%)" in balance.describe(schema, "speaker", 0.0, [300, 100])


def test_a_speaker_held_out_for_validation_gets_no_share_and_lowers_no_accept_probability():
    schema = _two_bucket_schema(held_out=50)
    assert balance.group_counts(schema, "speaker") == [SHORT, LONG, 0]  # the training split's, per bucket
    assert np.allclose(balance.balancing(schema, "speaker", 0.0).accept, [1 / 3, 1.0, 0.0])
    assert np.allclose(balance.target_shares(balance.group_counts(schema, "speaker"), 0.0), [0.5, 0.5, 0.0])


def test_a_schema_without_per_bucket_counts_balances_by_the_tables_and_draws_buckets_by_records():
    """A schema.json written before 3.2 reads, and balances as it did: tables' clips, buckets by records."""
    schema = _two_bucket_schema()
    old = dataclasses.replace(
        schema, version="3.1.0", buckets=tuple(dataclasses.replace(b, groups={}) for b in schema.buckets)
    )
    reread = Schema.from_json(old.to_json())
    assert balance.bucket_counts(reread, "speaker") is None
    plan = balance.balancing(reread, "speaker", 0.0)
    assert plan.bucket_kept is None and balance.bucket_weights({0: SHORT, 1: LONG}, plan) == {0: 300.0, 1: 100.0}
    assert "no per-bucket counts" in balance.describe(reread, "speaker", 0.0)


@pytest.fixture(scope="module")
def two_buckets(tmp_path_factory):
    """Shards of `_two_bucket_schema`: SHORT records of speaker 0 in bucket 0, LONG of speaker 1 in bucket 1."""
    out = tmp_path_factory.mktemp("two_buckets")
    schema = _two_bucket_schema()
    for b, speaker, n in ((schema.buckets[0], 0, SHORT), (schema.buckets[1], 1, LONG)):
        with tf.io.TFRecordWriter(str(out / b.shards["train"][0]["file"])) as w:
            for i in range(n):
                w.write(
                    encode_example(
                        b.features,
                        {
                            "id": f"clip{speaker}-{i}",
                            "speaker": schema.speakers[speaker].name,
                            "speaker_id": speaker,
                            "language": "en",
                            "language_id": 0,
                            "text": "a",
                            "text_ids": np.full(8, 2),
                            "text_len": 1,
                            "mel": np.zeros((b.max_mel_frames, 4)),
                            "mel_len": b.max_mel_frames,
                        },
                    )
                )
    (out / "schema.json").write_text(schema.to_json())
    return out


def test_the_dataset_api_gives_speakers_in_different_buckets_their_target_shares(two_buckets, caplog):
    import logging

    import melshards

    with caplog.at_level(logging.INFO, logger="melshards"):
        ds = melshards.dataset(
            str(two_buckets / "train-*.tfrecord"), 10, features=("speaker_id",), balance="speaker", balance_alpha=0.0
        )
    assert "short 75.0% -> 50.0% (drawn 50.0%), long 25.0% -> 50.0% (drawn 50.0%)" in caplog.text
    ids = np.concatenate([b["speaker_id"].numpy() for b in ds.take(300)])
    assert len(ids) == 3000 and abs((ids == 1).mean() - 0.5) < 0.04, (ids == 1).mean()
