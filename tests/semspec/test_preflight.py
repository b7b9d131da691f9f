"""semspec.preflight: a job whose draft cannot serve its method is refused before it is stored."""

from semspec.components import EMBEDDED_DRAFT, EMBEDDED_HEAD
from semspec.preflight import method_problem


def test_a_draft_head_drafts_no_steps():
    for method in ("semspec", "step_judge"):
        problem = method_problem(method, None, EMBEDDED_HEAD, "none")
        assert "draft head" in problem and EMBEDDED_DRAFT in problem


def test_token_sd_drafts_with_a_head_or_ngram():
    assert method_problem("token_sd", None, None, None) is None  # the embedded head
    assert method_problem("token_sd", None, "ngram", None) is None
    assert "neither" in method_problem("token_sd", None, EMBEDDED_DRAFT, None)


def test_ar_needs_nothing_but_the_target():
    assert method_problem("ar", None, EMBEDDED_HEAD, None) is None


def test_ngram_drafts_no_steps():
    for method in ("semspec", "step_judge"):
        assert "prompt lookup" in method_problem(method, None, "ngram", "none")


def test_a_step_draft_must_tokenize_as_the_target(tiny_dirs):
    target, draft, other = (str(tiny_dirs[k]) for k in ("target", "draft", "other_tok"))
    assert method_problem("step_judge", target, draft, "none") is None
    problem = method_problem("step_judge", target, other, "none")
    assert "needs a draft with the target's tokenizer" in problem and repr(other) in problem
