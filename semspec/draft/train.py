"""Distil the draft's adapter layers from the target.

The training text is the target's own answers, greedy and sampled, decoded by vLLM
(``target_answers``), and reference solutions. One teacher pass over it records, per
sequence, the hidden states after the shared (frozen) layers and the target's top-k next-token
logits at every response position.
Training then runs only the adapter layers + norm on those cached states; the loss is the
cross-entropy between the teacher's top-k distribution and the draft's softmax, taken over
the vocabulary the teacher ever ranks in its top-k on the training text (the LM head is
shared and frozen). Evaluation uses the full vocabulary.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from semspec.models.draft_artifact import (
    FORMAT,
    VOCAB_TENSOR,
    DraftArtifact,
    _decoder,
    target_checksums,
    target_signature,
)
from semspec.draft.config import DraftTrainConfig
from semspec.draft.data import Sequence, load_questions, reference_sequences

Log = Callable[[str], None]


@dataclass
class TeacherItem:
    hidden: dict[int, torch.Tensor]  # frozen-layer count -> [L, H] states after that many layers
    positions: torch.Tensor  # [n] positions whose next token is predicted (the response)
    topk_ids: torch.Tensor  # [n, K] teacher's top-k token ids, best first
    topk_logits: torch.Tensor  # [n, K]
    source: str


def _layer_output(out):
    return out[0] if isinstance(out, tuple) else out


@torch.no_grad()
def teacher_pass(target, seqs: list[Sequence], frozen: list[int], topk: int, batch_size: int,
                 pad_id: int, log: Log | None = None) -> list[TeacherItem]:
    dec = _decoder(target)
    device = next(target.parameters()).device
    captured: dict[int, torch.Tensor] = {}
    hooks = [
        dec.layers[k - 1].register_forward_hook(
            lambda _m, _i, out, k=k: captured.__setitem__(k, _layer_output(out))
        )
        for k in frozen
    ]
    order = sorted(range(len(seqs)), key=lambda i: (len(seqs[i].ids), i))
    items: list[TeacherItem | None] = [None] * len(seqs)
    try:
        for b, start in enumerate(range(0, len(order), batch_size)):
            idx = order[start:start + batch_size]
            width = max(len(seqs[i].ids) for i in idx)
            ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):
                ids[r, : len(seqs[i].ids)] = torch.tensor(seqs[i].ids)
                mask[r, : len(seqs[i].ids)] = 1
            captured.clear()
            last = dec(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
            for r, i in enumerate(idx):
                s = seqs[i]
                n = len(s.ids)
                pos = torch.arange(s.prompt_len - 1, n - 1)
                logits = target.lm_head(last[r, pos.to(device)]).float()
                vals, ind = logits.topk(topk, dim=-1)
                items[i] = TeacherItem(
                    hidden={k: captured[k][r, :n].float().cpu().clone() for k in frozen},
                    positions=pos,
                    topk_ids=ind.cpu(),
                    topk_logits=vals.cpu(),
                    source=s.source,
                )
            if log and (b % 10 == 0):
                log(f"teacher pass {min(start + batch_size, len(order))}/{len(order)}")
    finally:
        for h in hooks:
            h.remove()
    return items  # type: ignore[return-value]


class DraftStack(nn.Module):
    """The trainable part of the draft: adapter decoder layers + final norm."""

    def __init__(self, target, frozen_layers: int, adapter_init: list[int]):
        super().__init__()
        dec = _decoder(target)
        self.layers = nn.ModuleList()
        for j, i in enumerate(adapter_init):
            layer = copy.deepcopy(dec.layers[i]).float()
            if hasattr(layer, "self_attn") and hasattr(layer.self_attn, "layer_idx"):
                layer.self_attn.layer_idx = frozen_layers + j
            self.layers.append(layer)
        self.norm = copy.deepcopy(dec.norm).float()
        self._rotary = [dec.rotary_emb]  # shared, not a submodule (no parameters)
        for p in self.parameters():
            p.requires_grad_(True)

    def forward(self, hidden: torch.Tensor, select: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Normed output states [B, L, H]; with ``select`` (one position tensor per row) only
        those positions, concatenated [N, H] -- the last layer's MLP then runs only there."""
        bsz, length, _ = hidden.shape
        pos = torch.arange(length, device=hidden.device).unsqueeze(0).expand(bsz, -1)
        cos, sin = self._rotary[0](hidden, pos)
        pe = (cos.to(hidden.dtype), sin.to(hidden.dtype))
        causal = torch.full((length, length), float("-inf"), device=hidden.device).triu(1)
        causal = causal.to(hidden.dtype)[None, None]
        kw = dict(attention_mask=causal, position_ids=pos, position_embeddings=pe)
        layers = list(self.layers)
        if select is None or not layers:
            for layer in layers:
                hidden = _layer_output(layer(hidden, **kw))
            out = self.norm(hidden)
            return out if select is None else torch.cat([out[r, p] for r, p in enumerate(select)])
        for layer in layers[:-1]:
            hidden = _layer_output(layer(hidden, **kw))
        last = layers[-1]
        # Same arithmetic as the decoder layer's forward, with the MLP restricted to `select`.
        attn, _ = last.self_attn(hidden_states=last.input_layernorm(hidden), **kw)
        hidden = hidden + attn
        hidden = torch.cat([hidden[r, p] for r, p in enumerate(select)])
        hidden = hidden + last.mlp(last.post_attention_layernorm(hidden))
        return self.norm(hidden)

    def export(self) -> dict[str, torch.Tensor]:
        out = {}
        for j, layer in enumerate(self.layers):
            for name, t in layer.state_dict().items():
                out[f"layers.{j}.{name}"] = t.detach().clone()
        out["norm.weight"] = self.norm.weight.detach().clone()
        return out


