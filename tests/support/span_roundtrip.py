"""Gold answers through the SQuAD records and back (tests and benchmarks/bench_zh.py): is each
training answer's labelled token span its own tokenization ("recoverable"), and does that span,
"predicted", come back as the answer's exact characters through post-processing?"""

from __future__ import annotations

import json

from bert_datagen.trainer.finetune.squad_postprocess import detokenize, final_text, original_span


def gold_roundtrip(records, tokenizer, do_lower_case: bool = True) -> dict:
    """Counts over training examples with a labelled window: recoverable, exact, and the misses."""
    cols = records.columns
    done: set[int] = set()
    out = {"examples": 0, "recoverable": 0, "exact": 0, "misses": []}
    for r, line in enumerate(records.window_lines):
        window = json.loads(line)
        ex = int(window["example_index"])
        start, end = int(cols["start_positions"][r, 0]), int(cols["end_positions"][r, 0])
        if ex in done or start == 0:
            continue
        done.add(ex)
        example = json.loads(records.example_lines[ex])
        answer = example["answers"][0]
        pieces = window["tokens"][start:end + 1]
        out["examples"] += 1
        recoverable = detokenize(pieces) == detokenize(tokenizer.tokenize(answer))
        out["recoverable"] += recoverable
        first, last = window["token_to_word"][str(start)], window["token_to_word"][str(end)]
        text = final_text(detokenize(pieces), original_span(example, first, last), do_lower_case)
        if text == answer:
            out["exact"] += 1
        else:
            out["misses"].append({"id": example["id"], "answer": answer, "predicted": text, "pieces": pieces,
                                  "recoverable": recoverable})
    return out
