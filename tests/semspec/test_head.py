"""The EAGLE-style draft head: its batched forward matches its training forward, its artifact
round-trips and is refused by another target, and every method that drafts gives the same
text with it as the target alone where exactness is promised (greedy token_sd)."""

from __future__ import annotations

import pytest
import torch

from semspec.engine import Engine, Request
from semspec.head import HeadMismatchError, HeadModel, is_head, load_head, save_head
from semspec.models import LoadedModel, ModelIdentity
from semspec.probes import ProbePair
from semspec.runner import Feed, ModelRunner
from semspec.types import GenerationConfig
from tests.semspec.test_engine import cfg as engine_cfg

PROMPTS = [
    "Natalia sold 48 clips in April and half as many in May. How many clips in total?",
    "What is 7 times 6?",
    "Hi",
    "Let's think step by step. First, compute the cost.",
    "0 1 2 3 4 5 6 7 8 9",
]


def _head_model(target: LoadedModel, seed: int = 3) -> LoadedModel:
    torch.manual_seed(seed)
    head = HeadModel(target.model, layers=1)
    with torch.no_grad():  # a head that is not the identity, so drafts differ from the target
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    head.eval()
    return LoadedModel(head, target.tokenizer, ModelIdentity("test-head", "0" * 64), target.device,
                       target.dtype, spec="test-head")


@pytest.fixture(scope="module")
def head(tiny_target):
    return _head_model(tiny_target)


