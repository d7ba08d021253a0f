"""The quality figures of stats.json and `melshards stats`: the model's checks, the quality section and its
what-if tables, `--by`, `--json`, `--compare` and `--html`, from the two-speaker stats.json of test_stats_by with
the quality figures of a few synthetic clips added (`melshards.preprocess.stats.quality_stats`, as the job makes them)."""

from __future__ import annotations

import copy
import json
import re

import pytest

from melshards.preprocess.write.report import mostly_dropped
from melshards.shards_schema.stats_model import stats_problem
from tests.melshards.test_stats_by import run_stats, two_speaker_stats
from tests.preprocess.test_quality_stats import CLIPS, figures_of

PER_REASON = {"anna": {"mel_frames_above_cutoff": 1}, "bert": {}, "cleo": {"speaker_too_few_clips": 2}}


def quality_stats() -> dict:
    """two_speaker_stats with the quality figures of CLIPS (anna 7, bert 4, cleo 2: its speakers' measured)."""
    stats = two_speaker_stats()
    q = figures_of(CLIPS)
    stats["quality"] = q.section()
    for row in stats["speakers"]:
        row.update(q.speaker(row["name"]), per_reason=dict(PER_REASON[row["name"]]))
    for row in stats["languages"]:
        row.update(q.language(row["code"]), per_reason={})
    stats["mostly_dropped"] = mostly_dropped(stats["speakers"], stats["languages"])  # cleo: 2 of 2
    return stats


@pytest.fixture
def stats_file(tmp_path):
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(quality_stats()))
    return path


def test_the_model_accepts_the_quality_figures_and_a_stats_json_without_them():
    assert stats_problem(quality_stats()) is None
    assert stats_problem(two_speaker_stats()) is None  # written before the quality measures


@pytest.mark.parametrize(
    "edit, problem",
    [
        (
            lambda s: s["quality"]["global"]["snr_db"]["histogram"].update({"149": 2}),
            "a quality histogram sums to 13, but its count is 12",
        ),
        (
            lambda s: s["speakers"][1]["per_reason"].update(mel_frames_above_cutoff=1),
            "speakers' per_reason.mel_frames_above_cutoff sums to 2, but counts.per_reason.mel_frames_above_cutoff is 1",
        ),
        (
            lambda s: s["speakers"][0]["quality"]["snr_db"].update(not_measured=1),
            "speakers.0.quality.snr_db counts 7 + 1 not measured clips, but speakers.0.measured is 7",
        ),
        (lambda s: s["quality"]["measures"].pop("cer"), "quality.global.cer has no grid in quality.measures"),
        (
            lambda s: s["quality"]["rules"].update(min_snr_db="15"),
            "quality.rules.min_snr_db is a string ('15'), not a number, a boolean or null",
        ),
        (
            lambda s: s["quality"]["rate_what_if"][0].update(least=5),
            "rate outliers at k=1.0: least 5 is more than most 1",
        ),
        (
            lambda s: s["quality"]["rate_unjudged"].append(
                {"language": "en-US", "frontend": "english", "rated": 8, "speakers": ["anna", "cleo"]}
            ),
            "quality.rate_unjudged has en-US with 8 rated clips, but quality.rules.rate_min_clips is 3: it was judged",
        ),
        (
            lambda s: s["mostly_dropped"][0].update(dropped=1, per_reason={"speaker_too_few_clips": 1}),
            "mostly_dropped speaker cleo: 1 dropped of 2 measured is not most of them",
        ),
        (
            lambda s: s["mostly_dropped"][0].update(dropped=1),
            "mostly_dropped speaker cleo: per_reason sums to 2, but dropped is 1",
        ),
    ],
)
def test_the_model_refuses_quality_figures_that_do_not_add_up(edit, problem):
    stats = quality_stats()
    edit(stats)
    assert stats_problem(stats) == problem


def test_the_report_leads_with_the_speakers_and_languages_mostly_dropped(stats_file):
    lines = run_stats(stats_file).output.splitlines()
    assert lines[1:3] == [
        "WARNING: the filter dropped most of the clips of 1 speaker (stats.json mostly_dropped); listen to some of "
        "their rejected.jsonl rows before training without them:",
        "  speaker cleo  2 of 2 (100.0%): speaker_too_few_clips 2",
    ]


