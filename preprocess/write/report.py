"""Stage 9, Report: rejected.jsonl, stats.json, then schema.json (last: its presence marks a finished
run), into the run's staging dir; `melshards.preprocess.out_dir.staging` moves them into the output directory.

The rejected rows never meet in one worker: they are counted per reason by a combiner, and written
sorted in shards of at most about ROWS_PER_REJECTED_SHARD rows (`WriteRejected`), which the report
merges, a line at a time, into the one `rejected.jsonl` (sorted by id, reason and detail)."""

from __future__ import annotations

import dataclasses
import heapq
import json
import posixpath
import zlib
from collections.abc import Iterable, Iterator
from contextlib import ExitStack

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.clip import cache
from melshards.preprocess.config import AudioConfig, MelConfig, PreprocessConfig
from melshards.preprocess.out_dir import temp_files
from melshards.preprocess.out_dir.shards import TEMP_DIR, StagingFiles, remove_temp_dir
from melshards.preprocess.stats import bucketing, feature_stats
from melshards.preprocess.stats.quality_stats import QualityFigures
from melshards.shards_schema import (
    REJECTED_FILE,
    SCHEMA_FILE,
    SCHEMA_VERSION,
    SPLITS,
    STATS_FILE,
    AudioParams,
    Language,
    MelParams,
    Schema,
    SchemaError,
    Speaker,
)
from melshards.shards_schema.atomic import atomic_write
from melshards.shards_schema.extracted import outputs_of
from melshards.shards_schema.stats import FILTER_REASONS, QUALITY_REASONS, Cutoffs, Moments, summarize
from melshards.shards_schema.stats_model import stats_problem
from melshards.shards_schema.text import frontend_record


class AccountingError(RuntimeError):
    """stats.json as built breaks its declaration (`melshards.shards_schema.stats_model`), e.g. records in
    shards + rejected rows != input rows: a bug, never a property of the data."""


def length_summaries(hists: dict) -> dict:
    return {
        "text_len": summarize(hists.get("text_len", {})),
        "mel_frames": summarize(hists.get("mel_frames", {})),
        "duration_s": summarize(hists.get("duration_ms", {}), scale=0.001),
    }


HOURS = 3_600_000  # milliseconds
CACHE_COUNTS = ("hits", "computed", "damaged", "damaged_files")  # stats.json `cache`: clips and files


def written_clips_and_hours(written: dict, kind: str, name: str) -> tuple[int, float]:
    """The clips and hours (to 4 places) written into the shards for one speaker or language (`kind`)."""
    return written.get((kind, name, "clips"), 0), round(written.get((kind, name, "ms"), 0) / HOURS, 4)


def schema_speakers(corpus_tables: dict, written: dict, features: dict | None = None) -> list[Speaker]:
    """The speakers with ids, in id order; clips and hours as written into the shards; `features`
    (`feature_stats.finish`'s dict) gives each its pitch and energy statistics."""
    own = (features or {}).get("speakers", {})
    return [
        Speaker(
            s["id"],
            name,
            *written_clips_and_hours(written, "speaker", name),
            s["gender"],
            own.get(name, {}),
            (features or {}).get("centroids", {}).get(name, {}),
        )
        for name, s in sorted(corpus_tables["speakers"].items(), key=lambda kv: kv[1]["id"])
    ]


def schema_languages(corpus_tables: dict, written: dict, features: dict | None = None) -> list[Language]:
    own = (features or {}).get("languages", {})
    return [
        Language(
            x["id"],
            code,
            *written_clips_and_hours(written, "language", code),
            frontend_record(x["text_frontend"]),
            own.get(code, {}),
        )
        for code, x in sorted(corpus_tables["languages"].items(), key=lambda kv: kv[1]["id"])
    ]


def bucket_groups(corpus_tables: dict, written: dict, bucket: int) -> dict[str, dict[str, list[int]]]:
    """schema.json `Bucket.groups`: a bucket's records per speaker and per language id in each split
    (`written_counts`' ("bucket", index, split, kind, name) keys)."""
    tables = {"speaker": corpus_tables["speakers"], "language": corpus_tables["languages"]}
    out: dict[str, dict[str, list[int]]] = {}
    for split in SPLITS:
        out[split] = {}
        for kind, table in tables.items():
            counts = [0] * len(table)
            for name, row in table.items():
                counts[row["id"]] = written.get(("bucket", bucket, split, kind, name), 0)
            out[split][kind] = counts
    return out


