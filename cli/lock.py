"""An exclusive, advisory lock on an output path: two commands never write the same output at once.

Every command that writes an output (`bert-datagen run/task --output DIR`, `vocab --output FILE`,
`stats --plot FILE`; `bert-train pretrain/finetune --out RUN`, `export --out DIR`, `predict --out DIR`)
holds the lock of that path from before its first write (after its options are checked) until it
ends. A second command on the same path is refused at once (no waiting) with a message naming the
path and the command that holds it.

Where the lock lives: the file ``.bert-datagen-lock-NAME`` beside the output (in its parent
directory), so it exists before the output is created and is untouched by a swap that replaces the
output (a dataset's staging swap, an export's rename). The path is resolved first (``realpath``), so
``data/x``, ``./data/x/`` and a symlink to it share one lock. Where the parent cannot be written (an
output directory mounted in a read-only one) and the output is an existing directory, the lock is
``DIR/.bert-datagen-lock`` inside it instead (``inside_ok``; not for outputs that are replaced
whole).

The lock is ``flock(LOCK_EX | LOCK_NB)`` on a descriptor opened with ``O_CLOEXEC``: the kernel
releases it when the process ends, however it ends, so a lock file left behind by a killed command
blocks nobody (the next command takes it over). Worker processes never hold it: an exec'd process
(Beam's multi-process DirectRunner, Dask's spawned workers) does not get the descriptor, and a plain
``fork`` child closes its copy at once (``os.register_at_fork``), never unlocking the parent's lock.

The file holds one JSON line naming the holder (pid, host, command line, start time), written once
the lock is held; it is read only for the message of a refused command. A file at the lock path
is used only if it is ours: a regular file that is empty (a command killed between creating and
filling it) or carries our marker. Anything else there (another program's file, a directory, a
symlink) is refused with a message and never opened for writing, truncated or deleted.

On release the holder deletes the lock file (while still holding it, and only if the path still
names the file it locked), so outputs do not collect lock files, and removes again the parent
directories it created for it while they are empty; a command that had opened the file
just before waits for nothing: after taking the lock it checks that the path still names the file
it locked, and if not, starts again on the new one.

Object-store paths (``gs://``, any ``scheme://``) cannot be flock'ed: they take no lock (the lock
object is a no-op). Two commands writing the same object-store output at once are not prevented.
On network filesystems the lock is as good as their flock support (Linux maps flock to NFS locks).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shlex
import socket
import stat
import sys
import time
from types import TracebackType

from bert_datagen.contract.fs import is_remote

LOCK_PREFIX = ".bert-datagen-lock-"
INSIDE_LOCK_NAME = ".bert-datagen-lock"  # the fallback inside an existing output directory
MARKER = "bert-datagen-lock"
_NAME_MAX = 255
_ATTEMPTS = 20  # a lock file replaced this many times in a row while we open it: give up
_READ_LIMIT = 4096
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)

_HELD_FDS: set[int] = set()


def _close_in_fork_child() -> None:
    # A forked child shares the parent's open file description; closing its copy leaves the
    # parent's lock alone (only the last close, or LOCK_UN, would release it).
    for fd in list(_HELD_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_FDS.clear()


os.register_at_fork(after_in_child=_close_in_fork_child)


class OutputLockError(RuntimeError):
    """The output is locked by another command, or its lock path holds something not ours; the
    message names the output, the lock file and the holder."""


def lock_path_for(output: str) -> str | None:
    """The lock file of ``output`` (beside it, see the module doc); None for object-store paths."""
    if is_remote(output):
        return None
    full = os.path.realpath(os.path.abspath(output))
    parent, name = os.path.split(full)
    lock_name = LOCK_PREFIX + name
    if len(os.fsencode(lock_name)) > _NAME_MAX:  # keep it a valid file name, still unique per output
        digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:32]
        lock_name = f"{LOCK_PREFIX}{os.fsdecode(os.fsencode(name)[:150])}-{digest}"
    return os.path.join(parent, lock_name)


class OutputLock:
    """A held lock (or, for object stores, none); a context manager that releases it on exit."""

    def __init__(self, output: str, path: str | None = None, fd: int | None = None,
                 made_dirs: tuple[str, ...] = ()) -> None:
        self.output, self.path, self._fd, self._pid = output, path, fd, os.getpid()
        self._made_dirs = made_dirs  # parents created for the lock file, deepest first
        if fd is not None:
            _HELD_FDS.add(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None and os.getpid() == self._pid

    def release(self) -> None:
        """Delete the lock file (only if the path still names the file we locked), then unlock."""
        if not self.held:
            return
        fd, self._fd = self._fd, None
        assert fd is not None and self.path is not None
        try:
            _remove_if_locked(self.path, fd)
        finally:
            _HELD_FDS.discard(fd)
            os.close(fd)
        _remove_empty(self._made_dirs)

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def lock_output(output: str, option: str = "--output", inside_ok: bool = False) -> OutputLock:
    """Take the exclusive lock of ``output`` (no waiting) or raise OutputLockError naming the
    holder. ``option`` names the output in messages; ``inside_ok``: the output is a directory whose
    contents are written in place (not replaced whole), so its lock may live inside it when its
    parent cannot be written."""
    path = lock_path_for(output)
    if path is None:
        return OutputLock(output)
    try:
        return _acquire(output, path, option)
    except PermissionError as exc:
        if inside_ok and os.path.isdir(output):
            try:
                return _acquire(output, os.path.join(os.path.realpath(output), INSIDE_LOCK_NAME), option)
            except PermissionError:
                pass
        raise OutputLockError(f"{output}: cannot create its lock file {path}: {exc.strerror}; "
                              "the lock lives beside the output, so that directory must be writable") from exc


def _make_parents(directory: str) -> tuple[str, ...]:
    """Create ``directory`` and its missing parents; returns those it created, deepest first."""
    missing = []
    while directory and not os.path.isdir(directory) and directory != os.path.dirname(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    try:
        for made in reversed(missing):
            os.makedirs(made, exist_ok=True)
    except OSError as exc:
        _remove_empty(tuple(missing))
        if exc.errno in _NOT_WRITABLE:
            raise PermissionError(exc.errno, exc.strerror, exc.filename) from exc
        raise
    return tuple(missing)


def _remove_empty(directories: tuple[str, ...]) -> None:
    """Remove the directories we created for a lock file, deepest first, while they are empty (the
    command may have written its output there: then they stay)."""
    for directory in directories:
        try:
            os.rmdir(directory)
        except OSError:
            return


def _acquire(output: str, path: str, option: str) -> OutputLock:
    try:
        made_dirs = _make_parents(os.path.dirname(path))
    except PermissionError:
        raise
    except OSError as exc:
        raise OutputLockError(f"{output}: cannot create the directory of its lock file {path}: "
                              f"{exc.strerror}") from exc
    try:
        return _acquire_in(output, path, option, made_dirs)
    except BaseException:
        _remove_empty(made_dirs)
        raise


def _acquire_in(output: str, path: str, option: str, made_dirs: tuple[str, ...]) -> OutputLock:
    for _ in range(_ATTEMPTS):
        fd = _open_ours(output, path, option)
        if fd is None:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise OutputLockError(_busy_message(output, path, option, holder)) from None
        except BaseException:
            os.close(fd)
            raise
        if not _names_file(path, fd):  # its holder deleted it as it released it: use the new one
            os.close(fd)
            continue
        try:
            _write_holder(fd, output)
        except BaseException as exc:
            # We hold the lock: the file goes with it (an empty one would outlive a full disk).
            _remove_if_locked(path, fd)
            os.close(fd)
            if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
                raise OSError(exc.errno, exc.strerror, path) from exc  # a full disk: name the file
            raise
        return OutputLock(output, path, fd, made_dirs)
    raise OutputLockError(f"{output}: its lock file {path} keeps being replaced; try again")


def _open_ours(output: str, path: str, option: str) -> int | None:
    """A descriptor of the lock file, created now or already there and ours; None if it vanished
    in between. Raises PermissionError when the directory cannot be written (for the fallback)."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        pass
    except OSError as exc:
        if exc.errno in _NOT_WRITABLE:
            raise PermissionError(exc.errno, exc.strerror, path) from exc
        raise OutputLockError(f"{output}: cannot create its lock file {path}: {exc.strerror}") from exc
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(before.st_mode):
        raise OutputLockError(_not_ours_message(output, path, option))
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):  # replaced by a symlink or else
            raise OutputLockError(_not_ours_message(output, path, option)) from exc
        raise OutputLockError(f"{output}: cannot open its lock file {path}: {exc.strerror} "
                              "(made by another user?)") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode) or not _is_our_lock_file(fd):
        os.close(fd)
        raise OutputLockError(_not_ours_message(output, path, option))
    return fd


