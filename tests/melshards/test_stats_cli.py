"""`melshards stats`: printed tables against stats.json, JSON, the HTML report, comparison, errors."""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil

import pytest
from click.testing import CliRunner

from melshards.commands.stats import stats_command
from melshards.reports.stats_json_tables import COLUMNS
from melshards.reports.stats_report import build_report, load_run, stats_problem
from melshards.reports.whatif import DEFAULT_WHAT_IF
from melshards.shards_schema import SCHEMA_VERSION
from melshards.shards_schema.stats import REPORT_PERCENTILES, pkey


def run_stats(*args: str):
    result = CliRunner().invoke(stats_command, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


@pytest.fixture(scope="module")
def stats(shards_dir) -> dict:
    return json.loads((shards_dir / "stats.json").read_text())


@pytest.fixture(scope="module")
def printed(shards_dir) -> str:
    result = run_stats(shards_dir, "--batch-size", "16")
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def html_report(shards_dir, tmp_path_factory):
    """`stats --html` of the session's run, written once for the tests that read the page (one figure
    rendering for all): the page's path. Read-only: copy it before writing over it."""
    out = tmp_path_factory.mktemp("html") / "report.html"
    result = run_stats(shards_dir, "--html", out)
    assert result.exit_code == 0, result.output
    return out


def cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"\s{2,}", line.strip())]


def table(text: str, first_header: str) -> dict[str, list[str]]:
    """Rows of the printed table whose header starts with `first_header`, keyed by the first cell.

    The table ends at the first line without one cell per column (a blank line or the notes under it).
    """
    lines = text.splitlines()
    start = next(
        i
        for i, line in enumerate(lines)
        if line.startswith(first_header) or line.strip().startswith(first_header + " ")
    )
    width = len(cells(lines[start]))
    rows = {}
    for line in lines[start + 2 :]:
        row = cells(line)
        if len(row) != width:
            break
        rows[row[0]] = row[1:]
    return rows


def test_percentile_table_matches_stats_json(printed, stats):
    rows = table(printed, "pct")
    for q in REPORT_PERCENTILES:
        cells = rows[pkey(q)]
        want = [
            stats[part][key]["percentiles"][pkey(q)] for key, _ in COLUMNS for part in ("before_filter", "after_filter")
        ]
        assert [float(c) for c in cells] == pytest.approx([round(w, 2) for w in want], abs=0.005)
    means = [stats[part][key]["mean"] for key, _ in COLUMNS for part in ("before_filter", "after_filter")]
    assert [float(c) for c in rows["mean"]] == pytest.approx([round(m, 2) for m in means], abs=0.005)


def test_counts_table_matches_stats_json(printed, stats):
    rows = table(printed, "clips")
    c = stats["counts"]
    for label, key in (
        ("input rows", "input_rows"),
        ("in shards", "in_shards"),
        ("filtered", "filtered"),
        ("rejected", "rejected"),
    ):
        assert int(rows[label][0]) == c[key]
    for split, n in c["per_split"].items():
        assert int(rows[split][0]) == n
    for reason, n in c["per_reason"].items():
        assert int(rows[reason][0]) == n
        assert rows[reason][1] == f"{100 * n / c['input_rows']:.1f}%"


def test_padding_table_matches_stats_json(printed, stats):
    rows = table(printed, "length")
    pad, cut = stats["padding"], stats["cutoffs"]
    assert rows["mel frames"] == [
        f"{cut['min_mel_frames']}..{cut['max_mel_frames']}",
        str(pad["max_mel_frames"]),
        f"{100 * pad['mel_padding_fraction']:.1f}%",
        f"{100 * (1 - pad['mel_padding_fraction']):.1f}%",
    ]
    assert rows["text symbols"][1:3] == [str(pad["max_text_len"]), f"{100 * pad['text_padding_fraction']:.1f}%"]
    mib = 16 * (pad["max_mel_frames"] * 80 * 4 + pad["max_text_len"] * 4) / 2**20
    assert f"one batch of 16: {mib:.1f} MiB" in printed


