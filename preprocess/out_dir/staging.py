"""The output directory: one run at a time, built beside the run it replaces, published only once
it has finished, and never a file removed that melshards cannot prove it wrote.

While a run is live, `OUT_DIR` holds, besides a finished earlier run (if any):

    .melshards-lock           the holder: host, pid, run id, heartbeat. One live run per directory.
    .melshards-run-<id>/      the run's staging dir. `run.json` is written there before anything
                              else; the job writes its shards, reports and temp files only in it.
    .melshards-publish.json   only while a finished run is being moved into place (the journal).

melshards removes only:
- the files a finished run's `schema.json` lists (its shards), with that run's `schema.json`,
  `stats.json` and `rejected.jsonl`, and only when `--overwrite` replaces it with a newer run that
  has finished;
- a staging dir whose `run.json` names it (an unfinished run: failed, interrupted, or killed).
Any other file is left alone; one that a run would write over (`schema.json`, `stats.json`,
`rejected.jsonl`) or that the shard globs would pick up (`train-*.tfrecord`, `val-*.tfrecord`)
stops the run before any work, named, with what to do; so do a directory or link at such a name
(melshards writes only plain files), a `melshards train` model dir, a `schema.json` that is not a
run's, and an --output that names no directory or holds a glob character.

The lock is `preprocess.out_dir.lock` (created exclusively and whole, heartbeat, stale holders taken over).

Publishing (`OutputRun.publish`): the journal lists the old run's files and the new run's; the old
`schema.json` goes first (the directory is then visibly unfinished: the trainer refuses it rather
than read a mix), then the old files, then the new files are renamed in, `schema.json` last. A
publish cut short (power loss, kill -9) is finished by the next run that takes the lock, from the
journal, before it does anything else. A journal that exists but cannot be read or understood stops
every run until it is dealt with: the staging dir it names holds the rest of the new run.

Over 300 lines: what a directory holds, the staging dirs and the publish journal are one protocol
(what may be removed, and when, depends on all three) and read best together; the lock is apart.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import posixpath
import shutil
import threading
import time
import uuid
from collections.abc import Callable

from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.out_dir.lock import Lock, OutputError, is_local_path, join
from melshards.shards_schema import REJECTED_FILE, SCHEMA_FILE, SHARD_SUFFIX, SPLITS, STATS_FILE, SchemaError
from melshards.shards_schema.atomic import LOCAL, atomic_write
from melshards.shards_schema.ownership import MODEL_CHECKPOINT_DIR, MODEL_DIR_MARKS, model_dir_marks
from melshards.shards_schema.schema import PUBLISH_JOURNAL, Schema

log = logging.getLogger("melshards.preprocess")

STAGE_PREFIX = ".melshards-run-"
RUN_FILE = "run.json"
REPORTS = (SCHEMA_FILE, STATS_FILE, REJECTED_FILE)


def normal_dir(path: str) -> str:
    """One spelling per directory: absolute and normalised locally (`out//`, `./out/` and `out` are one
    directory, whatever the working directory is later); on gs:// without repeated or trailing `/`."""
    if is_local_path(path):
        return os.path.abspath(path)
    scheme, rest = path.split("://", 1)
    return f"{scheme}://" + "/".join(part for part in rest.split("/") if part)


# -- files: what a finished run owns, and what would be clobbered ------------------------------------
def list_names(out_dir: str, patterns: tuple[str, ...]) -> list[str]:
    """Names (not paths) of the files directly in out_dir that match any of the patterns."""
    found = FileSystems.match([join(out_dir, p) for p in patterns])
    return sorted(
        {
            posixpath.basename(m.path)
            for result in found
            for m in result.metadata_list
            if normal_dir(posixpath.dirname(m.path)) == normal_dir(out_dir)
        }
    )


def output_names(out_dir: str) -> list[str]:
    """Files a run writes or the shard globs read: the reports and DIR/{train,val}-*.tfrecord."""
    return list_names(out_dir, REPORTS + tuple(f"{s}-*{SHARD_SUFFIX}" for s in SPLITS))


