"""Shared test doubles for the datagen tests: a tiny vocab and tokenizer, and the recipe written out literally.

``reference_instances`` is RECIPE.md sections 2-3 transcribed line by line, one
document and one token at a time, drawing from the same streams as
``bert_datagen.datagen.instances`` (see its module doc).  The vectorized implementation must
produce exactly the same instances.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.documents import TokenizedDocument
from bert_datagen.datagen.instances import doc_pass_keys
from bert_datagen.datagen.rng import GOLDEN, MASK64, mix64

BUCKETS = 97


@dataclass
class FakeVocab:
    """[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4; odd ids >= 5 start words, even ids >= 6 are "##" pieces."""

    size: int = 5 + 2 * BUCKETS
    pad_id: int = 0
    cls_id: int = 2
    sep_id: int = 3
    mask_id: int = 4
    is_continuation: np.ndarray = field(default_factory=lambda: np.array(
        [i >= 6 and i % 2 == 0 for i in range(5 + 2 * BUCKETS)], dtype=bool))


class FakeTokenizer:
    """Whitespace words cut into 3-character pieces, hashed into FakeVocab ids."""

    def __init__(self) -> None:
        self.calls = 0

    def encode_ids(self, text: str) -> np.ndarray:
        ids = []
        for word in text.lower().split():
            for k in range(0, len(word), 3):
                h = zlib.crc32(word[k : k + 3].encode("utf-8")) % BUCKETS
                ids.append(5 + 2 * h if k == 0 else 6 + 2 * h)
        return np.asarray(ids, dtype=np.int32)

    def encode_batch_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        self.calls += 1
        return [self.encode_ids(t) for t in texts]


def make_doc(doc_id: int, sentences: Sequence[Sequence[int]]) -> TokenizedDocument:
    lengths = [len(s) for s in sentences]
    tokens = np.asarray([t for s in sentences for t in s], dtype=np.int32)
    return TokenizedDocument(doc_id, tokens, np.cumsum(lengths).astype(np.int32))


def synthetic_pool(n_docs: int, seed: int, max_sentences: int = 12, max_len: int = 30) -> list[TokenizedDocument]:
    """Documents of random word/piece ids (a fixed generator: only the test's data, not the code under test)."""
    gen = np.random.default_rng(seed)
    docs = []
    for d in range(n_docs):
        n_sent = int(gen.integers(1, max_sentences + 1))
        sentences = []
        for _ in range(n_sent):
            length = int(gen.integers(1, max_len + 1))
            ids = 5 + gen.integers(0, 2 * BUCKETS, size=length)
            ids[0] = 5 + 2 * (ids[0] // 2 % BUCKETS)  # a sentence starts with a word
            sentences.append(ids.tolist())
        docs.append(make_doc(mix64(seed * 1000 + d + 1), sentences))
    return docs


# ---------------------------------------------------------------- the recipe, literally


def _draw(key: int, counter: int) -> int:
    return mix64((key + counter * GOLDEN) & MASK64)


def _key(config: DatagenConfig, purpose: str, doc_id: int, pass_index: int) -> int:
    return int(doc_pass_keys(config.random_seed, purpose, np.array([doc_id], np.uint64), pass_index)[0])


def _uniform(u: int) -> float:
    return (u >> 11) * (1.0 / (1 << 53))


def _randint(u: int, low: int, high: int) -> int:
    return low + u % (high - low + 1)


def reference_instances(pool: Sequence[TokenizedDocument], pass_index: int, config: DatagenConfig, vocab) -> list[dict]:
    docs = sorted(pool, key=lambda d: d.doc_id)
    all_documents = [[d.sentence(i).tolist() for i in range(d.num_sentences)] for d in docs]
    max_num_tokens = config.max_seq_length - 3
    out = []
    for document_index, document in enumerate(all_documents):
        doc_id = docs[document_index].doc_id

        def key(purpose: str, doc_id: int = doc_id) -> int:
            return _key(config, purpose, doc_id, pass_index)

        target_seq_length = max_num_tokens
        if _uniform(_draw(key("target_length"), 1)) < config.short_seq_prob:
            target_seq_length = _randint(_draw(key("target_length"), 2), 2, max_num_tokens)
        current_chunk: list[list[int]] = []
        current_length = 0
        i = 0
        k = 0
        while i < len(document):
            segment = document[i]
            current_chunk.append(segment)
            current_length += len(segment)
            if i == len(document) - 1 or current_length >= target_seq_length:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = _randint(_draw(key("a_end"), k + 1), 1, len(current_chunk) - 1)
                tokens_a = [t for s in current_chunk[:a_end] for t in s]
                tokens_b: list[int] = []
                if len(current_chunk) == 1 or _uniform(_draw(key("is_random_next"), k + 1)) < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for t in range(config.max_notnext_tries):
                        random_document_index = _randint(_draw(key("partner"), k * config.max_notnext_tries + t + 1),
                                                         0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = _randint(_draw(key("b_start"), k + 1), 0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    i -= len(current_chunk) - a_end
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                trunc_key = _draw(key("truncate"), k + 1)
                removal = 0
                while len(tokens_a) + len(tokens_b) > max_num_tokens:
                    trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
                    removal += 1
                    if _uniform(_draw(trunc_key, removal)) < 0.5:
                        del trunc[0]
                    else:
                        trunc.pop()
                assert tokens_a and tokens_b
                tokens = [vocab.cls_id, *tokens_a, vocab.sep_id, *tokens_b, vocab.sep_id]
                segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                mask_key = _draw(key("mask"), k + 1)
                out.append(dict(
                    key=_draw(key("instance"), k + 1),
                    segment_ids=segment_ids,
                    next_sentence_label=int(is_random_next),
                    **reference_mask(tokens, mask_key, config, vocab),
                ))
                k += 1
                current_chunk = []
                current_length = 0
            i += 1
    return out


def reference_mask(tokens: list[int], mask_key: int, config: DatagenConfig, vocab) -> dict:
    seq = config.max_seq_length
    cand_indexes: list[list[int]] = []
    for i, token in enumerate(tokens):
        if token in (vocab.cls_id, vocab.sep_id):
            continue
        if config.whole_word_mask and cand_indexes and vocab.is_continuation[token]:
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])
    # The shuffle: groups ordered by the draw at their first position.
    cand_indexes.sort(key=lambda group: _draw(mask_key, group[0] + 1))
    num_to_predict = min(config.max_predictions_per_seq, max(1, int(round(len(tokens) * config.masked_lm_prob))))
    output = list(tokens)
    masked = []
    for index_set in cand_indexes:
        if len(masked) >= num_to_predict:
            break
        if len(masked) + len(index_set) > num_to_predict:
            continue
        for index in index_set:
            u = _uniform(_draw(mask_key, seq + index + 1))
            if u < config.mask_ratios[0]:
                output[index] = vocab.mask_id
            elif u < config.mask_ratios[0] + config.mask_ratios[1]:
                pass
            else:
                output[index] = _draw(mask_key, 2 * seq + index + 1) % vocab.size
            masked.append((index, tokens[index]))
    masked.sort()
    return dict(input_ids=output, positions=[p for p, _ in masked], labels=[t for _, t in masked])


def batch_rows(batch, keys) -> list[dict]:
    """The InstanceBatch in the reference's shape (padding checked separately)."""
    rows = []
    for r in range(len(batch)):
        length = int(batch.input_mask[r].sum())
        n_pred = int(batch.masked_lm_weights[r].sum())
        rows.append(dict(
            key=int(keys[r]),
            segment_ids=batch.segment_ids[r, :length].tolist(),
            next_sentence_label=int(batch.next_sentence_labels[r]),
            input_ids=batch.input_ids[r, :length].tolist(),
            positions=batch.masked_lm_positions[r, :n_pred].tolist(),
            labels=batch.masked_lm_ids[r, :n_pred].tolist(),
        ))
    return rows
