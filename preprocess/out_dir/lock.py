"""The output directory's lock: one live `melshards preprocess` run per directory.

One marker object, `OUT_DIR/.melshards-lock`, holding the run id, host name, boot id, pid namespace,
pid, start and heartbeat. Created exclusively and whole: locally written under a temporary name and
hard-linked to its name (the link fails if it exists), on gs:// an object upload with
`if_generation_match=0` (google-cloud-storage, installed with apache-beam[gcp]). The holder rewrites
it every `HEARTBEAT_S`, only if it is still the one it wrote (compare and replace in one step:
locally under the marker's flock, on gs:// an upload conditional on the generation read), from
`start_heartbeat` until `release` (the whole publish included). A holder is stale when its heartbeat
is `STALE_AFTER_S` old, or when it ran in this process table (same host, boot and pid namespace) and
its process is gone. A stale lock is taken over by removing it only if it is still the one judged
stale: locally under an exclusive flock of the marker (`_LocalMarker`), on gs:// by a delete
conditional on the generation judged stale. A create or a renewal that landed though its answer was
lost (google-cloud-storage retries such an upload, and the retry fails its precondition) is known
by the marker holding what this run wrote: the run keeps its lock. `preprocess.out_dir.staging` uses it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import posixpath
import socket
import threading
import time
import uuid
from typing import IO

from apache_beam.io.filesystems import FileSystems

from melshards.shards_schema.atomic import atomic_write

log = logging.getLogger("melshards.preprocess")

LOCK_FILE = ".melshards-lock"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 600.0  # ten missed heartbeats: the holder is gone (documented in docs/preprocess.md)


class OutputError(ValueError):
    """The output directory cannot take this run; the message says why and what to do."""


class OutputBusyError(OutputError):
    """Another live run holds the output directory."""


def is_local_path(path: str) -> bool:
    """A local path, not a URL (gs://...). (`preprocess.options.is_local` asks the same of a runner.)"""
    return "://" not in path


def join(*parts: str) -> str:
    return FileSystems.join(*parts)


def _now() -> float:
    return time.time()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


# -- the lock: one marker object, created exclusively ------------------------------------------------
# Held while a marker is open and flocked in this process (`_LocalMarker._locked`), and taken before a fork
# (`melshards.preprocess.workers.run_in_job_process` forks the job process while the heartbeat thread runs):
# a child forked while the heartbeat held the flocked file would keep the flock (it belongs to the open
# file, which the child shares) and block every later renewal until the job ends.
_MARKER_OPEN = threading.RLock()


def _new_marker_guard() -> None:
    global _MARKER_OPEN
    _MARKER_OPEN = threading.RLock()  # the child's copy may be held for the parent's other threads


os.register_at_fork(
    before=lambda: _MARKER_OPEN.acquire(),
    after_in_parent=lambda: _MARKER_OPEN.release(),
    after_in_child=_new_marker_guard,
)


class _LocalMarker:
    """A local file, created whole and exclusively; changed only by a holder of its flock.

    A renewal or removal opens the marker, takes an exclusive `flock` on it, checks that the file it
    locked is still the one at the marker's name (not one removed or replaced meanwhile: else it
    looks again), compares the contents with its token, and only then renames a new file over it or
    unlinks it, all before letting go. So a check and the write after it are one step: a renewal and
    a takeover of the same marker never both succeed. Readers need no lock: a marker's contents never
    change in place."""

    def __init__(self, path: str):
        self.path = path

    def create(self, data: bytes):
        """The token of the new marker, or None if one exists. Written whole under a temporary name,
        then hard-linked to the marker's name: the link is the exclusive step, and a reader never
        sees an empty or partial marker."""
        tmp = f"{self.path}.{uuid.uuid4().hex}.new"
        with open(tmp, "wb") as f:
            f.write(data)
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            return None
        finally:
            os.unlink(tmp)
        return data

    def read(self) -> tuple[bytes, object] | None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
            return data, data
        except FileNotFoundError:
            return None

    @contextlib.contextmanager
    def _locked(self):
        """The marker's file open and exclusively flocked, still the one at its name; None when there
        is none."""
        with _MARKER_OPEN:
            yield from self._locked_here()

    def _locked_here(self):
        while True:
            try:
                f: IO[bytes] = open(self.path, "r+b")  # opened for writing: NFS emulates flock with POSIX locks
            except FileNotFoundError:
                yield None
                return
            except PermissionError:  # another user's marker in a shared directory: flock needs no write access
                try:
                    f = open(self.path, "rb")
                except FileNotFoundError:
                    yield None
                    return
            with f:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                try:
                    here = os.stat(self.path)
                except FileNotFoundError:
                    here = None
                mine = os.fstat(f.fileno())
                if here is not None and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
                    yield f
                    return  # closing the file lets go of the flock

    def replace(self, data: bytes, token):
        """The new token, or None when the marker no longer holds `token`."""
        with self._locked() as f:
            if f is None or f.read() != token:
                return None
            with atomic_write(self.path, temp=f"{self.path}.{uuid.uuid4().hex}.new") as out:
                out.write(data)
            return data

    def delete(self, token) -> bool:
        """Remove the marker if it still holds `token`."""
        with self._locked() as f:
            if f is None or f.read() != token:
                return False
            os.unlink(self.path)
            return True


class _GcsMarker:
    """A GCS object written with generation preconditions (google-cloud-storage, installed with
    apache-beam[gcp]): create if absent, replace or delete only the generation that was read."""

    def __init__(self, path: str, bucket=None):
        self.path = path
        bucket_name, _, name = path[len("gs://") :].partition("/")
        if bucket is None:
            from google.cloud import storage  # type: ignore[attr-defined]  # google-cloud-storage has no py.typed: mypy sees only the typed google.cloud packages

            bucket = storage.Client().bucket(bucket_name)
        self.blob_name, self.bucket = name, bucket

    def _blob(self):
        return self.bucket.blob(self.blob_name)

    def create(self, data: bytes):
        from google.api_core.exceptions import PreconditionFailed

        blob = self._blob()
        try:
            blob.upload_from_string(data, if_generation_match=0)
        except PreconditionFailed:
            return None
        return blob.generation  # set from the upload's response

    def read(self):
        """(contents, generation), read at one generation; None when there is no object. An object
        replaced between the two requests is read again."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        for _ in range(5):
            blob = self._blob()
            try:
                blob.reload()
                return blob.download_as_bytes(if_generation_match=blob.generation), blob.generation
            except NotFound:
                return None
            except PreconditionFailed:  # replaced since the reload: read the new one
                continue
        raise OutputBusyError(f"{self.path} changed at every read: other runs keep taking it; try again")

    def replace(self, data: bytes, token):
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = self._blob()
        try:
            blob.upload_from_string(data, if_generation_match=token)
        except (PreconditionFailed, NotFound):
            return None
        return blob.generation

    def delete(self, token) -> bool:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        try:
            self._blob().delete(if_generation_match=token)
        except (PreconditionFailed, NotFound):
            return False
        return True


def marker(path: str, gcs_bucket=None):
    if is_local_path(path):
        return _LocalMarker(path)
    if path.startswith("gs://"):
        return _GcsMarker(path, gcs_bucket)
    raise OutputError(f"--output {path}: melshards can lock only local and gs:// directories; write to one of those")


def _read_first_line(path: str) -> str:
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return ""


def machine_identity() -> dict:
    """Where a pid means this process table: host name, boot id and pid namespace (containers that
    share a host name have their own pid namespaces; a reboot reuses pids)."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    return {
        "host": socket.gethostname(),
        "boot_id": _read_first_line("/proc/sys/kernel/random/boot_id"),
        "pidns": pidns,
    }


