"""semspec.draft.head_train.evaluate_depths: beside the chain's figures, how much of each draft
a tree of the head's w likeliest tokens a node would keep."""

import torch

from semspec.draft.head_data import Trace, target_states
from semspec.draft.head_train import evaluate_depths
from semspec.head import HeadModel


def test_a_wider_tree_keeps_at_least_the_chains_run_and_every_drafted_token_at_full_width(tiny_target):
    torch.manual_seed(0)
    vocab_size = tiny_target.model.config.vocab_size
    length, prompt_len, stride, accept_k = 24, 6, 4, 3
    traces = [Trace(torch.randint(5, vocab_size, (length,)).tolist(), prompt_len, "greedy") for _ in range(3)]
    states = target_states(tiny_target, traces)
    head = HeadModel(tiny_target.model, layers=1)
    ev = evaluate_depths(head, tiny_target, torch.arange(vocab_size), traces, states, depths=(1, 2), stride=stride,
                         accept_k=accept_k, widths=(1, 2, 8, vocab_size))
    within = ev["mean_accepted_within_top"]
    assert ev["mean_accepted"] <= within["2"] <= within["8"] <= within[str(vocab_size)]
    # with every token a branch, every drafted position is kept: accept_k, fewer at a trace's end
    starts = range(prompt_len - 1, length - 2, stride)
    assert within[str(vocab_size)] == sum(min(accept_k, length - s - 2) for s in starts) / len(starts)
    # the chain's figures (what model selection reads) are those of a call without widths
    chain = evaluate_depths(head, tiny_target, torch.arange(vocab_size), traces, states, depths=(1, 2),
                            stride=stride, accept_k=accept_k)
    assert chain == {k: v for k, v in ev.items() if k != "mean_accepted_within_top"}
