"""`melshards stats --by speaker|language`, and the speaker, language and split sections of stats.json:
tables, JSON and HTML from a two-speaker two-language stats.json built here, and the checks that refuse a
hand-edited one."""

from __future__ import annotations

import copy
import json
import re

import pytest
from click.testing import CliRunner

from melshards.commands.stats import stats_command
from melshards.shards_schema import SCHEMA_VERSION
from melshards.shards_schema.stats import compute_cutoffs, merge_histograms, summarize
from melshards.shards_schema.stats_model import stats_problem

# Lengths measured per language: en-US holds anna's 7 clips and the 2 of cleo (dropped: min_speaker_clips 3),
# en-GB bert's 4. The mel cut-off at p90 (300 frames) filters one of anna's clips (800 frames).
MEASURED = {
    "en-US": {
        "text_len": {30: 3, 50: 4, 90: 2},
        "mel_frames": {150: 3, 300: 5, 800: 1},
        "duration_ms": {1750: 3, 3490: 5, 9290: 1},
    },
    "en-GB": {"text_len": {20: 2, 40: 1, 70: 1}, "mel_frames": {120: 2, 250: 2}, "duration_ms": {1400: 2, 2900: 2}},
}
FILTER = {
    "min_duration_s": 0.5,
    "mel_frames_lower_percentile": 0.0,
    "mel_frames_upper_percentile": 90.0,
    "text_len_upper_percentile": 90.0,
    "min_speaker_clips": 3,
}
FRONTEND = {"name": "english", "version": 1}


def lengths(hists: dict) -> dict:
    return {
        "text_len": summarize(hists["text_len"]),
        "mel_frames": summarize(hists["mel_frames"]),
        "duration_s": summarize(hists["duration_ms"], scale=0.001),
    }


def speaker(id_, name, clips, hours, gender, measured, train, val) -> dict:
    return {
        "id": id_,
        "name": name,
        "clips": clips,
        "hours": hours,
        "gender": gender,
        "measured": measured,
        "per_split": {"train": train, "val": val},
    }


def two_speaker_stats() -> dict:
    """A valid stats.json of a measured run: speakers anna (en-US) and bert (en-GB), cleo dropped.

    The counts follow from the speakers: 13 rows, 10 in shards (train 8, val 2), 2 speaker_too_few_clips,
    1 mel_frames_above_cutoff.
    """
    before = {k: dict(merge_histograms(h[k] for h in MEASURED.values())) for k in MEASURED["en-US"]}
    after = {k: dict(h) for k, h in before.items()}
    for key, v in (("mel_frames", 800), ("duration_ms", 9290), ("text_len", 90)):  # anna's long clip
        after[key][v] -= 1
    for key, v in (("mel_frames", 150), ("duration_ms", 1750), ("text_len", 30)):  # cleo's two
        after[key][v] -= 2
    cut = compute_cutoffs(
        before, FILTER["min_duration_s"], 0.0, 90.0, 90.0, 8, {code: h["text_len"] for code, h in MEASURED.items()}
    )
    return {
        "schema_version": SCHEMA_VERSION,
        "counts": {
            "input_rows": 13,
            "in_shards": 10,
            "filtered": 3,
            "rejected": 0,
            "per_split": {"train": 8, "val": 2},
            "per_reason": {"speaker_too_few_clips": 2, "mel_frames_above_cutoff": 1},
        },
        "before_filter": lengths(before),
        "after_filter": lengths(after),
        "histograms": {
            part: {k: {str(v): c for v, c in sorted(h.items()) if c} for k, h in hists.items()}
            for part, hists in (("before_filter", before), ("after_filter", after))
        },
        "filter": FILTER,
        "cutoffs": {
            "min_duration_ms": cut.min_duration_ms,
            "min_mel_frames": cut.min_mel_frames,
            "max_mel_frames": cut.max_mel_frames,
            "max_text_len": cut.max_text_len,
            "padded_mel_frames": cut.padded_mel_frames,
            "padded_text_len": cut.padded_text_len,
            "max_text_len_by_language": cut.max_text_len_by_language,
        },
        "padding": {
            "max_text_len": cut.padded_text_len,
            "max_mel_frames": cut.padded_mel_frames,
            "multiple": 8,
            "mel_padding_fraction": 0.2,
            "text_padding_fraction": 0.4,
        },
        "speakers": [
            speaker(0, "anna", 6, 1.2345, "F", 7, 5, 1),
            speaker(1, "bert", 4, 2.5, "M", 4, 3, 1),
            speaker(None, "cleo", 0, 0.0, "", 2, 0, 0),
        ],
        "languages": [
            {
                "id": 0,
                "code": "en-GB",
                "clips": 4,
                "hours": 2.5,
                "text_frontend": dict(FRONTEND),
                "before_filter": lengths(MEASURED["en-GB"]),
                "max_text_len": 70,
            },
            {
                "id": 1,
                "code": "en-US",
                "clips": 6,
                "hours": 1.2345,
                "text_frontend": dict(FRONTEND),
                "before_filter": lengths(MEASURED["en-US"]),
                "max_text_len": 90,
            },
        ],
        "split": {"val_fraction": 0.2, "val_speakers": [], "val_speakers_not_found": []},
    }


