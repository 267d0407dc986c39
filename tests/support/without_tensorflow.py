"""`bert-train` as an install without TensorFlow runs it (issue #42: the `[train-jax]` extra):
`python -m tests.support.without_tensorflow pretrain ...`. TensorFlow is made unimportable the way a
missing package is (`sys.modules["tensorflow"] = None`: `import tensorflow` raises
ModuleNotFoundError and `importlib.util.find_spec` finds nothing), and at exit the TensorFlow
modules that did get loaded (none, if the JAX path is free of it) are printed last on stderr."""

from __future__ import annotations

import sys

MARK = "TENSORFLOW_MODULES_LOADED"


def main() -> None:
    sys.modules["tensorflow"] = None  # type: ignore[assignment]
    from bert_datagen.trainer.cli import main as bert_train

    try:
        bert_train(args=sys.argv[1:], prog_name="bert-train")
    finally:
        loaded = sorted(m for m, mod in sys.modules.items() if m.split(".")[0] == "tensorflow" and mod is not None)
        print(MARK, ",".join(loaded) or "none", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
