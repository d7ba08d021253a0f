"""Each corpus byte on gs:// is downloaded about once: the job's read and measure stages (`ReadCorpus`,
`MeasureClips`) over every container kind on a real GCS (tests/gcs_emulator.py, which counts the media
bytes it serves), each corpus under its own prefix, in one pipeline; files past Beam's 16 MiB read
chunk where the kind has big files. The clips measured from gs:// decode to the samples the same files
give read locally.

The corpora are noise clips (benchmarks/remote/read.py writes them) at 48 kHz: few seconds of audio
for many bytes, so measuring them costs little."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import apache_beam as beam
import pytest

from benchmarks.remote.read import write_parquet, write_segments, write_tars, write_wavs
from melshards.preprocess.clip import quality
from melshards.preprocess.clip.clips import load_decoded
from melshards.preprocess.clip.measure_stage import MeasureClips
from melshards.preprocess.config import PreprocessConfig
from melshards.preprocess.inputs.packed_clips import release_held
from melshards.preprocess.inputs.read_stage import ReadCorpus, detect_corpus
from tests.gcs_emulator import upload_tree
from tests.preprocess.conftest import beam_pipeline

SR = 48000
FLOAT = "FLOAT"  # 4-byte samples: many bytes for few seconds to measure
CFG = dataclasses.replace(PreprocessConfig(), quality=dataclasses.replace(PreprocessConfig().quality, measures=False))


def _corpora(root: Path) -> dict[str, Path]:
    """Each kind's corpus under root/KIND -> what --input names (relative to root/KIND)."""
    return {
        # one tar of 18 MB: six 16-second clips
        "tars": write_tars(root / "tars", 1, 6, 16.0, SR, FLOAT).relative_to(root / "tars"),
        # 19 MB in row groups of 100 rows, the Hugging Face export's
        "parquet": write_parquet(root / "parquet" / "train.parquet", 200, 100, 0.5, SR, FLOAT).relative_to(
            root / "parquet"
        ),
        # 19 MB in one row group of 300 rows: two batches of it (256 rows at most each)
        "one_group": write_parquet(root / "one_group" / "train.parquet", 300, 300, 0.33, SR, FLOAT).relative_to(
            root / "one_group"
        ),
        "wav": write_wavs(root / "wav", 6, 3.0, SR, FLOAT).relative_to(root / "wav"),
        # a WAV and a FLAC recording of two minutes cut into segments of 3-9 s: two batches
        "segments": write_segments(root / "segments", 2.0, ("WAV", "FLAC"), SR).relative_to(root / "segments"),
    }


@pytest.fixture(scope="module")
def read_from_gcs(gcs, tmp_path_factory):
    """The corpora of every kind, uploaded to a fresh bucket and read and measured from there in one
    pipeline -> (local root, bucket, {kind: corpus bytes}, {kind: media bytes served}, measured clips)."""
    root = tmp_path_factory.mktemp("gcs-reads")
    inputs = _corpora(root / "corpus")
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    gcs.make_bucket(bucket)
    upload_tree(gcs, root / "corpus", f"gs://{bucket}")
    corpora = [detect_corpus(f"gs://{bucket}/{kind}/{rel}".rstrip("/."), language="en") for kind, rel in inputs.items()]
    gcs.reset_counts()
    with beam_pipeline() as p:
        read = p | ReadCorpus(corpora, str(root / "temp"))
        measured = read["batches"] | MeasureClips(CFG, str(root / "temp"))
        _ = (
            measured.clips
            | beam.FlatMap(lambda b: [{k: c.get(k) for k in ("audio", "locator", "audio_hash")} for c in b["clips"]])
            | beam.Map(json.dumps)
            | beam.io.WriteToText(str(root / "clips"))
        )
    clips = [json.loads(line) for f in sorted(root.glob("clips-*")) for line in f.read_text().splitlines()]
    sizes = {k: sum(p.stat().st_size for p in (root / "corpus" / k).rglob("*") if p.is_file()) for k in inputs}
    served = {k: gcs.media_bytes(f"/{bucket}/o/{k}/") for k in inputs}
    return root / "corpus", bucket, sizes, served, clips


@pytest.mark.parametrize("kind", ["tars", "parquet", "one_group", "wav", "segments"])
def test_the_read_and_measure_stages_download_each_corpus_byte_about_once(read_from_gcs, kind):
    _, _, sizes, served, clips = read_from_gcs
    assert sizes["tars"] > 16 << 20 and sizes["parquet"] > 16 << 20 and sizes["one_group"] > 16 << 20
    # every clip's audio read (the segments' recordings but the gaps between them), none of it twice
    low = 0.8 if kind == "segments" else 0.97
    assert low * sizes[kind] <= served[kind] <= 1.05 * sizes[kind], (kind, served[kind] / sizes[kind])


def test_clips_read_from_gcs_decode_to_the_samples_of_the_same_files_read_locally(read_from_gcs):
    local, bucket, _, _, clips = read_from_gcs
    assert len(clips) == 6 + 200 + 300 + 6 + sum(
        1 for f in (local / "segments").glob("*.csv") for _ in f.read_text().splitlines()[1:]
    )
    for c in clips:
        path = str(local / c["audio"].removeprefix(f"gs://{bucket}/"))
        assert quality.audio_hash(load_decoded(path, CFG, c["locator"])) == c["audio_hash"], c
    release_held()
