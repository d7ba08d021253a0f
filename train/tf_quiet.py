"""`from melshards.train.tf_quiet import tf`: TensorFlow, imported without its C++ start-up INFO lines.

Importing TensorFlow 2.21 prints "oneDNN custom operations are on" and "Could not find cuda
drivers" (INFO), twice, through absl logging before absl::InitializeLog, which writes everything
to stderr and ignores TF_CPP_MIN_LOG_LEVEL (the variable filters only TF's own logger). So the
import runs with file descriptor 2 captured, and the captured lines are replayed, minus the
absl-format lines below TF_CPP_MIN_LOG_LEVEL (default 1: INFO hidden, warnings and errors kept; a
user's own value is respected, 0 shows everything). Every train module imports TensorFlow from
here, so whichever comes first does the filtered import.

The physical devices are listed inside the same capture: that is when CUDA is initialised, and on a
machine without a GPU it logs "E0000 ... cuda_platform.cc:52] failed call to cuInit: ... UNKNOWN
ERROR (303)" at ERROR level. That line is dropped unless the user asked for a GPU (`gpu_asked`:
CUDA_VISIBLE_DEVICES set to a device, not "" or "-1"), or TF_CPP_MIN_LOG_LEVEL is 0.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

# absl/glog line prefix: severity letter, then MMDD (0000 before absl is initialised) and the time
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
_UNINITIALISED = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_NO_GPU = "failed call to cuInit"


def gpu_asked() -> bool:
    """Whether the user asked for a GPU: CUDA_VISIBLE_DEVICES names a device ("" and "-1" hide them all)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible is not None and visible.strip() not in ("", "-1")


def min_log_level() -> int:
    """TF_CPP_MIN_LOG_LEVEL (set to 1 when the user has not set it); 0 when it is not a number."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        return int(os.environ["TF_CPP_MIN_LOG_LEVEL"])
    except ValueError:
        return 0


def keep_line(line: str, level: int, gpu: bool = False) -> bool:
    """Whether a line TensorFlow printed while importing passes TF_CPP_MIN_LOG_LEVEL `level`; `gpu`: the
    user asked for a GPU, so CUDA failing to start is news."""
    if level <= 0:
        return True
    if line.startswith(_UNINITIALISED):  # only announces the INFO lines that follow
        return False
    if _NO_GPU in line and not gpu:  # no GPU here, and none asked for: the CPU run is what was meant
        return False
    match = _ABSL_LINE.match(line)
    return match is None or _SEVERITY[match.group(1)] >= level


def import_tensorflow():
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    level = min_log_level()
    if level <= 0:
        import tensorflow

        return tensorflow
    gpu = gpu_asked()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow

            tensorflow.config.list_physical_devices()  # initialises CUDA (logs cuInit's failure without a GPU)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode("utf-8", "replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if keep_line(line, level, gpu)))
            sys.stderr.flush()
    return tensorflow


tf = import_tensorflow()
