"""The job against a real GCS: fake-gcs-server on loopback (tests/gcs_emulator.py), read and written through
Beam's GcsIO and google-cloud-storage as on Dataflow."""

from __future__ import annotations

import uuid

from tests.conftest import CORPUS, TINY_CONFIG
from tests.gcs_emulator import download_tree, upload_tree


def _bucket(gcs) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    gcs.make_bucket(name)
    return name


def test_a_corpus_on_gcs_gives_the_records_of_the_same_files_read_locally_downloading_each_byte_once(
    gcs, bucketed_dir, tmp_path
):
    from melshards.commands.preprocess import run

    bucket = _bucket(gcs)
    upload_tree(gcs, CORPUS, f"gs://{bucket}/ljspeech_tiny")
    gcs.reset_counts()
    out = f"gs://{bucket}/run"
    code = run(
        [
            "--input",
            f"gs://{bucket}/ljspeech_tiny",
            "--output",
            out,
            "--config",
            str(TINY_CONFIG),
            "--buckets",
            "4",
        ]
    )
    assert code == 0
    corpus_bytes = sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file())
    # every clip's audio read (the few rows rejected before decoding are the rest), none of it twice
    assert 0.8 * corpus_bytes <= gcs.media_bytes(f"/{bucket}/o/ljspeech_tiny/") <= 1.05 * corpus_bytes
    download_tree(gcs, out, tmp_path / "run")
    local = {p.name: p.read_bytes() for p in bucketed_dir.glob("*.tfrecord")}
    remote = {p.name: p.read_bytes() for p in (tmp_path / "run").glob("*.tfrecord")}
    assert local and remote == local
    assert (tmp_path / "run" / "rejected.jsonl").read_text().count("\n") == (
        bucketed_dir / "rejected.jsonl"
    ).read_text().count("\n")
