"""Buckets: s3:// and gs:// objects through fsspec's clients (s3fs, gcsfs), the object-store backend of
`bert_datagen.contract.fs` for every layer (the data CLIs, Beam's workers, the loaders and the trainer).

Why these clients and not Beam's or TensorFlow's: Beam's S3 filesystem needs its own pipeline options
in every process that touches a path (without them: ``Must provide one of client or options``), and
TensorFlow has no s3 filesystem at all; s3fs and gcsfs are configured the way their ecosystems are
(AWS's variables and credential chain, ``AWS_ENDPOINT_URL`` included; Google's application default
credentials and ``STORAGE_EMULATOR_HOST``), need neither Beam nor TensorFlow (so a reader's install
stays small), and read several byte ranges of an object concurrently (`read_ranges`).

Every failure is an `OSError` whose text is one line naming the path and the cause (a missing extra,
no credentials, no such bucket, access denied, no answer within the deadline), so both CLIs print it as
their ``Error:`` line.

A server that stops answering is an error within one `Deadline` (docs/buckets.md), never a hang: the
clients' own defaults retried for minutes (s3fs: 5 attempts of botocore's 5, each waiting 15 s for a
byte; gcsfs: 6 attempts, each waiting up to aiohttp's 300 s).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

# scheme -> (the module that serves it, the extra that installs it)
SCHEMES = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}


MIN_DEADLINE, MAX_DEADLINE = 2.0, 3600.0
MIN_TRY = 1.0  # seconds: a try's share below this would fail on a loaded machine's first byte


def backoff_allowance(attempts: int) -> float:
    """The clients' longest total wait between ``attempts`` tries, in seconds: gcsfs waits under
    1 + 2**(i-1) s before try i+1 (botocore's standard mode under 2**(i-1) s)."""
    return float(sum(min(1 + 2 ** (i - 1), 32) for i in range(1, attempts)))


@dataclass(frozen=True)
class Deadline:
    """How long a bucket request may go unanswered, its retries included, before it fails.

    ``seconds`` holds ``attempts`` tries and the clients' waits between them (`backoff_allowance`);
    each try has a connect timeout (a third of its share) and a read timeout (no byte for two thirds
    of its share), so even a try that stalls in both phases ends within its share. A transfer that
    keeps moving is never cut: the timeouts count silence, not duration."""

    seconds: float = 60.0
    attempts: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or not 1 <= self.attempts <= 5:
            raise ValueError(f"a bucket deadline's attempts are 1 to 5, not {self.attempts!r}")
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) or not (
                MIN_DEADLINE <= self.seconds <= MAX_DEADLINE) or self.per_attempt < MIN_TRY:
            raise ValueError(f"a bucket deadline is {MIN_DEADLINE:g} to {MAX_DEADLINE:g} seconds, with at least "
                             f"{MIN_TRY:g} s for each of its {self.attempts} tries besides "
                             f"{backoff_allowance(self.attempts):g} s of waits: not {self.seconds!r}")

    @classmethod
    def within(cls, seconds: float) -> Deadline:
        """The deadline of ``seconds`` with the most tries (up to 3) that leave each at least 2 s."""
        for attempts in (3, 2):
            if (seconds - backoff_allowance(attempts)) / attempts >= 2 * MIN_TRY:
                return cls(seconds, attempts)
        return cls(seconds, 1)

    @property
    def per_attempt(self) -> float:
        """One try's share, in seconds: its connect timeout plus its read timeout."""
        return (self.seconds - backoff_allowance(self.attempts)) / self.attempts

    @property
    def connect_timeout(self) -> float:
        return self.per_attempt / 3

    @property
    def read_timeout(self) -> float:
        return self.per_attempt * 2 / 3

    def describe(self) -> str:
        return (f"{self.seconds:g} s: {self.attempts} tries, each {self.connect_timeout:.3g} s to connect and "
                f"{self.read_timeout:.3g} s for an answer")


