"""The one filesystem interface of the project: local paths here, object stores through a plugged-in backend.

Every path test (`is_remote`), temp name (`temp_path_for`, `is_temp_name`) and atomic write
(`FileSystem.write_atomic`, `replacing`) lives in this module, so every cleanup recognises every
temp file we leave (one form: ``.tmp-<32 hex>-NAME``, which pipelines' staging recovery and the
trainer's run-directory cleanup both remove).

Layering: this module is Beam-free and TF-free. `PathFS` routes local paths to `LOCAL_FS`, buckets
(s3://, gs://) to `bert_datagen.contract.buckets` (s3fs and gcsfs, the same clients in every layer and
process: the CLIs, Beam's workers, the loaders, the trainer), and any other scheme to a backend the
layer above plugs in: `bert_datagen.pipelines.beam.fsio.BEAM_FS` over Beam's FileSystems (filesystems
registered with Beam, such as the tests' fake stores), `bert_datagen.trainer.runtime.gfs.GFILE_FS` over
tf.io.gfile; `DEFAULT_FS` (the loaders') has none. Library code in contract/ never picks one: callers
pass it.

Why fsspec's clients for buckets rather than Beam's or TensorFlow's: Beam's S3 filesystem needs
pipeline options in every process that touches a path, TensorFlow has no s3 filesystem, and neither
reads the ecosystems' standard configuration (``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST``); s3fs
and gcsfs do, need neither Beam nor TensorFlow, and fetch several byte ranges concurrently.
"""

from __future__ import annotations

import bz2
import contextlib
import glob
import gzip
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

from bert_datagen.contract.buckets import BUCKETS, BucketObjects, Deadline, is_bucket_path

TMP_MARKER = ".tmp-"
_LOCAL_GAP = 64 << 10  # bytes between two ranges of a local file that one read spans
# The one temp-name form: a 32-hex id (unique per write) makes it ours, the final name stays last
# (so writers that insist on an extension, numpy's .npz, keep it).
TEMP_NAME = re.compile(rf"^{re.escape(TMP_MARKER)}[0-9a-f]{{32}}-.+$")


def is_remote(path: str | os.PathLike) -> bool:
    """An object-store path (``scheme://...``): no directories, no atomic rename, no flock."""
    return "://" in os.fspath(path)


def temp_name(name: str) -> str:
    """The marked temp name for a file or directory called ``name``."""
    return f"{TMP_MARKER}{uuid.uuid4().hex}-{name}"


def is_temp_name(name: str) -> bool:
    """Whether ``name`` (a base name) is a temp name `temp_name` made."""
    return TEMP_NAME.match(name) is not None


def temp_path_for(path: str) -> str:
    """A temporary sibling of ``path`` carrying our marker (so a cleanup knows it is ours)."""
    directory, name = path.rsplit("/", 1) if is_remote(path) or "/" in path else (".", path)
    return f"{directory}/{temp_name(name)}"


def decompress_by_name(path: str, raw: bytes) -> bytes:
    """``raw`` decompressed when the name ends in .gz or .bz2; ValueError naming the file if it cannot be."""
    try:
        if path.endswith(".gz"):
            return gzip.decompress(raw)
        if path.endswith(".bz2"):
            return bz2.decompress(raw)
    except (OSError, EOFError, ValueError) as e:
        raise ValueError(f"{path}: cannot decompress: {e}") from e
    return raw


@contextlib.contextmanager
def replacing(path: str | os.PathLike, *, durable: bool = False) -> Iterator[Path]:
    """Yield the marked temp sibling of a local ``path`` to write; when the block ends without error
    it is renamed over ``path`` (flushed to disk first when ``durable``), otherwise removed."""
    target = Path(path)
    tmp = target.with_name(temp_name(target.name))
    try:
        yield tmp
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, target)  # onto a directory: IsADirectoryError, the directory untouched
    except BaseException as exc:
        if os.path.lexists(tmp):
            os.remove(tmp)
        if isinstance(exc, OSError) and exc.filename in (None, str(tmp)) and exc.errno is not None:
            # A write's error names no file (a full disk: "[Errno 28] No space left on device"), or
            # only the temp name: name the file the user asked for.
            raise OSError(exc.errno, exc.strerror, str(target)) from exc  # (the subclass of its errno)
        raise


def os_error_in(text: str, path: str) -> OSError | None:
    """The OSError a library reported only as text (Rust's "I/O error: ... (os error 28)", TensorFlow's
    "PATH; No space left on device"), naming ``path``; None when the text reports none."""
    import errno

    found = re.search(r"\(os error (\d+)\)|\[Errno (\d+)\]", text)
    if found:
        number = int(found.group(1) or found.group(2))
        return OSError(number, os.strerror(number), path)
    for number in sorted(errno.errorcode):
        if os.strerror(number) in text and not os.strerror(number).startswith("Unknown error"):
            return OSError(number, os.strerror(number), path)
    return None


