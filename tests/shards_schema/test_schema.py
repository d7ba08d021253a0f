import dataclasses
import json
from pathlib import Path

import pytest

from melshards.shards_schema import SCHEMA_VERSION, Schema, SchemaError, Vocabulary, read_schema
from melshards.shards_schema.config import ConfigError, from_dict, load_yaml


def test_schema_round_trips_through_json(shards_dir):
    schema = read_schema(str(shards_dir))
    again = Schema.from_json(schema.to_json())
    assert again == schema
    assert schema.version == SCHEMA_VERSION


def test_each_buckets_records_per_speaker_and_language_by_split_are_in_the_schema(bucketed_dir):
    """What balanced sampling weighs the buckets by: every bucket's counts per group add up to its records."""
    schema = read_schema(str(bucketed_dir))
    assert len(schema.buckets) > 1
    for b in schema.buckets:
        for split in ("train", "val"):
            speakers, languages = b.group_counts(split, "speaker"), b.group_counts(split, "language")
            assert len(speakers) == len(schema.speakers) and len(languages) == len(schema.languages)
            assert sum(speakers) == sum(languages) == b.counts[split]
    for s in schema.speakers:  # the buckets' counts add up to the speaker table's clips
        assert (
            sum(b.group_counts(split, "speaker")[s.id] for b in schema.buckets for split in ("train", "val")) == s.clips
        )


def test_every_listed_shard_has_its_size_in_bytes(bucketed_dir):
    schema = read_schema(str(bucketed_dir))
    listed = [f for files in schema.shards.values() for f in files]
    assert listed and all(f["bytes"] == (bucketed_dir / f["file"]).stat().st_size for f in listed)


def test_a_3_1_schema_without_group_counts_or_shard_sizes_still_reads(shards_dir):
    d = json.loads((shards_dir / "schema.json").read_text())
    d["version"] = "3.1.0"
    for b in d["buckets"]:
        del b["groups"]
        for files in b["shards"].values():
            for f in files:
                del f["bytes"]
    schema = Schema.from_dict(d)
    assert schema.buckets[0].group_counts("train", "speaker") is None
    assert schema.counts == read_schema(str(shards_dir)).counts


def test_other_major_version_is_refused(shards_dir):
    d = json.loads((shards_dir / "schema.json").read_text())
    d["version"] = "4.0.0"
    with pytest.raises(SchemaError, match="schema version 4.0.0"):
        Schema.from_dict(d)


def test_a_one_shape_schema_of_version_1_is_refused_with_re_run_preprocess(shards_dir, tmp_path):
    d = json.loads((shards_dir / "schema.json").read_text())
    b = d.pop("buckets")[0]  # the 1.x layout: one feature table and shard list at the top level
    d.update(version="1.1.0", features=b["features"], shards=b["shards"])
    (tmp_path / "schema.json").write_text(json.dumps(d))
    with pytest.raises(
        SchemaError,
        match=r"schema version 1\.1\.0, this melshards reads 3\.x; re-run "
        r"`melshards preprocess`",
    ):
        read_schema(str(tmp_path))


def test_a_2_x_schema_without_speakers_and_languages_is_refused_with_re_run_preprocess(shards_dir):
    d = json.loads((shards_dir / "schema.json").read_text())
    for key in ("speakers", "languages"):
        del d[key]
    d.update(version="2.1.0", text_frontend={"name": "english", "version": 1})
    with pytest.raises(SchemaError, match=r"schema version 2\.1\.0, this melshards reads 3\.x; re-run"):
        Schema.from_dict(d)


def test_the_speaker_and_language_tables_map_ids_back_to_names(shards_dir):
    schema = read_schema(str(shards_dir))
    assert [(s.id, s.name) for s in schema.speakers] == [(0, "ljspeech_tiny")]
    assert [(x.id, x.code, x.text_frontend["name"]) for x in schema.languages] == [(0, "en", "english")]
    assert schema.speakers[0].clips == schema.counts["train"] + schema.counts["val"]
    assert schema.speaker("ljspeech_tiny").id == 0 and schema.language("en").id == 0
    with pytest.raises(SchemaError, match=r"unknown speaker 'bob'; the shards have 1: 'ljspeech_tiny'"):
        schema.speaker("bob")
    d = json.loads(schema.to_json())
    d["speakers"][0]["id"] = 3
    with pytest.raises(SchemaError, match=r"speakers with ids \[3\], not 0..N-1"):
        Schema.from_dict(d)