def dropped_by_reason(written: dict, kind: str, name: str) -> dict[str, int]:
    """A speaker's or language's clips the filter dropped, per reason (`filter_and_write.dropped_counts`),
    most first."""
    found = {key[3]: n for key, n in written.items() if key[:3] == ("dropped", kind, name)}
    return dict(sorted(found.items(), key=lambda kv: (-kv[1], kv[0])))


def speaker_stats(
    corpus_tables: dict, written: dict, features: dict | None = None, quality: QualityFigures | None = None
) -> list[dict]:
    """stats.json `speakers`: the schema's table plus measured clips and clips per split, the clips the
    filter dropped per reason (and voiced f0 percentiles in runs with pitch; the quality measures'
    percentiles and the rate rule's outliers per k with `quality`); then the speakers dropped for too
    few clips (id null)."""
    pitch = (features or {}).get("pitch_percentiles", {})
    rows = [
        dict(
            dataclasses.asdict(s),
            measured=corpus_tables["speakers"][s.name]["measured"],
            per_split={split: written.get(("split", s.name, split), 0) for split in SPLITS},
            **({"pitch": pitch[s.name]} if s.name in pitch else {}),
        )
        for s in schema_speakers(corpus_tables, written, features)
    ]
    rows += [
        {
            "id": None,
            "name": name,
            "clips": 0,
            "hours": 0.0,
            "gender": "",
            "measured": n,
            "per_split": {split: 0 for split in SPLITS},
        }
        for name, n in sorted(corpus_tables["dropped_speakers"].items())
    ]
    for row in rows:
        row["per_reason"] = dropped_by_reason(written, "speaker", row["name"])
        if quality is not None:
            row.update(quality.speaker(row["name"]))
    return rows


def quality_dropped_by_speaker(written: dict) -> dict[str, dict[str, int]]:
    """stats.json `quality_dropped_by_speaker`: speaker -> quality rule -> clips it dropped, from the
    writer's counts (`filter_and_write.dropped_counts`, the speakers' `per_reason` too); speakers in
    name order, each one's rules in the order the filter tries them, only speakers and rules with a drop."""
    out: dict[str, dict[str, int]] = {}
    for key, n in written.items():
        if key[:2] == ("dropped", "speaker") and key[3] in QUALITY_REASONS and n:
            out.setdefault(key[2], {})[key[3]] = n
    return {s: {r: out[s][r] for r in QUALITY_REASONS if r in out[s]} for s in sorted(out)}


def mostly_dropped(speakers: list[dict], languages: list[dict]) -> list[dict]:
    """stats.json `mostly_dropped`: each language, then each speaker, the filter (its length cut-offs,
    its quality rules, `filter.min_speaker_clips`, a refused reference) dropped more than half the
    measured clips of, the largest share first (then the most clips, then by name): kind, name, clips
    measured, clips dropped and per reason (the rows' `per_reason`). What the summary says first."""
    groups = [("language", x["code"], x["before_filter"]["text_len"]["count"], x["per_reason"]) for x in languages]
    groups += [("speaker", s["name"], s["measured"], s["per_reason"]) for s in speakers]
    out = []
    for kind, name, measured, per_reason in groups:
        dropped = sum(per_reason.values())
        if 2 * dropped > measured:
            out.append({"kind": kind, "name": name, "measured": measured, "dropped": dropped, "per_reason": per_reason})
    return sorted(out, key=lambda x: (x["kind"] != "language", -x["dropped"] / x["measured"], -x["dropped"], x["name"]))


def language_stats(
    corpus_tables: dict,
    written: dict,
    cutoffs: Cutoffs | None,
    features: dict | None = None,
    quality: QualityFigures | None = None,
) -> list[dict]:
    """stats.json `languages`: the schema's table plus each language's before-filter length summaries,
    its text-length cut-off, the clips the filter dropped per reason (and the quality measures' exact
    histograms with `quality`)."""
    lengths = corpus_tables["language_lengths"]
    return [
        dict(
            dataclasses.asdict(x),
            before_filter=length_summaries(lengths.get(x.code, {})),
            max_text_len=cutoffs.text_limit(x.code) if cutoffs else None,
            per_reason=dropped_by_reason(written, "language", x.code),
            **(quality.language(x.code) if quality is not None else {}),
        )
        for x in schema_languages(corpus_tables, written, features)
    ]


