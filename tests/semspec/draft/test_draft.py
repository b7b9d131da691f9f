import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from semspec.draft.config import DraftTrainConfig
from semspec.draft.data import Sequence, clean_reference, generate_sequences, load_questions, prompt_ids
from semspec.draft.train import DraftStack, prepare_items, reference_answers, teacher_pass, train_draft
from semspec.models.draft_artifact import (DraftMismatchError, build_draft_model, check_compatible, load_artifact,
                                           materialize_draft, save_artifact)

from .conftest import tiny_target


def tiny_cfg(data_file, **kw):
    base = dict(seed=0, frozen_layers=2, adapter_layers=1, data=data_file, holdout=4,
                gen_prompts=4, ref_prompts=4, max_new_tokens=8, gen_batch_size=2,
                teacher_batch_size=3, eval_fraction=0.25, teacher_topk=8, steps=6,
                batch_size=2, lr=1e-3, warmup_steps=2, eval_every=3)
    base.update(kw)
    return DraftTrainConfig(**base)


def answers(target, tokenizer, cfg) -> list[Sequence]:
    """The answers ``target_answers`` gives, without vLLM: the tiny target's greedy ones
    (transformers), and made-up sampled ones (question by question, round by round)."""
    rows = load_questions(cfg.data, cfg.holdout)
    out = generate_sequences(target, tokenizer, [r["question"] for r in rows[: cfg.gen_prompts]], cfg.max_new_tokens,
                             cfg.gen_batch_size)
    for q, seq in enumerate(out):
        seq.question = q
    for r in range(cfg.sampled_answers if cfg.sampled_prompts else 0):
        for q in range(cfg.sampled_prompts):
            p = prompt_ids(tokenizer, rows[q]["question"])
            out.append(Sequence(p + tokenizer(f" so {q} and {r}.")["input_ids"] + [2], len(p), "sampled", q))
    return out


def train(target, tokenizer, data_file, cache_dir=None, **kw):
    """train_draft on the tiny config (``kw`` over it) and its answers."""
    cfg = tiny_cfg(data_file, **kw)
    return train_draft(target, tokenizer, cfg, answers(target, tokenizer, cfg), cache_dir=cache_dir)


def test_holdout_and_cleaning(data_file):
    rows = load_questions(data_file, holdout=4)
    assert len(rows) == 10 and rows[0]["question"].startswith("What is 4 ")
    assert clean_reference("2 * 3 = <<2*3=6>>6 eggs") == "2 * 3 = 6 eggs"


def test_draft_model_matches_trained_stack(target, tokenizer):
    seq = Sequence(ids=list(range(3, 23)), prompt_len=5, source="ref")
    item = teacher_pass(target, [seq], [2], topk=4, batch_size=1, pad_id=2)[0]
    stack = DraftStack(target, 2, [3])
    with torch.no_grad():
        for p in stack.parameters():
            p.add_(0.01 * torch.randn_like(p))
        want = stack(item.hidden[2][None])[0] @ target.lm_head.weight.T
        sel = torch.tensor([4, 9, 19])
        torch.testing.assert_close(stack(item.hidden[2][None], select=[sel]) @ target.lm_head.weight.T, want[sel])
    from semspec.models.draft_artifact import DraftArtifact, target_checksums, target_signature

    art = DraftArtifact(meta={"format": "semspec-draft/1", "frozen_layers": 2, "adapter_layers": 1,
                              "adapter_init": [3],
                              "target": {"signature": target_signature(target),
                                         "checksums": target_checksums(target, 2)}},
                        tensors=stack.export())
    draft = build_draft_model(target, art)
    assert draft.config.num_hidden_layers == 3
    with torch.no_grad():
        got = draft(torch.tensor([seq.ids])).logits[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # The draft's KV-cached decode agrees with its own full forward.
    with torch.no_grad():
        out = draft(torch.tensor([seq.ids[:-1]]), use_cache=True)
        step = draft(torch.tensor([seq.ids[-1:]]), past_key_values=out.past_key_values).logits[0, -1]
    torch.testing.assert_close(step, got[-1], atol=1e-4, rtol=1e-4)


def test_training_is_deterministic_from_seed(target, tokenizer, data_file):
    a = train(target, tokenizer, data_file, seed=3)
    b = train(tiny_target(), tokenizer, data_file, seed=3)
    c = train(tiny_target(), tokenizer, data_file, seed=4)
    assert a.tensors.keys() == b.tensors.keys()
    assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    assert any(not torch.equal(a.tensors[k], c.tensors[k]) for k in a.tensors)
    summary = a.meta["training"]
    assert summary["eval_after"]["tokens"] > 0 and summary["train_sequences"] == 7


def test_artifact_roundtrip_and_materialize(target, tokenizer, data_file, tmp_path):
    art = train(target, tokenizer, data_file)
    save_artifact(art, tmp_path / "art")
    meta = json.loads((tmp_path / "art" / "draft.json").read_text())
    assert meta["format"] == "semspec-draft/1" and meta["frozen_layers"] == 2
    loaded = load_artifact(tmp_path / "art")
    for k, t in art.tensors.items():
        assert loaded.tensors[k].dtype == torch.float16
        torch.testing.assert_close(loaded.tensors[k].float(), t, atol=1e-2, rtol=1e-2)
    out = materialize_draft(target, tokenizer, tmp_path / "art", tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert hf.config.num_hidden_layers == 3
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, build_draft_model(target, loaded)(ids).logits)
    # Shared layers are the target's own.
    torch.testing.assert_close(hf.model.layers[1].mlp.up_proj.weight, target.model.layers[1].mlp.up_proj.weight)


def test_mismatched_target_is_a_clear_error(target, tokenizer, data_file, tmp_path):
    art = train(target, tokenizer, data_file, steps=1)
    with pytest.raises(DraftMismatchError, match="different target weights"):
        check_compatible(tiny_target(seed=1), art)
    with pytest.raises(DraftMismatchError, match="architecture"):
        check_compatible(tiny_target(layers=5), art)


def test_cached_teacher_outputs_give_the_same_draft(target, tokenizer, data_file, tmp_path):
    a = train(target, tokenizer, data_file, str(tmp_path / "cache"))
    assert len(list((tmp_path / "cache").glob("teacher-*.safetensors"))) == 1
    b = train(target, tokenizer, data_file, str(tmp_path / "cache"))
    assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)


