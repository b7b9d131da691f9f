import json
from pathlib import Path

import pytest
import torch

from semspec.calibration.judge import (
    EmbeddingJudge,
    NLIJudge,
    entailment_label_index,
    evaluate_pairs,
    make_judge,
)

PAIRS = Path(__file__).with_name("step_pairs.jsonl")


def load_pairs():
    return [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]


def test_pair_set_is_big_and_mixed():
    pairs = load_pairs()
    assert len(pairs) >= 60
    kinds = {p["kind"] for p in pairs}
    assert {"paraphrase", "number_change", "reordered", "different_operation"} <= kinds
    assert 0.35 < sum(p["equivalent"] for p in pairs) / len(pairs) < 0.65


@pytest.fixture(scope="module")
def embed_judge():
    return EmbeddingJudge()


@pytest.mark.real_model
def test_embedded_judge_accuracy(embed_judge):
    result = evaluate_pairs(embed_judge, load_pairs())
    assert result["accuracy"] >= 0.85, result


@pytest.mark.real_model
def test_embedded_judge_design_example(embed_judge):
    a = "She sells 9 eggs for $2 each, so she makes $18."
    changed = "She sells 7 eggs for $2 each, so she makes $14."
    para = "Selling nine eggs at two dollars each gives 18 dollars."
    # Cosine alone prefers the wrong pair ...
    assert embed_judge.cosine(a, changed) > embed_judge.cosine(a, para)
    # ... the numeric rule fixes it.
    assert embed_judge.equivalent(a, para)
    assert not embed_judge.equivalent(a, changed)


@pytest.mark.real_model
def test_embedded_judge_matrix_is_symmetric(embed_judge):
    texts = ["She makes 9 * 2 = $18.", "She earns $18 since 9 * 2 = 18.", "She makes 7 * 2 = $14.", ""]
    eq = embed_judge.equivalence_matrix(texts)
    assert all(eq[i][i] for i in range(len(texts)))
    assert all(eq[i][j] == eq[j][i] for i in range(len(texts)) for j in range(len(texts)))
    assert eq[0][1] and not eq[0][2]


def test_make_judge_errors():
    with pytest.raises(ValueError):
        make_judge("nli")
    with pytest.raises(ValueError):
        make_judge("bogus")


def _fake_scorer(entails):
    """P(entailment) = 1 for the (premise, hypothesis) pairs in `entails`, else 0."""
    calls = []

    def score(premises, hypotheses):
        calls.append(len(premises))
        return [1.0 if (p, h) in entails else 0.0 for p, h in zip(premises, hypotheses)]

    score.calls = calls
    return score


def test_nli_judge_needs_both_directions():
    scorer = _fake_scorer({("a", "b"), ("b", "a"), ("a", "c")})
    judge = NLIJudge(scorer=scorer)
    assert judge.equivalent("a", "b")
    assert not judge.equivalent("a", "c")  # one direction only
    eq = judge.equivalence_matrix(["a", "b", "c"])
    assert eq == [[True, True, False], [True, True, False], [False, False, True]]
    assert scorer.calls[-1] == 6  # all ordered pairs in one batch


def test_nli_judge_numeric_rule_optional():
    scorer = _fake_scorer({("He has 3.", "He has 4."), ("He has 4.", "He has 3.")})
    assert NLIJudge(scorer=scorer).equivalent("He has 3.", "He has 4.")
    assert not NLIJudge(scorer=scorer, check_numbers=True).equivalent("He has 3.", "He has 4.")


def test_nli_judge_needs_model_or_scorer(tmp_path):
    with pytest.raises(ValueError):
        NLIJudge()
    with pytest.raises(FileNotFoundError):
        NLIJudge(tmp_path / "missing")


def test_entailment_label_index():
    assert entailment_label_index({0: "contradiction", 1: "neutral", 2: "entailment"}) == 2
    assert entailment_label_index({0: "ENTAILMENT", 1: "NEUTRAL", 2: "CONTRADICTION"}) == 0
    with pytest.raises(ValueError):
        entailment_label_index({0: "LABEL_0", 1: "LABEL_1"})


def _tiny_nli_dir(path: Path) -> Path:
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    words = "she he sells makes eggs for each so dollars has the a is".split()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *"0123456789", ".", ",", "$"]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab_file=str(path / "vocab.txt"))
    cfg = BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, num_labels=3,
        id2label={0: "contradiction", 1: "neutral", 2: "entailment"},
        label2id={"contradiction": 0, "neutral": 1, "entailment": 2},
    )
    torch.manual_seed(0)
    BertForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_nli_judge_with_a_real_sequence_classification_model(tmp_path):
    model_dir = _tiny_nli_dir(tmp_path / "nli")
    judge = make_judge("nli", model_dir=model_dir, threshold=0.0)
    assert judge.entail_index == 2
    # Threshold 0 accepts every entailment probability: all pairs equivalent.
    assert judge.equivalence_matrix(["she has 3 eggs.", "he sells eggs.", "she makes $ 9."]) == [[True] * 3] * 3
    strict = make_judge("nli", model_dir=model_dir, threshold=1.01)
    assert not strict.equivalent("she has 3 eggs.", "he sells eggs.")
    assert strict.equivalent("she has 3 eggs.", "she has 3 eggs.")  # identical text
    probs = strict.scorer(["she has 3 eggs."], ["he sells eggs."])
    assert len(probs) == 1 and 0.0 < probs[0] < 1.0