def run_stats(*args):
    result = CliRunner().invoke(stats_command, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def write(tmp_path, stats: dict, name: str = "run"):
    d = tmp_path / name
    d.mkdir()
    (d / "stats.json").write_text(json.dumps(stats))
    return d


@pytest.fixture
def run_dir(tmp_path):
    return write(tmp_path, two_speaker_stats())


def test_the_helper_builds_a_valid_stats_json():
    stats = two_speaker_stats()
    assert stats_problem(stats) is None
    assert stats["cutoffs"]["max_text_len_by_language"] == {"en-GB": 70, "en-US": 90}  # p90 per language
    assert stats["cutoffs"]["max_mel_frames"] == 300


def test_by_speaker_prints_the_speakers_most_hours_first_the_dropped_one_marked(run_dir):
    result = run_stats(run_dir, "--by", "speaker")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"stats of {run_dir / 'stats.json'}",
        "",
        "Speakers (most hours in the shards first)",
        "id       name  gender  clips  hours  train  val  measured",
        "-------  ----  ------  -----  -----  -----  ---  --------",
        "1        bert       M      4  2.500      3    1         4",
        "0        anna       F      6  1.234      5    1         7",
        "dropped  cleo       -      0  0.000      0    0         2",
        "total                     10  3.735      8    2        13",
        "dropped: 1 speaker with fewer measured clips than filter.min_speaker_clips, not in the shards",
        "2 speakers; hours per speaker: median 1.867, min 1.234, max 2.500; 0 without a validation clip",
    ]


def test_by_language_prints_front_end_clips_hours_cut_off_and_lengths(run_dir):
    result = run_stats(run_dir, "--by", "language")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[2:] == [
        "Languages (clips and hours in the shards)",
        "code   id  front end   clips  hours  measured  text cut-off",
        "-----  --  ----------  -----  -----  --------  ------------",
        "en-GB  0   english v1      4  2.500         4            70",
        "en-US  1   english v1      6  1.234         9            90",
        "",
        "Lengths before filtering, per language",
        "code   length         p50   p90   p99   max",
        "-----  ------------  ----  ----  ----  ----",
        "en-GB  text symbols    20    70    70    70",
        "       mel frames     120   250   250   250",
        "       seconds       1.40  2.90  2.90  2.90",
        "en-US  text symbols    50    90    90    90",
        "       mel frames     300   800   800   800",
        "       seconds       3.49  9.29  9.29  9.29",
    ]


def test_the_default_report_gains_one_line_on_speakers_and_languages(run_dir, shards_dir):
    lines = run_stats(run_dir).output.splitlines()
    assert lines[1] == "2 speakers (+1 dropped), 2 languages (en-GB, en-US)" and lines[2] == ""
    assert run_stats(shards_dir).output.splitlines()[1] == "1 speaker, 1 language (en)"


