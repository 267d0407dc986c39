"""`bert-train` with the record bytes its training and eval loaders fetch counted per shard file:
`python -m tests.support.counting_reads COUNTS.json [--without-tensorflow] ARGS...`. The counts
(`{shard path: bytes}`) are written to COUNTS.json when the command ends, however it ends, so a
test can check that each worker of a cluster fetched only its share of the training data."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path


def main() -> None:
    counts_path, args = Path(sys.argv[1]), sys.argv[2:]
    without_tensorflow = args[:1] == ["--without-tensorflow"]
    if without_tensorflow:
        args = args[1:]
    from bert_datagen.contract.loading.source import Source

    counts: dict[str, int] = {}
    lock = threading.Lock()
    read_files = Source._read_files

    def counted(self, wanted):
        got = read_files(self, wanted)
        with lock:
            for shard, (_, parts) in got.items():
                path = self.shards[shard].path
                counts[path] = counts.get(path, 0) + sum(len(p) for p in parts)
        return got

    Source._read_files = counted  # type: ignore[method-assign]
    sys.argv = [sys.argv[0], *args]
    try:
        if without_tensorflow:
            from tests.support.without_tensorflow import main as entry
        else:
            from bert_datagen.trainer.cli import main as entry  # type: ignore[assignment]
        entry()
    finally:
        with lock:
            counts_path.write_text(json.dumps(counts, sort_keys=True))


if __name__ == "__main__":
    main()
