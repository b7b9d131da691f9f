from __future__ import annotations

from semspec.steps import StepDetector, split_steps


def _feed(det, pieces):
    text, ends = "", []
    for i, p in enumerate(pieces, 1):
        prev = len(text)
        text += p
        e = det.ended(text, i, prev)
        ends.append(e.reason if e else None)
    return ends


def test_merged_newline_tokens_end_a_step():
    det = StepDetector("\n\n", max_step_tokens=50)
    assert _feed(det, ["So", " 3", ".\n\n"]) == [None, None, "delimiter"]
    assert _feed(det, ["So", " 3", ".\n", "\n"]) == [None, None, None, "delimiter"]
    assert _feed(det, ["So", "\n\n\n"]) == [None, "delimiter"]


def test_leading_blank_lines_do_not_make_empty_steps():
    det = StepDetector("\n\n", max_step_tokens=50)
    assert _feed(det, ["\n\n", "First", "\n\n"]) == [None, None, "delimiter"]


def test_cap_and_think_end():
    det = StepDetector("\n\n", think_end="</think>", max_step_tokens=3)
    assert _feed(det, ["a", "b", "c"]) == [None, None, "cap"]
    assert _feed(det, ["ok", "</think>"]) == [None, "think_end"]
    assert _feed(det, ["ok </", "think>"]) == [None, "think_end"]


def test_split_steps_roundtrip():
    t = "\n\nStep one.\n\nStep two.\n\n\nThe answer is 4."
    steps = split_steps(t)
    assert "".join(steps) == t
    assert steps[0] == "\n\nStep one.\n\n" and steps[-1] == "\nThe answer is 4."
    assert len(steps) == 3


def test_incremental_text_is_always_the_whole_decode(tiny_target):
    from semspec.steps import IncrementalText

    tok = tiny_target.tokenizer
    # multi-byte characters split over byte-level tokens, spaces, newlines, punctuation
    text = "Natalia sold 48 clips.\n\nCafé: 5 € each, 🦆 ducks ×3 — done.\n\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    inc = IncrementalText(tok)
    for k, t in enumerate(ids, 1):
        inc.push(t)
        assert inc.text == tok.decode(ids[:k], skip_special_tokens=False), k
    assert inc.text == text
    # a prefix of another tokenizer's text, then this one's tokens
    inc = IncrementalText(tok, prefix="Step 1: ")
    for t in ids[:5]:
        inc.push(t)
    assert inc.text == "Step 1: " + tok.decode(ids[:5])