def test_json_of_a_view_holds_every_row_and_the_summary(run_dir):
    figures = json.loads(run_stats(run_dir, "--by", "speaker", "--json").output)
    assert set(figures) == {"source", "speakers"}
    assert set(figures["speakers"]) == {"summary", "total", "rows"}
    assert [(r["name"], r["dropped"]) for r in figures["speakers"]["rows"]] == [
        ("bert", False),
        ("anna", False),
        ("cleo", True),
    ]
    assert figures["speakers"]["summary"] == {
        "speakers": 2,
        "dropped": 1,
        "hours_per_speaker": {"median": 1.8672, "min": 1.2345, "max": 2.5},
        "without_val": [],
        "val_speakers": [],
        "val_speakers_not_found": [],
    }
    assert figures["speakers"]["total"] == {
        "clips": 10,
        "hours": 3.7345,
        "per_split": {"train": 8, "val": 2},
        "measured": 13,
    }
    languages = json.loads(run_stats(run_dir, "--by", "language", "--json").output)["languages"]
    assert languages["codes"] == ["en-GB", "en-US"]
    assert set(languages["rows"][0]) == {
        "id",
        "code",
        "text_frontend",
        "clips",
        "hours",
        "measured",
        "max_text_len",
        "before_filter",
    }
    assert languages["rows"][1]["before_filter"]["mel_frames"] == {
        "count": 9,
        "p50": 300,
        "p90": 800,
        "p99": 800,
        "max": 800,
    }
    whole = json.loads(run_stats(run_dir, "--json").output)  # the full report holds both views
    assert whole["speakers"] == figures["speakers"] and whole["languages"] == languages


def test_a_thousand_speakers_show_the_top_50_and_say_how_many_more(tmp_path):
    stats = two_speaker_stats()
    many = [
        speaker(
            i,
            f"s{i:04d}",
            1 if i < 10 else 0,
            round(0.001 * (1000 - i), 4),
            "",
            1,
            1 if i < 8 else 0,
            1 if 8 <= i < 10 else 0,
        )
        for i in range(1000)
    ]
    stats["speakers"] = many
    assert stats_problem(stats) is None
    printed = run_stats(write(tmp_path, stats), "--by", "speaker").output.splitlines()
    rows = printed[printed.index(next(x for x in printed if x.startswith("---"))) + 1 :]
    assert [r.split()[1] for r in rows[:50]] == [f"s{i:04d}" for i in range(50)]
    assert rows[50].startswith("total") and rows[50].split()[1:3] == ["10", "500.500"]
    assert rows[51] == "950 more speaker(s) with fewer hours not shown; --json lists all 1000"
    assert "998 without a validation clip (s0000, s0001, s0002, s0003, s0004, ... (993 more))" in rows[52]
    assert (
        len(json.loads(run_stats(write(tmp_path, stats, "b"), "--by", "speaker", "--json").output)["speakers"]["rows"])
        == 1000
    )


def test_held_out_speakers_and_those_not_found_are_named(tmp_path):
    stats = two_speaker_stats()
    stats["split"] = {"val_fraction": 0.2, "val_speakers": ["bert", "zoe"], "val_speakers_not_found": ["zoe"]}
    printed = run_stats(write(tmp_path, stats), "--by", "speaker").output
    assert "held out for validation (split.val_speakers): bert\n" in printed
    assert "split.val_speakers not in the corpus: zoe; fix the names in the config" in printed


def test_html_adds_the_section_of_the_view(run_dir, tmp_path):
    for by, sections in (
        ("speaker", ["<h2>Speakers</h2>", "<td>dropped</td>", "<td>cleo</td>", 'alt="hours per speaker, top 50"']),
        ("language", ["<h2>Languages</h2>", "<td>english v1</td>", "<h3>Lengths before filtering, per language</h3>"]),
    ):
        out = tmp_path / f"{by}.html"
        result = run_stats(run_dir, "--by", by, "--html", out)
        assert result.exit_code == 0, result.output
        page = out.read_text()
        for text in sections + ["2 speakers (+1 dropped), 2 languages (en-GB, en-US)", "Length distributions"]:
            assert text in page, text
        assert len(re.findall(r'src="data:image/png;base64,', page)) == (3 if by == "speaker" else 2)
    page = (tmp_path / "language.html").read_text()
    assert "<h2>Speakers</h2>" not in page


