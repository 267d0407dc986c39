"""Word segmenters for whole-word masking of scripts written without spaces: a small registry of
``str -> list[str]`` functions, like the sentence splitters (``bert_datagen.datagen.sentences``).

BERT's basic tokenization makes every CJK ideograph a word of its own, so ``--whole-word-mask``
alone masks single characters. With ``--word-segmenter NAME`` the characters of each segmented
word form one masking unit (Chinese BERT-wwm, Cui et al. 2019); token ids do not change.

Guarantees every registered segmenter keeps (tests check them):

* the words, concatenated, are the text (nothing added, dropped or reordered);
* deterministic: the same text gives the same words, in any process (Beam may run the DoFns
  elsewhere), with no network access: the dictionary ships in the segmenter's package and is
  loaded lazily, once per process (``get_segmenter``);
* ``segmenter_info(name)`` names what decides the words (name, package version, dictionary
  checksum): the manifest records it, so a dataset says which segmentation it was masked with.

``jieba`` (MIT, offline, its dictionary inside the package) is the one registered here; its HMM
for words outside the dictionary is a Viterbi search, deterministic too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import cache
from typing import Any

Segmenter = Callable[[str], list[str]]

_SEGMENTERS: dict[str, tuple[Callable[[], Segmenter], Callable[[], dict[str, Any]]]] = {}


class SegmenterError(ValueError):
    """A segmenter that is unknown or not installed."""


def register_segmenter(name: str, factory: Callable[[], Segmenter], info: Callable[[], dict[str, Any]]) -> None:
    """Make ``factory()`` available as ``get_segmenter(name)``; ``info()`` gives its version and
    dictionary checksum (a plug-in point)."""
    _SEGMENTERS[name] = (factory, info)


def available_segmenters() -> list[str]:
    return sorted(_SEGMENTERS)


def _entry(name: str) -> tuple[Callable[[], Segmenter], Callable[[], dict[str, Any]]]:
    if name not in _SEGMENTERS:
        raise SegmenterError(f"unknown word segmenter {name!r}; available: {', '.join(available_segmenters())}")
    return _SEGMENTERS[name]


@cache
def get_segmenter(name: str) -> Segmenter:
    """The segmenter registered as ``name``, its dictionary loaded once per process."""
    return _entry(name)[0]()


@cache
def segmenter_info(name: str) -> dict[str, Any]:
    """``{"name", "version", "dictionary_sha256"}`` of the segmenter, as a manifest records it."""
    return {"name": name, **_entry(name)[1]()}


def check_segmenter(name: str) -> None:
    """SegmenterError unless ``name`` is registered and its package imports: a run checks this before
    any work, since otherwise the first worker to segment a sentence fails, its pipeline started."""
    segmenter_info(name)  # imports the package and reads its dictionary; cached for the manifest


def _import_jieba():
    try:
        import jieba
    except ImportError as e:
        raise SegmenterError("--word-segmenter jieba needs the jieba package: pip install 'bert-datagen[zh]'") from e
    return jieba


def _jieba_dictionary() -> bytes:
    jieba = _import_jieba()
    from importlib.resources import files

    return files(jieba).joinpath("dict.txt").read_bytes()


def _make_jieba() -> Segmenter:
    import logging

    jieba = _import_jieba()
    logging.getLogger("jieba").setLevel(logging.WARNING)  # its "Building prefix dict" lines
    # An instance of our own (jieba's global one may carry a user's added words), built from the
    # dictionary in the package, not from jieba's cache file in the temp directory: that file is
    # trusted without a check and may come from another version or dictionary.
    tokenizer = jieba.Tokenizer()
    with tokenizer.get_dict_file() as f:
        tokenizer.FREQ, tokenizer.total = tokenizer.gen_pfdict(f)
    tokenizer.initialized = True

    def segment(text: str) -> list[str]:
        return list(tokenizer.cut(text, HMM=True))

    return segment


def _jieba_info() -> dict[str, Any]:
    jieba = _import_jieba()
    return {"version": jieba.__version__, "dictionary_sha256": hashlib.sha256(_jieba_dictionary()).hexdigest()}


register_segmenter("jieba", _make_jieba, _jieba_info)