def read_schema_at(path: str) -> Schema:
    with FileSystems.open(path) as f:
        return Schema.from_json(f.read().decode("utf-8"), where=path)


def run_files(schema: Schema) -> list[str]:
    """The names a finished run owns: its shards as schema.json lists them, and its three reports."""
    shards = [s["file"] for b in schema.buckets for split in b.shards.values() for s in split]
    return sorted(set(shards) | set(REPORTS))


def finished_run(out_dir: str) -> list[str] | None:
    """The files of the finished run in out_dir, or None when there is none; a schema.json that is not
    one of ours is an OutputError."""
    path = join(out_dir, SCHEMA_FILE)
    if not FileSystems.exists(path):
        return None
    try:
        return run_files(read_schema_at(path))
    except OSError as e:
        raise OutputError(
            f"--output {out_dir}: cannot read its {SCHEMA_FILE} ({e}); nothing was changed: fix its "
            "permissions, or run again once it can be read"
        ) from e
    except (SchemaError, ValueError, KeyError, TypeError) as e:
        version = (_read_json(path) or {}).get("version")
        if isinstance(version, str) and version.split(".")[0].isdigit():
            raise OutputError(
                f"--output {out_dir} holds a run made by another version of melshards (schema.json {version}), "
                "whose files this version cannot list; move its schema.json, stats.json, rejected.jsonl and "
                "train-*/val-* shards out of the directory, or choose another --output"
            ) from e
        raise OutputError(
            f"--output {out_dir} holds a {SCHEMA_FILE} that is not a melshards schema ({e}); "
            "move it away or choose another --output"
        ) from e


def model_dir_names(out_dir: str) -> list[str]:
    """The names in out_dir that make it a `melshards train` model dir (`ownership.model_dir_marks`)."""
    if is_local_path(out_dir):
        return model_dir_marks(os.listdir(out_dir) if os.path.isdir(out_dir) else [])
    return [
        m
        for m in MODEL_DIR_MARKS
        if FileSystems.exists(join(out_dir, m))
        or FileSystems.match([join(out_dir, m, "*")], limits=[1])[0].metadata_list
    ]


def check_not_a_model_dir(out_dir: str) -> None:
    """OutputError for a model dir: its schema.json is the one its checkpoints were trained with,
    and shards do not belong among checkpoints, with --overwrite or without."""
    marks = model_dir_names(out_dir)
    if marks:
        raise OutputError(
            f"--output {out_dir} is a melshards train model dir (it holds "
            f"{', '.join(m + '/' if m == MODEL_CHECKPOINT_DIR else m for m in marks)}), whose "
            f"{SCHEMA_FILE} is the one its checkpoints were trained with; write the shards to a "
            "directory of their own: choose another --output"
        )


def check_is_a_run(out_dir: str, owned: list[str]) -> None:
    """OutputError for a melshards schema.json none of whose shards is beside it (a copy, such as a
    model dir's): not a run melshards can show it wrote, so never replaced."""
    shards = set(owned) - set(REPORTS)
    if shards and not shards & set(output_names(out_dir)):
        raise OutputError(
            f"--output {out_dir} holds a {SCHEMA_FILE} without any of the shards it lists (a copy of "
            "a run's schema.json?), which melshards leaves as it is; move it away or choose another "
            "--output"
        )


def foreign_files(present: list[str], owned: list[str]) -> list[str]:
    """Files a run would write over or whose shard names the globs would read, not owned by a run."""
    return sorted(set(present) - set(owned))