def test_compare_by_speaker_shows_clips_and_hours_of_both_runs(run_dir, tmp_path):
    other = two_speaker_stats()
    other["speakers"][0].update(clips=4, hours=0.9, per_split={"train": 3, "val": 1})  # anna loses 2 clips
    other["languages"][1].update(clips=4, hours=0.9)
    for key in ("in_shards", "input_rows"):
        other["counts"][key] -= 2
    other["counts"]["per_split"]["train"] -= 2
    printed = run_stats(run_dir, "--by", "speaker", "--compare", write(tmp_path, other, "b")).output.splitlines()
    assert printed[3:] == [
        "speaker  clips A  clips B  B-A  hours A  hours B     B-A",
        "-------  -------  -------  ---  -------  -------  ------",
        "anna           6        4   -2    1.234    0.900  -0.334",
        "bert           4        4   +0    2.500    2.500  +0.000",
        "cleo           0        0   +0    0.000    0.000  +0.000",
    ]
    figures = json.loads(run_stats(run_dir, "--by", "language", "--compare", tmp_path / "b", "--json").output)
    assert set(figures) == {"a", "b"} and figures["b"]["languages"]["rows"][1]["clips"] == 4


def test_a_bad_by_value_is_a_usage_error_naming_the_choices(run_dir):
    result = run_stats(run_dir, "--by", "gender")
    assert result.exit_code == 2
    assert "Invalid value for '--by': 'gender' is not one of 'speaker', 'language'." in result.output


def test_a_run_that_rejected_every_row_has_no_speakers_to_show(tmp_path):
    empty = {"count": 0, "mean": None, "percentiles": {}}
    lengths_ = {"text_len": empty, "mel_frames": empty, "duration_s": empty}
    run = write(
        tmp_path,
        {
            "schema_version": SCHEMA_VERSION,
            "counts": {
                "input_rows": 3,
                "in_shards": 0,
                "filtered": 0,
                "rejected": 3,
                "per_split": {"train": 0, "val": 0},
                "per_reason": {"unreadable_audio": 3},
            },
            "before_filter": lengths_,
            "after_filter": lengths_,
            "histograms": {"before_filter": {}, "after_filter": {}},
            "filter": {},
            "cutoffs": None,
            "speakers": [],
            "languages": [],
            "split": {"val_fraction": 0.1, "val_speakers": [], "val_speakers_not_found": []},
        },
    )
    assert run_stats(run).output.splitlines()[1] == "0 speakers, 0 languages"
    assert "no speakers: no clip was measured" in run_stats(run, "--by", "speaker").output
    assert "no languages: no clip was measured" in run_stats(run, "--by", "language").output


# -- the checks of the new sections, as `melshards stats` refuses a hand-edited stats.json -----------------
def _set(path: str, value):
    def edit(stats):
        *parents, last = path.split(".")
        node = stats
        for key in parents:
            node = node[int(key) if key.isdigit() else key]
        if value is DELETE:
            del node[last]
        else:
            node[int(last) if last.isdigit() else last] = value

    return edit


def _swap_speakers(stats):
    stats["speakers"][0], stats["speakers"][2] = stats["speakers"][2], stats["speakers"][0]


def _move_a_val_clip_to_train(stats):
    stats["speakers"][0]["per_split"] = {"train": 6, "val": 0}


DELETE = object()


