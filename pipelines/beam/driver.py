"""The driver steps `bert-datagen run` and `bert-datagen task` share: one implementation each, so both
commands read their inputs and vocab, stage their dataset, run their Beam pipelines and record the
dataset's provenance the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import apache_beam as beam

from bert_datagen.contract.fs import is_remote
from bert_datagen.pipelines.beam import fsio, outputs
from bert_datagen.pipelines.beam.errors import DatagenError, extract_input_error
from bert_datagen.pipelines.beam.runners import RunnerSetup

if TYPE_CHECKING:
    from bert_datagen.vocab.vocab_file import Vocab


def local_abspath(path: str) -> str:
    return path if is_remote(path) else os.path.abspath(os.path.expanduser(path))


def read_run_vocab(vocab_path: str) -> tuple[Vocab, str, bytes]:
    """The run's vocab, its absolute path (an input the output must not replace) and its bytes (the
    dataset's vocab.txt); DatagenError naming the file when it cannot be read."""
    from bert_datagen.contract.vocab_io import load_vocab

    try:
        vocab = load_vocab(vocab_path, fsio.BEAM_FS)
    except (OSError, ValueError) as e:
        message = str(e)
        raise DatagenError(message if vocab_path in message else f"{vocab_path}: {message}") from e
    vocab_path = local_abspath(vocab_path)
    return vocab, vocab_path, fsio.read_bytes(vocab_path)


@contextlib.contextmanager
def staged_dataset(output_dir: str, overwrite: bool, **layout: Any) -> Iterator[outputs.DatasetOutput]:
    """The run's staging directory in `output_dir` (`outputs.prepare_dataset_output`; `layout`: its
    split directories and side files), under the directory's lock (`outputs.lock_output`: a second
    command on it is refused): nothing in the directory changes before this point, and the old
    dataset is replaced only once the body has written a complete one; a failure or an interrupt, of
    the body or of the swap, undoes the run."""
    try:
        lock = outputs.lock_output(output_dir)
    except outputs.OutputError as e:
        raise DatagenError(str(e)) from e
    with lock:  # held from before DIR is looked at until the swap is done or undone
        try:
            out = outputs.prepare_dataset_output(output_dir, overwrite, **layout)
        except outputs.OutputError as e:
            raise DatagenError(str(e)) from e
        try:
            outputs.create_staging(out)
            yield out
            outputs.commit(out)
        except BaseException:
            outputs.discard(out)
            raise


def manifest_provenance(setup: RunnerSetup, vocab: Vocab, vocab_bytes: bytes, do_lower_case: bool) -> dict[str, dict]:
    """The manifest's "vocab" and "created_by" fields (keyword arguments of Manifest.build)."""
    from bert_datagen.contract.manifest import VOCAB_NAME

    return {"vocab": {"path": VOCAB_NAME, "sha256": hashlib.sha256(vocab_bytes).hexdigest(),
                      "size": int(vocab.size), "do_lower_case": do_lower_case},
            "created_by": {"runner": setup.runner, "python": platform.python_version()}}


def run_pipeline(setup: RunnerSetup, build: Callable[[beam.Pipeline], None]) -> None:
    """Build a pipeline on the runner's options and run it to the end; an input error a worker raised
    comes back as a DatagenError with its message (naming the file and line)."""
    pipeline = beam.Pipeline(options=setup.options)
    build(pipeline)
    try:
        result = pipeline.run()
        result.wait_until_finish()
        client = getattr(result, "client", None)  # DaskRunner leaves its client open
        if client is not None:
            client.close()
    except Exception as e:
        message = extract_input_error(e)
        if message is not None:
            raise DatagenError(message) from e
        raise