def test_printed_what_if_rows_match_the_json_figures(shards_dir, printed):
    figures = json.loads(run_stats(shards_dir, "--batch-size", "16", "--json").output)
    rows = table(printed, "upper")
    assert len(rows) == len(figures["what_if"]) == 6
    for w in figures["what_if"]:
        label = pkey(w["mel_q"]) + (" *" if w["is_job"] else "")
        assert rows[label] == [
            str(w["mel_cut"]),
            str(w["padded_mel_frames"]),
            str(w["text_cut"]),
            str(w["padded_text_len"]),
            f"{w['kept']}/{w['clips']}",
            f"{100 * w['kept_fraction']:.1f}%",
            str(w["text_over_cut"]),
            f"{100 * w['mel_padding_fraction']:.1f}%",
            f"{100 * w['text_padding_fraction']:.1f}%",
            f"{w['batch_bytes'] / 2**20:.1f}",
        ]
        assert w["batch_bytes"] == 16 * (w["padded_mel_frames"] * 80 * 4 + w["padded_text_len"] * 4)


def test_json_holds_the_same_figures_as_stats_json(shards_dir, stats):
    figures = json.loads(run_stats(shards_dir / "stats.json", "--json").output)
    assert figures["counts"]["per_reason"] == stats["counts"]["per_reason"]
    assert figures["after_filter"] == stats["after_filter"]
    assert figures["padding"]["max_mel_frames"] == stats["padding"]["max_mel_frames"]
    assert figures["n_mels"] == 80 and figures["batch_size"] == 32
    reasons = {r["reason"]: r for r in figures["reasons"]}
    assert reasons["mel_frames_above_cutoff"]["kind"] == "filtered"
    assert reasons["unreadable_audio"]["kind"] == "rejected"
    assert {e["id"] for e in reasons["mel_frames_above_cutoff"]["examples"]} == {"LJT003-0001", "LJT003-0002"}


def test_html_report_is_self_contained_and_holds_the_plots(html_report):
    page = html_report.read_text()
    # nothing fetched from elsewhere: every src is an embedded image, no links, scripts or style sheets
    sources = re.findall(r'src="([^"]*)"', page)
    assert len(sources) == 3  # the histograms, the what-if plot and the quality measures
    for src in sources:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")
    assert not re.search(r"https?://|<link|<script|url\(", page)
    for text in (
        "Length distributions",
        "What if",
        "Percentiles",
        "LJT003-0001",
        "mel_frames_above_cutoff",
        "p95 *",
        "Quality measures",
    ):
        assert text in page


def test_compare_shows_two_runs_side_by_side(shards_dir, tmp_path):
    other = json.loads((shards_dir / "stats.json").read_text())
    other["padding"]["max_mel_frames"] += 48
    other["counts"]["per_reason"]["too_long_for_test"] = 2  # a rejection reason: the counts must still add up
    other["counts"]["rejected"] += 2
    other["counts"]["input_rows"] += 2
    (tmp_path / "stats.json").write_text(json.dumps(other))
    result = run_stats(shards_dir, "--compare", tmp_path / "stats.json")
    assert result.exit_code == 0, result.output
    rows = table(result.output, "figure")
    pad = other["padding"]["max_mel_frames"]
    assert rows["padded mel frames"] == [str(pad - 48), str(pad), "+48"]
    assert rows["reason too_long_for_test"] == ["0", "2", "+2"]
    assert rows["in shards"][2] == "+0"


def test_a_directory_without_stats_json_is_an_error_that_says_what_to_pass(tmp_path):
    result = run_stats(tmp_path)
    assert result.exit_code != 0
    assert "stats.json does not exist" in result.output and "melshards preprocess" in result.output


