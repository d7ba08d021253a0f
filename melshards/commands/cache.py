"""`melshards cache info DIR` and `melshards cache prune DIR`: the feature cache of `preprocess --cache`."""

from __future__ import annotations

import time

import click


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


@click.group("cache", context_settings={"help_option_names": ["-h", "--help"]})
def cache_command() -> None:
    """The feature cache of `melshards preprocess --cache DIR` (docs/preprocess.md, Feature cache)."""


def check_cache_dir(cache_dir: str) -> None:
    """Refuse (exit 2, one line) a DIR that is missing or a file: nothing to report or prune there."""
    from melshards.preprocess.clip import cache

    why = cache.not_a_cache_dir(cache_dir)
    if why:
        raise click.UsageError(
            f"{cache_dir}: {why}; give the directory a run was given as `melshards preprocess --cache DIR`"
        )


@cache_command.command("info")
@click.argument("cache_dir", metavar="DIR")
def info_command(cache_dir: str) -> None:
    """What the cache holds: entries (clips), files, bytes, and what no recorded run used."""
    from melshards.preprocess.clip import cache

    check_cache_dir(cache_dir)
    i = cache.info(cache_dir)
    if not i.files:
        click.echo(f"{cache_dir}: no cache entries (a cache is made by `melshards preprocess --cache {cache_dir}`)")
        return
    click.echo(
        f"{cache_dir}: {i.entries} clips in {i.files} files, {_size(i.bytes)}; {i.runs} recorded run(s); "
        f"{i.unused_files} file(s) no recorded run used (`melshards cache prune` removes them)"
    )


@cache_command.command("prune")
@click.argument("cache_dir", metavar="DIR")
@click.option(
    "--unused-days",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Forget the runs older than this, then remove the entries no remaining run used.",
)
def prune_command(cache_dir: str, unused_days: float) -> None:
    """Remove the entries no run of the last --unused-days used; none while a run is using the cache."""
    from melshards.preprocess.clip import cache

    check_cache_dir(cache_dir)
    pruned = cache.prune(cache_dir, unused_days, time.time())
    click.echo(f"{cache_dir}: removed {pruned.files} file(s), {_size(pruned.bytes)}")
    if pruned.live:
        runs = ", ".join(f"{h.get('run_id')} (pid {h.get('pid', '?')} on {h.get('host', '?')})" for h in pruned.live)
        click.echo(
            f"kept every entries file: {len(pruned.live)} run(s) using the cache now ({runs}); "
            "prune again once they have finished"
        )