def _layer_reference(head: HeadModel, states_in: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The head's teacher-forced pass through transformers' own decoder layers (the reference)."""
    length = ids.shape[1]
    x = head.fuse_inputs(states_in, head.embed_tokens(ids))
    pos = torch.arange(length)[None]
    cos, sin = head.rotary_emb(x, pos)
    causal = torch.full((length, length), float("-inf")).triu(1)[None, None]
    for layer in head.layers:
        out = layer(x, attention_mask=causal, position_ids=pos, position_embeddings=(cos, sin))
        x = out[0] if isinstance(out, tuple) else out
    return head.norm(x)


def test_runner_pass_matches_the_training_forward(head, tiny_target):
    torch.manual_seed(0)
    h = tiny_target.hidden_size
    ids = torch.randint(5, 300, (1, 12))
    states = torch.randn(1, 12, h)
    with torch.no_grad():
        want = _layer_reference(head.model, states, ids)[0]
        (level1,) = head.model.unrolled_forward(states, ids)
    torch.testing.assert_close(level1[0], want, atol=1e-4, rtol=1e-4)
    runner = ModelRunner(head, slots=2)
    slot = runner.alloc()
    # 7 tokens in one row, then 5 one at a time beside another slot's feed
    out = runner.forward([Feed(slot, ids[0, :7].tolist(), [6], states=True, head_inputs=states[0, :7])])
    got = [out.states[0]]
    other = runner.alloc()
    for j in range(7, 12):
        out = runner.forward([Feed(other, [9], [0], states=True, head_inputs=torch.zeros(1, h)),
                              Feed(slot, [int(ids[0, j])], [0], states=True, head_inputs=states[0, j:j + 1])])
        got.append(out.states[1])
    torch.testing.assert_close(torch.cat(got), want, atol=1e-4, rtol=1e-4)
    # the logits are the target's LM head over the predicted state
    torch.testing.assert_close(out.logits[1], tiny_target.head_logits(want[-1:])[0], atol=1e-4, rtol=1e-4)


def test_unrolled_levels_are_the_heads_own_drafts(head, tiny_target):
    """Level m of the training forward at position j is what the head drafts m tokens after it
    last read a target state (at j - m + 1), as the runner runs it, for every start at once."""
    torch.manual_seed(1)
    h = tiny_target.hidden_size
    ids = torch.randint(5, 300, (2, 11))
    states = torch.randn(2, 11, h)
    with torch.no_grad():
        levels = head.model.unrolled_forward(states, ids, levels=4)
    checked = 0
    for b in range(2):
        for start in range(0, 8):
            runner = ModelRunner(head, slots=1)
            slot = runner.alloc()
            out = runner.forward([Feed(slot, ids[b, :start + 1].tolist(), [], states=True,
                                       head_inputs=states[b, :start + 1])])
            pred = out.states[0][-1:]
            torch.testing.assert_close(pred[0], levels[0][b, start], atol=1e-4, rtol=1e-4)
            for m in range(2, 5):
                j = start + m - 1
                if j >= ids.shape[1]:
                    break
                pred = runner.forward([Feed(slot, [int(ids[b, j])], [], states=True, head_inputs=pred)]).states[0]
                torch.testing.assert_close(pred[0], levels[m - 1][b, j], atol=1e-4, rtol=1e-4)
                checked += 1
    assert checked == 2 * 8 * 3  # every start reaches depth 4 inside the 11 positions


def test_a_head_needs_its_input_states(head):
    runner = ModelRunner(head, slots=1)
    with pytest.raises(ValueError, match="input state per fed token"):
        runner.forward([Feed(runner.alloc(), [5, 6], [1])])


def test_artifact_round_trip_and_target_check(head, tiny_target, tiny_draft, tmp_path):
    vocab = torch.arange(0, 200)
    save_head(head.model, vocab, {"target": __import__("semspec.head", fromlist=["x"]).target_fingerprint(
        tiny_target.model), "training": {"steps": 0}}, tmp_path / "h")
    loaded = load_head(tmp_path / "h", tiny_target)
    assert is_head(loaded) and loaded.vocab_ids.tolist() == vocab.tolist()
    for (k, a), b in zip(head.model.trained_state().items(), loaded.model.trained_state().values()):
        torch.testing.assert_close(a.half().float(), b.float(), msg=k)
    with pytest.raises(HeadMismatchError):
        load_head(tmp_path / "h", tiny_draft)  # another model (1 layer): refused
    engine = Engine.load(str(tiny_target.identity.name), draft=str(tmp_path / "h"), probes="none", device="cpu")
    assert is_head(engine.draft) and engine.same_tokenizer


def _cfg(method, **kw):
    return engine_cfg(method, **{"max_step_tokens": 6, "draft_tokens": 3, **kw})


def test_greedy_token_sd_with_a_head_is_the_target_text(head, tiny_target):
    engine = Engine(tiny_target, head)
    for p in PROMPTS:
        ar = engine.generate(p, _cfg("ar"))
        sd = engine.generate(p, _cfg("token_sd"))
        assert sd.text == ar.text, p
        assert sd.counters.drafted_tokens > 0
    # and batched: the same text as alone, whatever the batch holds
    reqs = [Request(PROMPTS[i % len(PROMPTS)], _cfg("token_sd", max_new_tokens=20 + 3 * i), key=i) for i in range(10)]
    alone = {r.key: engine.generate(r.prompt, r.config).text for r in reqs}
    batched = {d.key: d.result.text for d in engine.generate_many(reqs, batch_size=4)}
    assert batched == alone


def test_after_verification_the_head_rereads_the_target_states(head, tiny_target):
    """Drafted positions read the head's own predictions; once the target has run them, a
    re-sync feeds them again with the target's states, and the head's prediction at the end
    is exactly its teacher-forced one."""
    from semspec.stream import HeadStream, Stream
    from semspec.testing import run_alone

    t_runner, d_runner = ModelRunner(tiny_target, 1), ModelRunner(head, 1)
    prompt = tiny_target.tokenizer("What is 7 times 6?")["input_ids"]
    T = Stream(t_runner, prompt)
    D = HeadStream(d_runner, prompt, T)
    T.slot, D.slot = t_runner.alloc(), d_runner.alloc()
    run_alone(T.forward(keep_for=[]))
    run_alone(D.forward(keep_for=[]))
    assert D.true_upto == len(prompt)  # the prompt read with the target's states
    drafted = [11, 12, 13]
    for x in drafted:
        D.append([x])
        run_alone(D.forward(keep_for=[]))
    assert D.true_upto == len(prompt) + 1 and D.reusable == D.true_upto  # the first draft read a prediction
    run_alone(T.forward(extra=drafted))  # the target verifies: its states are now known
    D.truncate(D.reusable)
    D.append(T.ids[D.cached:])
    out = run_alone(D.forward(keep_for=[]))
    assert D.true_upto == len(T.ids)
    ids = torch.tensor([T.ids])
    states_in = torch.cat([torch.zeros(1, tiny_target.hidden_size),
                           torch.stack([T.states[p] for p in range(len(T.ids) - 1)])])[None]
    with torch.no_grad():
        want = head.model.unrolled_forward(states_in, ids)[0][0]
    torch.testing.assert_close(out.hidden[-1], want[-1], atol=1e-4, rtol=1e-4)


def test_semspec_runs_on_a_head_and_refeeds_accepted_steps(head, tiny_target):
    engine = Engine(tiny_target, head, ProbePair.always_accept(tiny_target.hidden_size, tiny_target.hidden_size))
    res = engine.generate(PROMPTS[0], _cfg("semspec"))
    assert res.counters.steps_accepted > 0
    assert all(s.author == "draft" for s in res.steps if s.decision == "accepted")
    # batched, same as alone
    reqs = [Request(p, _cfg("semspec"), key=i) for i, p in enumerate(PROMPTS)]
    alone = {r.key: engine.generate(r.prompt, r.config).text for r in reqs}
    assert {d.key: d.result.text for d in engine.generate_many(reqs, batch_size=3)} == alone


@pytest.fixture(scope="module")
def trained_head(tiny_target):
    """A head trained a little on the tiny target's own greedy answers: its drafts are
    accepted at times, so acceptance counts can tell whether it read the right states."""
    from semspec.draft.config import HeadTrainConfig
    from semspec.draft.head_data import Trace, target_states
    from semspec.draft.head_train import train_head
    from semspec.models import encode_prompt

    engine = Engine(tiny_target)
    traces = []
    for p in PROMPTS * 2:
        res = engine.generate(p, _cfg("ar", max_new_tokens=30))
        prompt = encode_prompt(tiny_target.tokenizer, p)
        traces.append(Trace(prompt + tiny_target.tokenizer(res.text, add_special_tokens=False)["input_ids"],
                            len(prompt), "greedy"))
    states = target_states(tiny_target, traces)
    torch.manual_seed(0)
    head = HeadModel(tiny_target.model, layers=1)
    w = tiny_target.model.get_output_embeddings().weight.detach().float()
    train_head(head, w, traces, states, HeadTrainConfig(steps=60, batch_size=4, lr=3e-3, threads=1,
                                                        train_dtype="float32"))
    return LoadedModel(head, tiny_target.tokenizer, ModelIdentity("trained", "3" * 64), tiny_target.device,
                       tiny_target.dtype)


def test_chunked_prefills_keep_the_states_a_head_reads(trained_head, tiny_target):
    """Prompts fed in chunks of 3 tokens (the target's and the head's first read): the head
    must see every state, so drafts, acceptances and text match the unchunked run."""
    engine = Engine(tiny_target, trained_head)
    reqs = [Request(p, _cfg("token_sd"), key=i) for i, p in enumerate(PROMPTS)]
    whole = {d.key: d.result for d in engine.generate_many(reqs, batch_size=3)}
    chunked = {d.key: d.result for d in engine.generate_many(reqs, batch_size=3, max_prefill_tokens=3)}
    for k in whole:
        assert chunked[k].text == whole[k].text
        c, w = chunked[k].counters, whole[k].counters
        assert (c.drafted_tokens, c.accepted_tokens) == (w.drafted_tokens, w.accepted_tokens), k
    assert sum(r.counters.accepted_tokens for r in whole.values()) > 0  # the comparison has teeth


@pytest.mark.real_model
@pytest.mark.slow
def test_the_shipped_head_drafts_for_smollm2(smollm2):
    """The committed artifact loads onto the embedded target (and is checked against it),
    and greedy token_sd with it writes the target's own text while keeping some drafts."""
    from semspec.components import EMBEDDED_HEAD
    from semspec.head import EMBEDDED_HEAD_DIR, resolve_head

    assert resolve_head(EMBEDDED_HEAD) == EMBEDDED_HEAD_DIR
    engine = Engine(smollm2, load_head(EMBEDDED_HEAD_DIR, smollm2, spec=EMBEDDED_HEAD))
    q = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. " \
        "How many clips did Natalia sell altogether in April and May?"
    greedy = dict(max_new_tokens=48, temperature=0.0, draft_tokens=4)
    ar = engine.generate(q, GenerationConfig(method="ar", **greedy))
    sd = engine.generate(q, GenerationConfig(method="token_sd", **greedy))
    assert sd.text == ar.text
    assert sd.counters.accepted_tokens > 0