def test_a_stats_json_without_schema_beside_it_still_reports(shards_dir, tmp_path):
    shutil.copy(shards_dir / "stats.json", tmp_path / "stats.json")
    result = run_stats(tmp_path / "stats.json")
    assert result.exit_code == 0, result.output
    assert "pass --n-mels" in result.output
    with_mels = run_stats(tmp_path / "stats.json", "--n-mels", "80")
    assert "one batch of 32" in with_mels.output


def test_bad_what_if_percentiles_are_refused():
    result = run_stats("anything", "--what-if", "90,abc")
    assert result.exit_code == 2 and "comma-separated" in result.output


@pytest.fixture(scope="module")
def all_rejected_dir(tmp_path_factory):
    """A run's directory whose stats.json says every row was rejected (no clip measured): its report has
    no figures to draw, so the tests of how `--html` writes render this one (cheap) page. Read-only."""
    run = tmp_path_factory.mktemp("all_rejected")
    empty = {"count": 0, "mean": None, "percentiles": {}}
    lengths = {"text_len": empty, "mel_frames": empty, "duration_s": empty}
    (run / "stats.json").write_text(
        json.dumps(
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
                "before_filter": lengths,
                "after_filter": lengths,
                "histograms": {"before_filter": {}, "after_filter": {}},
                "filter": {},
                "cutoffs": None,
            }
        )
    )
    return run


def test_a_run_that_rejected_every_row_still_reports_counts_and_html(all_rejected_dir, tmp_path):
    result = run_stats(all_rejected_dir, "--html", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    assert table(result.output, "clips")["unreadable_audio"] == ["3", "100.0%"]
    assert "no what-if: no clip was measured" in result.output
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


def test_json_compare_holds_both_runs_figures(shards_dir, tmp_path):
    other = json.loads((shards_dir / "stats.json").read_text())
    for key in ("in_shards", "input_rows"):  # the counts must still add up, and the tables with them
        other["counts"][key] += 5
    other["counts"]["per_split"]["train"] += 5
    other["speakers"][0]["clips"] += 5
    other["speakers"][0]["per_split"]["train"] += 5
    other["languages"][0]["clips"] += 5
    (tmp_path / "stats.json").write_text(json.dumps(other))
    figures = json.loads(run_stats(shards_dir, "--compare", tmp_path / "stats.json", "--json").output)
    assert set(figures) == {"a", "b"}
    assert figures["b"]["counts"]["in_shards"] == figures["a"]["counts"]["in_shards"] + 5
    assert figures["a"]["source"] != figures["b"]["source"]


DELETE = object()


@pytest.mark.parametrize(
    "path, value, problem",
    [
        (["counts"], [56, 44], "counts is a list, not an object"),
        (["counts", "input_rows"], "56", "counts.input_rows is a string ('56'), not an integer"),
        (["counts", "per_reason"], ["unreadable_audio"], "counts.per_reason is a list, not an object"),
        (
            ["before_filter", "mel_frames", "percentiles", "p50"],
            "231.5",
            "before_filter.mel_frames.percentiles.p50 is a string ('231.5'), not a number",
        ),
        (
            ["after_filter", "text_len", "mean"],
            "49.66",
            "after_filter.text_len.mean is a string ('49.66'), not a number",
        ),
        (["histograms"], [], "histograms is a list, not an object"),
        (
            ["histograms", "before_filter", "mel_frames", "abc"],
            1,
            "histograms.before_filter.mel_frames has the key 'abc', not an integer length",
        ),
        (
            ["histograms", "after_filter", "duration_ms", "2140"],
            "many",
            "histograms.after_filter.duration_ms.2140 is a string ('many'), not an integer",
        ),
        (["histograms", "before_filter", "text_len"], DELETE, "histograms.before_filter.text_len is missing"),
        (["cutoffs"], "none", "cutoffs is a string ('none'), not an object"),
        (["padding", "multiple"], None, "padding.multiple is null, not an integer"),
        (["filter", "mel_frames_upper_percentile"], DELETE, "filter.mel_frames_upper_percentile is missing"),
    ],
)
def test_a_stats_json_with_a_field_of_the_wrong_type_is_named_not_a_traceback(stats, tmp_path, path, value, problem):
    damaged = copy.deepcopy(stats)
    *parents, last = path
    node = damaged
    for key in parents:
        node = node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    assert stats_problem(damaged) == problem
    (tmp_path / "stats.json").write_text(json.dumps(damaged))
    result = run_stats(tmp_path)  # asserts that the error is a message, not a traceback
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'stats.json'} is damaged" in result.output and problem in result.output
    assert "re-run `melshards preprocess`" in result.output


