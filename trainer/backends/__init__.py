"""The Keras backends `bert-train` runs on, and the one choice between them.

Keras reads its backend once, when it is first imported, from `KERAS_BACKEND`. The choice is made
here, before anything imports Keras: `--backend` where given, else Keras's own `KERAS_BACKEND`, else
TensorFlow; a `--backend` that contradicts a set `KERAS_BACKEND` is refused rather than silently
preferring one. Each backend's compiled step, placement and collectives live in one module beside
this one (`tensorflow` is still spread over runtime/; `jax.py`).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import MutableMapping

BACKENDS = ("tensorflow", "jax")
DEFAULT_BACKEND = "tensorflow"
# The install extra that brings each backend (pyproject.toml).
EXTRAS = {"tensorflow": "bert-datagen[train]", "jax": "bert-datagen[train-jax]"}
# The packages a backend cannot run without.
_NEEDS = {"tensorflow": ("tensorflow", "keras"), "jax": ("jax", "keras")}


class BackendError(ValueError):
    """A backend that cannot be chosen: unknown, contradicted, already fixed, or not installed."""


def choose_backend(option: str | None, environ: MutableMapping[str, str]) -> str:
    """The backend of this process, set in `environ["KERAS_BACKEND"]` for Keras to read.

    `option` is `--backend` (None when absent). Raises BackendError naming the reason."""
    env = environ.get("KERAS_BACKEND") or None
    if option is not None and option not in BACKENDS:
        raise BackendError(f"--backend {option!r}: choose one of {', '.join(BACKENDS)}")
    if env is not None and env not in BACKENDS:
        raise BackendError(f"KERAS_BACKEND={env!r}: bert-train runs on {' or '.join(BACKENDS)}")
    if option is not None and env is not None and option != env:
        raise BackendError(f"--backend {option} contradicts KERAS_BACKEND={env}: unset one of them")
    name = option or env or DEFAULT_BACKEND
    missing = [pkg for pkg in _NEEDS[name] if importlib.util.find_spec(pkg) is None]
    if missing:
        raise BackendError(f"the {name} backend needs {', '.join(missing)}, which is not installed: "
                           f"pip install '{EXTRAS[name]}'")
    keras = sys.modules.get("keras")
    if keras is not None and keras.backend.backend() != name:
        raise BackendError(f"Keras is already running on {keras.backend.backend()} in this process; "
                           f"the {name} backend must be chosen before Keras is imported")
    environ["KERAS_BACKEND"] = name
    return name
