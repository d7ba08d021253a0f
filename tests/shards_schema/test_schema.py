import dataclasses
import json
from pathlib import Path

import pytest

from shards_schema import SCHEMA_VERSION, Schema, SchemaError, Vocabulary, read_schema
from shards_schema.config import ConfigError, from_dict, load_yaml


def test_schema_round_trips_through_json(shards_dir):
    schema = read_schema(str(shards_dir))
    again = Schema.from_json(schema.to_json())
    assert again == schema
    assert schema.version == SCHEMA_VERSION


def test_other_major_version_is_refused(shards_dir):
    d = json.loads((shards_dir / "schema.json").read_text())
    d["version"] = "2.0.0"
    with pytest.raises(SchemaError, match="schema version 2.0.0"):
        Schema.from_dict(d)


def test_directory_without_schema_is_an_unfinished_run(tmp_path):
    with pytest.raises(SchemaError, match="no finished preprocessing run"):
        read_schema(str(tmp_path))


def test_incompatible_schemas_name_the_difference(shards_dir):
    schema = read_schema(str(shards_dir))
    other = dataclasses.replace(schema, max_mel_frames=schema.max_mel_frames + 8)
    schema.check_compatible(dataclasses.replace(schema, counts={"train": 1, "val": 0}), "a", "b")
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
    with pytest.raises(ConfigError, match="expected int"):
        from_dict(_Outer, {"inner": {"x": "one"}})
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(_Outer, tmp_path / "missing.yaml")


CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_every_shipped_config_is_checked():
    assert {p.name for p in CONFIGS} >= {"ljspeech.yaml", "ljspeech_tiny.yaml", "train_base.yaml", "train_tiny.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_loads_and_validates(path, shards_dir):
    """Preprocess configs validate on their own; train configs against the demo run's schema (the
    shapes decide e.g. whether model.reduction_factor divides the padded length)."""
    if path.name.startswith("train"):
        from train.config import load_config
        cfg = load_config(str(path))
        cfg.validate(read_schema(str(shards_dir)))
        assert cfg != type(cfg)(), f"{path.name} sets nothing: it should say what it is for"
    else:
        from preprocess.config import PreprocessConfig, load_config
        cfg = load_config(str(path))
        assert isinstance(cfg, PreprocessConfig)
