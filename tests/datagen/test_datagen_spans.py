"""Span masking (``masking_unit="span"``): the vectorized selection against a scalar transcription
of its rule, span lengths, whole words, the 80/10/10 choice per span, counts and determinism."""

from __future__ import annotations

import numpy as np
import pytest

from bert_datagen.datagen.config import ConfigError, DatagenConfig
from bert_datagen.datagen.masking import mask_batch, num_to_predict
from bert_datagen.datagen.rng import GOLDEN, MASK64, Stream, mix64
from bert_datagen.datagen.span_masking import MAX_SPAN_WORDS, span_length_probabilities
from tests.support.datagen_fakes import FakeVocab

VOCAB = FakeVocab()


def draw(key: int, counter: int) -> int:
    return mix64((key + counter * GOLDEN) & MASK64)


def uniform(x: int) -> float:
    return (x >> 11) / float(1 << 53)


def reference_spans(tokens: list[int], key: int, config: DatagenConfig) -> dict:
    """The span rule one word at a time, in plain Python."""
    seq = config.max_seq_length
    words: list[list[int]] = []
    for i, t in enumerate(tokens):
        if t in (VOCAB.cls_id, VOCAB.sep_id):
            continue
        if words and VOCAB.is_continuation[t]:
            words[-1].append(i)
        else:
            words.append([i])
    cdf = np.cumsum(span_length_probabilities())
    cdf[-1] = 1.0
    target = min(config.max_predictions_per_seq, max(1, round(len(tokens) * config.masked_lm_prob)))
    taken: dict[int, int] = {}  # word index -> first position of its span
    count = 0
    for w in sorted(range(len(words)), key=lambda w: draw(key, words[w][0] + 1)):
        if count >= target:
            break
        if w in taken:
            continue
        length = int(np.searchsorted(cdf, uniform(draw(key, 3 * seq + words[w][0] + 1)), side="right")) + 1
        for k in range(length):
            if w + k >= len(words) or w + k in taken or count + len(words[w + k]) > target:
                break
            taken[w + k] = words[w][0]
            count += len(words[w + k])
    output = list(tokens)
    for w, first in taken.items():
        u = uniform(draw(key, seq + first + 1))
        for i in words[w]:
            if u < config.mask_ratios[0]:
                output[i] = VOCAB.mask_id
            elif u >= config.mask_ratios[0] + config.mask_ratios[1]:
                output[i] = draw(key, 2 * seq + i + 1) % VOCAB.size
    positions = sorted(i for w in taken for i in words[w])
    return dict(positions=positions, input_ids=output, spans=taken, words=words)


