"""The arithmetic the benchmarks report their figures with, and the task subsets they train on."""

from pathlib import Path

import pytest

from benchmarks.bench_trainer import input_ratios


def test_input_ratios_pair_blocks_and_keep_the_cpu_bound_apart():
    # (wall, cpu) per block; pair 2 ran while another job slowed the machine down.
    real = [(1.0, 2.0), (3.0, 2.1), (1.1, 2.0)]
    cached = [(1.0, 1.9), (1.5, 1.9), (1.0, 1.9)]
    r = input_ratios(real, cached)
    assert r["input_ratio_pairs"] == pytest.approx([1.0, 0.5, 1.0 / 1.1])
    assert r["input_ratio_median_of_pairs"] == pytest.approx(1.0 / 1.1)
    assert r["input_ratio_real_over_cached"] == pytest.approx(3.5 / 5.1)
    assert r["input_cpu_ratio_cached_over_real"] == pytest.approx(5.7 / 6.1)


def test_input_ratios_need_pairs():
    with pytest.raises(ValueError):
        input_ratios([(1.0, 1.0)], [])


# ---------------------------------------------------------------- fine-tuning benchmark: seeds and subsets


def test_seed_stats_summarise_each_metric_over_seeds():
    from benchmarks.bench_finetune import seed_stats

    per_seed = [{"f1": 0.5, "exact_match": 10.0, "loss": 9.0}, {"f1": 0.7, "exact_match": 20.0},
                {"f1": 0.6, "exact_match": 30.0}]
    s = seed_stats(per_seed, ("f1", "exact_match"))
    assert set(s) == {"f1", "exact_match"}
    assert s["f1"]["mean"] == pytest.approx(0.6)
    assert s["f1"]["std"] == pytest.approx(0.1)  # sample sd, not population
    assert (s["exact_match"]["min"], s["exact_match"]["max"]) == (10.0, 30.0)
    assert s["exact_match"]["values"] == [10.0, 20.0, 30.0]
    assert seed_stats([{"f1": 0.4}], ("f1",))["f1"]["std"] == 0.0
    with pytest.raises(ValueError):
        seed_stats([], ("f1",))
    with pytest.raises(KeyError):
        seed_stats([{"f1": 0.4}], ("accuracy",))


def test_task_subsets_keep_the_first_questions_and_sentences(tmp_path):
    import json

    from benchmarks.bench_finetune import first_conll_sentences, first_squad_questions

    def article(title, counts):
        return {"title": title, "paragraphs": [
            {"context": f"{title} {p}", "qas": [{"id": f"{title}-{p}-{q}", "question": "?", "answers": []}
                                                for q in range(n)]} for p, n in enumerate(counts)]}

    source = tmp_path / "squad.json"
    source.write_text(json.dumps({"version": "1.1", "data": [article("a", [2, 3]), article("b", [4])]}))
    ids = [qa["id"] for a in json.loads(Path(first_squad_questions(source, 4, str(tmp_path / "q.json"))).read_text())["data"]
           for p in a["paragraphs"] for qa in p["qas"]]
    assert ids == ["a-0-0", "a-0-1", "a-1-0", "a-1-1"]
    whole = json.loads(Path(first_squad_questions(source, None, str(tmp_path / "w.json"), articles=1)).read_text())
    assert [a["title"] for a in whole["data"]] == ["a"] and whole["version"] == "1.1"
    assert sum(len(p["qas"]) for p in whole["data"][0]["paragraphs"]) == 5

    conll = tmp_path / "train.conll"
    conll.write_text("a\tO\nb\tB-x\n\t\nc\tO\n\t\n\nd\tO\n\t\n")  # a TAB-only line ends a sentence, as in WNUT train
    assert Path(first_conll_sentences(conll, 2, str(tmp_path / "s.conll"))).read_text() == "a\tO\nb\tB-x\n\nc\tO\n\n"
