"""`melshards inspect SHARD_GLOB`: check shards against their schema without training."""

from __future__ import annotations

import os
import posixpath

import click

MAX_PROBLEMS_SHOWN = 20  # per file; a file of bad records would otherwise bury the summary


def shard_table(results) -> str:
    from melshards.reports.stats_json_tables import render
    from melshards.shards_schema.shards import base_name, dir_of

    one_dir = len({dir_of(r.path) for r in results}) == 1
    rows = [
        [
            base_name(r.path) if one_dir else r.path,
            r.split,
            str(r.records),
            "-" if r.expected is None else str(r.expected),
            str(len(r.problems)),
        ]
        for r in results
    ]
    return render(["shard", "split", "records", "listed", "problems"], rows, left=2)


@click.command("inspect", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("shard_globs", nargs=-1, required=True, metavar="SHARD_GLOB...")
@click.option(
    "--schema", "schema_path", default=None, help="schema.json to check against; default: the one beside each shard."
)
@click.option(
    "--show",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Print N good records and write their mel as PNG to --out.",
)
@click.option(
    "--out",
    "out_dir",
    default="melshards-inspect",
    show_default=True,
    help="Directory for the --show PNGs (created if missing); a file there is written over only if inspect wrote it.",
)
def inspect_command(shard_globs: tuple[str, ...], schema_path: str | None, show: int, out_dir: str) -> None:
    """Count records per shard and split, check every record parses to its length bucket's shapes and
    that 0 < text_len <= max_text_len and 0 < mel_len <= max_mel_frames of the bucket. Exits 1 when it
    finds problems.

    Quote SHARD_GLOB, e.g. 'out/demo/shards/*.tfrecord' (local or gs://); file names the shell
    expanded work too.
    """
    from melshards.shards_schema import SPLITS, SchemaError
    from melshards.shards_schema.shards import InputError, check_shard, expand_globs, reference_problems, schemas_for

    if show:
        check_out_dir(out_dir)
    try:
        files = expand_globs(shard_globs)
    except InputError as e:
        raise click.UsageError(str(e)) from e
    try:
        schemas, problems = schemas_for(files, schema_path)
    except (SchemaError, InputError) as e:
        raise click.ClickException(str(e)) from e
    results: list = []
    shown: list = []
    for f in files:
        result, records = check_shard(f, schemas[f], keep=show - len(shown))
        results.append(result)
        shown += [(r, schemas[f]) for r in records]
        problems += result.problems
    problems += reference_problems(files, schemas)  # other_clip runs: each reference is the slice it names

    click.echo(shard_table(results))
    per_split = dict.fromkeys([*SPLITS, *(r.split for r in results)], 0)
    for r in results:
        per_split[r.split] += r.records
    click.echo(
        f"total: {sum(r.records for r in results)} records in {len(results)} shards ("
        + ", ".join(f"{s} {n}" for s, n in per_split.items())
        + ")"
    )
    if shown:
        _show(shown, out_dir)
    if problems:
        click.echo(f"\nPROBLEMS ({len(problems)}):")
        for path in dict.fromkeys(p.path for p in problems):
            mine = [p for p in problems if p.path == path]
            for p in mine[:MAX_PROBLEMS_SHOWN]:
                click.echo(f"  {p}")
            if len(mine) > MAX_PROBLEMS_SHOWN:
                click.echo(f"  ... and {len(mine) - MAX_PROBLEMS_SHOWN} more in {path}")
        raise SystemExit(1)
    s = schemas[files[0]]
    shapes = ", ".join(
        f"b{b.index:02d} text_ids [{b.max_text_len}] mel [{b.max_mel_frames}, {s.n_mels}]" for b in s.buckets
    )
    extra = f"; the records also hold {', '.join(s.optional)}, consistent with their lengths" if s.optional else ""
    click.echo(
        f"\nOK: every record parses to its bucket's shapes ({shapes}) with 0 < text_len <= the bucket's "
        f"max_text_len and 0 < mel_len <= its max_mel_frames{extra}"
    )


def check_out_dir(out_dir: str) -> None:
    """Refuse (exit 2), before any shard is read, a local --out that is a file or lies under one; creates
    nothing. gs:// paths are left to the write."""
    if "://" in out_dir:
        return
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise click.UsageError(
            f"--out {out_dir} is a file; pass a directory for the --show PNGs (it is created if missing)"
        )
    parent = os.path.dirname(os.path.abspath(out_dir))
    while not os.path.exists(parent):  # the nearest existing ancestor decides: the rest is created later
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise click.UsageError(f"--out {out_dir}: cannot create it, {parent} is a file; pass a directory path")


def png_paths(shown, out_dir: str) -> list[str]:
    """Where the --show PNGs go, one per record (`record_view.png_names`: distinct clip ids never share a
    file); UsageError (exit 2) naming any file there that inspect did not write
    (`melshards.shards_schema.ownership`), before one is written."""
    from melshards.reports.record_view import png_names
    from melshards.shards_schema.ownership import PNG, NotOurs, check_may_write

    paths = [posixpath.join(out_dir, name + ".png") for name in png_names([record for record, _ in shown])]
    try:
        for path in paths:
            check_may_write("--out", path, PNG)
    except NotOurs as e:
        raise click.UsageError(str(e)) from e
    return paths


def _show(shown, out_dir: str) -> None:
    import tensorflow as tf

    from melshards.reports.record_view import describe, save_png

    paths = png_paths(shown, out_dir)
    try:
        tf.io.gfile.makedirs(out_dir)
    except (tf.errors.OpError, OSError) as e:
        raise click.UsageError(f"--out {out_dir}: cannot create it ({e}); pass a writable directory") from e
    for (record, schema), path in zip(shown, paths):
        click.echo("")
        for line in describe(record, schema):
            click.echo(line)
        with tf.io.gfile.GFile(path, "wb") as f:
            save_png(record, schema, f)
        click.echo(f"  mel PNG   {path}")