def build_stats(
    cfg: PreprocessConfig,
    input_rows: int,
    before: dict,
    after: dict,
    cutoffs: Cutoffs | None,
    reasons: dict,
    shards: list[dict],
    buckets: dict | None = None,
    text: dict | None = None,
    train_hist: dict | None = None,
    corpus_tables: dict | None = None,
    written: dict | None = None,
    inputs: list[dict] | None = None,
    features: dict | None = None,
    quality: QualityFigures | None = None,
) -> dict:
    """stats.json, checked against its declaration (StatsFile) before it is written; `features`:
    `feature_stats.finish`'s dict (runs with pitch or energy); `quality`: the quality measures' figures."""
    stats = {
        "schema_version": SCHEMA_VERSION,
        "counts": {
            "input_rows": input_rows,
            "in_shards": sum(s["records"] for s in shards),
            "filtered": sum(v for k, v in reasons.items() if k in FILTER_REASONS),
            "rejected": sum(v for k, v in reasons.items() if k not in FILTER_REASONS),
            "per_split": {s: sum(x["records"] for x in shards if x["split"] == s) for s in SPLITS},
            "per_reason": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        },
        "before_filter": length_summaries(before),
        "after_filter": length_summaries(after),
        "histograms": {
            "before_filter": {k: {str(v): c for v, c in sorted(h.items())} for k, h in before.items()},
            "after_filter": {k: {str(v): c for v, c in sorted(h.items())} for k, h in after.items()},
        },
        "filter": dataclasses.asdict(cfg.filter),
        "cutoffs": dataclasses.asdict(cutoffs) if cutoffs else None,
        **({"inputs": inputs} if inputs is not None else {}),  # each --input: its format, rows, prefixed labels
        "features": list(cfg.optional_features),
        "feature_stats": (features or {}).get("global", {}),
        "quality_dropped_by_speaker": quality_dropped_by_speaker(written or {}),
    }
    if quality is not None:
        stats["quality"] = quality.section()
    if cfg.reference.source == "other_clip":
        stats["references"] = reference_counts(written or {})
    if corpus_tables is not None:
        stats["speakers"] = speaker_stats(corpus_tables, written or {}, features, quality)
        stats["languages"] = language_stats(corpus_tables, written or {}, cutoffs, features, quality)
        stats["mostly_dropped"] = mostly_dropped(stats["speakers"], stats["languages"])
        stats["split"] = {
            "val_fraction": cfg.split.val_fraction,
            "val_speakers": list(cfg.split.val_speakers),
            "val_speakers_not_found": corpus_tables["missing_val_speakers"],
        }
    if cutoffs and buckets:
        per_bucket = bucketing.bucket_stats(
            buckets, after.get("mel_frames", {}), text or {}, shards, cfg.pad, train_hist or {}
        )
        largest = per_bucket["buckets"][-1]
        stats["padding"] = {  # the shards as written: the largest bucket's shapes, padding over all buckets
            "max_text_len": largest["max_text_len"],
            "max_mel_frames": largest["max_mel_frames"],
            "multiple": cfg.pad.multiple,
            "mel_padding_fraction": per_bucket["mel_padding_fraction"],
            "text_padding_fraction": per_bucket["text_padding_fraction"],
        }
        stats["buckets"] = per_bucket
    problem = stats_problem(stats)
    if problem:
        raise AccountingError(
            f"stats.json as built is not what melshards.shards_schema.stats_model declares: {problem}"
        )
    return stats


def mel_params(m: MelConfig) -> MelParams:
    """The mel settings as the contract records them (and derives the pad value from)."""
    return MelParams(m.n_fft, m.hop_length, m.win_length, m.n_mels, m.fmin, m.fmax, m.log_floor, m.power)


def audio_params(a: AudioConfig) -> AudioParams:
    """What the run's front end did to the audio before the mel, as schema.json records it: the rate,
    the trim (its method, and the setting that method reads) and the loudness target."""
    vad = a.trim_silence and a.trim_method == "webrtcvad"
    return AudioParams(
        a.sample_rate,
        a.trim_silence,
        a.trim_top_db,
        trim_method=a.trim_method,
        loudness_target_lufs=a.loudness_target_lufs,
        vad_aggressiveness=a.vad_aggressiveness if vad else None,
    )


