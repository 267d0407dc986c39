"""The errors of a data run that cannot produce a dataset, below every stage that raises them: the
driver's `DatagenError`, and the input errors a worker raises inside a DoFn, which the driver finds
again in whatever a runner wraps them in."""

from __future__ import annotations

import re

ERROR_TAG = "[bert-datagen error] "


class DatagenError(RuntimeError):
    """A run that cannot produce a dataset; the message names the file or option and the reason."""


def input_error(message: str) -> RuntimeError:
    """An error raised inside a DoFn whose message the driver can find in any runner's wrapping."""
    return RuntimeError(ERROR_TAG + message.replace("\n", " "))


def extract_input_error(exc: BaseException) -> str | None:
    """The clean message of an ``input_error`` raised in a worker, from a runner's wrapped exception."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        match = re.search(re.escape(ERROR_TAG) + r"([^\n]*)", str(exc))
        if match:
            message = re.sub(r"\s*\[while running [^\]]*\].*$", "", match.group(1))
            return message.strip().rstrip("'\"")
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None
