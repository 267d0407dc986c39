"""The fake object store under its own scheme fakestore://, with object deletes and renames (registered with Beam on import)."""

from __future__ import annotations

import os

from tests.support.remote_store import FakeObjectStore

SCHEME = "fakestore"
PREFIX = f"{SCHEME}://"
ROOT: dict[str, str] = {}


class DeletingObjectStore(FakeObjectStore):
    """The fake object store of test_tools_remote, under its own scheme, with object deletes."""

    SCHEME = SCHEME
    ROOT = ROOT

    def delete(self, paths) -> None:
        for path in paths:
            os.remove(self._local(path))  # objects only, as an object store deletes

    def rename(self, sources, destinations) -> None:
        for src, dst in zip(sources, destinations, strict=True):
            os.makedirs(os.path.dirname(self._local(dst)), exist_ok=True)
            os.replace(self._local(src), self._local(dst))
