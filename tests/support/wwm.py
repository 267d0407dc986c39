"""Whole-word masking measured on laid-out rows: how many masked CJK characters had their whole
segmented word masked (tests and benchmarks/bench_zh.py)."""

from __future__ import annotations

import numpy as np

from bert_datagen.datagen.documents import split_marks
from bert_datagen.datagen.masking import candidate_groups


def cjk_ids(vocab) -> np.ndarray:
    """A boolean per id: the token is one CJK ideograph."""
    from bert_datagen.vocab.train import is_cjk_ideograph

    return np.array([len(t) == 1 and is_cjk_ideograph(t) for t in vocab.tokens], dtype=bool)


def whole_word_counts(marked_ids: np.ndarray, lengths: np.ndarray, positions: np.ndarray, weights: np.ndarray,
                      vocab) -> dict[str, int]:
    """Counts over masked CJK characters: all, those whose whole group (segmented word, as laid out
    in the row) is masked, and those of words of two or more characters."""
    ids, continues = split_marks(marked_ids)
    cand, _, group = candidate_groups(ids, lengths, vocab, True, continues)
    n, seq = ids.shape
    masked = np.zeros((n, seq), dtype=bool)
    rows, slots = np.nonzero(weights > 0)
    masked[rows, positions[rows, slots]] = True
    gid = np.where(cand, group, -1)
    key = np.arange(n)[:, None] * seq + gid
    sizes = np.bincount(key[cand], minlength=n * seq)
    masked_in = np.bincount(key[cand & masked], minlength=n * seq)
    is_cjk = cjk_ids(vocab)[ids] & masked
    whole = is_cjk & (masked_in[key] == sizes[key])
    multi = is_cjk & (sizes[key] > 1)
    return {"masked_cjk": int(is_cjk.sum()), "whole_word": int(whole.sum()), "in_multi_char_words": int(multi.sum()),
            "whole_multi_char_words": int((whole & multi).sum())}


def write_zh_corpus(corpora, root, n_docs: int) -> tuple[str, str]:
    """The first ``n_docs`` articles of the zhwiki sample (``corpora``: ../shared/corpora) as one
    WikiExtractor file under ``root``, and a vocab trained on them: (input path, vocab path)."""
    from bert_datagen.contract.fs import LOCAL_FS
    from bert_datagen.contract.vocab_io import write_vocab
    from bert_datagen.vocab.train import train_vocab

    text = (corpora / "zhwiki_sample" / "wiki_00").read_text(encoding="utf-8")
    blocks = text.split("</doc>")[:n_docs]
    path, vocab_path = root / "zh.txt", root / "vocab.txt"
    path.write_text("</doc>".join(blocks) + "</doc>\n", encoding="utf-8")
    lines = [line for line in "".join(blocks).splitlines() if line.strip() and not line.startswith("<doc")]
    write_vocab(train_vocab(lines, vocab_size=4000, do_lower_case=True, min_frequency=1), str(vocab_path), LOCAL_FS)
    return str(path), str(vocab_path)


class DocumentWords:
    """Every document's token ids and word-continuation marks as generation makes them (tokenized
    and segmented in this process), laid end to end: the truth a record's masks are measured
    against, found by where the record's A and B segments are in the documents."""

    def __init__(self, path: str, vocab, config) -> None:
        from bert_datagen.datagen.documents import tokenize_documents
        from bert_datagen.datagen.readers import read_documents
        from bert_datagen.vocab.tokenizer import BertTokenizer

        with open(path, "rb") as f:
            raws = list(read_documents(path, f.read(), config, {}))
        docs = tokenize_documents(raws, BertTokenizer(vocab), config, {})
        ids, marks = zip(*(split_marks(d.tokens) for d in docs), strict=True)
        gap = [np.full(1, -1, np.int32)]  # between documents: no segment spans it
        self.ids = np.concatenate([x for a in ids for x in ([a.astype(np.int32)] + gap)])
        self.continues = np.concatenate([x for m in marks for x in ([m] + [np.zeros(1, bool)])])
        self._bytes = self.ids.tobytes()

    def find(self, segment: np.ndarray) -> int:
        """Where ``segment`` (token ids) first occurs in the documents; -1 when nowhere."""
        needle = np.asarray(segment, np.int32).tobytes()
        at = self._bytes.find(needle)
        while at >= 0 and at % 4:
            at = self._bytes.find(needle, at + 1)
        return at // 4 if at >= 0 else -1

    def word(self, at: int) -> tuple[int, int]:
        """The document word (its token range) that token ``at`` is in."""
        start = at
        while self.continues[start]:
            start -= 1
        end = at + 1
        while end < len(self.continues) and self.continues[end]:
            end += 1
        return start, end


def document_word_counts(words: DocumentWords, original: np.ndarray, lengths: np.ndarray, segment_ids: np.ndarray,
                         positions: np.ndarray, weights: np.ndarray, vocab,
                         word_bits: np.ndarray | None = None) -> dict[str, int]:
    """Over NSP records ([CLS] A [SEP] B [SEP], ``original``: unmasked ids): masked CJK characters,
    those whose whole document word is in the row and masked, those of words of two or more
    characters, and the records whose ``word_bits`` (when given) are not their segments' marks."""
    from bert_datagen.datagen.record_layout import unpack_word_bits

    is_cjk = cjk_ids(vocab)
    counts = {"masked_cjk": 0, "whole_word": 0, "in_multi_char_words": 0, "records": 0, "wrong_word_bits": 0}
    stored = None if word_bits is None else unpack_word_bits(word_bits, original.shape[1])
    for r in range(original.shape[0]):
        n = int(lengths[r])
        sep = int(np.argmax(segment_ids[r, :n])) - 1  # the first [SEP]: the last position of segment 0
        spans = ((1, sep), (sep + 1, n - 1))  # row positions [lo, hi) of A and B
        at = [words.find(original[r, lo:hi]) for lo, hi in spans]
        assert min(at) >= 0, f"record {r}: a segment not found in the documents"
        counts["records"] += 1
        if stored is not None:
            expected = np.zeros(original.shape[1], bool)
            for (lo, hi), a in zip(spans, at, strict=True):
                expected[lo:hi] = words.continues[a:a + hi - lo]
            counts["wrong_word_bits"] += int(not np.array_equal(expected, stored[r]))
        masked = set(positions[r][weights[r] > 0].tolist())
        for p in sorted(masked):
            if not is_cjk[original[r, p]]:
                continue
            side = 0 if p < sep else 1
            lo, hi = spans[side]
            start, end = words.word(at[side] + p - lo)
            row_start, row_end = start - at[side] + lo, end - at[side] + lo
            counts["masked_cjk"] += 1
            counts["in_multi_char_words"] += int(end - start > 1)
            counts["whole_word"] += int(row_start >= lo and row_end <= hi
                                        and all(q in masked for q in range(row_start, row_end)))
    return counts
