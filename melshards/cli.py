"""The `melshards` command: subcommands are imported only when used (TensorFlow is slow to import)."""
from __future__ import annotations

import importlib
import os

import click

_COMMANDS = {
    "preprocess": ("preprocess.run", "preprocess_command"),
    "train": ("train.run", "train_command"),
    "synthesize": ("train.synthesize", "synthesize_command"),
    "stats": ("melshards.stats_cli", "stats_command"),
    "inspect": ("melshards.inspect_cli", "inspect_command"),
}


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


class _LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(_COMMANDS)

    def get_command(self, ctx, name):
        if name not in _COMMANDS:
            return None
        module, attr = _COMMANDS[name]
        return getattr(importlib.import_module(module), attr)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="melshards")
def cli() -> None:
    """Log-mel TFRecord shards for TTS training: preprocess once, train with static shapes."""


def main() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF C++ INFO off, warnings kept; Beam workers inherit it
    cli()
