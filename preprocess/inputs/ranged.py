"""Parts of a corpus file, local or on gs://, read with each read fetching about what its reader needs.

Beam's `FileSystems.open` reads a gs:// object 16 MiB at a time: a reader that seeks past a tar member
or a parquet column chunk and reads the next small header downloads the 16 MiB that follow. A
`RangedFile` is a seekable binary file that fetches what a read misses with one ranged read, sized by
its policy:

- exact (`min_fetch` 0, the default): what is asked for and no more (a tar member at its offset;
  pyarrow's reads of a parquet footer, column chunks and pages, which ask for what they need);
- at least `min_fetch` bytes (a tar's headers: one fetch holds a header, the small `.json` member
  after it and the next header);
- with `grow`, a miss where the last fetch ended (a decoder reading on, 8 KiB at a time) fetches
  twice as much as the last such fetch, up to MAX_GROWN; elsewhere, or after an expected span's
  fetch, `min_fetch` again;
- `expect(start, end)`: a miss in [start, end) fetches up to `end` in one read (a segment's bytes,
  from where the decoder seeks to in it).

The bytes fetched are held, up to `keep` bytes (the oldest let go first; the last fetch is always
held), so a reader that comes back (a decoder reading a header again) does not fetch them twice. A
gs:// object is read through Beam's GcsIO with the options Beam's FileSystems have (the job's
credentials, or --no_auth), a local file with `os.pread`, another scheme through Beam's FileSystems.
A read that cannot be fetched is an OSError naming the file.
"""

from __future__ import annotations

import io
import os

from apache_beam.io.filesystems import FileSystems

from melshards.preprocess.out_dir.lock import is_local_path

MAX_GROWN = 1 << 20  # bytes: the largest fetch a `grow` reader's run of sequential misses grows to


class _Local:
    """A local file read with `os.pread` (no buffer of its own: the RangedFile holds what it fetched)."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size

    def fetch(self, start: int, n: int) -> bytes:
        parts, got = [], 0
        while got < n:
            part = os.pread(self.fd, n - got, start + got)
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def close(self) -> None:
        os.close(self.fd)


class _Remote:
    """A remote object: on gs://, Beam's GcsIO reader with a one-byte buffer, so each read is one
    ranged download of exactly the bytes asked for; another scheme, Beam's FileSystems reader."""

    def __init__(self, path: str):
        self.path = path
        try:
            if path.startswith("gs://"):
                from apache_beam.io.gcp import gcsio
                from apache_beam.options.value_provider import RuntimeValueProvider

                # the options Beam's FileSystems build their GCS file system from (FileSystems.get_filesystem)
                options = FileSystems._pipeline_options or RuntimeValueProvider.runtime_options
                self.file = gcsio.GcsIO(pipeline_options=options).open(path, "rb", read_buffer_size=1)
            else:
                self.file = FileSystems.open(path)
            self.size = self.file.seek(0, os.SEEK_END)
        except OSError:
            raise
        except Exception as e:  # the client's own errors (google.api_core's NotFound, Forbidden, ...)
            raise OSError(f"{path}: {type(e).__name__}: {e}") from e

    def fetch(self, start: int, n: int) -> bytes:
        try:
            self.file.seek(start)
            return self.file.read(n)
        except OSError:
            raise
        except Exception as e:  # as above: a failed download is an I/O error to the reader
            raise OSError(f"{self.path}: {type(e).__name__}: {e}") from e

    def close(self) -> None:
        self.file.close()


class RangedFile(io.RawIOBase):
    """`path` open for reading, local or remote, fetching by the policy the module docstring describes;
    `fetched` and `fetches` count the bytes and reads fetched."""

    def __init__(self, path: str, min_fetch: int = 0, keep: int = 0, grow: bool = False):
        super().__init__()
        self.path, self.min_fetch, self.keep, self.grow = path, min_fetch, keep, grow
        self._source = _Local(path) if is_local_path(path) else _Remote(path)
        self.size = self._source.size
        self._pos = 0
        self._held: list[tuple[int, bytes]] = []  # (start, bytes) fetched, oldest first
        self._held_bytes = 0
        self._end, self._grown = -1, 0  # where the last fetch ended; the size of the last grown one (0: none)
        self._expected: tuple[int, int] | None = None
        self.fetched = self.fetches = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise OSError(f"{self.path}: seek to {base + offset}, before the start")
        self._pos = base + offset
        return self._pos

    def expect(self, start: int, end: int) -> None:
        """The next reads are of [start, end) (an estimate): a miss in it fetches up to `end` at once."""
        self._expected = (max(0, start), min(end, self.size))

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self.size - self._pos))
        done = 0
        while done < n:
            p = self._pos + done
            start, data = self._find(p) or self._fetch(p, n - done)
            k = min(n - done, start + len(data) - p)
            view[done : done + k] = data[p - start : p - start + k]
            done += k
        self._pos += done
        return done

    def read(self, size: int | None = -1) -> bytes:
        n = self.size - self._pos if size is None or size < 0 else size
        buffer = bytearray(max(0, min(n, self.size - self._pos)))
        return bytes(buffer[: self.readinto(buffer)])

    def readall(self) -> bytes:
        return self.read()

    def close(self) -> None:
        if not self.closed:
            self._held, self._held_bytes = [], 0
            self._source.close()
        super().close()

    def _find(self, p: int) -> tuple[int, bytes] | None:
        for start, data in reversed(self._held):
            if start <= p < start + len(data):
                return start, data
        return None

    def _fetch(self, p: int, want: int) -> tuple[int, bytes]:
        size = max(want, self.min_fetch)
        grown = 0
        if self._expected and self._expected[0] <= p < self._expected[1]:
            size = max(want, self._expected[1] - p)
        elif self.grow:
            grown = max(self.min_fetch, min(MAX_GROWN, 2 * self._grown)) if p == self._end else self.min_fetch
            size = max(want, grown)
        after = [start for start, _ in self._held if start > p]  # never fetch again what is held
        size = min(size, self.size - p, *(s - p for s in after))
        data = self._source.fetch(p, size)
        if len(data) != size:
            raise OSError(f"{self.path}: {len(data)} bytes at {p}, expected {size} (the file changed during the run?)")
        self.fetched += size
        self.fetches += 1
        self._end, self._grown = p + size, grown
        self._held.append((p, data))
        self._held_bytes += size
        while len(self._held) > 1 and self._held_bytes > self.keep:
            self._held_bytes -= len(self._held.pop(0)[1])
        return p, data