@pytest.mark.parametrize(
    "edit, problem",
    [
        ({"input_rows": 999}, "counts.input_rows is 999, but in_shards + filtered + rejected"),
        ({"in_shards": -1}, "counts.in_shards is -1, a negative count"),
        ({"per_split": {"train": 1, "val": 0}}, "counts.per_split sums to 1, but counts.in_shards is"),
        ({"per_reason": {"unreadable_audio": -4}}, "counts.per_reason.unreadable_audio is -4, a negative count"),
        ({"filtered": 0, "rejected": "ALL"}, "counts.per_reason's filtered reasons sum to"),
    ],
)
def test_a_stats_json_whose_counts_do_not_add_up_names_the_field_with_exit_2(stats, tmp_path, edit, problem):
    damaged = copy.deepcopy(stats)
    counts = damaged["counts"]
    if edit.get("rejected") == "ALL":  # every dropped row moved to `rejected`: the sum holds, the split does not
        edit = dict(edit, rejected=counts["filtered"] + counts["rejected"])
    counts.update(edit)
    (tmp_path / "stats.json").write_text(json.dumps(damaged))
    result = run_stats(tmp_path)
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'stats.json'} is damaged" in result.output and problem in result.output
    assert "stats of" not in result.output  # no table printed from the bad counts


@pytest.mark.parametrize("where", ["directory", "under a file"])
def test_html_to_a_path_that_cannot_be_a_file_is_exit_2_before_any_output(shards_dir, tmp_path, where):
    (tmp_path / "taken").write_text("a file")
    html = tmp_path if where == "directory" else tmp_path / "taken" / "sub" / "r.html"
    before = sorted(tmp_path.rglob("*"))
    result = run_stats(shards_dir, "--html", html)
    assert result.exit_code == 2, result.output
    assert f"--html {html}" in result.output
    assert ("names a directory" if where == "directory" else "is a file") in result.output
    assert "stats of" not in result.output
    assert sorted(tmp_path.rglob("*")) == before  # nothing created


