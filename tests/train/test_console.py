"""TensorFlow's C++ start-up INFO lines are hidden by default; warnings, errors and a user's own
TF_CPP_MIN_LOG_LEVEL are kept."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from train.tf_quiet import keep_line

INFO = "I0000 00:00:1795333283.558699    6284 port.cc:153] oneDNN custom operations are on."
WARN = "W0000 00:00:1795333283.558699    6284 x.cc:1] a warning"
ERROR = "E0000 00:00:1795333291.594740    6284 x.cc:1] an error"
NO_GPU = ("E0000 00:00:1795333291.594740    6284 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
          "Failed call to cuInit: UNKNOWN ERROR (303)")
BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
OTHER = "Traceback (most recent call last):"


@pytest.mark.parametrize("level, kept", [
    (0, [INFO, WARN, ERROR, BANNER, OTHER]),
    (1, [WARN, ERROR, OTHER]),
    (2, [ERROR, OTHER]),
    (3, [OTHER]),
])
def test_import_lines_are_kept_by_severity(level, kept):
    assert [line for line in (INFO, WARN, ERROR, BANNER, OTHER) if keep_line(line, level)] == kept


def _stderr_of(args, **env):
    base = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(args, capture_output=True, text=True, env=dict(base, **env), timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_melshards_help_prints_no_tensorflow_start_up_lines():
    err = _stderr_of([sys.executable, "-c", "import sys; from melshards.cli import main; sys.argv[0] = 'melshards'; "
                                            "main()", "--help"])
    assert "oneDNN" not in err and "cuda drivers" not in err and "absl::InitializeLog" not in err


def test_a_users_own_log_level_is_respected():
    code = "from train.tf_quiet import tf"
    assert "oneDNN custom operations" not in _stderr_of([sys.executable, "-c", code])
    assert "oneDNN custom operations" in _stderr_of([sys.executable, "-c", code], TF_CPP_MIN_LOG_LEVEL="0")


def test_cuinit_failing_is_shown_only_when_a_gpu_was_asked_for():
    assert not keep_line(NO_GPU, 1) and not keep_line(NO_GPU, 2)
    assert keep_line(NO_GPU, 1, gpu=True) and keep_line(NO_GPU, 0)
    assert keep_line(ERROR, 2)


def test_a_cpu_run_prints_no_cuinit_error_unless_a_gpu_was_asked_for():
    code = "from train.tf_quiet import tf; tf.config.list_physical_devices(); tf.constant(1.0).numpy()"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in env.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
    assert done.returncode == 0, done.stderr
    assert "cuInit" not in done.stderr and "cuda_platform" not in done.stderr


def test_gpu_asked_means_cuda_visible_devices_names_a_device(monkeypatch):
    from train.tf_quiet import gpu_asked

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert not gpu_asked()
    for value, asked in (("0", True), ("0,1", True), ("", False), ("-1", False)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert gpu_asked() is asked
