"""The filesystem interface itself: atomic writes, the temp-name form, cleanup, and paths on a
local filesystem and on a (fake, in-memory) object store plugged in as a backend."""

from __future__ import annotations

import io
import os
from fnmatch import fnmatchcase

import pytest

from bert_datagen.contract.fs import (
    LOCAL_FS,
    TMP_MARKER,
    PathFS,
    is_remote,
    is_temp_name,
    remove_temp_files,
    replacing,
    temp_name,
    temp_path_for,
)


class MemoryObjects:
    """An object store in a dict: no directories, renames recorded."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.log: list[tuple[str, str]] = []

    def open_read(self, path: str) -> io.BytesIO:
        return io.BytesIO(self.objects[path])

    def write(self, path: str, data: bytes) -> None:
        self.log.append(("write", path))
        self.objects[path] = data

    def exists(self, path: str) -> bool:
        return path in self.objects

    def rename(self, src: str, dst: str) -> None:
        assert dst not in self.objects, "an object store cannot rename over an object"
        self.log.append(("rename", dst))
        self.objects[dst] = self.objects.pop(src)

    def delete(self, paths: list[str]) -> None:
        for path in paths:
            del self.objects[path]

    def list_prefix(self, prefix: str) -> list[str]:
        return [p for p in self.objects if p.startswith(prefix)]

    def glob(self, pattern: str) -> list[str]:
        return [p for p in self.objects if fnmatchcase(p, pattern)]

    def join(self, base: str, *parts: str) -> str:
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def test_is_remote() -> None:
    assert is_remote("gs://bucket/ds") and is_remote("fakestore://b/x")
    assert not is_remote("/data/ds") and not is_remote("relative/ds")


def test_the_one_temp_form() -> None:
    name = temp_name("manifest.json")
    assert name.startswith(TMP_MARKER) and name.endswith("-manifest.json") and is_temp_name(name)
    assert len(name) == len(TMP_MARKER) + 32 + 1 + len("manifest.json")
    assert temp_name("x") != temp_name("x")  # one per write: concurrent writers never collide
    assert not any(map(is_temp_name, [".tmp-notours.txt", ".tmp-123-a", ".tmp-final.json-12", "manifest.json"]))
    assert temp_path_for("gs://b/ds/manifest.json").startswith("gs://b/ds/.tmp-")
    assert temp_path_for("/d/logits.npz").startswith("/d/.tmp-") and temp_path_for("/d/logits.npz").endswith(".npz")
    assert temp_path_for("bare.txt").startswith("./.tmp-")


def test_local_write_atomic_replaces_and_leaves_no_temp(tmp_path) -> None:
    path = str(tmp_path / "sub" / "out.json")
    LOCAL_FS.write_atomic(path, b"one")
    LOCAL_FS.write_atomic(path, b"two")
    assert LOCAL_FS.read_bytes(path) == b"two"
    assert os.listdir(tmp_path / "sub") == ["out.json"]
    (tmp_path / "adir").mkdir()
    with pytest.raises(IsADirectoryError):
        LOCAL_FS.write_atomic(str(tmp_path / "adir"), b"x")
    assert (tmp_path / "adir").is_dir()


def test_replacing_keeps_the_old_file_when_the_write_fails(tmp_path) -> None:
    path = tmp_path / "metrics.json"
    path.write_text("old")
    with pytest.raises(RuntimeError), replacing(path, durable=True) as tmp:
        assert is_temp_name(tmp.name) and tmp.parent == tmp_path
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["metrics.json"]


def test_cleanup_removes_only_our_temp_files(tmp_path) -> None:
    ours = temp_name("part.tfrecord")
    for name in (ours, ".tmp-notours.txt", ".tmp-final.json-12", "keep.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / temp_name("adir")).mkdir()  # directories are their owners' to clean
    assert remove_temp_files(tmp_path) == [ours]
    assert sorted(remove_temp_files(tmp_path, any_marked=True)) == [".tmp-final.json-12", ".tmp-notours.txt"]
    assert len(os.listdir(tmp_path)) == 2 and (tmp_path / "keep.txt").exists()


def test_join_and_listing_on_local_paths(tmp_path) -> None:
    fs = PathFS(MemoryObjects())
    base = str(tmp_path)
    assert fs.join(base, "train", "part.tfrecord") == os.path.join(base, "train", "part.tfrecord")
    fs.write_atomic(fs.join(base, "train", "part.tfrecord"), b"r")
    assert fs.is_dir(fs.join(base, "train")) and fs.list_names(base) == ["train"]
    fs.move(fs.join(base, "train", "part.tfrecord"), fs.join(base, "moved", "part.tfrecord"))
    assert fs.glob(fs.join(base, "*", "*.tfrecord")) == [fs.join(base, "moved", "part.tfrecord")]
    fs.remove_tree(fs.join(base, "moved"))
    assert fs.list_names(base) == ["train"] and fs.list_names(fs.join(base, "train")) == []


def test_object_store_paths_go_to_the_backend() -> None:
    store = MemoryObjects()
    fs = PathFS(store)
    ds = "mem://bucket/ds/"
    path = fs.join(ds, "train", "part.tfrecord")
    assert path == "mem://bucket/ds/train/part.tfrecord"
    fs.write_atomic(path, b"one")
    fs.write_atomic(path, b"two")  # replaces: delete, then rename the complete temp object
    assert fs.read_bytes(path) == b"two" and list(store.objects) == [path]
    assert [op for op, _ in store.log] == ["write", "rename"] * 2
    assert is_temp_name(store.log[0][1].rsplit("/", 1)[1]) and store.log[1] == ("rename", path)
    fs.write_atomic(fs.join(ds, "manifest.json"), b"{}")
    assert fs.is_dir("mem://bucket/ds") and not fs.is_dir("mem://bucket/other")
    assert fs.list_names("mem://bucket/ds") == ["manifest.json", "train"]
    assert fs.listdir("mem://bucket/ds") == ["mem://bucket/ds/manifest.json", "mem://bucket/ds/train"]
    assert fs.glob("mem://bucket/ds/train/*") == [path]
    fs.move(path, fs.join(ds, "manifest.json"))
    assert fs.read_bytes("mem://bucket/ds/manifest.json") == b"two"
    fs.remove_tree("mem://bucket/ds")
    assert store.objects == {}