def test_html_write_failure_is_exit_2_naming_the_path(all_rejected_dir, tmp_path, monkeypatch):
    from melshards.shards_schema.atomic import LocalFiles

    def create(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(LocalFiles, "create", staticmethod(create))
    out = tmp_path / "r.html"
    result = run_stats(all_rejected_dir, "--html", out)
    assert result.exit_code == 2, result.output
    assert f"--html {out}: cannot write it" in result.output and "Permission denied" in result.output
    assert list(tmp_path.iterdir()) == []


def test_an_html_write_cut_short_keeps_the_previous_report_whole(all_rejected_dir, tmp_path, html_report, monkeypatch):
    """The disk fills up half-way through the page: the previous report is left as it was (the page is
    written beside it and renamed over it), and nothing else is left behind."""
    import builtins
    import io

    out = tmp_path / "report.html"
    shutil.copyfile(html_report, out)
    before = out.read_bytes()
    real_open = io.open

    class HalfWritten:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def cut_short(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return HalfWritten(f) if "w" in mode and str(file).startswith(str(tmp_path)) else f

    monkeypatch.setattr(io, "open", cut_short)  # Beam's local files open through io.open
    monkeypatch.setattr(builtins, "open", cut_short)
    result = run_stats(all_rejected_dir, "--html", out)
    monkeypatch.undo()
    assert result.exit_code == 2 and f"--html {out}: cannot write it" in result.output, result.output
    assert "No space left on device" in result.output
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_the_stats_json_preprocess_wrote_has_the_shape_stats_reads(stats):
    assert stats_problem(stats) is None


def test_bucket_tables_match_stats_json(bucketed_dir):
    stats = json.loads((bucketed_dir / "stats.json").read_text())
    printed = run_stats(bucketed_dir).output
    rows = table(printed, "bucket")
    b = stats["buckets"]
    for r in b["buckets"]:
        assert rows[f"b{r['index']:02d}"] == [
            str(r["max_mel_frames"]),
            str(r["max_text_len"]),
            str(r["records"]["train"]),
            str(r["records"]["val"]),
            f"{100 * r['mel_padding_fraction']:.1f}%",
            f"{100 * r['text_padding_fraction']:.1f}%",
        ]
    assert rows["all"][4] == f"{100 * b['mel_padding_fraction']:.1f}%"
    for m in b["merges"]:
        assert f"a bucket up to {m['bound']} frames would hold {m['records']} < 8 training records" in printed
    ks = table(printed, "K")
    assert list(ks) == ["1", "2", "4 *", "8", "16"]  # --buckets 4: the job's row is starred
    for w in b["what_if"]:
        row = ks[str(w["k"]) + (" *" if w["k"] == 4 else "")]
        assert row == [str(w["buckets_used"])] * 2 + [f"{100 * w['padding_fraction']:.1f}%"]


def test_html_report_shows_the_buckets(bucketed_dir):
    from melshards.reports.html_report import render_html

    run = load_run(str(bucketed_dir), None)
    # the page without its quality section (the figure `stats --html` draws in html_report is not needed here)
    page = render_html(build_report(run, 32, list(DEFAULT_WHAT_IF)), run.stats["histograms"])
    assert "Length buckets" in page and "What if the number of buckets were different" in page
    assert "<td>b03</td>" in page


def test_histogram_axis_ends_past_the_kept_clips_and_counts_the_outliers():
    from melshards.reports.html_report import shown_range

    before = {100: 5, 200: 5, 300: 1, 10_000: 2}  # two 100 s outliers
    lo, hi, beyond = shown_range(before, {100: 5, 200: 5}, [216.0, 300.0])
    assert (lo, hi, beyond) == (100, 346, 2)
    assert shown_range({100: 1, 150: 1}, {100: 1}, [152.0]) == (100, 150, 0)  # nothing beyond: the data's end


@pytest.mark.parametrize("name", ["schema.json", "stats.json", "rejected.jsonl", "train-*.tfrecord"])
def test_stats_html_refuses_to_write_over_a_runs_own_files(shards_dir, tmp_path, name):
    run = tmp_path / "run"
    shutil.copytree(shards_dir, run)
    target = next(run.glob(name))
    before = target.read_bytes()
    result = run_stats(run, "--html", target)
    assert result.exit_code == 2, result.output
    assert f"--html {target}: it exists and is not an HTML report" in result.output
    assert "stats of" not in result.output  # refused before anything is printed
    assert target.read_bytes() == before


def test_stats_html_refuses_a_page_it_did_not_write_and_writes_over_its_own_report(
    all_rejected_dir, tmp_path, html_report
):
    theirs = tmp_path / "notes.html"
    theirs.write_text("<!DOCTYPE html><html><head><title>my notes</title></head><body>mine</body></html>\n")
    result = run_stats(all_rejected_dir, "--html", theirs)
    assert result.exit_code == 2 and "is not an HTML report" in result.output, result.output
    assert "mine" in theirs.read_text()
    ours = tmp_path / "report.html"
    shutil.copyfile(html_report, ours)  # a report an earlier `stats --html` wrote
    ours.write_text(ours.read_text().replace("Length distributions", "an older report"))
    result = run_stats(all_rejected_dir, "--html", ours)  # writes over it
    assert result.exit_code == 0, result.output
    assert "Length distributions" in ours.read_text() and "an older report" not in ours.read_text()
