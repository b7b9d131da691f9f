"""semspec.draft.head_train.evaluate_depths: its figures are those of the head drafting one
token at a time, and beside the chain's figures, how much of each draft a tree of the head's
w likeliest tokens a node would keep."""

import pytest
import torch

from semspec.draft.head_data import Trace, target_states
from semspec.draft.head_train import evaluate_depths
from semspec.head import HeadModel


def _greedy_trace(target, prompt: list[int], new: int) -> Trace:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(new):
            ids.append(int(target.model(torch.tensor([ids])).logits[0, -1].argmax()))
    return Trace(ids, len(prompt), "greedy")


def _near_target_head(target) -> HeadModel:
    """A head that drafts much as the target writes, yet reads the states it is given: the
    target's layers over the token's embedding plus a third of the state read (the head's
    default reads the state alone, and agrees with the target on few tokens of a tiny one)."""
    head = HeadModel(target.model, layers=2)
    h = target.hidden_size
    with torch.no_grad():
        head.fc.weight.copy_(torch.cat([torch.eye(h) / 3, torch.eye(h)], dim=1))
    return head.eval()


def _drafted_states(head: HeadModel, trace: Trace, states: torch.Tensor, start: int, depth: int) -> list[torch.Tensor]:
    """The head's predicted states at depths 1..``depth`` of a draft from answer position
    ``start``, drafted one token at a time: each pass is the head alone over the sequence so
    far (one level: plain causal attention, no cache), the target's states read up to
    ``start``, the head's own predictions read after it."""
    read = torch.cat([torch.zeros(1, states.shape[1]), states[: start + 1].float()])
    predicted = []
    for d in range(depth):
        ids = torch.tensor([trace.ids[: start + 2 + d]])
        (level,) = head.unrolled_forward(read[None], ids, 1)
        predicted.append(level[0, -1])
        read = torch.cat([read, level[0, -1:]])
    return predicted


def _reference(head, target, vocab, traces, states, depths, stride, accept_k) -> dict:
    """evaluate_depths' figures (chain only), from drafts made one token at a time."""
    w = target.model.get_output_embeddings().weight.float()
    max_d = max(*depths, accept_k)
    hits, seen = [0] * max_d, [0] * max_d
    runs = n_runs = in_vocab = total = 0
    by_kind: dict[str, list[int]] = {}
    with torch.no_grad():
        for t, s in zip(traces, states):
            n = len(t.ids)
            top1 = (s.float() @ w.T).argmax(-1)
            answer = top1[t.prompt_len - 1: n - 1]
            in_vocab += sum(int(x) in vocab.tolist() for x in answer)
            total += len(answer)
            for start in range(t.prompt_len - 1, n - 2, stride):
                predicted = _drafted_states(head, t, s, start, min(max_d, n - 2 - start))
                agree = [int(vocab[(p @ w[vocab].T).argmax()]) == int(top1[start + 1 + d])
                         for d, p in enumerate(predicted)]
                for d, ok in enumerate(agree):
                    hits[d] += ok
                    seen[d] += 1
                tally = by_kind.setdefault(t.kind, [0, 0])
                tally[0] += agree[0]
                tally[1] += 1
                if t.kind == "greedy":
                    lead = agree[:accept_k] + [False]
                    runs += lead.index(False)
                    n_runs += 1
    return {
        "top1_by_depth": {str(d): hits[d - 1] / seen[d - 1] if seen[d - 1] else None for d in depths},
        "positions_by_depth": {str(d): seen[d - 1] for d in depths},
        "top1_depth1_by_kind": {k: h / c for k, (h, c) in sorted(by_kind.items())},
        "mean_accepted": runs / n_runs, "accept_k": accept_k,
        "target_top1_in_vocab": in_vocab / total, "traces": len(traces),
    }


def test_figures_are_those_of_drafting_one_token_at_a_time(tiny_target):
    """Greedy traces of the target and sampled-like ones of other tokens, of several lengths
    (padded together in a batch), a vocabulary without some of the target's tokens: every
    figure as drafting token by token gives it."""
    torch.manual_seed(0)
    vocab_size = tiny_target.model.config.vocab_size
    traces = [_greedy_trace(tiny_target, torch.randint(5, vocab_size, (p,)).tolist(), new)
              for p, new in ((6, 30), (4, 17), (9, 24), (5, 3), (7, 2))]
    traces += [Trace(torch.randint(5, vocab_size, (n,)).tolist(), 5, "sampled") for n in (26, 13)]
    states = target_states(tiny_target, traces)
    head = _near_target_head(tiny_target)
    top1 = [int(x) for s in states for x in (s.float() @ tiny_target.model.lm_head.weight.float().T).argmax(-1)]
    dropped = sorted(set(top1), key=top1.count)[-2:]  # two tokens the target often picks
    vocab = torch.tensor([t for t in range(vocab_size) if t not in dropped])
    args = dict(depths=(1, 2, 5), stride=3, accept_k=4)

    got = evaluate_depths(head, tiny_target, vocab, traces, states, batch_size=3, **args)
    want = _reference(head, tiny_target, vocab, traces, states, **args)
    assert got["positions_by_depth"] == want["positions_by_depth"] and got["traces"] == want["traces"] == 7
    for key in ("top1_by_depth", "top1_depth1_by_kind"):
        assert got[key] == pytest.approx(want[key]), key
    for key in ("mean_accepted", "target_top1_in_vocab"):
        assert got[key] == pytest.approx(want[key]), key
    assert 0 < want["top1_by_depth"]["5"] < 1 and 0 < want["target_top1_in_vocab"] < 1
    assert 0 < want["mean_accepted"] < args["accept_k"]
    # one trace at a time, without padding: the same figures
    assert evaluate_depths(head, tiny_target, vocab, traces, states, batch_size=1, **args) == got


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