def select_vocab(items: list[TeacherItem], size: int, always: list[int], vocab_size: int) -> torch.Tensor | None:
    """The ``size`` tokens the teacher ranks first most often on the training text (ties: by
    how often they reach its top-k), plus ``always`` (e.g. EOS); None for the full vocabulary."""
    if size <= 0 or size >= vocab_size:
        return None
    top1 = torch.bincount(torch.cat([it.topk_ids[:, 0] for it in items]), minlength=vocab_size).double()
    anyk = torch.bincount(torch.cat([it.topk_ids.reshape(-1) for it in items]), minlength=vocab_size).double()
    score = top1 * (anyk.max() + 1) + anyk
    score[torch.tensor(sorted(set(always)), dtype=torch.long)] = float("inf")
    return torch.sort(score.topk(size).indices).values


def _pad_hidden(items: list[TeacherItem], k: int) -> torch.Tensor:
    width = max(it.hidden[k].shape[0] for it in items)
    h = items[0].hidden[k].shape[1]
    out = torch.zeros(len(items), width, h)
    for r, it in enumerate(items):
        out[r, : it.hidden[k].shape[0]] = it.hidden[k]
    return out


@torch.no_grad()
def evaluate(stack: DraftStack, head_weight: torch.Tensor, items: list[TeacherItem], k: int,
             vocab: torch.Tensor | None = None, batch_size: int = 8) -> dict:
    """Top-1 agreement of the draft (over its own vocabulary) with the teacher's full-vocabulary
    top-1 (a greedy acceptance proxy), the teacher's top-1 NLL under the draft, and how often
    the teacher's top-1 lies in the draft's vocabulary."""
    stack.eval()
    agree = total = covered = 0
    nll = 0.0
    if vocab is not None:
        head_weight = head_weight[vocab]
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        out = stack(_pad_hidden(chunk, k), select=[it.positions for it in chunk])
        offsets = [0]
        for it in chunk:
            offsets.append(offsets[-1] + len(it.positions))
        for r, it in enumerate(chunk):
            logits = out[offsets[r]:offsets[r + 1]] @ head_weight.T
            want = it.topk_ids[:, 0]
            pred = logits.argmax(-1)
            if vocab is not None:
                pred = vocab[pred]
                col = torch.searchsorted(vocab, want.contiguous()).clamp_max(len(vocab) - 1)
                inside = vocab[col] == want
            else:
                col, inside = want, torch.ones_like(want, dtype=torch.bool)
            agree += int((pred == want).sum())
            total += len(want)
            covered += int(inside.sum())
            logp = logits.log_softmax(-1).gather(1, col[:, None])[:, 0]
            nll += float(-torch.where(inside, logp, torch.full_like(logp, -30.0)).sum())
    stack.train()
    return {"top1_agreement": agree / max(total, 1), "teacher_top1_nll": nll / max(total, 1),
            "tokens": total, "teacher_top1_in_vocab": covered / max(total, 1)}


