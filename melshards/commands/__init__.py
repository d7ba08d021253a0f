"""The `melshards` command: the click group here, one module per subcommand beside it, each imported
only when it runs.

TensorFlow and Beam are slow to import (docs/performance.md#preprocess-start-up), so `melshards --help`
lists the commands from the short help kept here and imports neither; `melshards stats` imports no
TensorFlow.
The subcommands share the helpers below (logging, output-file checks, running without exiting).
The tables, what-ifs and HTML they print live in `melshards.reports`.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import logging
import os

import click

# name -> (module, click command, one-line help shown by `melshards --help`)
_COMMANDS = {
    "preprocess": (
        "melshards.commands.preprocess",
        "preprocess_command",
        "Corpus -> log-mel -> percentile statistics -> filter -> pad -> TFRecord shards.",
    ),
    "train": (
        "melshards.commands.train",
        "train_command",
        "Train a text-to-mel model on shards written by `preprocess`.",
    ),
    "synthesize": (
        "melshards.commands.synthesize",
        "synthesize_command",
        "Speak text with a trained model and write a WAV.",
    ),
    "stats": (
        "melshards.commands.stats",
        "stats_command",
        "Percentiles, counts, padding and what-if cut-offs of a preprocessing run.",
    ),
    "inspect": ("melshards.commands.inspect", "inspect_command", "Check shards against their schema without training."),
    "cache": ("melshards.commands.cache", "cache_command", "Size of the preprocess feature cache, and pruning it."),
}
_USES_TENSORFLOW = ("train", "synthesize", "inspect")
_KEEPS_COMPILED = ("train", "synthesize")  # the commands that compile with XLA: their programs kept across runs


def setup_logging() -> None:
    """INFO lines of melshards itself; libraries' INFO chatter (absl's checkpoint callbacks) stays out."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("absl").setLevel(logging.WARNING)


def check_output_file(option: str, path: str, example: str) -> None:
    """Refuse (exit 2) a local output file that cannot be written: a directory, a path under a file, or
    one in a directory that is not writable. Creates nothing; gs:// paths are left to the write."""
    if "://" in path:
        return
    if os.path.isdir(path) or path.endswith(("/", os.sep)):
        raise click.UsageError(
            f"{option} {path} names a directory; pass the path of the file to write, e.g. {os.path.join(path, example)}"
        )
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):  # the nearest existing ancestor decides: the rest is created later
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise click.UsageError(
            f"{option} {path}: cannot create its directory, {parent} is a file; pass a path in a directory"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise click.UsageError(f"{option} {path}: {parent} is not writable; pass a path in a writable directory")


def run_command(command: click.Command, argv: list[str] | None, prog_name: str) -> int:
    """Run a click command without exiting (tests, `python -m ...`); returns the exit code."""
    try:
        command.main(args=argv, standalone_mode=False, prog_name=prog_name)
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return e.exit_code
    return 0


def import_tensorflow_quietly(command: str) -> None:
    """TensorFlow without its C++ start-up INFO lines (`melshards.train.tf_quiet`), before a command runs;
    for `train` and `synthesize`, with the persistent XLA cache on (`melshards.train.xla_cache`; TensorFlow
    reads its XLA flags as it starts)."""
    if command in _KEEPS_COMPILED:
        from melshards.train.xla_cache import enable_persistent_cache

        enable_persistent_cache()
    from melshards.train.tf_quiet import import_tensorflow

    import_tensorflow()


class _LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(_COMMANDS)

    def get_command(self, ctx, name):
        if name not in _COMMANDS:
            return None
        module, attr, _ = _COMMANDS[name]
        command = getattr(importlib.import_module(module), attr)
        if name in _USES_TENSORFLOW and not getattr(command, "_imports_tf_quietly", False):
            run = command.invoke  # runs the command; `--help` exits before it, without TensorFlow

            def invoke(ctx, run=run, name=name):
                import_tensorflow_quietly(name)
                return run(ctx)

            command.invoke, command._imports_tf_quietly = invoke, True
        return command

    def format_commands(self, ctx, formatter):
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_, _, short) in _COMMANDS.items()])


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="melshards")
def cli() -> None:
    """Log-mel TFRecord shards for TTS training: preprocess once, train with static shapes."""


def main() -> None:
    # At exit, the interpreter's last garbage collections walk the whole heap (Beam, librosa, numba,
    # TensorFlow; docs/performance.md#preprocess-start-up). Frozen objects are skipped; memory goes
    # back to the OS with the process either way.
    atexit.register(gc.freeze)
    cli()