def is_bucket_path(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an object in a bucket this module serves (s3://, gs://, gcs://)."""
    scheme, sep, _ = os.fspath(path).partition("://")
    return bool(sep) and scheme in SCHEMES


def split_bucket(path: str) -> tuple[str, str]:
    """``(bucket, key)`` of an object path."""
    rest = path.partition("://")[2]
    bucket, _, key = rest.partition("/")
    return bucket, key


def StorageError(code: int, reason: str, path: str) -> OSError:  # noqa: N802 - raised like a class
    """A bucket operation that failed, as the OSError subclass of its errno (FileNotFoundError,
    PermissionError, ...), so callers catch it as they catch a local file's error."""
    return OSError(code, reason, path)


# What a client raises when the server did not answer (timeouts, refused or dropped connections), by
# type name: the clients' exception classes live in packages a reader may not have (botocore, aiohttp).
_UNANSWERED = {"ReadTimeoutError", "ConnectTimeoutError", "EndpointConnectionError", "ConnectionClosedError",
               "ServerTimeoutError", "ClientConnectorError", "ServerDisconnectedError", "ClientOSError",
               "TimeoutError", "FSTimeoutError", "ConnectionRefusedError", "ConnectionResetError",
               "ConnectionError", "ProxyError"}


def _unanswered(exc: BaseException) -> BaseException | None:
    """The exception in ``exc``'s chain that says the server did not answer, if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ in _UNANSWERED or isinstance(exc, (TimeoutError, ConnectionError)):
            return exc
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


def _first_line(exc: BaseException) -> str:
    name = type(exc).__name__
    return str(exc).splitlines()[0] if str(exc).strip() else name


def _cause(exc: BaseException, path: str, deadline: Deadline | None = None) -> StorageError:
    """The one-line error for a client's exception on ``path``."""
    name = type(exc).__name__
    text = _first_line(exc)
    silent = None if isinstance(exc, (FileNotFoundError, PermissionError)) else _unanswered(exc)
    if silent is not None:
        within = f"within the bucket deadline ({deadline.describe()})" if deadline else "in time"
        said = _first_line(silent)
        said = type(silent).__name__ + (f": {said}" if said != type(silent).__name__ else "")
        return StorageError(errno.ETIMEDOUT, f"the server did not answer {within}: {said}", path)
    bucket = split_bucket(path)[0]
    if name in ("NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError") or "credentials" in text.lower() and "not" in text.lower():
        hint = ("set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or an instance role"
                if path.startswith("s3") else "run `gcloud auth application-default login` or set "
                "GOOGLE_APPLICATION_CREDENTIALS")
        return StorageError(errno.EACCES, f"no credentials found ({hint})", path)
    if isinstance(exc, FileNotFoundError) and ("bucket" in text.lower() and "not" in text.lower()):
        return StorageError(errno.ENOENT, f"bucket {bucket!r} does not exist", path)
    if isinstance(exc, FileNotFoundError):
        return StorageError(errno.ENOENT, "no such object", path)
    if isinstance(exc, PermissionError) or "AccessDenied" in text or "403" in text:
        return StorageError(errno.EACCES, f"access denied ({text})", path)
    if isinstance(exc, OSError) and exc.errno is not None and exc.strerror:
        return StorageError(exc.errno, exc.strerror, path)
    return StorageError(errno.EIO, f"{name}: {text}", path)


@contextlib.contextmanager
def reported(path: str, deadline: Deadline | None = None) -> Iterator[None]:
    """Turn a client's exception on ``path`` into a `StorageError` with one line naming it."""
    try:
        yield
    except (ImportError, KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        if isinstance(exc, OSError) and exc.filename == path:  # already ours
            raise  # noqa: BLE001 - clients raise their own types (botocore, google-auth, aiohttp)
        raise _cause(exc, path, deadline) from exc


class ReportedStream:
    """A client's stream of an object whose reads fail as `reported` says: the client fetches blocks
    as they are read, so a server that stops answering shows up in ``read``, not in ``open``."""

    def __init__(self, stream: Any, path: str, objects: BucketObjects) -> None:
        self._stream, self._path, self._objects = stream, path, objects

    def read(self, size: int = -1) -> bytes:
        with self._objects.reported(self._path):
            return self._stream.read(size)

    def readinto(self, buffer: Any) -> int:
        with self._objects.reported(self._path):
            return self._stream.readinto(buffer)

    def seek(self, offset: int, whence: int = 0) -> int:
        with self._objects.reported(self._path):
            return self._stream.seek(offset, whence)

    def __getattr__(self, name: str) -> Any:  # tell, close, closed, readable, seekable, size ...
        return getattr(self._stream, name)

    def __enter__(self) -> ReportedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.close()


# What configures the clients (read by the clients themselves; here only to know when to make a new one).
_CLIENT_ENV = ("AWS_", "STORAGE_EMULATOR_HOST", "GOOGLE_", "GCSFS_")


class _RaisedAnyway(logging.Filter):
    """Drops gcsfs's log of a request that failed for good: it logs the exception with its traceback
    (``logger.exception``) and then raises it, which the caller reports as one line; with a handler on
    the root logger (the CLIs') or none at all (Python's last resort) those were 5-7 tracebacks on
    stderr before that line. Its other records are kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not ("out of retries on exception" in message or "non-retriable exception" in message)


def _quiet_client_logs() -> None:
    log = logging.getLogger("gcsfs")
    if not any(isinstance(f, _RaisedAnyway) for f in log.filters):
        log.addFilter(_RaisedAnyway())


def _s3_session() -> Any:
    """botocore's session without its ``Expect: 100-continue`` on uploads: aiohttp waits for the
    server's "continue" without any timeout, so a write to a server that stopped answering hung for
    good. Without it a refused upload sends its body before the refusal (a shard: megabytes)."""
    from aiobotocore.session import AioSession
    from botocore.handlers import add_expect_header

    session = AioSession()
    session.unregister("before-call.s3", add_expect_header)
    return session


def _gcs_emulated() -> bool:
    """Whether gcsfs is pointed at an emulator (its own reading of STORAGE_EMULATOR_HOST): then it is
    anonymous, as emulators are. Otherwise it looks for credentials, and Google's default chain asks
    the metadata server (169.254.169.254) whether this is a GCE machine, an address the user never
    configured."""
    from gcsfs import core

    return not core._location().startswith("https://storage.")


def _gcs_class(attempts: int) -> type:
    """gcsfs's filesystem with ``attempts`` tries a request: its own count (6) is fixed when the class
    is defined, and its waits between tries grow to 32 s."""
    from gcsfs.core import GCSFileSystem
    from gcsfs.retry import retry_request

    class BoundedGCSFileSystem(GCSFileSystem):
        _request = retry_request(retries=attempts)(GCSFileSystem._request.__wrapped__)

    return BoundedGCSFileSystem


class BucketObjects:
    """The `bert_datagen.contract.fs.ObjectStore` primitives for s3:// and gs:// (object names are full
    paths), every request bounded by ``deadline``. Clients are made on first use per process and
    scheme; listings are never cached (another process may have written since)."""

    def __init__(self, deadline: Deadline = Deadline()) -> None:
        self.deadline = deadline
        self._clients: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        # Client key -> until when its server counts as silent: once a request waited out the whole
        # deadline, the next ones (a reader's check of what happened, the next shard) fail at once
        # instead of each waiting it out again, so a reader stops within one deadline.
        self._silent: dict[tuple, float] = {}

    def _key(self, path: str) -> tuple:
        # A client per configuration: a process that changes its endpoint or credentials variables
        # (a test, a notebook) gets a client that sees the change, as a new process would.
        return (path.partition("://")[0], self.deadline,
                tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_CLIENT_ENV))))

    @contextlib.contextmanager
    def reported(self, path: str) -> Iterator[None]:
        """`reported`, failing at once while ``path``'s server counts as silent (see ``_silent``)."""
        key = self._key(path)
        if time.monotonic() < self._silent.get(key, 0.0):
            raise StorageError(errno.ETIMEDOUT, "the server did not answer within the bucket deadline "
                               f"({self.deadline.describe()}) moments ago; not asked again so soon", path)
        try:
            with reported(path, self.deadline):
                yield
        except OSError as e:
            if e.errno == errno.ETIMEDOUT:
                self._silent[key] = time.monotonic() + self.deadline.seconds
            raise

    def with_deadline(self, deadline: Deadline) -> BucketObjects:
        """These primitives with another deadline (clients of their own)."""
        return self if deadline == self.deadline else BucketObjects(deadline)

    def client(self, path: str) -> Any:
        scheme = path.partition("://")[0]
        key = self._key(path)
        with self._lock:
            if key not in self._clients:
                self._clients[key] = self._make_client(scheme, path, self.deadline)
            return self._clients[key]

    @staticmethod
    def _make_client(scheme: str, path: str, deadline: Deadline) -> Any:
        module, extra = SCHEMES[scheme]
        connect, read = deadline.connect_timeout, deadline.read_timeout
        try:
            if module == "s3fs":
                import s3fs

                # botocore makes the tries (standard mode: timeouts, dropped connections, 5xx and
                # throttling), s3fs none of its own on top (its default multiplied botocore's).
                client = s3fs.S3FileSystem(
                    use_listings_cache=False, skip_instance_cache=True, session=_s3_session(),
                    config_kwargs={"connect_timeout": connect, "read_timeout": read,
                                   "retries": {"total_max_attempts": deadline.attempts, "mode": "standard"}})
                client.retries = 1  # an attribute, not an argument, of s3fs's
                return client
            import aiohttp

            _quiet_client_logs()
            # The core class, not gcsfs's default export: that one first asks a gRPC control plane
            # for every bucket's layout (60 s against an emulator, and not needed for objects).
            return _gcs_class(deadline.attempts)(
                use_listings_cache=False, skip_instance_cache=True, token="anon" if _gcs_emulated() else None,
                requests_timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read))
        except ImportError as e:
            raise StorageError(errno.ENOPKG, f"{scheme}:// paths need {module} (pip install "
                               f"'bert-datagen[{extra}]'): {e}", path) from e

    def open_read(self, path: str) -> BinaryIO:
        with self.reported(path):
            stream = self.client(path).open(path, "rb", block_size=8 << 20)
        return ReportedStream(stream, path, self)  # type: ignore[return-value]

    def read_bytes(self, path: str) -> bytes:
        with self.reported(path):
            return self.client(path).cat_file(path)

    def read_ranges(self, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes ``[begin, end)`` of each range, fetched concurrently, one request per range."""
        if not ranges:
            return []
        with self.reported(path):
            parts = self.client(path).cat_ranges([path] * len(ranges), [b for b, _ in ranges],
                                                 [e for _, e in ranges], on_error="raise")
        for (begin, end), part in zip(ranges, parts, strict=True):
            if isinstance(part, BaseException):
                raise _cause(part, path, self.deadline) from part
            if len(part) != end - begin:
                raise StorageError(errno.EIO, f"a read of bytes [{begin}, {end}) returned {len(part)} "
                                   "bytes: the object is shorter than expected", path)
        return parts

    def version(self, path: str) -> str:
        """What identifies this object's current contents: size and ETag (S3) or generation (GCS)."""
        with self.reported(path):
            info = self.client(path).info(path)
        tag = info.get("generation") or info.get("ETag") or info.get("etag") or info.get("LastModified")
        return f"{info.get('size')}:{tag}"

    def size(self, path: str) -> int:
        with self.reported(path):
            return int(self.client(path).info(path)["size"])

    def write(self, path: str, data: bytes) -> None:
        with self.reported(path):
            self.client(path).pipe_file(path, data)

    def exists(self, path: str) -> bool:
        """Whether the object exists (a bucket for a bare ``scheme://bucket``); any failure other than
        "not found" (no credentials, access denied) is raised, not taken for absence."""
        bucket, key = split_bucket(path)
        if not key.strip("/"):
            return self._bucket_exists(path)
        with self.reported(path):
            try:
                return self.client(path).info(path)["type"] == "file"
            except FileNotFoundError:
                return False

    def _bucket_exists(self, path: str) -> bool:
        bucket = split_bucket(path)[0]
        with self.reported(path):
            client = self.client(path)
            try:
                if hasattr(client, "call_s3"):  # s3fs's exists() swallows every error of a bucket probe
                    client.call_s3("head_bucket", Bucket=bucket)
                    return True
                client.info(bucket)
                return True
            except FileNotFoundError:
                return False

    def check_bucket(self, path: str) -> None:
        """FileNotFoundError naming ``path`` when its bucket does not exist (or cannot be seen)."""
        bucket = split_bucket(path)[0]
        if not self._bucket_exists(path):
            raise StorageError(errno.ENOENT, f"bucket {bucket!r} does not exist", path)

    def rename(self, src: str, dst: str) -> None:
        # An object store has no rename: copy, then delete the source (the copy appears whole).
        with self.reported(src):
            client = self.client(src)
            client.copy(src, dst)
            client.rm_file(src)

    def delete(self, paths: list[str]) -> None:
        for path in paths:
            with self.reported(path):
                try:
                    self.client(path).rm_file(path)
                except FileNotFoundError:
                    pass

    def list_prefix(self, prefix: str) -> list[str]:
        scheme = prefix.partition("://")[0]
        with self.reported(prefix):
            try:
                found = self.client(prefix).find(prefix)
            except FileNotFoundError:
                return []
        # find() matches a key prefix; keep only what lies under it, as full paths.
        keys = [f"{scheme}://{name}" for name in found]
        return sorted(k for k in keys if k.startswith(prefix) and not k.endswith("/"))

    def glob(self, pattern: str) -> list[str]:
        scheme = pattern.partition("://")[0]
        with self.reported(pattern):
            try:
                found = self.client(pattern).glob(pattern)
            except FileNotFoundError:
                return []
        client = self.client(pattern)
        return sorted(f"{scheme}://{name}" for name in found if client.isfile(f"{scheme}://{name}"))

    def join(self, base: str, *parts: str) -> str:
        return posixpath.join(base, *parts)


BUCKETS = BucketObjects()


def check_output_bucket(path: str, option: str, buckets: BucketObjects = BUCKETS) -> None:
    """Before any work: an OSError naming ``option`` and ``path`` when ``path`` lies in a bucket that
    does not exist (or that these credentials cannot see, or whose server does not answer). Without
    it a run found out at its first write, naming an internal temp object of its staging prefix."""
    if not is_bucket_path(path):
        return
    try:
        buckets.check_bucket(path)
    except OSError as e:
        raise StorageError(e.errno or errno.EIO, f"{e.strerror} ({option})", path) from e