def front_end(schema: Schema) -> PreprocessConfig:
    """The config that computes a clip's log-mel as the run that wrote `schema` did (`audio_params`,
    `mel_params`): what `melshards synthesize --reference` takes a reference WAV through. SchemaError
    for a run trimmed by webrtcvad whose schema.json (3.3) does not say how aggressively."""
    a, m = schema.audio, schema.mel
    vad = a.vad_aggressiveness
    if a.trim_silence and a.trim_method == "webrtcvad" and vad is None:
        raise SchemaError(
            f"schema.json {schema.version} does not record the webrtcvad aggressiveness the run trimmed with; "
            "re-run `melshards preprocess` with this melshards to compute a reference as the run did"
        )
    audio = AudioConfig(
        sample_rate=a.sample_rate,
        trim_silence=a.trim_silence,
        trim_top_db=a.trim_top_db,
        trim_method=a.trim_method,
        loudness_target_lufs=a.loudness_target_lufs,
        **({} if vad is None else {"vad_aggressiveness": vad}),
    )
    mel = MelConfig(m.n_fft, m.hop_length, m.win_length, m.n_mels, m.fmin, m.fmax, m.log_floor, m.power)
    return PreprocessConfig(audio=audio, mel=mel)


def build_schema(
    cfg: PreprocessConfig,
    buckets: dict,
    text: dict,
    moments: Moments,
    shards: list[dict],
    corpus_tables: dict,
    written: dict,
    features: dict | None = None,
    extractors: list[dict] | None = None,
) -> Schema:
    m = cfg.mel
    if moments.n == 0:  # no training frames: identity normalisation, stated rather than invented
        mean, std = [0.0] * m.n_mels, [1.0] * m.n_mels
    else:
        mean = [round(float(x), 6) for x in moments.mean]
        std = [round(float(max(x, 1e-5)), 6) for x in moments.std()]
    texts = bucketing.text_bounds(text, len(buckets["bounds"]), cfg.pad.multiple)
    return Schema(
        version=SCHEMA_VERSION,
        audio=audio_params(cfg.audio),
        mel=mel_params(m),
        vocabulary=tuple(corpus_tables["vocabulary"]),
        speakers=tuple(schema_speakers(corpus_tables, written, features)),
        languages=tuple(schema_languages(corpus_tables, written, features)),
        mel_mean=tuple(mean),
        mel_std=tuple(std),
        pad_multiple=cfg.pad.multiple,
        buckets=tuple(
            Schema.make_bucket(
                i,
                texts[i],
                bound,
                m.n_mels,
                [x for x in shards if x["bucket"] == i],
                cfg.optional_features,
                m.hop_length,
                bucket_groups(corpus_tables, written, i),
                extracted=outputs_of(extractors or ()),
                sample_rate=cfg.audio.sample_rate,
                reference_frames=cfg.reference.frames,
            )
            for i, bound in enumerate(buckets["bounds"])
        ),
        text_unit=cfg.text_unit,
        feature_stats=(features or {}).get("global", {}),
        extractors=tuple(extractors or ()),
        reference=reference_record(cfg, written),
    )


def reference_counts(written: dict) -> dict:
    """An other_clip run's records whose reference is not another clip of their split: `own_clip`, per
    split, those cut from themselves (their speaker has no other clip they may take), and
    `val_from_train`, the validation records cut from a training clip of their speaker (it has no other
    validation clip). schema.json's `reference` and stats.json's `references` hold them."""
    return {
        "own_clip": {split: int(written.get(("reference", "own_clip", split), 0)) for split in SPLITS},
        "val_from_train": int(written.get(("reference", "val_from_train", "val"), 0)),
    }


def reference_record(cfg: PreprocessConfig, written: dict) -> dict:
    """schema.json's `reference`: the config's choice and, for other_clip, `reference_counts`; {} in a run
    without references."""
    r = cfg.reference
    if r.source == "none":
        return {}
    out = {"source": r.source, "frames": r.frames}
    if r.source == "other_clip":
        out.update(min_seconds=r.min_seconds, seed=r.seed, single_clip=r.single_clip, **reference_counts(written))
    return out


def _write_text(out_dir: str, name: str, text: str) -> None:
    """Write to a temporary name, then rename: a retried or killed report never leaves a partial file
    (schema.json's presence marks a finished run)."""
    tmp = FileSystems.join(out_dir, TEMP_DIR, f"{name}.writing")
    with atomic_write(FileSystems.join(out_dir, name), temp=tmp, fs=StagingFiles) as f:
        f.write(text.encode("utf-8"))


