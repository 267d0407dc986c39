"""`bert-datagen vocab`: the run command's readers, Google's layout, clear errors, atomic output."""

from __future__ import annotations

import json

from click.testing import CliRunner

from bert_datagen.contract.fs import LOCAL_FS
from bert_datagen.contract.vocab_io import load_vocab
from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.readers import read_documents
from bert_datagen.pipelines.cli import main
from bert_datagen.vocab.train import train_vocab

DOCS = [
    ["The quick brown fox jumps over the lazy dog.", "Foxes are running and jumping."],
    ["Unwanted, unaffable, unbelievable: UNDERSTANDING understood understands!", "ΟΔΟΣ Café naïve."],
    ["中文字符，漢字。", "More text about dogs, foxes and running."],
]


def write_sentences(path, docs=DOCS, repeat=20):
    path.write_text("\n\n".join("\n".join(d) for d in docs * repeat) + "\n", encoding="utf-8")
    return path


def invoke(*args):
    return CliRunner().invoke(main, ["vocab", *args], catch_exceptions=False)


def test_trains_google_layout_from_sentences(tmp_path):
    corpus = write_sentences(tmp_path / "a.txt")
    out = tmp_path / "vocab.txt"
    result = invoke("--input", str(corpus), "--output", str(out), "--vocab-size", "2100",
                    "--input-format", "sentences", "--min-frequency", "1")
    assert result.exit_code == 0, result.output
    vocab = load_vocab(str(out), LOCAL_FS)
    assert vocab.tokens[0] == "[PAD]" and vocab.unk_id == 100 and vocab.mask_id == 103
    assert vocab.tokens[104] == "[unused99]" and vocab.tokens[998] == "[unused993]"
    assert "ς" in vocab and "fox" in vocab or "##ox" in vocab
    assert vocab.sha256 in result.output and f"{vocab.size:,} tokens" in result.output


def test_uses_the_run_commands_readers(tmp_path):
    """Same corpus through bert_datagen.datagen.readers + train_vocab gives the same bytes as the command."""
    wiki = tmp_path / "wiki_00"
    body = "".join(f'<doc id="{i}" url="u" title="Fox {i}">\nFox {i}\n' + "\n".join(d) + "\n</doc>\n"
                   for i, d in enumerate(DOCS * 10))
    wiki.write_text(body, encoding="utf-8")
    out = tmp_path / "v.txt"
    result = invoke("--input", str(tmp_path / "wiki_*"), "--output", str(out), "--vocab-size", "300",
                    "--input-format", "wikiextractor", "--cased", "--min-frequency", "1")
    assert result.exit_code == 0, result.output
    config = DatagenConfig(input_format="wikiextractor", do_lower_case=False)
    texts = [p for doc in read_documents(str(wiki), wiki.read_bytes(), config, {}) for p in doc.paragraphs]
    expected = train_vocab(texts, 300, do_lower_case=False, min_frequency=1)
    assert load_vocab(str(out), LOCAL_FS).tokens == tuple(expected)
    assert "Fox" in expected  # cased, and titles repeated as the first line were dropped by the reader
    assert "<" not in expected  # the <doc> markup never reached the trainer


def test_jsonl_and_text_field(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"body": " ".join(d)}) for d in DOCS * 10) + "\n", encoding="utf-8")
    out = tmp_path / "v.txt"
    result = invoke("--input", str(path), "--output", str(out), "--vocab-size", "300",
                    "--input-format", "jsonl", "--text-field", "body", "--min-frequency", "1")
    assert result.exit_code == 0, result.output
    assert load_vocab(str(out), LOCAL_FS).tokens[:5] == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def test_same_options_same_bytes(tmp_path):
    corpus = write_sentences(tmp_path / "a.txt")
    outs = []
    for name in ("x.txt", "y.txt"):
        result = invoke("--input", str(corpus), "--output", str(tmp_path / name), "--vocab-size", "400")
        assert result.exit_code == 0, result.output
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1]


def test_bad_inputs_name_the_file_and_write_nothing(tmp_path):
    out = tmp_path / "v.txt"
    result = CliRunner().invoke(main, ["vocab", "--input", str(tmp_path / "missing*.txt"), "--output", str(out)])
    assert result.exit_code != 0 and "missing*.txt: no input file matches" in result.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\nnot json\n', encoding="utf-8")
    result = CliRunner().invoke(main, ["vocab", "--input", str(bad), "--output", str(out), "--input-format", "jsonl"])
    assert result.exit_code != 0 and "bad.jsonl: line 2: not valid JSON" in result.output
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["vocab", "--input", str(empty), "--output", str(out)])
    assert result.exit_code != 0 and "no documents found" in result.output
    small = write_sentences(tmp_path / "s.txt")
    result = CliRunner().invoke(main, ["vocab", "--input", str(small), "--output", str(out),
                                       "--vocab-size", "1010", "--layout", "google"])
    assert result.exit_code != 0 and "smaller than the 999 reserved tokens plus" in result.output
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "bad.jsonl", "empty.txt", "s.txt"]


def test_options_a_setting_ignores_are_refused_or_kept(tmp_path):
    corpus = write_sentences(tmp_path / "a.txt")
    out = tmp_path / "v.txt"
    result = CliRunner().invoke(main, ["vocab", "--input", str(corpus), "--output", str(out), "--text-field", "body"])
    assert result.exit_code == 2 and "--text-field does not apply here: --input-format text has no fields" in result.output
    assert not out.exists()
    # --layout auto picks the compact layout for a small vocab; unused slots asked for are kept there.
    result = invoke("--input", str(corpus), "--output", str(out), "--vocab-size", "300", "--num-unused", "7",
                    "--input-format", "sentences", "--min-frequency", "1")
    assert result.exit_code == 0, result.output
    tokens = load_vocab(str(out), LOCAL_FS).tokens
    assert tokens[:5] == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") and tokens[5:12] == tuple(
        f"[unused{i}]" for i in range(7)) and "[unused7]" not in tokens


def test_zhwiki_default_vocab_covers_its_characters(shared_corpora, tmp_path):
    """Default options on Chinese Wikipedia: at most 0.5% [UNK] (11.4% of its characters were lost
    to --limit-alphabet before unspaced scripts were kept beside it), and the shortfall explained."""
    import numpy as np

    from bert_datagen.vocab.tokenizer import BertTokenizer

    corpus = shared_corpora / "zhwiki_sample" / "wiki_00"
    out = tmp_path / "vocab.txt"
    result = invoke("--input", str(corpus), "--output", str(out), "--vocab-size", "8000")
    assert result.exit_code == 0, result.output
    assert "short of --vocab-size: no more pieces occur at least --min-frequency 2 times" in result.output
    vocab = load_vocab(str(out), LOCAL_FS)
    config = DatagenConfig()
    texts = [p for doc in read_documents(str(corpus), corpus.read_bytes(), config, {}) for p in doc.paragraphs]
    ids = np.concatenate(BertTokenizer(vocab).encode_batch_ids(texts))
    assert ids.size > 300_000
    assert np.mean(ids == vocab.unk_id) <= 0.005