def rows(n: int, seq: int, length: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """``[CLS] A [SEP] B [SEP]`` rows whose words are 1-3 pieces."""
    draws = Stream.for_purpose(seed, "test-spans").u64_array(n * seq).reshape(n, seq)
    starts = 5 + 2 * (draws % np.uint64(97)).astype(np.int32)
    cont = (draws >> np.uint64(40)) % np.uint64(3) == 0  # about a third of pieces are "##"
    ids = np.where(cont, starts + 1, starts).astype(np.int32)
    ids[:, 0], ids[:, 20], ids[:, length - 1] = VOCAB.cls_id, VOCAB.sep_id, VOCAB.sep_id
    ids[:, length:] = 0
    return ids, np.full(n, length)


CONFIG = DatagenConfig(max_seq_length=96, max_predictions_per_seq=14, masking_unit="span")


def test_config_spellings_and_validation():
    assert DatagenConfig(whole_word_mask=True).masking_unit == "word"
    assert DatagenConfig(masking_unit="word").whole_word_mask
    assert CONFIG.whole_word_mask  # spans are whole words (verify checks "at most num_to_predict")
    assert DatagenConfig(masking_unit="word").to_dict() == DatagenConfig(whole_word_mask=True).to_dict()
    with pytest.raises(ConfigError, match="--masking-unit 'phrase'"):
        DatagenConfig(masking_unit="phrase")


def test_vectorized_spans_equal_the_scalar_rule():
    ids, lengths = rows(400, 96, 90)
    keys = Stream(17).u64_array(400)
    out = mask_batch(ids, lengths, keys, CONFIG, VOCAB)
    for r in range(400):
        ref = reference_spans(ids[r, :90].tolist(), int(keys[r]), CONFIG)
        n = int(out.masked_lm_weights[r].sum())
        assert out.masked_lm_positions[r, :n].tolist() == ref["positions"], r
        assert out.input_ids[r, :90].tolist() == ref["input_ids"], r
        assert out.masked_lm_ids[r, :n].tolist() == ids[r, ref["positions"]].tolist()


def test_counts_reach_the_target_and_never_exceed_it():
    ids, lengths = rows(3000, 96, 90, seed=5)
    out = mask_batch(ids, lengths, Stream(2).u64_array(3000), CONFIG, VOCAB)
    counts = out.masked_lm_weights.sum(axis=1)
    target = num_to_predict(lengths, CONFIG)
    assert (counts <= target).all()
    assert (counts == target).mean() > 0.95  # spans are cut to fit, so rows nearly always fill up


def test_span_lengths_follow_the_truncated_geometric_and_choices_are_per_span():
    ids, lengths = rows(4000, 96, 90, seed=8)
    keys = Stream(23).u64_array(4000)
    lengths_seen, choices = [], []
    for r in range(4000):
        tokens = ids[r, :90].tolist()
        ref = reference_spans(tokens, int(keys[r]), CONFIG)
        by_span: dict[int, list[int]] = {}
        for w, first in ref["spans"].items():
            by_span.setdefault(first, []).append(w)
        for first, ws in by_span.items():
            positions = [i for w in ws for i in ref["words"][w]]
            new = [ref["input_ids"][i] for i in positions]
            u = uniform(draw(int(keys[r]), CONFIG.max_seq_length + first + 1))
            choices.append(u)
            if u < 0.8:  # the whole span is [MASK]
                assert new == [VOCAB.mask_id] * len(positions)
            elif u < 0.9:  # the whole span keeps its tokens
                assert new == [tokens[i] for i in positions]
            lengths_seen.append(len(ws))
    lengths_seen = np.asarray(lengths_seen)
    assert lengths_seen.max() <= MAX_SPAN_WORDS
    # Long spans are cut by the budget and by earlier spans; length 1 and 2 shares stay close to
    # the distribution's 0.27 and 0.21 up to that bias.
    share = np.bincount(lengths_seen, minlength=11)[1:] / lengths_seen.size
    probs = span_length_probabilities()
    assert share[0] >= probs[0] - 0.02 and abs(share[1] - probs[1]) < 0.05
    assert 2.0 < lengths_seen.mean() < 3.8
    c = np.asarray(choices)
    assert abs((c < 0.8).mean() - 0.8) < 0.02 and abs((c >= 0.9).mean() - 0.1) < 0.015


def test_span_length_distribution_itself():
    probs = span_length_probabilities()
    assert probs.shape == (10,) and probs.sum() == pytest.approx(1.0)
    assert (probs[1:] / probs[:-1]) == pytest.approx(np.full(9, 0.8))
    assert (np.arange(1, 11) * probs).sum() == pytest.approx(3.79, abs=0.01)  # SpanBERT's 3.8 words
    from bert_datagen.datagen.span_masking import span_lengths

    drawn = span_lengths(Stream(4).u64_array(200_000))
    observed = np.bincount(drawn, minlength=11)[1:] / drawn.size
    assert np.abs(observed - probs).max() < 0.005


def test_same_key_same_spans_other_key_other_spans():
    ids, lengths = rows(50, 96, 90)
    keys = Stream(1).u64_array(50)
    a = mask_batch(ids, lengths, keys, CONFIG, VOCAB)
    b = mask_batch(ids, lengths, keys, CONFIG, VOCAB)
    c = mask_batch(ids, lengths, keys + np.uint64(1), CONFIG, VOCAB)
    assert (a.input_ids == b.input_ids).all() and (a.masked_lm_positions == b.masked_lm_positions).all()
    assert (a.masked_lm_positions != c.masked_lm_positions).any(axis=1).mean() > 0.9
    # rows do not depend on their neighbours in the batch
    d = mask_batch(ids[10:20], lengths[10:20], keys[10:20], CONFIG, VOCAB)
    assert (d.input_ids == a.input_ids[10:20]).all()