@pytest.mark.parametrize(
    "edit, problem",
    [
        (_set("speakers", DELETE), "speakers is missing"),
        (_set("languages", None), "languages is null, not a list"),
        (_set("split", DELETE), "split is missing"),
        (_set("speakers.0.clips", "6"), "speakers.0.clips is a string ('6'), not an integer"),
        (_set("speakers.0.hours", "1.2"), "speakers.0.hours is a string ('1.2'), not a number"),
        (_set("speakers.1.gender", "male"), "speakers.1.gender is a string ('male'), not 'F', 'M' or ''"),
        (_set("speakers.0.per_split", [5, 1]), "speakers.0.per_split is a list, not an object"),
        (
            _set("languages.0.text_frontend.version", None),
            "languages.0.text_frontend.version is null, not an integer or a string",
        ),
        (
            _set("languages.1.before_filter.text_len.percentiles.p50", "50"),
            "languages.1.before_filter.text_len.percentiles.p50 is a string ('50'), not a number",
        ),
        (_set("split.val_speakers", "bert"), "split.val_speakers is a string ('bert'), not a list"),
        (_set("speakers.0.clips", 7), "speakers.0.per_split sums to 6, but speakers.0.clips is 7"),
        (_set("speakers.2.measured", -2), "speakers.2.measured is -2, a negative count"),
        (_move_a_val_clip_to_train, "speakers' per_split.train sums to 9, but counts.per_split.train is 8"),
        (
            _set("speakers.1", speaker(1, "bert", 3, 2.5, "M", 4, 2, 1)),
            "speakers' clips sum to 9, but counts.in_shards is 10",
        ),
        (_set("speakers.1.id", 2), "speakers.1.id is 2, but ids run 0..N-1 in table order, so it should be 1"),
        (
            _swap_speakers,
            "speakers.1.id is 1, after a dropped speaker (id null) at speakers.0: dropped speakers come last",
        ),
        (
            _set("speakers.2", speaker(None, "cleo", 1, 0.0, "", 2, 1, 0)),
            "speakers.2.clips is 1, but speaker 'cleo' was dropped (id null): it has no clips",
        ),
        (_set("speakers.1.name", "anna"), "speakers.1.name is 'anna', a speaker listed twice"),
        (_set("languages.0.clips", 5), "languages' clips sum to 11, but counts.in_shards is 10"),
        (_set("languages.0.id", 1), "languages.0.id is 1, but ids run 0..N-1 in table order, so it should be 0"),
        (_set("languages.1.code", "en-GB"), "languages.1.code is 'en-GB', a language listed twice"),
        (
            _set("languages.0.max_text_len", 90),
            "languages.0.max_text_len is 90, but cutoffs.max_text_len_by_language.en-GB is 70",
        ),
        (
            _set("languages.1.max_text_len", None),
            "languages.1.max_text_len is null, but cutoffs.max_text_len_by_language.en-US is 90",
        ),
        (
            _set("cutoffs.max_text_len_by_language", {"en-GB": 70, "en-US": 80}),
            "cutoffs.max_text_len is 90, but the largest of cutoffs.max_text_len_by_language is 80",
        ),
        (
            _set(
                "inputs",
                [
                    {
                        "input": "a.csv",
                        "name": "a",
                        "format": "manifest",
                        "rows": "13",
                        "language": None,
                        "prefixed_speakers": 0,
                        "prefixed_ids": 0,
                    }
                ],
            ),
            "inputs.0.rows is a string ('13'), not an integer",
        ),
    ],
)
def test_a_stats_json_whose_speakers_or_languages_do_not_add_up_is_refused_naming_the_field(tmp_path, edit, problem):
    damaged = two_speaker_stats()
    edit(damaged)
    assert stats_problem(damaged) == problem
    result = run_stats(write(tmp_path, damaged), "--by", "speaker")
    assert result.exit_code == 2, result.output
    assert "is damaged" in result.output and problem in result.output
    assert "re-run `melshards preprocess`" in result.output and "Speakers" not in result.output


def test_inputs_are_optional_and_read_when_present():
    stats = two_speaker_stats()
    stats["inputs"] = [
        {
            "input": "a.csv",
            "name": "a",
            "format": "manifest",
            "rows": 13,
            "language": "en-US",
            "prefixed_speakers": 0,
            "prefixed_ids": 0,
        }
    ]
    assert stats_problem(stats) is None
    unmeasured = copy.deepcopy(stats)
    del unmeasured["inputs"]
    assert stats_problem(unmeasured) is None


def test_quality_drops_per_speaker_must_add_up_to_each_rules_count():
    stats = two_speaker_stats()
    stats["counts"]["per_reason"] = {"speaker_too_few_clips": 2, "clipped": 1}  # still 3 filtered
    stats["quality_dropped_by_speaker"] = {"anna": {"clipped": 1}}
    assert stats_problem(stats) is None
    stats["quality_dropped_by_speaker"] = {"anna": {"clipped": 1}, "bert": {"clipped": 1}}
    assert stats_problem(stats) == (
        "quality_dropped_by_speaker's clipped sums to 2, but counts.per_reason.clipped is 1"
    )
    stats["quality_dropped_by_speaker"] = {"anna": {"clipped": 1, "too_short": 1}}
    assert stats_problem(stats) == "quality_dropped_by_speaker.anna has 'too_short', not a quality rule"
