"""A dataset replaced as `bert-datagen run --overwrite` and `task --overwrite` replace one (the swap of
pipelines/beam/outputs.py: the new dataset written into a staging directory, then the old manifest
retired first and the new one placed last), locally or in a bucket: what the tests of issue #43
point 1 do to a dataset under a reader or a run."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from bert_datagen.contract.fs import is_remote

SPLIT_DIRS = ("train", "eval", "dev", "test")


def replace_dataset(target: str, write: Callable[[str], object]) -> None:
    """``target``'s dataset replaced by the one ``write(directory)`` makes; in a bucket it is made
    locally and uploaded into the staging prefix before the same commit."""
    from bert_datagen.pipelines.beam.outputs import commit, create_staging, prepare_dataset_output

    out = prepare_dataset_output(target, overwrite=True, split_dirs=SPLIT_DIRS)
    create_staging(out)
    if is_remote(target):
        from tests.support.servers import upload_tree

        with tempfile.TemporaryDirectory() as scratch:
            write(scratch)
            upload_tree(Path(scratch), out.staging)
    else:
        write(out.staging)
    commit(out)