def holder_text(h: dict) -> str:
    age = _now() - h.get("heartbeat", 0)
    return (
        f"run {h.get('run_id')} (pid {h.get('pid')} on {h.get('host')}, started "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(h.get('started', 0)))}, "
        f"last heartbeat {age:.0f}s ago)"
    )


def is_stale(holder: dict, now: float, here: dict) -> bool:
    """A holder is stale when its heartbeat is STALE_AFTER_S old, or when it ran in this process table
    (same host, boot and pid namespace: `machine_identity`) and its process is gone."""
    if now - float(holder.get("heartbeat", 0)) > STALE_AFTER_S:
        return True
    same_table = all(holder.get(k) == v for k, v in here.items()) and all(here.values())
    return same_table and not _pid_alive(int(holder.get("pid", -1)))


class Heartbeat:
    """A daemon thread that calls `renew` every `every` seconds until `stop`: one that raises (a
    transient error: network, 5xx) is logged and tried again at the next beat; one that returns False
    (the marker is no longer ours) ends the beats, with `lost` logged. The lock and the cache's
    lease keep their markers fresh with it."""

    def __init__(self, path: str, renew, lost: str = ""):
        self.path, self._renew, self._lost = path, renew, lost
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, every: float) -> None:
        def beat():
            while not self._stop.wait(every):
                try:
                    kept = self._renew()
                except Exception as e:  # noqa: BLE001
                    log.warning("could not renew %s (%s); trying again in %.0fs", self.path, e, every)
                    continue
                if kept is False:
                    log.warning("%s %s", self.path, self._lost)
                    return

        self._thread = threading.Thread(
            target=beat, name=f"melshards-heartbeat-{posixpath.basename(self.path)}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """No beat after this returns (but from the beat's own thread, which ends at its next check)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()


class Lock:
    """The output directory's lock, held by this process for one run, with a heartbeat thread."""

    def __init__(self, out_dir: str, run_id: str, gcs_bucket=None):
        self.path = join(out_dir, LOCK_FILE)
        self.marker = marker(self.path, gcs_bucket)
        self.here = machine_identity()
        self.info = {"run_id": run_id, **self.here, "pid": os.getpid(), "started": _now(), "heartbeat": _now()}
        self.token = None
        self.lost = False
        self._sent: list[bytes] = []  # what this run wrote to the marker since `token` was confirmed
        self._mutex = threading.RLock()  # the token, and the marker as this process reads and renews it (an
        # interrupt handler in the thread that holds it may take it again)
        self.heartbeat = Heartbeat(self.path, self.renew, "is no longer held by this run; it will not publish")

    def _data(self) -> bytes:
        return json.dumps(self.info, sort_keys=True).encode()

    def _write_landed(self, current: tuple[bytes, object] | None):
        """The marker's token when it holds what this run wrote (`_sent`), else None: a write whose
        answer was lost (a GCS client retries an upload; the retry, conditional on the generation
        before, finds the one the first attempt made and fails) is this run's all the same."""
        return current[1] if current is not None and current[0] in self._sent else None

    def acquire(self) -> None:
        for _ in range(3):
            self._sent = [self._data()]
            token = self.marker.create(self._sent[0])
            if token is not None:
                self.token, self._sent = token, []
                return
            current = self.marker.read()
            if current is None:  # released between our create and read
                continue
            token = self._write_landed(current)
            if token is not None:
                self.token, self._sent = token, []
                return
            try:
                holder = json.loads(current[0])
            except ValueError:
                holder = None
            if not isinstance(holder, dict):
                raise OutputBusyError(
                    f"{self.path} is not a lock melshards can read; if no melshards preprocess is using "
                    f"{posixpath.dirname(self.path)}, delete it"
                )
            if not is_stale(holder, _now(), self.here):
                raise OutputBusyError(
                    f"--output {posixpath.dirname(self.path)} is in use by another melshards preprocess "
                    f"{holder_text(holder)}; wait for it to finish, or choose another --output "
                    f"(a holder is stale once its process is gone or {STALE_AFTER_S / 60:.0f} minutes "
                    "pass without a heartbeat)"
                )
            log.warning("taking over %s from a stale holder: %s", self.path, holder_text(holder))
            self.marker.delete(current[1])
        raise OutputBusyError(f"could not take {self.path}: other runs keep taking it; try again")

    def renew(self) -> bool:
        """Rewrite the marker with a new heartbeat if it is still this run's; False once it is not."""
        with self._mutex:
            if self.lost or self.token is None:
                return False
            self.info["heartbeat"] = _now()
            self._sent.append(self._data())  # kept until confirmed: a renewal that raised may have landed
            token = self.marker.replace(self._sent[-1], self.token)
            if token is None:
                token = self._write_landed(self.marker.read())
            if token is None:
                self.lost = True
                return False
            self.token, self._sent = token, []
            return True

    def start_heartbeat(self, every: float | None = None) -> None:
        """Renew the marker every `every` seconds (HEARTBEAT_S) until `release`: through the job and
        through the publish, however long moving the files takes."""
        self.heartbeat.start(HEARTBEAT_S if every is None else every)

    def still_held(self) -> bool:
        """Whether the marker is still this run's (checked before anything is published)."""
        with self._mutex:
            current = self.marker.read()
            return not self.lost and current is not None and current[1] == self.token

    def stop_heartbeat(self) -> None:
        self.heartbeat.stop()

    def release(self) -> None:
        self.stop_heartbeat()
        with self._mutex:
            if self.token is not None:
                self.marker.delete(self.token)
                self.token = None
