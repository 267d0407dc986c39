"""PyTorch and JAX are optional extras: only the loaders' glue modules (and the JAX backend's own) import them, and nothing of
ours imports those modules, so every other module loads without them."""

from __future__ import annotations

import ast

from tests.project.test_layering import REPO, import_graph, module_files

GLUE = {
    "torch": {"bert_datagen.contract.loading.torch_adapter", "bert_datagen.contract.loading.torch_shares",
              "bert_datagen.contract.loading.torch_workers"},
    # The JAX backend's modules (only `--backend jax` reaches them, through function-level imports).
    "jax": {"bert_datagen.contract.loading.jax_hosts", "bert_datagen.trainer.backends.jax",
            "bert_datagen.trainer.backends.jax_cluster"},
}


def _third_party(path) -> set[str]:  # noqa: ANN001
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_only_the_glue_imports_torch_or_jax() -> None:
    importers = {framework: set() for framework in GLUE}
    for name, path in module_files(REPO).items():
        for framework in GLUE:
            if framework in _third_party(path):
                importers[framework].add(name)
    assert importers == GLUE


# The JAX backend's run state and inference import its step module; a run reaches them only inside the
# functions that run on JAX (`runtime/training.py`, `runtime/inference.py`), so a TensorFlow-only install
# never loads it.
BACKEND_USERS = {("bert_datagen.trainer.runtime.jax_training", "bert_datagen.trainer.backends.jax"),
                 ("bert_datagen.trainer.runtime.jax_training", "bert_datagen.trainer.backends.jax_cluster"),
                 ("bert_datagen.trainer.runtime.cluster", "bert_datagen.trainer.backends.jax_cluster"),
                 ("bert_datagen.trainer.runtime.inference", "bert_datagen.trainer.backends.jax")}


def test_nothing_of_ours_imports_the_glue() -> None:
    glue = set().union(*GLUE.values())
    assert sorted((m, t) for m, targets in import_graph(REPO).items() for t in targets
                  if t in glue and m not in glue and (m, t) not in BACKEND_USERS) == []