def test_two_adapter_layers(target, tokenizer, data_file, tmp_path):
    art = train(target, tokenizer, data_file, frozen_layers=1, adapter_layers=2, steps=2)
    assert art.meta["adapter_init"] == [2, 3] and art.num_layers == 3
    save_artifact(art, tmp_path / "a")
    draft = build_draft_model(target, load_artifact(tmp_path / "a"))
    seq = Sequence(ids=list(range(3, 15)), prompt_len=4, source="ref")
    item = teacher_pass(target, [seq], [1], topk=4, batch_size=1, pad_id=2)[0]
    stack = DraftStack(target, 1, [2, 3])
    stack.load_state_dict({k.replace("layers.", "layers.", 1): v.float() for k, v in load_artifact(tmp_path / "a").tensors.items()})
    with torch.no_grad():
        want = stack(item.hidden[1][None], select=[item.positions]) @ target.lm_head.weight.T
        got = draft(torch.tensor([seq.ids])).logits[0, item.positions]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_reduced_vocabulary_draft(target, tokenizer, data_file, tmp_path):
    from semspec.models.identity import ModelIdentity
    from semspec.models.loaded import LoadedModel
    from semspec.models.reduced_vocab import read_vocab_subset

    art = train(target, tokenizer, data_file, draft_vocab=24)
    vocab = art.vocab_ids
    assert vocab is not None and len(vocab) == 24 and tokenizer.eos_token_id in vocab.tolist()
    assert art.meta["draft_vocab_size"] == 24
    ev = art.meta["training"]["eval_after"]
    assert 0 < ev["teacher_top1_in_vocab"] <= 1 and ev["top1_agreement"] <= ev["teacher_top1_in_vocab"]
    save_artifact(art, tmp_path / "art")
    assert torch.equal(load_artifact(tmp_path / "art").vocab_ids, vocab)  # ids are not cast to fp16
    out = materialize_draft(target, tokenizer, tmp_path / "art", tmp_path / "hf")
    assert torch.equal(read_vocab_subset(out, "cpu"), vocab)
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    lm = LoadedModel(model=hf, tokenizer=tokenizer, identity=ModelIdentity("d", "0"), device=torch.device("cpu"),
                     dtype=torch.float32, vocab_ids=read_vocab_subset(out, "cpu"))
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        full = hf(ids).logits[0]
        got, _ = lm.forward(ids, None, False)
    torch.testing.assert_close(got[:, vocab], full[:, vocab], atol=1e-5, rtol=1e-5)
    outside = torch.ones(full.shape[1], dtype=torch.bool)
    outside[vocab] = False
    assert torch.isinf(got[:, outside]).all()


def test_sampled_answers_train_the_draft_and_their_held_out_questions_score_it(target, tokenizer, data_file):
    cfg = tiny_cfg(data_file, sampled_prompts=6, sampled_answers=2)  # gen 4 (1 held out), refs after question 6
    given = answers(target, tokenizer, cfg)
    data = prepare_items(target, tokenizer, cfg, [2], given)
    # held out: the last greedy question (3) with both its sampled answers; the sampled answers of
    # questions 4 and 5, which have no greedy answer, train
    assert len(data.held_greedy) == 1 and len(data.held_sampled) == 2
    assert len(data.train) == 3 + 4 + 10  # greedy, references, sampled
    held = [s for s in given if s.source == "sampled" and s.question == 3]
    assert sum(it.hidden[2].shape[0] for it in data.held_sampled) == sum(len(s.ids) for s in held)
    # the references follow every answered question: the 4 after question 6 (data lines 11-14)
    assert [s.ids[s.prompt_len:-1] for s in reference_answers(tokenizer, cfg)] == [
        tokenizer(clean_reference(r["answer"]))["input_ids"] for r in load_questions(data_file, 4)[6:10]]

    art = train_draft(target, tokenizer, cfg, given)
    tr = art.meta["training"]
    assert tr["train_sequences"] == 17 and tr["eval_sampled_sequences"] == 2
    assert tr["eval_after_sampled"]["tokens"] == sum(len(it.positions) for it in data.held_sampled)
    assert "eval_after_sampled" not in train(target, tokenizer, data_file).meta["training"]


def test_the_answers_must_be_those_the_config_asks_for(target, tokenizer, data_file):
    cfg = tiny_cfg(data_file, sampled_prompts=6)
    given = answers(target, tokenizer, cfg)
    with pytest.raises(ValueError, match="4 greedy and 6 sampled answers, 4 and 5 were given"):
        prepare_items(target, tokenizer, cfg, [2], given[:-1])
    unplaced = [Sequence(s.ids, s.prompt_len, s.source) for s in given]  # no question: no held-out split
    with pytest.raises(ValueError, match="which question it answers"):
        prepare_items(target, tokenizer, cfg, [2], unplaced)
    with pytest.raises(ValueError, match="10 questions after the first 4; 11 are asked for"):
        reference_answers(tokenizer, tiny_cfg(data_file, ref_prompts=5, sampled_prompts=6))
    with pytest.raises(ValueError, match="sampled_answers"):
        tiny_cfg(data_file, sampled_answers=0)
