"""The inputs of issue #44's memory checks, in the formats users have, written to a scratch folder.

- ``write_wikiextractor_variants``: ../shared/corpora/enwiki_extract_2015's articles (WikiExtractor
  ``<doc>`` blocks) as one file, the first copy as it is and each further one with every article's
  paragraphs in a seeded order (its title line first): a new document per article and copy, as long
  as it has two paragraphs (a one-paragraph article repeats, and the pipeline collapses it).
- ``write_book_variants``: ../shared/corpora/gutenberg_en's books, one file a book as Project
  Gutenberg serves them (header, ``*** START OF`` ... ``*** END OF``, licence): copy 0 as it is, each
  further copy with the body's paragraphs (blank-line blocks) in a seeded order. Each book is one
  document (``--input-format text`` detects the layout), hundreds of KB of text.

These are data built from the shared corpora: never commit them (they go under a temporary folder).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

CORPORA = Path(__file__).resolve().parent.parent.parent / "shared" / "corpora"
WIKI = CORPORA / "enwiki_extract_2015"
BOOKS = CORPORA / "gutenberg_en"
_START = re.compile(r"^[ \t]*\*\*\* ?START OF", re.MULTILINE)
_END = re.compile(r"^[ \t]*\*\*\* ?END OF", re.MULTILINE)
# The closing line some books have inside the body: the reader drops what follows it, so it stays last.
_CLOSING = re.compile(r"^[ \t]*End of (the )?Project Gutenberg", re.MULTILINE | re.IGNORECASE)


def _wiki_articles() -> list[tuple[str, str, list[str]]]:
    """(``<doc ...>`` line, title line, paragraphs) of every article, in file order."""
    files = sorted(WIKI.glob("wiki_[0-9][0-9]"))
    if not files:
        raise SystemExit(f"scale_corpora: corpus not found at {WIKI}")
    articles = []
    for path in files:
        for block in path.read_text(encoding="utf-8").split("</doc>"):
            lines = block.strip("\n").split("\n")
            if not lines[0].startswith("<doc"):
                continue
            body = [line for line in lines[2:] if line.strip()]
            articles.append((lines[0], lines[1] if len(lines) > 1 else "", body))
    return articles


def write_wikiextractor_variants(copies: int, path: Path, seed: int = 0) -> Path:
    """``copies`` copies of the Wikipedia extract in one WikiExtractor file (see the module docstring)."""
    articles = _wiki_articles()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for copy in range(copies):
            rng = random.Random(f"wiki-{seed}-{copy}")
            for head, title, body in articles:
                paragraphs = list(body)
                if copy:
                    rng.shuffle(paragraphs)
                out.write("\n".join([head, title, "", *paragraphs, "</doc>\n"]))
    return path


def _reordered_book(text: str, rng: random.Random) -> str:
    """A Gutenberg book with its body's paragraphs (blank-line blocks) in a seeded order; header (to
    its START line), footer (from its closing or END line) and line ends as they were."""
    start, end = _START.search(text), _END.search(text)
    if start is None or end is None:
        raise SystemExit("scale_corpora: a book without Gutenberg START/END lines")
    end = _CLOSING.search(text, start.end(), end.start()) or end
    newline = "\r\n" if "\r\n" in text else "\n"
    body_at = text.index("\n", start.start()) + 1
    paragraphs = [p for p in re.split(r"(?:[ \t]*\r?\n){2,}", text[body_at:end.start()]) if p.strip()]
    rng.shuffle(paragraphs)
    return text[:body_at] + newline + (newline * 2).join(paragraphs) + newline * 2 + text[end.start():]


def write_book_variants(books: int, folder: Path, seed: int = 0) -> list[Path]:
    """``books`` book files made from the shared books in turn (see the module docstring)."""
    sources = sorted(p for p in BOOKS.glob("*.txt"))
    if not sources:
        raise SystemExit(f"scale_corpora: books not found at {BOOKS}")
    texts = [p.read_bytes().decode("utf-8") for p in sources]
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(books):
        copy, which = divmod(i, len(sources))
        text = texts[which] if copy == 0 else _reordered_book(texts[which], random.Random(f"book-{seed}-{copy}-{which}"))
        path = folder / f"book-{copy:04d}-{sources[which].stem}.txt"
        path.write_bytes(text.encode("utf-8"))
        paths.append(path)
    return paths
