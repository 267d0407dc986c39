"""Buckets: s3:// and gs:// objects through fsspec's clients (s3fs, gcsfs), the object-store backend of
`bert_datagen.contract.fs` for every layer (the data CLIs, Beam's workers, the loaders and the trainer).

Why these clients and not Beam's or TensorFlow's: Beam's S3 filesystem needs its own pipeline options
in every process that touches a path (without them: ``Must provide one of client or options``), and
TensorFlow has no s3 filesystem at all; s3fs and gcsfs are configured the way their ecosystems are
(AWS's variables and credential chain, ``AWS_ENDPOINT_URL`` included; Google's application default
credentials and ``STORAGE_EMULATOR_HOST``), need neither Beam nor TensorFlow (so a reader's install
stays small), and read several byte ranges of an object concurrently (`read_ranges`).

Every failure is an `OSError` whose text is one line naming the path and the cause (a missing extra,
no credentials, no such bucket, access denied), so both CLIs print it as their ``Error:`` line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

# scheme -> (the module that serves it, the extra that installs it)
SCHEMES = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}


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


def _cause(exc: BaseException, path: str) -> StorageError:
    """The one-line error for a client's exception on ``path``."""
    name = type(exc).__name__
    text = str(exc).splitlines()[0] if str(exc) else name
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
def reported(path: str) -> Iterator[None]:
    """Turn a client's exception on ``path`` into a `StorageError` with one line naming it."""
    try:
        yield
    except (ImportError, KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        if isinstance(exc, OSError) and exc.filename == path:  # already ours
            raise  # noqa: BLE001 - clients raise their own types (botocore, google-auth, aiohttp)
        raise _cause(exc, path) from exc


# What configures the clients (read by the clients themselves; here only to know when to make a new one).
_CLIENT_ENV = ("AWS_", "STORAGE_EMULATOR_HOST", "GOOGLE_", "GCSFS_")


class BucketObjects:
    """The `bert_datagen.contract.fs.ObjectStore` primitives for s3:// and gs:// (object names are full
    paths). Clients are made on first use per process and scheme; listings are never cached (another
    process may have written since)."""

    def __init__(self) -> None:
        self._clients: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def client(self, path: str) -> Any:
        scheme = path.partition("://")[0]
        # A client per configuration: a process that changes its endpoint or credentials variables
        # (a test, a notebook) gets a client that sees the change, as a new process would.
        key = (scheme, tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_CLIENT_ENV))))
        with self._lock:
            if key not in self._clients:
                self._clients[key] = self._make_client(scheme, path)
            return self._clients[key]

    @staticmethod
    def _make_client(scheme: str, path: str) -> Any:
        module, extra = SCHEMES[scheme]
        try:
            if module == "s3fs":
                import s3fs

                return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True)
            # The core class, not gcsfs's default export: that one first asks a gRPC control plane
            # for every bucket's layout (60 s against an emulator, and not needed for objects).
            from gcsfs.core import GCSFileSystem

            return GCSFileSystem(use_listings_cache=False, skip_instance_cache=True)
        except ImportError as e:
            raise StorageError(errno.ENOPKG, f"{scheme}:// paths need {module} (pip install "
                               f"'bert-datagen[{extra}]'): {e}", path) from e

    def open_read(self, path: str) -> BinaryIO:
        with reported(path):
            return self.client(path).open(path, "rb", block_size=8 << 20)

    def read_bytes(self, path: str) -> bytes:
        with reported(path):
            return self.client(path).cat_file(path)

    def read_ranges(self, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes ``[begin, end)`` of each range, fetched concurrently, one request per range."""
        if not ranges:
            return []
        with reported(path):
            parts = self.client(path).cat_ranges([path] * len(ranges), [b for b, _ in ranges],
                                                 [e for _, e in ranges], on_error="raise")
        for (begin, end), part in zip(ranges, parts, strict=True):
            if isinstance(part, BaseException):
                raise _cause(part, path) from part
            if len(part) != end - begin:
                raise StorageError(errno.EIO, f"a read of bytes [{begin}, {end}) returned {len(part)} "
                                   "bytes: the object is shorter than expected", path)
        return parts

    def version(self, path: str) -> str:
        """What identifies this object's current contents: size and ETag (S3) or generation (GCS)."""
        with reported(path):
            info = self.client(path).info(path)
        tag = info.get("generation") or info.get("ETag") or info.get("etag") or info.get("LastModified")
        return f"{info.get('size')}:{tag}"

    def size(self, path: str) -> int:
        with reported(path):
            return int(self.client(path).info(path)["size"])

    def write(self, path: str, data: bytes) -> None:
        with reported(path):
            self.client(path).pipe_file(path, data)

    def exists(self, path: str) -> bool:
        """Whether the object exists (a bucket for a bare ``scheme://bucket``); any failure other than
        "not found" (no credentials, access denied) is raised, not taken for absence."""
        bucket, key = split_bucket(path)
        if not key.strip("/"):
            return self._bucket_exists(path)
        with reported(path):
            try:
                return self.client(path).info(path)["type"] == "file"
            except FileNotFoundError:
                return False

    def _bucket_exists(self, path: str) -> bool:
        bucket = split_bucket(path)[0]
        with reported(path):
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
        with reported(src):
            client = self.client(src)
            client.copy(src, dst)
            client.rm_file(src)

    def delete(self, paths: list[str]) -> None:
        for path in paths:
            with reported(path):
                try:
                    self.client(path).rm_file(path)
                except FileNotFoundError:
                    pass

    def list_prefix(self, prefix: str) -> list[str]:
        scheme = prefix.partition("://")[0]
        with reported(prefix):
            try:
                found = self.client(prefix).find(prefix)
            except FileNotFoundError:
                return []
        # find() matches a key prefix; keep only what lies under it, as full paths.
        keys = [f"{scheme}://{name}" for name in found]
        return sorted(k for k in keys if k.startswith(prefix) and not k.endswith("/"))

    def glob(self, pattern: str) -> list[str]:
        scheme = pattern.partition("://")[0]
        with reported(pattern):
            try:
                found = self.client(pattern).glob(pattern)
            except FileNotFoundError:
                return []
        client = self.client(pattern)
        return sorted(f"{scheme}://{name}" for name in found if client.isfile(f"{scheme}://{name}"))

    def join(self, base: str, *parts: str) -> str:
        return posixpath.join(base, *parts)


BUCKETS = BucketObjects()
