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

Every read of the persistent XLA cache (train/xla_cache.py) logs "E0000 ... text_format.cc] Error
parsing text-format tensorflow.XlaSerializedCacheEntry: ..." at ERROR level, although the program
loads: TensorFlow writes each entry as a binary proto (WriteBinaryProto) and reads it with
ReadTextOrBinaryProto, which tries the text format first, and protobuf's text parser logs its
failure through absl before the binary read succeeds. absl takes no filter but a minimum severity
(TF_CPP_MIN_LOG_LEVEL 3 would hide every ERROR line, real ones too), so around the calls that compile
with XLA, and so may read the cache, `reading_xla_cache` sends file descriptor 2 through a filter
process that drops exactly the lines holding that message (`CACHE_ENTRY_TEXT_PARSE`) and passes
every other line on, in order, a fatal error's included (the filter outlives this process).

Loading a cached XLA:CPU program also logs, at ERROR level, that its "Target machine feature
+prefer-no-scatter" and "+prefer-no-gather" are "not supported on the host machine ... could lead to
execution errors such as SIGILL", on the machine that compiled it too: XLA records these two LLVM
tuning attributes among the compile machine's features, and the host's list never holds them. They
choose how code is scheduled, not which instructions exist, so those two lines are dropped as well
(`HARMLESS_FEATURE_LINES`); a line naming any other missing feature (a real instruction set) is kept.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator

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


# what protobuf logs each time TensorFlow reads a persistent XLA cache entry (see the module doc)
CACHE_ENTRY_TEXT_PARSE = "Error parsing text-format tensorflow.XlaSerializedCacheEntry"
HARMLESS_FEATURE_LINES = tuple(
    f"Target machine feature +{hint} is not  supported on the host machine"  # XLA's text, two spaces included
    for hint in ("prefer-no-scatter", "prefer-no-gather")
)
FILTER_DRAIN_S = 10.0  # at most this long for the filter to pass the block's last lines on

# the filter: stdin (the command's fd 2 meanwhile) line by line to stdout (the command's stderr), less
# the lines holding any of argv[1:]; it reads to the end whatever happens to a write, so no writer ever blocks
_DROP_LINES = """\
import sys
drops, out = [a.encode() for a in sys.argv[1:]], sys.stdout.buffer
for line in iter(sys.stdin.buffer.readline, b""):
    if not any(drop in line for drop in drops):
        try:
            out.write(line)
            out.flush()
        except OSError:
            pass
"""


@contextlib.contextmanager
def dropping_stderr_lines(*fragments: str) -> Iterator[None]:
    """Meanwhile file descriptor 2 (TensorFlow's C++ logging and Python's sys.stderr) goes through a
    filter process that drops the lines holding any of `fragments` and passes every other line on, in order;
    it has passed them all on when the block ends. The filter runs in a session of its own: a Ctrl-C
    does not reach it, and if this process dies in the block it still passes on what was written
    before. With TF_CPP_MIN_LOG_LEVEL 0 (show everything), or when the filter cannot start, nothing is
    filtered."""
    started = _start_filter(fragments) if min_log_level() > 0 else None
    if started is None:
        yield
        return
    saved, proc = started
    os.dup2(proc.stdin.fileno(), 2)  # type: ignore[union-attr]  # stdin=PIPE
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        proc.stdin.close()  # type: ignore[union-attr]
        try:
            proc.wait(timeout=FILTER_DRAIN_S)
        except subprocess.TimeoutExpired:  # a process started in the block holds the pipe: the filter ends with it
            pass


def _start_filter(fragments: tuple[str, ...]) -> tuple[int, subprocess.Popen] | None:
    """(a copy of fd 2, the filter process writing to it), or None when either cannot be had."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to filter
        return None
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _DROP_LINES, *fragments],
            stdin=subprocess.PIPE,
            stdout=saved,
            start_new_session=True,
        )
    except OSError:
        os.close(saved)
        return None
    return saved, proc


def reading_xla_cache():
    """`dropping_stderr_lines` of CACHE_ENTRY_TEXT_PARSE and HARMLESS_FEATURE_LINES when the persistent XLA
    cache is on (TF_XLA_FLAGS names it), else a block that changes nothing: around a call that may compile
    with XLA."""
    from melshards.train.xla_cache import cache_dir_in_flags

    if cache_dir_in_flags(os.environ.get("TF_XLA_FLAGS", "")) is None:
        return contextlib.nullcontext()
    return dropping_stderr_lines(CACHE_ENTRY_TEXT_PARSE, *HARMLESS_FEATURE_LINES)


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