def test_the_report_shows_each_measure_its_rule_and_what_other_bounds_would_drop(stats_file):
    out = run_stats(stats_file).output
    section = out[out.index("Quality measures") :]
    assert re.search(r"snr_db\s+dB\s+12\s+1\s+12\s+12\s+30\s+50\s+50\s+30.07\s+noisy\s+< 15\s+0", section)
    # below 15 dB: anna's 12 and bert's 14.95; below 25: and 20; below 30: and 25, 28
    rows = re.findall(r"^\s*(?:noisy\s+snr_db)?\s+(\d+) (\*)?\s+(\d+)\s+[\d.]+%\s+12$", section, re.M)
    assert [(b, n) for b, _, n in rows] == [("5", "0"), ("10", "0"), ("15", "2"), ("20", "2"), ("25", "3"), ("30", "5")]
    assert [star for _, star, _ in rows].count("*") == 1
    assert re.search(r"^\s*3 \*\s+1$", section, re.M)  # the rate rule at the run's k (3): anna's 30 symbols/s


def test_json_holds_the_what_if_rows_and_by_views_hold_quality_per_speaker_and_language(stats_file):
    report = json.loads(run_stats(stats_file, "--json").output)["quality"]
    noisy = next(w for w in report["what_if"] if w["rule"] == "noisy")["rows"]
    assert {r["setting"]: (r["least"], r["most"]) for r in noisy}[15.0] == (2, 2)
    cer = next(m for m in report["measures"] if m["measure"] == "cer")
    assert (cer["count"], cer["not_measured"], cer["percentiles"]["p50"]) == (4, 9, 0.25)
    by_speaker = run_stats(stats_file, "--by", "speaker").output
    # name, rate p50, snr p50, speaker_too_few_clips, mel_frames_above_cutoff, rate outliers at the run's k (3)
    assert re.search(r"^anna\s+16\s+33\s+0\s+1\s+1$", by_speaker, re.M)
    assert re.search(r"^cleo\s+15\s+50\s+2\s+0\s+0$", by_speaker, re.M)
    languages = json.loads(run_stats(stats_file, "--by", "language", "--json").output)["languages"]["rows"]
    assert languages[0]["quality"]["cer"]["percentiles"]["p50"] == 0.25 and "histogram" not in languages[0]["quality"]


def test_compare_and_html_show_the_quality_figures(stats_file, tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps(two_speaker_stats()))
    out = run_stats(old, "--compare", stats_file).output
    assert re.search(r"quality snr_db p50\s+-\s+30\s+-$", out, re.M)
    page = tmp_path / "r.html"
    assert run_stats(stats_file, "--by", "speaker", "--html", page).exit_code == 0
    html = page.read_text()
    for text in ("Quality measures", "What if the quality bounds were different", "Quality per speaker"):
        assert text in html
    # lengths, what-if, quality measures, hours per speaker, speaking rate per speaker
    assert html.count("data:image/png;base64,") == 5
    bad = copy.deepcopy(quality_stats())
    bad["quality"]["global"]["snr_db"]["count"] = 3
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert run_stats(tmp_path / "bad.json").exit_code == 2


def test_compare_by_speaker_shows_each_runs_quality_drops(stats_file, tmp_path):
    other = quality_stats()  # anna's one filtered clip dropped by the noisy rule instead of the mel cut-off
    other["counts"]["per_reason"] = {"speaker_too_few_clips": 2, "noisy": 1}
    other["speakers"][0]["per_reason"] = {"noisy": 1}
    (tmp_path / "b.json").write_text(json.dumps(other))
    out = run_stats(stats_file, "--by", "speaker", "--compare", tmp_path / "b.json").output
    assert re.search(r"^anna\s+6\s+6\s+\+0\s+1.234\s+1.234\s+\+0.000\s+0\s+1$", out, re.M)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(two_speaker_stats()))
    out = run_stats(old, "--by", "speaker", "--compare", tmp_path / "b.json").output
    assert re.search(r"^anna\s+6\s+6\s+.*\s+-\s+1$", out, re.M)  # A was written before the counts


def test_the_quality_section_names_the_languages_the_rate_bounds_did_not_judge():
    from melshards.reports.quality_tables import quality_report, quality_table

    stats = quality_stats()
    stats["quality"]["rate_unjudged"] = [{"language": "cmn", "frontend": "characters", "rated": 2, "speakers": ["dai"]}]
    text = " ".join(quality_table({"quality": quality_report(stats)}).split())
    assert (
        "Not judged by the rate bounds (too few rated clips), only by the ceiling on symbols per second: cmn "
        "(characters, 2 rated clips: dai)" in text
    )