def remove_temp_files(directory: str | os.PathLike, *, any_marked: bool = False) -> list[str]:
    """Delete the temp files of interrupted writes directly in a local ``directory``; their names.

    Only names of the one form, unless ``any_marked``: then every file whose name starts with the
    marker (for directories wholly ours, where older versions left ``.tmp-NAME-PID``)."""
    removed = []
    if os.path.isdir(directory):
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            ours = entry.name.startswith(TMP_MARKER) if any_marked else is_temp_name(entry.name)
            if ours and entry.is_file(follow_symlinks=False):
                os.remove(entry.path)
                removed.append(entry.name)
    return removed


class FileSystem(Protocol):
    """What the project does with files; `LOCAL_FS` and `PathFS` implement it."""

    def read_bytes(self, path: str) -> bytes:
        """The file's bytes, decompressed when its name ends in .gz or .bz2 (`decompress_by_name`)."""
        ...

    def write_atomic(self, path: str, data: bytes) -> None: ...

    def exists(self, path: str) -> bool: ...

    def listdir(self, directory: str) -> list[str]: ...

    def join(self, base: str, *parts: str) -> str: ...

    def glob(self, pattern: str) -> list[str]:
        """Files matching the pattern, sorted (empty when none)."""
        ...


class LocalFS:
    """Local paths through the os module; writes go to a temp sibling, then are renamed into place."""

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return decompress_by_name(path, f.read())

    def open_read(self, path: str) -> BinaryIO:
        return open(path, "rb")

    def write_atomic(self, path: str, data: bytes) -> None:
        if os.path.isdir(path):
            raise IsADirectoryError(21, "is a directory; refusing to replace it with a file", path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with replacing(path) as tmp:
            tmp.write_bytes(data)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def lexists(self, path: str) -> bool:
        """Like `exists`, but a dangling symlink exists (it is something we would replace)."""
        return os.path.lexists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def listdir(self, directory: str) -> list[str]:
        """Full paths of the entries of a directory, sorted."""
        return [os.path.join(directory, name) for name in sorted(os.listdir(directory))]

    def list_names(self, directory: str) -> list[str]:
        """Names of a directory's entries, sorted; [] when it is not a directory."""
        return sorted(os.listdir(directory)) if os.path.isdir(directory) else []

    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)

    def glob(self, pattern: str) -> list[str]:
        return sorted(p for p in glob.glob(pattern) if os.path.isfile(p))

    def makedirs(self, directory: str) -> None:
        os.makedirs(directory or ".", exist_ok=True)

    def move(self, src: str, dst: str) -> None:
        """Rename ``src`` over ``dst`` (atomic per file), creating ``dst``'s directory."""
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        os.replace(src, dst)

    def delete(self, paths: list[str]) -> None:
        for path in paths:
            if os.path.lexists(path):
                os.remove(path)

    def remove_tree(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)


LOCAL_FS = LocalFS()


