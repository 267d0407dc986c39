"""`Overlap`: a worker that has the machine to itself runs a few of a stage's elements at once.

The DirectRunner's only worker hands a DoFn one element at a time. For a stage whose work is mostly
NumPy, CRC32C and file writes (building a pass's records), which release the GIL, a second thread of
the same worker keeps the idle core busy: measured 1.5x on the build stage's passes with two threads
on two cores. Where workers share the machine (two or more, Dask, Dataflow), each is one
core and runs its elements one at a time, as before (``width`` 1).

Each element's outputs are made whole in a thread and handed back on the DoFn's own thread, in the
order the elements came: what is emitted, and every byte written, is the same as one at a time.
At most ``width`` elements are in flight, so the memory of a stage is at most ``width`` times one
element's, if the threads share glibc's malloc arenas (``share_malloc_arena``).
"""

from __future__ import annotations

import ctypes
import platform
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Overlap(Generic[T]):
    """Runs ``work(element)`` for up to ``width`` elements at once; ``submit`` and ``drain`` give back
    the results of finished elements in submission order (an error is raised where its result would
    have been)."""

    def __init__(self, work: Callable[[Any], T], width: int) -> None:
        if width < 1:
            raise ValueError(f"Overlap width must be at least 1, not {width}")
        self.work = work
        self.width = width
        self._pending: deque[Future[T]] = deque()
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, element: Any) -> Iterator[T]:
        """Start ``element`` (when iterated); yields the results of the oldest elements while ``width``
        are running."""
        if self.width == 1:
            yield self.work(element)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.width, thread_name_prefix="overlap")
        self._pending.append(self._pool.submit(self.work, element))
        while len(self._pending) >= self.width:
            yield self._pending.popleft().result()

    def drain(self) -> Iterator[T]:
        """The results of every element still running (the end of a bundle)."""
        while self._pending:
            yield self._pending.popleft().result()

    def discard(self) -> None:
        """Drop the elements still running (waited for, results and errors dropped): a bundle that
        failed is run again whole, so nothing of its attempt may come out of the next one."""
        while self._pending:
            future = self._pending.popleft()
            if not future.cancel():
                future.exception()  # waited for; an error of the failed attempt is not raised again

    def close(self) -> None:
        """Stop the threads; elements not drained are waited for and their results dropped."""
        self.discard()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


# glibc's mallopt parameter for the most malloc arenas (malloc.h).
_M_ARENA_MAX = -8


def share_malloc_arena() -> bool:
    """Have threads started from now on allocate from the arenas that exist, not arenas of their own
    (glibc only; False elsewhere, where nothing changes).

    glibc gives each new thread an arena of its own, and memory freed in one arena is not reused by
    another: the 12x WikiExtractor run building two passes at once peaked at 859 MB with an arena a
    thread, 792 MB with them shared (one pass at a time: 660 MB). Threads that already have an
    arena keep it; later ones take turns on the arenas there are. For the rest of the process: glibc
    fixes its limit when it first applies it.
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 1))
    except (OSError, AttributeError):
        return False
