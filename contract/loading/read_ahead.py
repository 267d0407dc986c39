"""One fetch at a time on a background thread, for a reader that knows what it will read next
(`NumpyBatches`' next window, `MixedBatches`' next span): its requests to a bucket then run while
the current batches are used."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class ReadAhead:
    """A fetch started under a key (`start`) and taken back under the same key (`take`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool: tuple[int, ThreadPoolExecutor] | None = None  # (the process it belongs to, the pool)
        self._pending: tuple[Any, Future] | None = None  # (key, its fetch)

    def start(self, key: Any, fetch: Callable[..., Any], *args: Any) -> None:
        """Run ``fetch(*args)`` in the background unless the fetch under ``key`` already runs; a
        fetch under another key is dropped (its result never taken)."""
        if self._pending is not None and self._pending[0] == key:
            return
        if self._pool is None or self._pool[0] != os.getpid():  # none yet, or one a fork left behind
            self._pool = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix=self.name))
        self._pending = (key, self._pool[1].submit(fetch, *args))

    def take(self, key: Any) -> Any | None:
        """The result of the fetch started under ``key`` (its error raised here), else None; a fetch
        under another key is dropped."""
        pending, self._pending = self._pending, None
        if pending is None or pending[0] != key:
            return None
        return pending[1].result()

    def __getstate__(self) -> dict:
        # A DataLoader worker gets a copy: without the thread and what it was reading.
        return {"name": self.name, "_pool": None, "_pending": None}