def test_shards_with_other_speaker_ids_do_not_mix(shards_dir):
    schema = read_schema(str(shards_dir))
    other = dataclasses.replace(schema, speakers=(dataclasses.replace(schema.speakers[0], name="someone"),))
    with pytest.raises(SchemaError, match="differs from here in speakers"):
        schema.check_compatible(other, here="here", there="there")


def test_runs_with_other_reference_settings_do_not_mix_but_other_fallback_counts_do(shards_dir, tmp_path):
    """Schema.contract holds `reference` (a same_clip run's shape is in no bucket's features), less the
    count of records that fell back to their own clip; shard discovery over two directories compares it."""
    from melshards.shards_schema.shards import schemas_for

    schema = read_schema(str(shards_dir))
    other_clip = {"source": "other_clip", "frames": 40, "min_seconds": 3.0, "seed": 0, "single_clip": "own_clip"}
    runs = {
        "a": dict(other_clip, own_clip={"train": 0, "val": 0}, val_from_train=0),
        "b": dict(other_clip, own_clip={"train": 3, "val": 2}, val_from_train=4),
        "c": {"source": "same_clip", "frames": 40},
        "d": {"source": "same_clip", "frames": 64},
        "none": {},
    }
    for name, reference in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "schema.json").write_text(dataclasses.replace(schema, reference=reference).to_json())
    files = {n: str(tmp_path / n / "train-b00-00000-of-00001.tfrecord") for n in runs}
    assert schemas_for([files["a"], files["b"]], None)[1] == []
    for one, two in (("a", "c"), ("c", "d"), ("c", "none")):
        problems = schemas_for([files[one], files[two]], None)[1]
        assert len(problems) == 1 and "differs" in problems[0].what and "in reference" in problems[0].what


def test_an_edited_summary_disagreeing_with_the_buckets_is_refused(shards_dir):
    d = json.loads((shards_dir / "schema.json").read_text())
    d["max_mel_frames"] += 8
    with pytest.raises(SchemaError, match="max_mel_frames .* is not its buckets'"):
        Schema.from_dict(d)


def _two_buckets(schema: Schema) -> Schema:
    """The one-bucket schema of the shared run, as bucket 1 (its files keep their b00 names), plus a
    shorter bucket 0."""
    small = Schema.make_bucket(
        0, 16, 8, schema.n_mels, [{"split": "train", "file": "train-b00-00001-of-00002.tfrecord", "records": 2}]
    )
    big = dataclasses.replace(schema.buckets[0], index=1)
    return dataclasses.replace(schema, buckets=(small, big))


def test_the_largest_bucket_gives_the_one_shape_readers_use(shards_dir):
    one = read_schema(str(shards_dir))
    assert len(one.buckets) == 1 and one.features == one.buckets[0].features
    two = _two_buckets(one)
    assert (two.max_text_len, two.max_mel_frames, two.features) == (one.max_text_len, one.max_mel_frames, one.features)
    assert two.counts == {"train": one.counts["train"] + 2, "val": one.counts["val"]}
    assert [f["file"] for f in two.shards["train"]] == [
        "train-b00-00000-of-00001.tfrecord",
        "train-b00-00001-of-00002.tfrecord",
    ]
    assert Schema.from_json(two.to_json()) == two


def test_bucket_of_file_reads_the_listing_then_the_name(shards_dir):
    two = _two_buckets(read_schema(str(shards_dir)))
    listed = two.buckets[1].shards["train"][0]["file"]
    assert listed == "train-b00-00000-of-00001.tfrecord"
    assert two.bucket_of_file(f"gs://b/run/{listed}").index == 1  # the listing wins over the name
    assert two.bucket_of_file("train-b00-00001-of-00002.tfrecord").index == 0
    assert two.bucket_of_file("dir/val-b01-00003-of-00009.tfrecord").index == 1  # not listed: by its name
    assert two.bucket_of_file("val-b07-00000-of-00001.tfrecord") is None  # no such bucket
    assert two.bucket_of_file("extra.tfrecord") is None
    one = read_schema(str(shards_dir))
    assert one.bucket_of_file("extra.tfrecord") is one.buckets[0]  # one bucket: every file is in it