def _names_file(path: str, fd: int) -> bool:
    try:
        now = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _remove_if_locked(path: str, fd: int) -> None:
    """Delete the lock file we hold through ``fd``, only while ``path`` still names it."""
    try:
        if _names_file(path, fd):
            os.unlink(path)
    except OSError:
        pass  # a lock file left behind is harmless: the next command takes it over


def _read_text(fd: int) -> str:
    return os.pread(fd, _READ_LIMIT, 0).decode("utf-8", "replace")


def _parse_holder(text: str) -> dict | None:
    try:
        record = json.loads(text.splitlines()[0]) if text.strip() else None
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get(MARKER) == 1 else None


def _is_our_lock_file(fd: int) -> bool:
    text = _read_text(fd)
    return not text or _parse_holder(text) is not None


def _read_holder(fd: int) -> dict | None:
    return _parse_holder(_read_text(fd))


def _command_line() -> str:
    # The process's command line, for the message a refused command prints; it changes nothing.
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    program = program if program and not program.startswith("-") else f"python {program}".strip()
    line = " ".join([program, *(shlex.quote(a) for a in sys.argv[1:])])
    return line if len(line) <= 300 else line[:297] + "..."


def _write_holder(fd: int, output: str) -> None:
    record = {MARKER: 1, "pid": os.getpid(), "host": socket.gethostname(), "command": _command_line(),
              "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "output": output}
    data = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    os.ftruncate(fd, 0)  # the file is ours (created now, or a dead holder's record)
    os.pwrite(fd, data, 0)


def _busy_message(output: str, path: str, option: str, holder: dict | None) -> str:
    if holder is None:
        who = "another command (it is just starting)"
    else:
        who = (f"another command: pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}: "
               f"{holder.get('command')}")
    return (f"{output}: is being written by {who}; wait for it to end or choose another {option} "
            f"(lock file {path}; the lock ends with that process)")


def _not_ours_message(output: str, path: str, option: str) -> str:
    return (f"{output}: {path} exists and is not a bert-datagen lock file; it is where the lock of "
            f"this output goes: move it away or choose another {option} (nothing was changed)")