def not_plain_files(out_dir: str, names: list[str] | tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(name, what it is) for each entry directly in a local out_dir that a publish would delete or
    rename onto (`names`, the reports, anything the shard globs name) and that is not a plain file:
    a directory, a symbolic link. melshards writes only plain files, so such an entry is the user's.
    gs:// has no directories: an object is never in the way of another."""
    if not is_local_path(out_dir) or not os.path.isdir(out_dir):
        return []
    import fnmatch

    globs = tuple(f"{s}-*{SHARD_SUFFIX}" for s in SPLITS)
    wanted = set(names) | set(REPORTS)
    found = []
    with os.scandir(out_dir) as entries:
        for e in entries:
            if (e.name in wanted or any(fnmatch.fnmatchcase(e.name, g) for g in globs)) and not e.is_file(
                follow_symlinks=False
            ):
                found.append(
                    (
                        e.name,
                        "a symbolic link" if e.is_symlink() else "a directory" if e.is_dir() else "not a plain file",
                    )
                )
    return sorted(found)


def check_plain_files(out_dir: str, names: list[str] | tuple[str, ...] = (), then: str = "") -> None:
    """OutputError naming the first entry `not_plain_files` finds, before anything is touched."""
    found = not_plain_files(out_dir, names)
    if found:
        (name, what), more = found[0], (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
        raise OutputError(
            f"--output {out_dir}: {join(out_dir, name)}{more} is {what}, not a file melshards "
            f"wrote, where a run's shards and reports go{then}; move it out of {out_dir} "
            "or choose another --output"
        )


def conflict_message(out_dir: str, foreign: list[str]) -> str:
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    return (
        f"--output {out_dir} holds files that melshards did not write and would write over or read as "
        f"shards: {shown}; move them out of {out_dir} or choose another --output"
    )


# -- staging, removal, publishing --------------------------------------------------------------------
def files_under(path: str) -> dict[str, int]:
    """Every file under a directory (gs://: every object under the prefix) -> its size in bytes."""
    if is_local_path(path):
        found = {}
        for d, _, names in os.walk(path):
            for n in names:
                try:
                    found[os.path.join(d, n)] = os.path.getsize(os.path.join(d, n))
                except OSError:  # removed meanwhile
                    pass
        return found
    return {m.path: m.size_in_bytes for m in FileSystems.match([path.rstrip("/") + "/**"])[0].metadata_list}


def remove_tree(path: str, keep: tuple[str, ...] = ()) -> None:
    """Delete a staging dir and everything under it, but the files named in `keep` directly in it."""
    if is_local_path(path) and not keep:
        shutil.rmtree(path, ignore_errors=True)
        return
    doomed = [f for f in files_under(path) if f not in {join(path, k) for k in keep}]
    if doomed:
        FileSystems.delete(doomed)
    if is_local_path(path):  # the emptied subdirectories
        for d, subdirs, _ in os.walk(path, topdown=False):
            for s in subdirs:
                shutil.rmtree(os.path.join(d, s), ignore_errors=True)


def tree_bytes(path: str) -> int:
    return sum(files_under(path).values())


def _write(path: str, data: bytes) -> None:
    """Write whole or not at all (`atomic_write`; a local file is on disk before it is renamed)."""
    local = is_local_path(path)
    with atomic_write(path, fs=LOCAL if local else FileSystems, sync=local) as f:
        f.write(data)


def _read_json(path: str) -> dict | None:
    """The JSON object in a file, or None when it cannot be read or is not one (for run.json: a
    staging dir not proven ours is left alone)."""
    try:
        with FileSystems.open(path) as f:
            data = json.loads(f.read())
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def _read_present(path: str) -> bytes | None:
    """A file's bytes, or None when it does not exist; a file that exists, or may exist, and cannot be
    read (a GCS or NFS hiccup, permissions) is an OSError, never taken for an absent one."""
    try:
        with FileSystems.open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None
    except Exception as e:  # Beam's BeamIOError, GCS client errors
        try:
            present = FileSystems.exists(path)
        except Exception:  # cannot tell: it may be there
            present = True
        if not present:
            return None
        raise OSError(f"{type(e).__name__}: {e}") from e


def read_journal(out_dir: str) -> dict | None:
    """The publish journal in out_dir, or None when there is none. One that cannot be read, or read
    but not understood, is an OutputError: a journal names a staging dir holding the rest of a new
    run, which must never be taken for an unfinished run's and removed."""
    path = join(out_dir, PUBLISH_JOURNAL)
    try:
        data = _read_present(path)
    except OSError as e:
        raise OutputError(
            f"cannot read {path}, the journal of a publish that was cut short ({e}); nothing was "
            "changed: run again once it can be read"
        ) from e
    if data is None:
        return None
    try:
        journal = json.loads(data)
    except ValueError:
        journal = None
    if (
        not isinstance(journal, dict)
        or not isinstance(journal.get("stage"), str)
        or not all(
            isinstance(journal.get(k), list) and all(isinstance(n, str) and n and "/" not in n for n in journal[k])
            for k in ("remove", "move")
        )
    ):
        raise OutputError(journal_unusable(out_dir, "is not a publish journal melshards can read"))
    return journal


def journal_unusable(out_dir: str, why: str) -> str:
    """The one line for a journal that cannot be finished: what to do by hand."""
    return (
        f"{join(out_dir, PUBLISH_JOURNAL)} {why}; move the directory's files somewhere safe, delete the journal, "
        "and run again"
    )


def unfinished_stages(out_dir: str) -> list[str]:
    """Staging dirs that melshards made (their run.json names them) and that no run holds now."""
    stages = []
    for result in FileSystems.match([join(out_dir, f"{STAGE_PREFIX}*/{RUN_FILE}")]):
        for m in result.metadata_list:
            stage = posixpath.dirname(m.path)
            info = _read_json(m.path)
            if info and STAGE_PREFIX + str(info.get("run_id")) == posixpath.basename(stage):
                stages.append(stage)
    return sorted(stages)


def journal_stage(out_dir: str, journal: dict) -> str:
    """The staging dir a journal names: by name, under out_dir (the directory may have moved since),
    and only one that its run.json proves melshards made."""
    name = journal.get("stage")
    stage = join(out_dir, str(name))
    info = None
    if isinstance(name, str) and "/" not in name and name == STAGE_PREFIX + str(journal.get("run_id")):
        try:
            info = json.loads(_read_present(join(stage, RUN_FILE)) or b"null")
        except OSError as e:
            raise OutputError(
                f"cannot read {join(stage, RUN_FILE)}, named by the journal of a publish that was cut "
                f"short ({e}); nothing was changed: run again once it can be read"
            ) from e
        except ValueError:
            info = None
    if not isinstance(info, dict) or STAGE_PREFIX + str(info.get("run_id")) != name:
        raise OutputError(journal_unusable(out_dir, f"names no staging dir of melshards in {out_dir}"))
    return stage


def apply_journal(out_dir: str, journal: dict) -> None:
    """Move a finished staged run into out_dir as the journal says; safe to run again after a crash.
    A file that is neither staged nor in place stops it (the journal is kept)."""
    stage, remove, move = journal_stage(out_dir, journal), journal["remove"], journal["move"]
    check_plain_files(
        out_dir,
        remove + move,
        then=f"; the publish of run {journal.get('run_id')} cut short there "
        f"is finished once it is gone (the journal is kept)",
    )
    # one listing each (on gs:// an existence check per shard is a request per shard)
    staged = {posixpath.basename(f) for f in files_under(stage) if normal_dir(posixpath.dirname(f)) == stage}
    existing = set(output_names(out_dir))
    lost = [n for n in move if n not in staged and n not in existing]
    if lost:
        raise OutputError(
            f"cannot finish the publish in {out_dir}: {', '.join(lost[:5])} are neither staged nor "
            f"in place; the journal {join(out_dir, PUBLISH_JOURNAL)} is kept; re-run the job with "
            "another --output"
        )
    if SCHEMA_FILE in remove and SCHEMA_FILE in existing and SCHEMA_FILE in staged:
        FileSystems.delete([join(out_dir, SCHEMA_FILE)])  # first: nobody reads a half-replaced run
    old = [join(out_dir, n) for n in remove if n in existing and n != SCHEMA_FILE and n not in move]
    if old:
        FileSystems.delete(old)
    for name in sorted(move, key=lambda n: n == SCHEMA_FILE):  # schema.json last
        if name in staged:
            FileSystems.rename([join(stage, name)], [join(out_dir, name)])
    FileSystems.delete([join(out_dir, PUBLISH_JOURNAL)])
    remove_tree(stage)


# For an interrupt handler (melshards.commands.ctrl_c, in the main thread, where publishing runs too): it sets
# STOPPING so that no publish begins, and lets one under way (PUBLISHING) finish; PUBLISHED lists
# the directories this process published.
STOPPING = threading.Event()
PUBLISHING = False
PUBLISHED: list[str] = []


@dataclasses.dataclass(eq=False)
class OutputRun:
    """One run's hold on its output directory: the lock, the staging dir, and the run it replaces.
    Publish and abort run in the main thread (so does the interrupt handler); each is safe to repeat."""

    out_dir: str
    stage: str
    replaces: list[str]  # names of the finished run it replaces on publish ([] when there is none)
    lock: Lock
    published: bool = False
    closed: bool = False

    def publish(self) -> None:
        """Replace the finished run (if any) with the staged one, which must have written schema.json.
        Not begun once an interrupt is being handled (STOPPING), nor by a run that lost its lock."""
        global PUBLISHING
        if STOPPING.is_set():
            raise KeyboardInterrupt
        PUBLISHING = True  # from here on an interrupt waits for the end of the publish
        try:  # the heartbeat goes on renewing the lock until release: a long publish is not taken over
            if not self.lock.still_held():
                raise OutputError(
                    f"{self.lock.path} is no longer held by this run (another run took it over "
                    "after this one could not renew it); nothing was published, and "
                    f"{self.out_dir} is as that run left it"
                )
            staged = run_files(read_schema_at(join(self.stage, SCHEMA_FILE)))
            then = f"; nothing was published, the new run was removed and {self.out_dir} is as it was"
            try:  # what publishing will delete or write over: checked before anything is touched
                check_plain_files(self.out_dir, self.replaces + staged, then=then)
                foreign = foreign_files(output_names(self.out_dir), self.replaces)  # a user's file since open_run
                if foreign:
                    raise OutputError(conflict_message(self.out_dir, foreign) + then)
            except OutputError:
                remove_tree(self.stage)
                self.closed = True
                raise
            journal = {
                "run_id": self.lock.info["run_id"],
                "stage": posixpath.basename(self.stage),
                "remove": self.replaces,
                "move": staged,
            }
            _write(join(self.out_dir, PUBLISH_JOURNAL), json.dumps(journal, indent=1).encode())
            apply_journal(self.out_dir, journal)
            self.published = True
            PUBLISHED.append(self.out_dir)
        finally:
            PUBLISHING = False
            self.lock.release()

    def abort(self, keep: tuple[str, ...] = ()) -> None:
        """Remove what this run staged (but `keep`, left in the staging dir) and give the directory up."""
        if self.published or self.closed:
            return
        if self.lock.still_held():  # else another run holds the directory now, staging dir and all
            remove_tree(self.stage, keep + (RUN_FILE,) if keep else ())
        self.lock.release()
        self.closed = True  # last: an abort cut short by an interrupt is done again by the handler


ACTIVE: set[OutputRun] = set()  # runs of this process, for the interrupt handler


def check_output_path(out_dir: str) -> None:
    """OutputError for an --output that names no directory: empty (which would be the working
    directory), or a URL with nothing after its scheme."""
    if not out_dir or out_dir.endswith("://"):
        raise OutputError(
            f"--output {out_dir!r} names no directory; give the directory for the shards and reports "
            "(local, or gs://BUCKET/PATH)"
        )


GLOB_CHARS = "*?[]"


def check_no_glob_chars(out_dir: str) -> None:
    """OutputError for a path (made absolute) holding a glob character: Beam's FileSystems.match and
    TensorFlow's glob, which find a run's files and shards, would read it as a pattern."""
    held = [c for c in GLOB_CHARS if c in out_dir]
    if held:
        raise OutputError(
            f"--output {out_dir}: its path holds {' '.join(held)}, which Beam and TensorFlow read as a "
            f"glob pattern when they look for the run's files; choose a directory whose path has none "
            f"of {' '.join(GLOB_CHARS)}"
        )


def check_not_a_file(out_dir: str) -> None:
    if is_local_path(out_dir):
        from pathlib import Path

        for p in (Path(out_dir), *Path(out_dir).parents):
            if p.exists():
                if not p.is_dir():
                    raise OutputError(f"--output {out_dir}: {p} is a file, not a directory; choose another --output")
                break


def open_run(out_dir: str, overwrite: bool, gcs_bucket=None, echo: Callable[[str], None] = lambda s: None) -> OutputRun:
    """Take the output directory for a new run, or raise OutputError before any work.

    Refuses an --output naming no directory or holding a glob character, and a `melshards train`
    model dir; takes the lock, finishes a publish that was cut short, removes unfinished runs'
    staging dirs, refuses a schema.json that is not a run melshards wrote (not its schema, or one
    without its shards) and a finished run without `overwrite`, and checks that no file of someone
    else's would be written over or read as a shard, nor a directory or link stand where a run's
    files go. Returns the OutputRun whose staging dir the job writes into.
    """
    check_output_path(out_dir)
    out_dir = normal_dir(out_dir)
    check_no_glob_chars(out_dir)
    check_not_a_file(out_dir)
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:8]
    try:
        check_not_a_model_dir(out_dir)  # in here: a listing that fails (permissions, credentials) is one line too
        if is_local_path(out_dir):
            os.makedirs(out_dir, exist_ok=True)
        lock = Lock(out_dir, run_id, gcs_bucket)
        lock.acquire()
    except OutputError:
        raise
    except Exception as e:  # OSError, Beam's BeamIOError, GCS and credential errors
        raise OutputError(
            f"--output {out_dir} is not writable ({type(e).__name__}: {e}); fix its permissions "
            "or credentials, or choose another --output"
        ) from e
    try:
        journal = read_journal(out_dir)
        if journal is not None:
            echo(f"finishing the publish of run {journal.get('run_id')} that was cut short in {out_dir}")
            apply_journal(out_dir, journal)
        for stage in unfinished_stages(out_dir):
            log.info("removing %s, the staging dir of an unfinished run", stage)
            remove_tree(stage)
        check_plain_files(out_dir)
        owned = finished_run(out_dir)  # first: the user's own schema.json is named as such, --overwrite or not
        if owned is not None:
            check_is_a_run(out_dir, owned)
            if not overwrite:
                raise OutputError(
                    f"--output {out_dir} already holds a finished run ({SCHEMA_FILE} exists); "
                    "pass --overwrite to replace it once the new run has finished, or choose "
                    "another directory"
                )
        foreign = foreign_files(output_names(out_dir), owned or [])
        if foreign:
            raise OutputError(conflict_message(out_dir, foreign))
        check_plain_files(out_dir, owned or [])
        stage = join(out_dir, STAGE_PREFIX + run_id)
        if is_local_path(stage):
            os.makedirs(stage)
        _write(join(stage, RUN_FILE), json.dumps(dict(lock.info, output=out_dir)).encode())  # before any other
    except BaseException:
        lock.release()
        raise
    lock.start_heartbeat()
    run = OutputRun(out_dir, stage, owned or [], lock)
    ACTIVE.add(run)
    return run


def close_run(run: OutputRun, ok: bool, keep: tuple[str, ...] = ()) -> None:
    """Publish a finished run, or remove what it staged. The run stays ACTIVE until that is done, so
    an interrupt in between still finds it."""
    try:
        if ok:
            run.publish()
        else:
            run.abort(keep)
    finally:
        ACTIVE.discard(run)


def abort_active() -> None:
    """For an interrupt: remove every active run's staging dir and release its lock."""
    for run in list(ACTIVE):
        run.abort()
        ACTIVE.discard(run)


def exception_chain(exc: BaseException | None):
    """exc, then its cause or context, and so on (Beam wraps a worker's error in its own)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_disk_full(exc: BaseException) -> bool:
    return any(
        (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e)
        for e in exception_chain(exc)
    )
