"""semspec.stepwise: the step-level programs' plumbing that needs no model."""

from __future__ import annotations

from semspec.stepwise import Reply, side_by_side


def _asks(name: str, times: int):
    """A sub-program that makes ``times`` calls and returns the replies it got."""
    got = []
    for i in range(times):
        got.append((yield f"{name}{i}"))
    return got


def test_side_by_side_batches_each_round_and_returns_every_result_in_order():
    both = side_by_side([_asks("a", 2), _asks("b", 1), _asks("c", 0)])
    assert next(both) == ["a0", "b0"]
    assert both.send(["ra0", "rb0"]) == ["a1"]  # b is done: only a asks again
    try:
        both.send(["ra1"])
    except StopIteration as stop:
        assert stop.value == [["ra0", "ra1"], ["rb0"], []]
    else:
        raise AssertionError("side_by_side did not end")


class _Chars:
    """A tokenizer whose token ids are characters' code points."""

    def __len__(self):
        return 128

    def decode(self, ids, skip_special_tokens=False):
        return "".join(map(chr, ids))

    def batch_decode(self, seqs):
        return [self.decode(s) for s in seqs]


def _write(text: str, doom_cap: int | None = None, **config):
    """Run ``ar``'s step program against a target that writes ``text`` (its characters as
    tokens), stopping each request at a line break as an engine's stop string would; the result.
    ``doom_cap``: the program's, as an engine with a doom rule of the length kind sets it."""
    from semspec.stepwise import ModelFacts, StepProgram
    from semspec.types import GenerationConfig

    cfg = GenerationConfig(method="ar", max_new_tokens=len(text), **config)
    program = StepProgram([ord(">")], cfg, ModelFacts(_Chars(), frozenset({0}), 4096), None, {})
    program.doom_cap = doom_cap
    gen, written = program.program(), 0
    try:
        call = next(gen)
        while True:
            chunk = text[written:written + call.max_tokens]
            if call.stop_at_step_end and "\n" in chunk:
                chunk = chunk[:chunk.index("\n") + 1]
            written += len(chunk)
            call = gen.send(Reply([ord(c) for c in chunk]))
    except StopIteration:
        pass
    return program.result(), written


LOOP = "so 64.\n" + "The answer is 64.\n" * 20


def test_a_sequence_that_loops_is_cut_after_the_first_copy_of_its_answer_line():
    """stop_loops: looked at after every step, the loop ends the sequence ("repetition") with
    its answer line once; the run reaches back into "so 64.\\n", but the kept copy is the one
    that starts a line. Without stop_loops it writes to the cap."""
    kept = "so 64.\nThe answer is 64.\n"
    result, written = _write(LOOP, step_delimiter="\n", max_step_tokens=64, stop_loops=True)
    assert (result.text, result.finish_reason) == (kept, "repetition")
    assert [s.text for s in result.steps] == ["so 64.\n", "The answer is 64.\n"]
    c = result.counters
    assert c.generated_tokens == len(kept) and c.cut_tokens == written - len(kept) == 2 * 18
    full, _ = _write(LOOP, step_delimiter="\n", max_step_tokens=64)
    assert (full.text, full.finish_reason, full.counters.cut_tokens) == (LOOP, "length", 0)


def test_the_step_a_cut_falls_in_is_cut_short_and_later_ones_go():
    """Steps of 40 tokens: the first holds the kept text and the loop's start, and is cut to
    the kept text; the second, past the cut, is dropped; the tokens generated up to the step
    the loop was found in count as cut."""
    result, written = _write(LOOP, step_delimiter="\n\n", max_step_tokens=40, stop_loops=True)
    kept = "so 64.\nThe answer is 64.\n"
    assert (result.text, result.finish_reason, written) == (kept, "repetition", 80)
    (step,) = result.steps
    assert (step.text, step.target_tokens, step.index) == (kept, len(kept), 0)
    assert (result.counters.generated_tokens, result.counters.cut_tokens) == (len(kept), 80 - len(kept))


def test_a_doom_cap_cuts_the_sequence_at_that_token_within_its_step():
    """A doom rule of the length kind: after the step that passes the cap the text is cut at
    the cap (the step it falls in cut short) and the sequence ends "doomed", as the token
    engine stops it at that token; a sequence that ends before the cap is untouched."""
    text = "First line here.\nSecond line, longer than the first.\nThird.\n"
    result, written = _write(text, doom_cap=30, step_delimiter="\n", max_step_tokens=64)
    assert (result.text, result.finish_reason) == (text[:30], "doomed")
    assert [s.text for s in result.steps] == ["First line here.\n", text[17:30]]
    assert (result.counters.generated_tokens, result.counters.cut_tokens) == (30, written - 30)
    short, _ = _write(text, doom_cap=len(text) + 1, step_delimiter="\n", max_step_tokens=64)
    assert (short.text, short.finish_reason) == (text, "length")
