"""TensorFlow's C++ start-up INFO lines are hidden by default; warnings, errors and a user's own
TF_CPP_MIN_LOG_LEVEL are kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from melshards.train.tf_quiet import keep_line

INFO = "I0000 00:00:1795333283.558699    6284 port.cc:153] oneDNN custom operations are on."
WARN = "W0000 00:00:1795333283.558699    6284 x.cc:1] a warning"
ERROR = "E0000 00:00:1795333291.594740    6284 x.cc:1] an error"
NO_GPU = (
    "E0000 00:00:1795333291.594740    6284 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
    "Failed call to cuInit: UNKNOWN ERROR (303)"
)
BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
OTHER = "Traceback (most recent call last):"


@pytest.mark.parametrize(
    "level, kept",
    [
        (0, [INFO, WARN, ERROR, BANNER, OTHER]),
        (1, [WARN, ERROR, OTHER]),
        (2, [ERROR, OTHER]),
        (3, [OTHER]),
    ],
)
def test_import_lines_are_kept_by_severity(level, kept):
    assert [line for line in (INFO, WARN, ERROR, BANNER, OTHER) if keep_line(line, level)] == kept


def _stderr_of(args, **env):
    base = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(args, capture_output=True, text=True, env=dict(base, **env), timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_melshards_help_imports_neither_tensorflow_nor_beam():
    """The top-level help and every subcommand's help, in one fresh interpreter: none imports
    TensorFlow (whose import prints the start-up lines) or Beam."""
    code = """
import sys
from melshards.commands import cli
for args in (["--help"], ["train", "--help"], ["synthesize", "--help"], ["inspect", "--help"],
             ["preprocess", "--help"], ["stats", "--help"]):
    try:
        cli.main(args=args, prog_name="melshards", standalone_mode=False)
    except SystemExit:
        pass
    print(args[0], [m for m in ("tensorflow", "apache_beam") if m in sys.modules], file=sys.stderr)
"""
    err = _stderr_of([sys.executable, "-c", code])
    assert err.splitlines()[-6:] == [
        f"{name} []" for name in ("--help", "train", "synthesize", "inspect", "preprocess", "stats")
    ], err


# What TensorFlow's C++ start-up prints, written straight to file descriptor 2 as C++ code does (not
# through sys.stderr), by a stand-in `tensorflow` package: a real TensorFlow prints different lines,
# or none, depending on the machine (no oneDNN line on a CPU without oneDNN).
FAKE_TF = f"""
import os
os.write(2, {(BANNER + chr(10)).encode()!r})
os.write(2, b"I0000 00:00:1795333283.558699    6284 fake.cc:1] known info line\\n")
os.write(2, b"W0000 00:00:1795333283.558699    6284 fake.cc:2] known warning line\\n")
os.write(2, b"E0000 00:00:1795333283.558699    6284 fake.cc:3] known error line\\n")


class config:  # what melshards.train.tf_quiet calls inside its capture
    @staticmethod
    def list_physical_devices(device_type=None):
        return []
"""


@pytest.mark.parametrize(
    "user_level, shown",
    [
        (None, ["known warning line", "known error line"]),  # unset: INFO hidden
        ("0", [BANNER, "known info line", "known warning line", "known error line"]),
        ("2", ["known error line"]),
        ("3", []),
    ],
)
def test_a_users_own_log_level_decides_which_import_lines_are_shown(tmp_path, user_level, shown):
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(FAKE_TF)
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from melshards.train.tf_quiet import tf; "
        f"assert tf.__file__.startswith({str(tmp_path)!r}), tf.__file__"
    )
    env = {} if user_level is None else {"TF_CPP_MIN_LOG_LEVEL": user_level}
    err = _stderr_of([sys.executable, "-c", code], **env)
    everything = [BANNER, "known info line", "known warning line", "known error line"]
    assert [text for text in everything if text in err] == shown, err


def test_cuinit_failing_is_shown_only_when_a_gpu_was_asked_for():
    assert not keep_line(NO_GPU, 1) and not keep_line(NO_GPU, 2)
    assert keep_line(NO_GPU, 1, gpu=True) and keep_line(NO_GPU, 0)
    assert keep_line(ERROR, 2)


def test_gpu_asked_means_cuda_visible_devices_names_a_device(monkeypatch):
    from melshards.train.tf_quiet import gpu_asked

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert not gpu_asked()
    for value, asked in (("0", True), ("0,1", True), ("", False), ("-1", False)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert gpu_asked() is asked


CACHE_READ = (
    "E0000 00:00:1795874332.247076    9731 text_format.cc:378] Error parsing text-format "
    "tensorflow.XlaSerializedCacheEntry: 2:1: Expected identifier, got: 4"
)


AOT_LOADER = (
    "E0000 00:00:1795912230.223508   21189 cpu_aot_loader.cc:220] Loading XLA:CPU AOT result. Target machine "
    "feature +{} is not  supported on the host machine. Machine type used for XLA:CPU compilation doesn't "
    "match the machine type for execution. Compile machine features: [+64bit,+avx512f,+prefer-no-scatter,"
    "+prefer-no-gather] vs host machine features: [64bit]. This could lead to execution errors such as SIGILL."
)


def test_reading_the_xla_cache_drops_the_tuning_hint_feature_lines_and_keeps_a_missing_instruction_set(
    capfd, monkeypatch
):
    """XLA:CPU's complaint that the tuning attributes +prefer-no-scatter and +prefer-no-gather are not host
    features is dropped when a cached program loads; the same complaint for a real instruction set stays."""
    from melshards.train.tf_quiet import reading_xla_cache

    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_persistent_cache_directory=/tmp/x")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    scatter, gather, avx = (AOT_LOADER.format(f) for f in ("prefer-no-scatter", "prefer-no-gather", "avx512f"))
    with reading_xla_cache():
        os.write(2, f"{scatter}\n{gather}\n{avx}\n{CACHE_READ}\n".encode())
    assert capfd.readouterr().err == f"{avx}\n"


def test_reading_the_xla_cache_drops_its_text_parse_line_and_passes_every_other_line_in_order(capfd, monkeypatch):
    """What TensorFlow logs each time it reads a persistent-cache entry is dropped; every other line written
    to file descriptor 2 meanwhile (C++ errors, a line left open) comes through, in order. (Python's
    sys.stderr writes to file descriptor 2 too, except under pytest's capture.)"""
    from melshards.train.tf_quiet import reading_xla_cache

    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_persistent_cache_directory=/tmp/x")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    with reading_xla_cache():
        os.write(2, f"{ERROR}\n{CACHE_READ}\n".encode())
        os.write(2, f"{OTHER}\n".encode())
        os.write(2, f"{CACHE_READ}\nno newline yet".encode())
    os.write(2, b", now one\n")
    assert capfd.readouterr().err == f"{ERROR}\n{OTHER}\nno newline yet, now one\n"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # the user asked for every line
    with reading_xla_cache():
        os.write(2, f"{CACHE_READ}\n".encode())
    assert capfd.readouterr().err == f"{CACHE_READ}\n"