def train_stack(stack: DraftStack, head_weight: torch.Tensor, train_items: list[TeacherItem],
                eval_items: list[TeacherItem], k: int, cfg: DraftTrainConfig,
                log: Log | None = None, draft_vocab: torch.Tensor | None = None) -> dict:
    """Train ``stack``; the loss runs over ``draft_vocab`` (the draft's own vocabulary) or,
    for a full-vocabulary draft, over every token the teacher ever ranks in its top-k."""
    gen = torch.Generator().manual_seed(cfg.seed)
    if draft_vocab is None:
        vocab = torch.unique(torch.cat([it.topk_ids.reshape(-1) for it in train_items]))
    else:
        vocab = draft_vocab
    # teacher top-k entries outside the loss vocabulary map to a padding column at -inf
    remap = torch.full((head_weight.shape[0],), len(vocab), dtype=torch.long)
    remap[vocab] = torch.arange(len(vocab))
    w_sub = head_weight[vocab].detach().float()
    params = [p for p in stack.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    history = []
    before = evaluate(stack, head_weight, eval_items, k, draft_vocab) if eval_items else None
    if log and before:
        log(f"step 0: eval {before}")
    perm: list[int] = []
    t0 = time.perf_counter()
    stack.train()
    for step in range(cfg.steps):
        if len(perm) < cfg.batch_size:
            perm += torch.randperm(len(train_items), generator=gen).tolist()
        batch = [train_items[i] for i in perm[: cfg.batch_size]]
        del perm[: cfg.batch_size]
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        hs = stack(_pad_hidden(batch, k), select=[it.positions for it in batch])
        tids = remap[torch.cat([it.topk_ids for it in batch])]
        tlog = torch.cat([it.topk_logits for it in batch]) / cfg.temperature
        # the teacher's distribution renormalised over the draft's vocabulary
        p = tlog.masked_fill(tids == len(vocab), float("-inf")).softmax(-1).nan_to_num(0.0)
        logq = (hs @ w_sub.T / cfg.temperature).log_softmax(-1)
        logq = torch.cat([logq, torch.zeros_like(logq[:, :1])], 1)  # padding column, p = 0 there
        loss = -(p * logq.gather(1, tids)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if log and (step % 20 == 0 or step == cfg.steps - 1):
            log(f"step {step + 1}/{cfg.steps} loss {loss.item():.4f} lr {lr_at(step):.2e} "
                f"{time.perf_counter() - t0:.0f}s")
        if eval_items and cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            ev = evaluate(stack, head_weight, eval_items, k, draft_vocab)
            history.append({"step": step + 1, **ev})
            if log:
                log(f"step {step + 1}: eval {ev}")
    after = evaluate(stack, head_weight, eval_items, k, draft_vocab) if eval_items else None
    return {"eval_before": before, "eval_after": after, "eval_history": history,
            "train_seconds": time.perf_counter() - t0, "loss_vocab_size": int(len(vocab)),
            "final_loss": float(loss.item()) if cfg.steps else None}


def _teacher_cache_path(target, seqs: list[Sequence], k: int, topk: int, cache_dir: str) -> Path:
    h = hashlib.sha256()
    h.update(json.dumps(target_signature(target), sort_keys=True).encode())
    h.update(json.dumps(target_checksums(target, k), sort_keys=True).encode())
    h.update(json.dumps([k, topk, [(s.ids, s.prompt_len, s.source) for s in seqs]]).encode())
    return Path(cache_dir) / f"teacher-{h.hexdigest()[:16]}.safetensors"


def cached_teacher_pass(target, seqs: list[Sequence], ks: list[int], topk: int, batch_size: int,
                        pad_id: int, cache_dir: str | None = None, log: Log | None = None) -> list[TeacherItem]:
    """``teacher_pass`` for the frozen-layer counts ``ks``; each count is cached on its own in
    ``cache_dir`` (safetensors), and the missing ones are computed in one pass."""
    if not cache_dir:
        return teacher_pass(target, seqs, list(ks), topk, batch_size, pad_id, log=log)
    from safetensors.torch import load_file, save_file

    paths = {k: _teacher_cache_path(target, seqs, k, topk, cache_dir) for k in ks}
    missing = [k for k in ks if not paths[k].is_file()]
    items = teacher_pass(target, seqs, missing, topk, batch_size, pad_id, log=log) if missing else None
    for k in missing:
        tensors = {}
        for i, it in enumerate(items):
            tensors[f"{i}.hidden"] = it.hidden[k].contiguous()
            tensors[f"{i}.positions"] = it.positions.contiguous()
            tensors[f"{i}.topk_ids"] = it.topk_ids.contiguous()
            tensors[f"{i}.topk_logits"] = it.topk_logits.contiguous()
        paths[k].parent.mkdir(parents=True, exist_ok=True)
        tmp = paths[k].with_suffix(".tmp")
        save_file(tensors, str(tmp))
        os.replace(tmp, paths[k])
    if items is None:
        items = []
        for i, s in enumerate(seqs):
            items.append(TeacherItem(hidden={}, positions=None, topk_ids=None, topk_logits=None,
                                     source=s.source))
    for k in ks:
        if k in missing:
            continue
        t = load_file(str(paths[k]))
        for i, it in enumerate(items):
            it.hidden[k] = t[f"{i}.hidden"]
            if it.positions is None:
                it.positions, it.topk_ids, it.topk_logits = (
                    t[f"{i}.positions"], t[f"{i}.topk_ids"], t[f"{i}.topk_logits"])
        if log:
            log(f"loaded teacher outputs for {k} shared layers from {paths[k]}")
    return items


def target_answers(engine, cfg: DraftTrainConfig, cache_dir: str | None = None,
                   log: Log | None = None) -> list[Sequence]:
    """The target's answers the draft learns from, decoded by ``engine`` (a ``VLLMEngine`` on
    the target) with the head's trace code (each answer seeded, cached answer by answer under
    ``cache_dir``): greedy ones to the first ``cfg.gen_prompts`` questions after the holdout
    (source "gen"), then ``cfg.sampled_answers`` sampled ones to each of the first
    ``cfg.sampled_prompts`` ("sampled"); round r's seeds follow round r - 1's, so more
    answers keep the first ones."""
    from semspec.draft.head_data import generate_traces
    from semspec.types import GenerationConfig

    rows = load_questions(cfg.data, cfg.holdout)
    if len(rows) < cfg.answered_prompts:
        raise ValueError(f"{cfg.data} has {len(rows)} questions after the first {cfg.holdout}; "
                         f"{cfg.answered_prompts} are asked for")
    questions = [r["question"] for r in rows[: cfg.answered_prompts]]
    greedy = GenerationConfig(method="ar", temperature=0.0, max_new_tokens=cfg.max_new_tokens)
    sampling = GenerationConfig(method="ar", temperature=cfg.sample_temperature, top_p=cfg.sample_top_p,
                                max_new_tokens=cfg.max_new_tokens)
    runs = [("gen", greedy, cfg.gen_prompts, cfg.seed)] if cfg.gen_prompts else []
    n = cfg.sampled_prompts
    runs += [("sampled", sampling, n, cfg.seed + r * n) for r in range(cfg.sampled_answers if n else 0)]
    out: list[Sequence] = []
    for source, config, count, seed in runs:
        kind = "greedy" if source == "gen" else source  # the head's name for them, and its cache's
        traces = generate_traces(engine, questions[:count], config, kind, cfg.gen_batch_size, seed, cache_dir, log)
        out += [Sequence(t.ids, t.prompt_len, source, q) for q, t in enumerate(traces)]
    return out


def reference_answers(tokenizer, cfg: DraftTrainConfig) -> list[Sequence]:
    """The reference solutions of the ``cfg.ref_prompts`` questions after the answered ones."""
    rows = load_questions(cfg.data, cfg.holdout)
    need = cfg.answered_prompts + cfg.ref_prompts
    if len(rows) < need:
        raise ValueError(f"{cfg.data} has {len(rows)} questions after the first {cfg.holdout}; {need} are asked for "
                         f"({cfg.answered_prompts} answered, {cfg.ref_prompts} references)")
    return reference_sequences(tokenizer, rows[cfg.answered_prompts:need])


@dataclass
class DraftItems:
    """The teacher's outputs over the training text and the two held-out sets."""

    train: list[TeacherItem]
    held_greedy: list[TeacherItem]  # the held-out questions' greedy answers
    held_sampled: list[TeacherItem]  # and their sampled ones
    data_seconds: float
    teacher_seconds: float


def prepare_items(target, tokenizer, cfg: DraftTrainConfig, ks: list[int], answers: list[Sequence],
                  cache_dir: str | None = None, log: Log | None = None) -> DraftItems:
    """The teacher's outputs (hidden states for every k in ``ks``) over the target's
    ``answers`` (``target_answers``) and the reference solutions. Held out: the last
    ``eval_fraction`` of the greedily answered questions, with all their answers."""
    t0 = time.perf_counter()
    gen = [s for s in answers if s.source == "gen"]
    sampled = [s for s in answers if s.source == "sampled"]
    want = (cfg.gen_prompts, cfg.sampled_prompts * cfg.sampled_answers)
    if (len(gen), len(sampled)) != want:
        raise ValueError(f"the config asks for {want[0]} greedy and {want[1]} sampled answers, {len(gen)} and "
                         f"{len(sampled)} were given (semspec.draft.train.target_answers decodes them)")
    if any(s.question is None for s in gen + sampled):  # the held-out split is by question
        raise ValueError("every answer must say which question it answers (Sequence.question)")
    ref = reference_answers(tokenizer, cfg)
    t_data = time.perf_counter() - t0
    n_eval = int(round(len(gen) * cfg.eval_fraction)) if gen else 0
    held = {s.question for s in gen[len(gen) - n_eval:]} if n_eval else set()
    held_greedy = [s for s in gen if s.question in held]
    held_sampled = [s for s in sampled if s.question in held]
    train_seqs = [s for s in gen if s.question not in held] + ref + [s for s in sampled if s.question not in held]
    if not train_seqs:
        raise ValueError("no training sequences")
    t0 = time.perf_counter()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    items = cached_teacher_pass(target, train_seqs + held_greedy + held_sampled, ks, cfg.teacher_topk,
                                cfg.teacher_batch_size, pad, cache_dir=cache_dir, log=log)
    n_train, n_greedy = len(train_seqs), len(held_greedy)
    return DraftItems(items[:n_train], items[n_train:n_train + n_greedy], items[n_train + n_greedy:], t_data,
                      time.perf_counter() - t0)


def train_draft(target, tokenizer, cfg: DraftTrainConfig, answers: list[Sequence], cache_dir: str | None = None,
                log: Log | None = None, target_name: str | None = None,
                answers_from: dict | None = None) -> DraftArtifact:
    """Build a draft artifact for ``target`` from its ``answers`` (``target_answers``);
    deterministic given ``cfg`` (seed, threads) and the answers. ``answers_from``: how they
    were decoded (engine, number type, threads), recorded with the training summary."""
    t_start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    n_layers = int(target.config.num_hidden_layers)
    k = cfg.frozen_layers
    if not 1 <= k < n_layers:
        raise ValueError(f"frozen_layers must be in [1, {n_layers - 1}]")
    init = cfg.resolved_adapter_init(n_layers)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)

    data = prepare_items(target, tokenizer, cfg, [k], answers, cache_dir, log)
    train_items, eval_items = data.train, data.held_greedy

    stack = DraftStack(target, k, init)
    head_weight = target.get_output_embeddings().weight.detach().float()
    always = [t for t in (getattr(tokenizer, n, None) for n in ("eos_token_id", "pad_token_id", "bos_token_id"))
              if t is not None]
    vocab = select_vocab(train_items, cfg.draft_vocab, always, head_weight.shape[0])
    summary = train_stack(stack, head_weight, train_items, eval_items, k, cfg, log=log, draft_vocab=vocab)
    if data.held_sampled:  # where a sampled job's answers go: the figure sampling cares about
        summary["eval_after_sampled"] = evaluate(stack, head_weight, data.held_sampled, k, vocab)
    summary.update({
        "data_seconds": data.data_seconds, "teacher_seconds": data.teacher_seconds,
        "total_seconds": time.perf_counter() - t_start,
        "train_sequences": len(train_items), "eval_sequences": len(eval_items),
        "eval_sampled_sequences": len(data.held_sampled),
        "answers": answers_from,
        "train_response_tokens": int(sum(len(it.positions) for it in train_items)),
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
    })
    meta = {
        "format": FORMAT,
        "frozen_layers": k,
        "adapter_layers": len(init),
        "adapter_init": init,
        "hidden_size": int(target.config.hidden_size),
        "draft_vocab_size": int(len(vocab)) if vocab is not None else None,
        "target": {
            "name": target_name,
            "signature": target_signature(target),
            "checksums": target_checksums(target, k),
        },
        "config": cfg.to_dict(),
        "training": summary,
    }
    tensors = stack.export()
    if vocab is not None:
        tensors[VOCAB_TENSOR] = vocab.clone()
    return DraftArtifact(meta=meta, tensors=tensors)