def test_shard_names_put_split_then_bucket_so_split_globs_match_every_bucket():
    import fnmatch

    from melshards.shards_schema import parse_shard_name, shard_name

    names = [shard_name(s, b, i, 3) for s in ("train", "val") for b in (0, 1, 12) for i in range(3)]
    assert shard_name("train", 3, 1, 4) == "train-b03-00001-of-00004.tfrecord"
    assert fnmatch.filter(names, "train-*.tfrecord") == names[:9]
    assert fnmatch.filter(names, "val-*.tfrecord") == names[9:]
    assert parse_shard_name("a/b/val-b12-00002-of-00003.tfrecord") == {
        "split": "val",
        "bucket": 12,
        "index": 2,
        "count": 3,
    }
    assert parse_shard_name("train-00000-of-00001.tfrecord") is None


def test_directory_without_schema_is_an_unfinished_run(tmp_path):
    with pytest.raises(SchemaError, match="no finished preprocessing run"):
        read_schema(str(tmp_path))


def test_incompatible_schemas_name_the_difference(shards_dir):
    schema = read_schema(str(shards_dir))
    bigger = dataclasses.replace(schema.buckets[0], max_mel_frames=schema.max_mel_frames + 8)
    other = dataclasses.replace(schema, buckets=(bigger,))
    fewer = dataclasses.replace(schema.buckets[0], counts={"train": 1, "val": 0})
    schema.check_compatible(dataclasses.replace(schema, buckets=(fewer,)), "a", "b")
    with pytest.raises(SchemaError, match="max_mel_frames"):
        schema.check_compatible(other, "a/schema.json", "b/schema.json")


def test_vocabulary_skips_unknown_characters_and_reserves_pad_and_eos():
    v = Vocabulary()
    ids, skipped = v.encode("ab~_#")
    assert ids == [v.symbols.index("a"), v.symbols.index("b")] and skipped == 3
    assert v.decode(ids) == "ab" and v.pad_id == 0 and v.eos_id == 1


@dataclasses.dataclass(frozen=True)
class _Inner:
    x: int = 1
    y: float = 2.0


@dataclasses.dataclass(frozen=True)
class _Outer:
    inner: _Inner = _Inner()
    name: str = "a"


def test_config_loader_rejects_unknown_keys_and_wrong_types(tmp_path):
    assert from_dict(_Outer, {"inner": {"y": 3}}) == _Outer(_Inner(1, 3.0))
    with pytest.raises(ConfigError, match=r"unknown key\(s\) z; valid keys are: x, y"):
        from_dict(_Outer, {"inner": {"z": 1}})
    with pytest.raises(ConfigError, match="inner.x is .one., must be an integer"):
        from_dict(_Outer, {"inner": {"x": "one"}})
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(_Outer, tmp_path / "missing.yaml")


CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_every_shipped_config_is_checked():
    assert {p.name for p in CONFIGS} >= {"ljspeech.yaml", "ljspeech_tiny.yaml", "train_base.yaml", "train_tiny.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_loads_and_validates(path, shards_dir, request):
    """Preprocess configs validate on their own; train configs against the demo run's schema (the
    shapes decide e.g. whether model.reduction_factor divides the padded length), or the run with
    every feature for a model that asks for features."""
    if path.name.startswith("train"):
        from melshards.train.config import load_config
        from melshards.train.contract import MODEL_INPUTS
        from melshards.train.plugins import model_inputs

        cfg = load_config(str(path))
        run = shards_dir if model_inputs(cfg.model_factory) == MODEL_INPUTS else request.getfixturevalue("features_dir")
        cfg.validate(read_schema(str(run)))
        assert cfg != type(cfg)(), f"{path.name} sets nothing: it should say what it is for"
    else:
        from melshards.preprocess.config import PreprocessConfig, load_config

        cfg = load_config(str(path))
        assert isinstance(cfg, PreprocessConfig)
