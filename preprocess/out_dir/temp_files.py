"""The run's temp files: what a stage of the job writes for a later one outside Beam's model, and the
one reason each stays right when a runner runs a bundle again (after a failure, or twice at once).

A stage hands on what grows with the corpus (rows, measured clips, their arrays) as files in the
run's temp dir, and the runner carries only where they are: its memory does not grow with the corpus.
Every such file keeps four rules; this module names and writes each of them, and reads those read
whole (a scan and the rejected rows' shards are read as streams, through the same references):

1. **Named by what it holds** (`content_name`): its kind and the sha1 of the ids (or the input path)
   it holds. A bundle's elements are the same in every attempt and what it writes is a function of
   them, so a bundle run again, or twice at once, writes the same names with the same bytes.
2. **Written whole or not at all** (`write`, `writing`): a local file under a temporary name of its
   own (`<name>.<random>.writing`), renamed over its name once complete; a gs:// object in one upload,
   which makes the object only when the block ends without an error (an error cancels the upload). A
   reader finds no file or a whole one: an earlier attempt's or this one's, which are the same bytes.
3. **Read through a reference** (`read`): the path, and where in it, that a Beam element carries. A
   stage yields a reference after its file is written, and the runner passes on only the outputs of a
   bundle that succeeded: no stage looks for a file that a failed attempt left unwritten or half
   made, and none looks for one by listing the directory.
4. **Removed with the temp dir** by the report stage, after the last reader (`shards.remove_temp_dir`),
   with what failed attempts left there (a `.writing` file, a file no passed-on reference names).

| file | written by | read by |
|---|---|---|
| `scan-<sha1 of the container file's path>.pkl` | ScanFiles (`read_stage.write_scan`) | ReadRows (`read_stage.read_scan`) |
| `rows-<sha1 of the rows' ids>.pkl`, batches of rows | ReadRows (`batch_files.write_rows`) | Measure |
| `clips-<sha1 of the clips' ids>.pkl`, `features-<same>.npz` | Measure (`batch_files.write_measured`) | DuplicateAudio, ChooseBuckets, AttachReferences, FilterAndWrite |
| `rejected-NNNNN.jsonl` (the rows whose id's crc32 falls in shard N) | WriteRejected (`report`) | WriteReport |
| `progress-<sha1 of a batch's ids>-<rows>.txt` (empty), `input-rows.txt` | Measure, ReadRows (`progress`) | the command's progress line |

The progress files are the one exception to rule 3: the command is no stage of the job and takes
no element, so it lists them. Each holds nothing but its name, a batch and its rows: a batch measured
twice is one file, counted once.

The temp TFRecord files (`shards.RollingFiles`) keep the same rules with a writer of their own, which
names a file by the hash of its bytes once it has streamed them. Outside the temp dir: the feature
cache's entries, which the writer reads back through the path a clip carries (`cache`: kept across
runs, named by their keys, written whole; one gone or damaged is computed again). No channel at all:
the read stage's sqlite working set (`inputs.working_set`) and a worker thread's held readers
(`inputs.packed_clips`), each made, used and dropped inside one attempt of one stage.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.out_dir.lock import is_local_path
from melshards.preprocess.out_dir.shards import TEMP_DIR, StagingFiles, create_file
from melshards.shards_schema.atomic import atomic_write


def temp_dir(out_dir: str) -> str:
    """The run's temp dir in its output (staging) dir: made before the job, removed by the report stage."""
    return FileSystems.join(out_dir, TEMP_DIR)


def digest(held: Iterable[str]) -> str:
    """The sha1 of the ids (or paths) a file holds, one a line: the same in every attempt."""
    return hashlib.sha1("\n".join(held).encode("utf-8")).hexdigest()


def content_name(kind: str, held: Iterable[str], suffix: str) -> str:
    """`<kind>-<digest of held><suffix>`: a temp file's name, from what it holds."""
    return f"{kind}-{digest(held)}{suffix}"


@contextlib.contextmanager
def writing(path: str) -> Iterator[BinaryIO]:
    """A binary file for the whole content of `path`, in place when the block ends, not at all when it
    raises (rule 2 above)."""
    if is_local_path(path):
        with atomic_write(path, fs=StagingFiles) as f:
            yield f
    else:  # Beam's gs:// writer: the upload is made at close, cancelled when the block raises
        with create_file(path) as f:
            yield f


def write(path: str, data: bytes) -> str:
    """`data` as the whole content of `path` (`writing`); returns `path`."""
    with writing(path) as f:
        f.write(data)
    return path


def read(path: str, offset: int = 0, size: int = -1) -> bytes:
    """The bytes of a temp file a reference names: `size` bytes from `offset` (default: all)."""
    with FileSystems.open(path) as f:
        if offset:
            f.seek(offset)
        return f.read(size)
