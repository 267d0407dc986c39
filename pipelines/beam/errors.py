"""The error of a data run that cannot produce a dataset, below every stage that raises it."""


class DatagenError(RuntimeError):
    """A run that cannot produce a dataset; the message names the file or option and the reason."""