class ObjectStore(Protocol):
    """The primitives a remote backend provides (object names are full ``scheme://`` paths)."""

    def open_read(self, path: str) -> BinaryIO:
        """A binary stream of the object as stored (no decompression)."""
        ...

    def write(self, path: str, data: bytes) -> None: ...

    def exists(self, path: str) -> bool: ...

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst``, which does not exist."""
        ...

    def delete(self, paths: list[str]) -> None: ...

    def list_prefix(self, prefix: str) -> list[str]:
        """Every object whose name starts with ``prefix`` (recursively)."""
        ...

    def glob(self, pattern: str) -> list[str]: ...

    def join(self, base: str, *parts: str) -> str: ...


class PathFS:
    """The `FileSystem` for every path: local ones through `LOCAL_FS`, remote ones through ``remote``.

    An object store has no directories: a "directory" is the prefix ``path/`` of the objects under
    it, and a write is complete once the object appears under its final name."""

    def __init__(self, remote: ObjectStore, local: LocalFS = LOCAL_FS, buckets: BucketObjects = BUCKETS) -> None:
        self.remote = remote
        self.local = local
        self.buckets = buckets

    def with_deadline(self, deadline: Deadline) -> PathFS:
        """This filesystem with buckets bounded by ``deadline`` instead (docs/buckets.md)."""
        return PathFS(self.remote, self.local, self.buckets.with_deadline(deadline))

    def store(self, path: str) -> ObjectStore:
        """The backend of a remote ``path``: buckets (s3://, gs://) through `bert_datagen.contract.buckets` in every
        layer, any other scheme through the layer's own backend (Beam's or TensorFlow's filesystems)."""
        return self.buckets if is_bucket_path(path) else self.remote

    def read_bytes(self, path: str) -> bytes:
        if not is_remote(path):
            return self.local.read_bytes(path)
        if is_bucket_path(path):
            return decompress_by_name(path, self.buckets.read_bytes(path))
        with self.store(path).open_read(path) as f:
            return decompress_by_name(path, f.read())

    def check_container(self, path: str) -> None:
        """For a path in a bucket: FileNotFoundError naming it when the bucket itself is missing."""
        if is_bucket_path(path):
            self.buckets.check_bucket(path)

    def read_ranges(self, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes ``[begin, end)`` of each range of a file as stored (a bucket serves them as
        concurrent ranged requests: nothing else of the object is fetched)."""
        if is_bucket_path(path):
            return self.buckets.read_ranges(path, ranges)
        # A local file's ranges that lie close together in order are one read, cut: a read costs
        # more than copying the bytes between (a loader may ask for thousands of one-record ranges).
        gap = _LOCAL_GAP if not is_remote(path) else -1
        out: list[bytes] = []
        with self.open_read(path) as f:
            i = 0
            while i < len(ranges):
                begin, end = ranges[i]
                j = i + 1
                while j < len(ranges) and end <= ranges[j][0] <= end + gap:
                    end = max(end, ranges[j][1])
                    j += 1
                f.seek(begin)
                data = f.read(end - begin)
                if len(data) != end - begin:
                    raise OSError(5, f"bytes [{begin}, {end}) lie past the end of the file "
                                  f"({begin + len(data)} bytes read)", path)
                out.extend([data] if j == i + 1 else [data[b - begin:e - begin] for b, e in ranges[i:j]])
                i = j
        return out

    def version(self, path: str) -> str:
        """What identifies a file's current contents without reading them: size and modification
        time for a local file, size and ETag or generation for an object."""
        if is_bucket_path(path):
            return self.buckets.version(path)
        if not is_remote(path):
            st = os.stat(path)
            return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
        with self.open_read(path) as f:
            return str(len(f.read()))

    def open_read(self, path: str) -> BinaryIO:
        return self.store(path).open_read(path) if is_remote(path) else self.local.open_read(path)

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path``: temp sibling first, then rename over the final name."""
        if not is_remote(path):
            self.local.write_atomic(path, data)
            return
        tmp = temp_path_for(path)
        self.store(tmp).write(tmp, data)
        self.move(tmp, path)

    def exists(self, path: str) -> bool:
        return self.store(path).exists(path) if is_remote(path) else self.local.exists(path)

    def lexists(self, path: str) -> bool:
        return self.store(path).exists(path) if is_remote(path) else self.local.lexists(path)

    def objects_under(self, prefix: str) -> list[str]:
        """Every object under the "directory" ``prefix`` (an object store has no directories)."""
        return sorted(self.store(prefix).list_prefix(prefix.rstrip("/") + "/"))

    def is_dir(self, path: str) -> bool:
        return bool(self.objects_under(path)) if is_remote(path) else self.local.is_dir(path)

    def listdir(self, directory: str) -> list[str]:
        """Full paths of what a directory holds, sorted."""
        if not is_remote(directory):
            return self.local.listdir(directory)
        return [self.join(directory, name) for name in self.list_names(directory)]

    def list_names(self, directory: str) -> list[str]:
        """Names one level below ``directory`` (files and "subdirectories"), sorted."""
        if not is_remote(directory):
            return self.local.list_names(directory)
        prefix = directory.rstrip("/") + "/"
        return sorted({p[len(prefix):].split("/", 1)[0] for p in self.objects_under(directory)})

    def join(self, base: str, *parts: str) -> str:
        return self.store(base).join(base, *parts) if is_remote(base) else self.local.join(base, *parts)

    def glob(self, pattern: str) -> list[str]:
        return sorted(self.store(pattern).glob(pattern)) if is_remote(pattern) else self.local.glob(pattern)

    def makedirs(self, directory: str) -> None:
        if not is_remote(directory):  # prefixes need no creating
            self.local.makedirs(directory)

    def move(self, src: str, dst: str) -> None:
        if not is_remote(src):
            self.local.move(src, dst)
            return
        if self.store(dst).exists(dst):  # no atomic rename-over: the final name is briefly absent
            self.store(dst).delete([dst])
        self.store(src).rename(src, dst)

    def delete(self, paths: list[str]) -> None:
        for path in paths:
            if is_remote(path) and self.store(path).exists(path):
                self.store(path).delete([path])
        self.local.delete([p for p in paths if not is_remote(p)])

    def remove_tree(self, path: str) -> None:
        if not is_remote(path):
            self.local.remove_tree(path)
            return
        self.delete(self.objects_under(path) + [path])


class OnlyBuckets:
    """The remote backend of a layer without filesystems of its own (the loaders): buckets are served
    by `bert_datagen.contract.buckets`; any other scheme is refused with one line naming the path."""

    def _refuse(self, path: str, *_: object) -> None:
        scheme = os.fspath(path).partition("://")[0]
        raise OSError(93, f"no filesystem for {scheme}:// here (local paths, s3:// and gs:// are read)", path)

    open_read = write = exists = rename = list_prefix = glob = join = _refuse  # type: ignore[assignment]

    def delete(self, paths: list[str]) -> None:
        self._refuse(paths[0])


# Local paths and buckets: the filesystem of code that has neither Beam nor TensorFlow (the loaders).
DEFAULT_FS = PathFS(OnlyBuckets())  # type: ignore[arg-type]
