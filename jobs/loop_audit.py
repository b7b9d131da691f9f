"""How the loop rule (``semspec.repetition``) fares on samples decoded without it: the yield
benchmark's ``fixed_n`` arm keeps its loops (`--keep-loops`), so its texts, tokenized again
with the target's tokenizer, say what the rule would have done to the same samples.

- false cuts: samples that ended by themselves (EOS) in which the rule finds a loop;
- tails: samples cut off at the token cap that end in a loop the rule finds; a tail runs from
  the loop's onset (where the rule cuts) to the cap, and the rule spares what comes after the
  token it fires on. Capped samples without such a loop (rambling, near-loops whose numbers
  change) are counted apart.

Decoding a text and tokenizing it again can merge or split a few tokens, so the counts are the
rule's on the text, near what it saw on the engine's own tokens.
"""

from __future__ import annotations

from typing import Iterable

from semspec.repetition import DEFAULT_RULE, LoopRule, find_loop, line_break_ids, loop_end


def audit(samples: Iterable[tuple[str, str]], tokenizer, rule: LoopRule = DEFAULT_RULE) -> dict:
    """The rule's false cuts and spared tails over ``samples``: (output text, finish reason)."""
    breaks = line_break_ids(tokenizer)
    eos = eos_cut = capped = looping = tail = spared = 0
    for text, finish in samples:
        if finish not in ("eos", "length"):
            continue
        ids = tokenizer.encode(text, add_special_tokens=False)
        if finish == "eos":
            eos += 1
            eos_cut += find_loop(ids, rule, line_breaks=breaks) is not None
            continue
        capped += 1
        fires = loop_end(ids, rule)
        if fires is None:
            continue
        looping += 1
        onset = find_loop(ids, rule, line_breaks=breaks)
        tail += len(ids) - onset
        spared += len(ids) - fires
    return {
        "eos_samples": eos, "eos_cut": eos_cut, "false_cut_share": round(eos_cut / eos, 4) if eos else None,
        "capped_samples": capped, "capped_looping": looping, "tail_tokens": tail, "tail_tokens_spared": spared,
        "tail_spared_share": round(spared / tail, 4) if tail else None,
    }
