"""Shards of the shipped corpus for the training benchmarks, made once and reused."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "ljspeech_tiny"
TINY = REPO / "configs" / "ljspeech_tiny.yaml"


def demo_shards(out: str, **changes: dict) -> Path:
    """Preprocess data/ljspeech_tiny into `out`, in one bucket, unless a finished run is already there; with
    `changes`, the demo config with those top-level sections replaced (written as `<out>.yaml`)."""
    path = Path(out)
    if not (path / "schema.json").exists():
        from melshards.commands.preprocess import run

        config = TINY
        if changes:
            import yaml

            config = path.with_name(path.name + ".yaml")
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(yaml.safe_dump({**(yaml.safe_load(TINY.read_text()) or {}), **changes}))
        # one shape: these benchmarks compare input pipelines of the schema's one static shape
        code = run(
            ["--input", str(CORPUS), "--output", str(path), "--config", str(config), "--overwrite", "--buckets", "1"]
        )
        if code:
            raise SystemExit(f"preprocessing the demo corpus into {out} failed with exit code {code}")
    return path


def relabel(
    src: Path, dst: Path, speaker_of, language_of, speakers: tuple[str, ...], languages: tuple[str, ...]
) -> Path:
    """A copy of the preprocessing run in `src` whose records are spoken by speakers[speaker_of(i)] in
    languages[language_of(i)] (i counts the records over the run's shard files, in schema.json's order),
    with schema.json's speaker and language tables recounted to match. The audio stays the shipped
    corpus's one voice: this makes shards of several speakers and languages for the trainer, not a
    corpus to learn voices from."""
    import json

    import tensorflow as tf

    schema = json.loads((src / "schema.json").read_text())
    sr, hop = schema["audio"]["sample_rate"], schema["mel"]["hop_length"]
    frontend = schema["languages"][0]["text_frontend"]
    clips = {"speakers": [0] * len(speakers), "languages": [0] * len(languages)}
    frames = {"speakers": [0] * len(speakers), "languages": [0] * len(languages)}
    dst.mkdir(parents=True)
    i = 0
    for bucket in schema["buckets"]:
        # schema.json's per-bucket group counts (3.2), recounted as the records are relabelled
        groups = {
            split: {"speaker": [0] * len(speakers), "language": [0] * len(languages)} for split in ("train", "val")
        }
        for split in ("train", "val"):
            for shard in bucket["shards"][split]:
                with tf.io.TFRecordWriter(str(dst / shard["file"])) as w:
                    for raw in tf.data.TFRecordDataset(str(src / shard["file"])).as_numpy_iterator():
                        ex = tf.train.Example.FromString(raw)
                        s, lang = speaker_of(i), language_of(i)
                        f = ex.features.feature
                        f["speaker"].bytes_list.value[:] = [speakers[s].encode()]
                        f["speaker_id"].int64_list.value[:] = [s]
                        f["language"].bytes_list.value[:] = [languages[lang].encode()]
                        f["language_id"].int64_list.value[:] = [lang]
                        for table, k in (("speakers", s), ("languages", lang)):
                            clips[table][k] += 1
                            frames[table][k] += f["mel_len"].int64_list.value[0]
                        groups[split]["speaker"][s] += 1
                        groups[split]["language"][lang] += 1
                        w.write(ex.SerializeToString(deterministic=True))
                        i += 1
                if "bytes" in shard:  # the shard's new size
                    shard["bytes"] = (dst / shard["file"]).stat().st_size
        if "groups" in bucket:
            bucket["groups"] = groups
    hours = {t: [round(n * hop / sr / 3600, 4) for n in v] for t, v in frames.items()}
    schema["speakers"] = [
        {"id": k, "name": name, "clips": clips["speakers"][k], "hours": hours["speakers"][k], "gender": ""}
        for k, name in enumerate(speakers)
    ]
    schema["languages"] = [
        {
            "id": k,
            "code": code,
            "clips": clips["languages"][k],
            "hours": hours["languages"][k],
            "text_frontend": frontend,
        }
        for k, code in enumerate(languages)
    ]
    (dst / "schema.json").write_text(json.dumps(schema, indent=2) + "\n")
    return dst
