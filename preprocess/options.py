"""Beam's options for the job: refuse what neither melshards nor Beam knows, default the runner, and
tell a local runner from a remote one (`--workers` and the progress line apply only to local runs)."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.runner import create_runner

# Beam 2.77's DirectRunner first tries to download the Prism runner (no network here, and a slow
# start everywhere); the in-process FnApiRunner runs this job and honours --direct_num_workers
# and --direct_running_mode.
DEFAULT_RUNNER = "FnApiRunner"
LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner")


class OptionsError(ValueError):
    """A Beam option (or --workers) the job cannot run with: said in one line, before any work."""


def _beam_parser() -> argparse.ArgumentParser:
    """Beam's own parser of every registered PipelineOptions class (handed out by its public hook)."""
    parsers: list[argparse.ArgumentParser] = []
    PipelineOptions([]).get_all_options(add_extra_args_fn=parsers.append)
    parser = parsers[0]
    parser.exit_on_error = False  # ArgumentError instead of printing usage and exiting
    return parser


def check_beam_args(beam_args: list[str], own_options: list[str]) -> None:
    """Refuse options that neither melshards nor Beam knows (Beam would only log a warning and run
    with its defaults), suggesting the closest known name."""
    parser = _beam_parser()
    try:
        _, unknown = parser.parse_known_args(beam_args)
    except argparse.ArgumentError as e:
        raise OptionsError(f"bad Beam option: {e}") from e
    if not unknown:
        return
    flag = next((a for a in unknown if a.startswith("-")), None)
    if flag is None:
        raise OptionsError(f"unexpected argument {unknown[0]!r}: preprocess takes only options (see --help)")
    name = flag.split("=", 1)[0]
    beam_names = ["--" + dest for dest in PipelineOptions([]).get_all_options()]

    def is_flag(candidate: str) -> bool:  # an option's dest is not always one of its flags
        try:
            return candidate in own_options or not parser.parse_known_args([candidate])[1]
        except argparse.ArgumentError:  # known, but wants a value
            return True

    close = [c for c in difflib.get_close_matches(name, own_options + beam_names, n=5) if is_flag(c)]
    hint = f"; did you mean {close[0]}?" if close else "; see --help, and Beam's pipeline options"
    raise OptionsError(f"unknown option {name}: neither melshards nor Beam knows it{hint}")


def check_runner(runner: str) -> None:
    """OptionsError for a --runner Beam cannot make (an unknown name, a module that does not import):
    Beam would say so only when the job is built."""
    try:
        create_runner(runner)
    except (ValueError, ImportError) as e:
        raise OptionsError(f"bad Beam option --runner {runner}: {e}") from e


def pipeline_options(beam_args: list[str], own_options: Sequence[str] = ()) -> PipelineOptions:
    """The job's options from the arguments neither melshards nor click took; OptionsError (the only
    error here said to be a bad Beam option) for one Beam cannot parse or run with."""
    check_beam_args(beam_args, list(own_options))
    try:
        options = PipelineOptions(beam_args)
        std = options.view_as(StandardOptions)
    except ValueError as e:  # what Beam's own parsing refuses beyond argparse's checks
        raise OptionsError(f"bad Beam option: {e}") from e
    if std.runner is None:
        std.runner = DEFAULT_RUNNER
    if isinstance(std.runner, str):
        check_runner(std.runner)
    return options


def is_local(options: PipelineOptions) -> bool:
    runner = options.view_as(StandardOptions).runner
    return (runner if isinstance(runner, str) else type(runner).__name__) in LOCAL_RUNNERS
