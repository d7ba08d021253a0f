"""A run with every optional feature (`features_dir`: pitch, energy, audio, durations from TextGrids),
through the CLI: what the records hold, the statistics, the accounting and what inspect and stats say."""

import json
import os
import re

import numpy as np
import pytest
from click.testing import CliRunner

from melshards.commands.inspect import inspect_command
from melshards.commands.stats import stats_command
from melshards.preprocess.clip import audio
from melshards.preprocess.config import MelConfig
from melshards.shards_schema import read_schema
from melshards.shards_schema.shards import check_shard
from tests.conftest import MISSING_ALIGNMENTS, STRETCHED


@pytest.fixture(scope="module")
def run(features_dir):
    schema = read_schema(str(features_dir))
    stats = json.loads((features_dir / "stats.json").read_text())
    rejected = [json.loads(x) for x in (features_dir / "rejected.jsonl").read_text().splitlines()]
    records = []
    for f in sorted(features_dir.glob("*.tfrecord")):
        _, found = check_shard(str(f), schema, keep=1000)
        records += found
    return schema, stats, rejected, records


def test_the_records_hold_every_feature_the_config_asked_for(run):
    schema, stats, _, records = run
    assert schema.optional == ("pitch", "energy", "audio", "durations")
    assert stats["features"] == ["pitch", "energy", "audio", "durations"]
    assert schema.text_unit == "phone"
    for b in schema.buckets:
        assert b.feature("audio").shape == (b.max_mel_frames * schema.mel.hop_length,)
        assert b.feature("durations").shape == (b.max_text_len,)
    assert len(records) == stats["counts"]["in_shards"] > 30


def test_clips_without_or_with_a_mismatched_textgrid_are_rejected_and_counted(run):
    _, stats, rejected, _ = run
    by_reason = {}
    for r in rejected:
        by_reason.setdefault(r["reason"], set()).add(r["id"])
    assert by_reason["missing_alignment"] >= set(MISSING_ALIGNMENTS)
    assert by_reason["alignment_mismatch"] == {STRETCHED}
    detail = next(r["detail"] for r in rejected if r["id"] == STRETCHED)
    ends = [float(x) for x in re.findall(r"at (\d+\.\d+) s", detail)]
    assert ends[0] - ends[1] == pytest.approx(0.5, abs=0.002) and "tolerance 20 ms" in detail
    c = stats["counts"]
    assert c["in_shards"] + c["filtered"] + c["rejected"] == c["input_rows"]
    assert c["per_reason"]["alignment_mismatch"] == 1


def test_durations_sum_to_mel_len_and_text_ids_are_phones(run):
    schema, _, _, records = run
    vocab = schema.vocab()
    assert "sil" in schema.vocabulary and "A" in schema.vocabulary and "sp" not in schema.vocabulary
    for r in records:
        n, frames = int(r["text_len"]), int(r["mel_len"])
        assert int(np.sum(r["durations"][:n])) == frames
        assert not np.any(r["durations"][n:])
        assert vocab.decode(r["text_ids"][:n]) == r["text"].decode()


def test_the_stored_audio_gives_the_stored_mel(run):
    schema, _, _, records = run
    m = schema.mel
    cfg = MelConfig(m.n_fft, m.hop_length, m.win_length, m.n_mels, m.fmin, m.fmax, m.log_floor, m.power)
    for r in records[:5]:
        n, frames = int(r["audio_len"]), int(r["mel_len"])
        assert 1 + n // m.hop_length == frames
        mel = audio.log_mel(r["audio"][:n].astype(np.float32) / 32767, schema.audio.sample_rate, cfg)
        stored = r["mel"][:frames]
        # int16 quantisation noise (about 1e-4 in a mel bin) matters only near the floor; above
        # log-mel -5 the two agree within float16's spacing there
        loud = stored > -5
        assert mel.shape == stored.shape and loud.mean() > 0.2
        assert np.max(np.abs(mel - stored)[loud]) < 0.01


def test_pitch_and_energy_are_per_mel_frame_and_zero_in_padding(run):
    _, _, _, records = run
    for r in records:
        frames = int(r["mel_len"])
        f0 = r["pitch"][:frames]
        assert (f0 > 0).mean() > 0.3 and np.all((f0 == 0) | ((f0 >= 65) & (f0 <= 800)))
        assert not np.any(r["pitch"][frames:]) and not np.any(r["energy"][frames:])
        assert np.all(r["energy"][:frames] >= 0)


def test_feature_statistics_are_global_per_speaker_and_per_language(run):
    schema, stats, _, records = run
    train = [r for r in records if os.path.basename(r["_file"]).startswith("train")]
    voiced = np.concatenate([r["pitch"][: int(r["mel_len"])] for r in train])
    voiced = voiced[voiced > 0].astype(np.float64)
    energy = np.concatenate([r["energy"][: int(r["mel_len"])] for r in train]).astype(np.float64)
    g = schema.feature_stats
    assert g["pitch"]["frames"] == voiced.size and g["energy"]["frames"] == energy.size
    # the statistics are of the float32 features; the records hold them as float16
    assert g["pitch"]["mean"] == pytest.approx(voiced.mean(), rel=1e-3)
    assert g["pitch"]["std"] == pytest.approx(voiced.std(), rel=1e-2)
    assert g["energy"]["mean"] == pytest.approx(energy.mean(), rel=1e-3)
    (speaker,) = schema.speakers
    (language,) = schema.languages
    assert speaker.stats == language.stats == g  # one speaker, one language: the same frames
    assert stats["feature_stats"] == g
    pitch = stats["speakers"][0]["pitch"]
    assert pitch["count"] == voiced.size
    assert pitch["percentiles"]["p50"] == pytest.approx(np.median(voiced), abs=1.0)


def test_inspect_checks_and_shows_the_features(features_dir, tmp_path):
    result = CliRunner().invoke(
        inspect_command, [str(features_dir / "*.tfrecord"), "--show", "1", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "also hold pitch, energy, audio, durations" in result.output
    assert "voiced" in result.output and "durations" in result.output and "sum" in result.output


def test_stats_by_speaker_shows_pitch_percentiles(features_dir):
    result = CliRunner().invoke(stats_command, [str(features_dir), "--by", "speaker"])
    assert result.exit_code == 0, result.output
    assert "f0 p5 Hz" in result.output and "f0 p95 Hz" in result.output