# -- rejected.jsonl: written in sorted shards, merged into one file ---------------------------------
# what one worker holds and sorts: bounds the report stage's memory whatever the rows rejected
# (docs/performance.md#the-report-stage-rejected-rows)
ROWS_PER_REJECTED_SHARD = 100_000


def rejected_order(row: dict) -> tuple[str, str, str]:
    """rejected.jsonl's order: by id, reason and detail (stable across runs)."""
    return row["id"], row["reason"], row.get("detail", "")


def rejected_line(row: dict) -> str:
    return json.dumps(row, sort_keys=True) + "\n"


def rejected_shard_count(rows: int, rows_per_shard: int = ROWS_PER_REJECTED_SHARD) -> int:
    return max(1, -(-rows // rows_per_shard))


def rejected_shard_of(row: dict, shards: int) -> int:
    """The shard a rejected row is written in: by its id (crc32, the same in every process)."""
    return zlib.crc32(row["id"].encode("utf-8")) % shards


def merged_lines(paths: Iterable[str]) -> Iterator[str]:
    """The lines of rejected shards (each sorted by `rejected_order`), merged into one sorted stream:
    one line of each shard in memory at a time."""
    with ExitStack() as stack:
        files = [(line.decode("utf-8") for line in stack.enter_context(FileSystems.open(p))) for p in sorted(paths)]
        yield from heapq.merge(*files, key=lambda line: rejected_order(json.loads(line)))


def write_merged(out_dir: str, name: str, paths: Iterable[str]) -> None:
    """`merged_lines` of the shards into out_dir/name, through a temporary name (as `_write_text`)."""
    tmp = FileSystems.join(out_dir, TEMP_DIR, f"{name}.writing")
    with atomic_write(FileSystems.join(out_dir, name), temp=tmp, fs=StagingFiles) as f:
        for line in merged_lines(paths):
            f.write(line.encode("utf-8"))


class _WriteRejectedShardFn(beam.DoFn):
    """(shard index, its rows) -> the rows sorted, written to the temp dir; yields the file's path."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def process(self, keyed):
        index, rows = keyed
        path = FileSystems.join(temp_files.temp_dir(self.out_dir), f"rejected-{index:05d}.jsonl")
        with temp_files.writing(path) as f:  # a retried bundle writes it again: the same rows, sorted
            for row in sorted(rows, key=rejected_order):
                f.write(rejected_line(row).encode("utf-8"))
        yield path


class WriteRejected(beam.PTransform):
    """Rejected rows -> {"reasons": (reason, count) per reason (a combiner), "shards": the paths of the
    rows written sorted in shards of about `rows_per_shard` rows under out_dir's temp dir, for
    `write_merged`}. No worker holds more than one shard's rows."""

    def __init__(self, out_dir: str, rows_per_shard: int = ROWS_PER_REJECTED_SHARD):
        super().__init__()
        self.out_dir, self.rows_per_shard = out_dir, rows_per_shard

    def expand(self, rejected):
        per_shard = self.rows_per_shard
        reasons = (
            rejected | "Reason" >> beam.Map(lambda row: (row["reason"], 1)) | "CountReasons" >> beam.CombinePerKey(sum)
        )
        total = (
            reasons | "Counts" >> beam.Values() | "Total" >> beam.CombineGlobally(sum).without_defaults()
        )  # none rejected: no element
        shards = (
            rejected
            | "Key"
            >> beam.Map(
                lambda row, n: (rejected_shard_of(row, rejected_shard_count(n, per_shard)), row),
                beam.pvalue.AsSingleton(total, default_value=0),
            )
            | "Group" >> beam.GroupByKey()
            | "WriteShard" >> beam.ParDo(_WriteRejectedShardFn(self.out_dir))
        )
        return {"reasons": reasons, "shards": shards}


def write_reports(out_dir: str, rejected_shards: Iterable[str], stats: str, schema: str | None) -> None:
    """rejected.jsonl (`write_merged` of the rejected shards), stats.json, then schema.json (a run that
    finished), each through a temporary name in the temp dir; then the temp dir is removed, once,
    after the last file, so schema.json is never written into a temp dir already removed.

    Safe to run again, as a retried bundle does: the last of the reports in place (schema.json, or
    stats.json in a run without one) means an earlier attempt wrote them all and may have begun
    removing the temp dir, rejected shards included; then the removal alone is finished."""
    last = SCHEMA_FILE if schema is not None else STATS_FILE
    if not FileSystems.exists(FileSystems.join(out_dir, last)):
        write_merged(out_dir, REJECTED_FILE, rejected_shards)
        _write_text(out_dir, STATS_FILE, stats)
        if schema is not None:
            _write_text(out_dir, SCHEMA_FILE, schema)
    remove_temp_dir(out_dir)


class _WriteReportFn(beam.DoFn):
    def __init__(self, out_dir: str, cfg: PreprocessConfig, cache_dir: str | None = None):
        self.out_dir, self.cfg, self.cache_dir = out_dir, cfg, cache_dir

    def process(
        self,
        _,
        input_rows,
        before,
        cutoffs,
        plan,
        reasons,
        rejected_shards,
        shards,
        moments,
        tables,
        written,
        inputs,
        feature_groups,
        cache_use,
        quality_summary,
    ):
        buckets, text = plan["buckets"], plan["text"]
        written = written[0] if written else {}  # none when no batch was written
        features = None
        if self.cfg.features.pitch or self.cfg.features.energy or self.cfg.extractors:
            features = feature_groups[0] if feature_groups else feature_stats.empty_finished(self.cfg.optional_features)
        stats = build_stats(
            self.cfg,
            input_rows,
            before,
            plan["after"],
            cutoffs,
            dict(reasons),
            list(shards),
            buckets,
            text,
            plan["train_hist"],
            tables,
            written,
            inputs,
            features,
            QualityFigures.of(quality_summary, self.cfg),
        )
        if self.cache_dir:  # what the feature cache gave, and the files this run used (for `cache prune`)
            use = cache_use[0] if cache_use else {"counts": {}, "files": set()}
            run_id = posixpath.basename(self.out_dir.rstrip("/")).lstrip(".")
            stats["cache"] = {
                "dir": self.cache_dir,
                **{k: int(use["counts"].get(k, 0)) for k in CACHE_COUNTS},
                # the clips each part of an entry was computed for (`cache.part_names`); 0: read from the cache
                "parts_computed": {
                    p: int(use.get("parts", {}).get(p, 0))
                    for p in cache.part_names(self.cfg, [x["name"] for x in use.get("extractors", [])])
                },
                "files_used": len(use["files"]),
            }
            cache.record_use(self.cache_dir, run_id, use["files"])
        schema = None  # every row rejected (or filtered): no schema.json, the CLI says so from stats.json
        if cutoffs is not None and buckets is not None:
            ran = cache_use[0].get("extractors", []) if cache_use else []  # the extractors' records
            built = build_schema(self.cfg, buckets, text, moments, list(shards), tables, written, features, ran)
            schema = built.to_json()
        write_reports(self.out_dir, rejected_shards, json.dumps(stats, indent=2) + "\n", schema)
        if schema is not None:
            yield FileSystems.join(self.out_dir, SCHEMA_FILE)


class WriteReport(beam.PTransform):
    """Writes rejected.jsonl and stats.json, then schema.json, once the shards are in place."""

    def __init__(self, out_dir: str, cfg: PreprocessConfig, cache_dir: str | None = None):
        super().__init__()
        self.out_dir, self.cfg, self.cache_dir = out_dir, cfg, cache_dir

    def expand(self, inputs):
        S = beam.pvalue
        rejected = inputs["rejected"] | "Rejected" >> WriteRejected(self.out_dir)
        return (
            inputs["input_rows"].pipeline
            | "Once" >> beam.Create([None])
            | "Write"
            >> beam.ParDo(
                _WriteReportFn(self.out_dir, self.cfg, self.cache_dir),
                input_rows=S.AsSingleton(inputs["input_rows"]),
                before=S.AsSingleton(inputs["before"]),
                cutoffs=S.AsSingleton(inputs["cutoffs"]),
                plan=S.AsSingleton(inputs["plan"]),
                reasons=S.AsDict(rejected["reasons"]),
                rejected_shards=S.AsList(rejected["shards"]),
                shards=S.AsList(inputs["shards"]),
                moments=S.AsSingleton(inputs["moments"]),
                tables=S.AsSingleton(inputs["tables"]),
                written=S.AsList(inputs["written"]),
                inputs=S.AsSingleton(inputs["inputs"]),
                feature_groups=S.AsList(inputs["feature_stats"]),
                cache_use=S.AsList(inputs["cache"]),
                quality_summary=S.AsSingleton(inputs["quality"]),
            )
        )
