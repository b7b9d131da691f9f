"""Train an EAGLE-style draft head (``semspec.head``) on the target's own traces and states.

Loss at every response position j (the head read the target's state at j-1 and token j):
cross-entropy of the head's next-token distribution against the target's (both over the
reduced vocabulary: the target's distribution is its LM head over its own state at j,
renormalised there), plus ``reg_weight`` x smooth-L1 of the head's predicted state on the
target's. The states the head reads carry uniform noise while training, so it stays on
course when it reads its own imperfect predictions while drafting.

Evaluation (``evaluate_depths``) drafts with the head's training-time test
(``HeadModel.unrolled_forward``): from every ``eval_stride``-th response position of the
held-out traces the head reads the target's states up to there, then drafts on its own
predicted states along the trace's tokens; depth d's agreement is how often its d-th token
is the target's top-1 (full vocabulary) there.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from semspec.draft.config import HeadTrainConfig
from semspec.draft.head_data import Trace, padded_batches
from semspec.head import HeadModel
from semspec.models.loaded import LoadedModel

Log = Callable[[str], None]
NEVER_DRAFTED = torch.iinfo(torch.long).max  # the rank of a token outside the head's vocabulary


def select_vocab(traces: list[Trace], size: int, always: list[int], vocab_size: int) -> torch.Tensor:
    """The ``size`` tokens the target writes most often in ``traces`` (ties: lower id), plus
    ``always`` (EOS and the like), sorted."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for t in traces:
        counts += torch.bincount(torch.tensor(t.ids[t.prompt_len:], dtype=torch.long), minlength=vocab_size).double()
    counts[torch.tensor(sorted(set(always)), dtype=torch.long)] = float("inf")
    size = min(size, vocab_size)
    order = sorted(range(vocab_size), key=lambda i: (-counts[i].item(), i))[:size]
    return torch.tensor(sorted(order), dtype=torch.long)


def _batch(traces: list[Trace], states: list[torch.Tensor], noise: float, gen: torch.Generator | None,
           prompt_loss: bool = False):
    """Padded (ids [B, L], states read [B, L, H], target states [B, L, H], loss mask [B, L]).
    The loss covers the answer, and with ``prompt_loss`` the prompt too."""
    width = max(len(t.ids) for t in traces)
    h = states[0].shape[1]
    ids = torch.zeros(len(traces), width, dtype=torch.long)
    read = torch.zeros(len(traces), width, h)
    want = torch.zeros(len(traces), width, h)
    mask = torch.zeros(len(traces), width, dtype=torch.bool)
    for r, (t, s) in enumerate(zip(traces, states)):
        n = len(t.ids)
        s = s.float()
        ids[r, :n] = torch.tensor(t.ids)
        read[r, 1:n] = s[: n - 1]
        want[r, :n] = s
        # positions whose state predicts a response token: prompt_len - 1 .. n - 2
        mask[r, 0 if prompt_loss else t.prompt_len - 1: n - 1] = True
    if noise > 0:
        read = read + (torch.rand(read.shape, generator=gen) * 2 - 1) * noise
    return ids, read, want, mask


def head_loss(head: HeadModel, w_sub: torch.Tensor, traces, states, cfg: HeadTrainConfig,
              gen: torch.Generator | None) -> tuple[torch.Tensor, dict]:
    """The weighted loss over the unrolled levels (level m weighs ``cfg.unroll_decay`` ** (m - 1)),
    normalised by the weights' sum; figures per level. Level 1 counts at every position of
    the loss mask; a later level m only where a draft of depth m starts inside the answer (the
    head never drafts in a prompt): at j with j - m + 1 >= the answer's first position."""
    ids, read, want, mask = _batch(traces, states, cfg.input_noise, gen, cfg.prompt_loss)
    preds = head.unrolled_forward(read, ids, cfg.unroll)
    target = want[mask]
    if torch.is_autocast_enabled("cpu"):  # cast the LM head rows once, not at every product
        w_sub = w_sub.to(torch.get_autocast_dtype("cpu"))
    with torch.no_grad():
        p = (target @ w_sub.T).softmax(-1)
        # (max's indices: argmax over 8,192 columns measured 2-3x slower on this CPU)
        p_top = p.max(-1).indices
    at = torch.arange(ids.shape[1]).expand_as(ids)[mask]
    answer_from = torch.tensor([t.prompt_len - 1 for t in traces])[:, None].expand_as(ids)[mask]
    total, weights, stats = 0.0, 0.0, {"cls": [], "reg": [], "top1": []}
    for m, pred in enumerate(preds):
        valid = (at - m >= answer_from) if m else torch.ones_like(at, dtype=torch.bool)
        got = pred[mask][valid]
        logq = (got @ w_sub.T).log_softmax(-1)
        cls = -(p[valid] * logq).sum(-1).mean()
        reg = F.smooth_l1_loss(got, target[valid])
        w = cfg.unroll_decay ** m
        total, weights = total + w * (cls + cfg.reg_weight * reg), weights + w
        stats["cls"].append(cls.item())
        stats["reg"].append(reg.item())
        stats["top1"].append(float((logq.detach().max(-1).indices == p_top[valid]).float().mean()))
    return total / weights, {k: v[0] for k, v in stats.items()} | {"top1_by_level": stats["top1"]}


def resolve_train_dtype(cfg: HeadTrainConfig) -> HeadTrainConfig:
    """``cfg`` with ``train_dtype`` "auto" made concrete for this CPU: bfloat16 where it has
    bfloat16 matrix instructions, float32 where torch would emulate them."""
    if cfg.train_dtype != "auto":
        return cfg
    from semspec.models.dtypes import cpu_has_fast_bf16

    return dataclasses.replace(cfg, train_dtype="bfloat16" if cpu_has_fast_bf16() else "float32")


def train_step(head: HeadModel, w_sub: torch.Tensor, traces: list[Trace], states: list[torch.Tensor],
               cfg: HeadTrainConfig, gen: torch.Generator, opt: torch.optim.Optimizer,
               params: list[torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """One optimisation step on a batch (``cfg.train_dtype`` made concrete): the loss, its
    backward, gradient clipping and the update; returns the loss and ``head_loss``'s figures."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.train_dtype == "bfloat16"):
        loss, info = head_loss(head, w_sub, traces, states, cfg, gen)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return loss, info


def train_head(head: HeadModel, w_sub: torch.Tensor, train: list[Trace], train_states: list[torch.Tensor],
               cfg: HeadTrainConfig, log: Log | None = None, progress=None,
               checkpoint: str | os.PathLike | None = None, checkpoint_every: int = 100,
               select: Callable[[HeadModel], float] | None = None) -> dict:
    """Optimise ``head`` in place (AdamW, warm-up + cosine to a tenth over ``cfg.steps``,
    stopping after ``cfg.last_step``, gradient clipping, matrix products in
    ``cfg.train_dtype``); deterministic given ``cfg.seed`` and the thread count, and a run
    stopped early holds the weights the whole schedule had at that step. With ``select`` (a
    held-out score, higher is better) the head is scored every ``cfg.select_every`` steps
    and ends with the best weights scored. With ``checkpoint`` (a file path) the run saves
    its whole state every ``checkpoint_every`` steps and resumes from it: a resumed run
    ends with the same weights as an uninterrupted one."""
    cfg = resolve_train_dtype(cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    head.train()
    perm: list[int] = []
    first = 0
    best = {"score": None, "step": None, "state": None}
    history: list[dict] = []
    if checkpoint is not None and Path(checkpoint).is_file():
        first, perm, best, history = _load_checkpoint(checkpoint, head, opt, gen)
        if log:
            log(f"resumed from {checkpoint} at step {first}")
    if log and cfg.last_step < cfg.steps:
        log(f"training stops after step {cfg.last_step} of a {cfg.steps}-step schedule (stop_after)")
    t0 = time.perf_counter()
    last: dict = {}
    for step in range(first, cfg.last_step):
        if len(perm) < cfg.batch_size:
            perm += torch.randperm(len(train), generator=gen).tolist()
        pick, perm = perm[: cfg.batch_size], perm[cfg.batch_size:]
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss, last = train_step(head, w_sub, [train[i] for i in pick], [train_states[i] for i in pick], cfg, gen,
                                opt, params)
        final_step = step + 1 == cfg.last_step
        if progress is not None:
            progress(step + 1, last)
        if log and (step % 100 == 0 or final_step):
            log(f"step {step + 1}/{cfg.last_step} loss {loss.item():.4f} (cls {last['cls']:.3f} reg {last['reg']:.4f}) "
                f"batch top-1 by level {'/'.join(f'{x:.3f}' for x in last['top1_by_level'])} lr {lr_at(step):.2e} "
                f"{time.perf_counter() - t0:.0f}s")
        if select is not None and cfg.select_every and ((step + 1) % cfg.select_every == 0 or final_step):
            head.eval()
            score = float(select(head))
            head.train()
            history.append({"step": step + 1, "score": score})
            if best["score"] is None or score > best["score"]:
                best = {"score": score, "step": step + 1, "state": head.trained_state()}
            if log:
                log(f"step {step + 1}: held-out score {score:.4f} (best {best['score']:.4f} at step {best['step']})")
        if checkpoint is not None and ((step + 1) % checkpoint_every == 0 or final_step):
            _save_checkpoint(checkpoint, step + 1, perm, head, opt, gen, best, history)
    if best["state"] is not None:
        head.load_state_dict(best["state"], strict=False)
    head.eval()
    return {"train_seconds": time.perf_counter() - t0, "resumed_at_step": first, "final_batch": last,
            "selected_step": best["step"], "selection_history": history}


def _save_checkpoint(path, step: int, perm: list[int], head: HeadModel, opt, gen: torch.Generator,
                     best: dict, history: list[dict]) -> None:
    from safetensors.torch import save_file

    tensors = {f"param.{k}": v.detach().contiguous() for k, v in head.trained_state().items()}
    if best["state"] is not None:
        tensors.update({f"best.{k}": v.contiguous() for k, v in best["state"].items()})
    names = {id(p): n for n, p in head.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            for key, v in opt.state[p].items():
                tensors[f"opt.{names[id(p)]}.{key}"] = v.detach().clone().contiguous().reshape(v.shape or (1,))
    tensors["generator"] = gen.get_state()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"step": str(step), "perm": json.dumps(perm), "history": json.dumps(history),
                                           "best": json.dumps({"score": best["score"], "step": best["step"]})})
    os.replace(tmp, path)


def _load_checkpoint(path, head: HeadModel, opt, gen: torch.Generator):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    head.load_state_dict({k[len("param."):]: v for k, v in tensors.items() if k.startswith("param.")}, strict=False)
    for name, p in head.named_parameters():
        state = {k.rsplit(".", 1)[1]: v for k, v in tensors.items() if k.startswith(f"opt.{name}.")}
        if state:
            state["step"] = state["step"].reshape(())
            opt.state[p] = state
    gen.set_state(tensors["generator"])
    best = json.loads(meta["best"])
    best["state"] = {k[len("best."):]: v for k, v in tensors.items() if k.startswith("best.")} or None
    return int(meta["step"]), json.loads(meta["perm"]), best, json.loads(meta["history"])


@torch.inference_mode()
def evaluate_depths(head: HeadModel, target: LoadedModel, vocab: torch.Tensor, traces: list[Trace],
                    states: list[torch.Tensor], depths=(1, 2, 4, 8, 16), stride: int = 8,
                    accept_k: int = 6, widths: tuple[int, ...] = (), batch_size: int = 4) -> dict:
    """Held-out agreement of the head's d-th drafted token with the target's top-1 (full
    vocabulary), for each d in ``depths`` (every depth up to the largest is drafted), from
    every ``stride``-th answer position s of each trace (the head read the target's states
    up to s). ``mean_accepted``: the leading run of agreeing tokens among the first
    ``accept_k`` drafted (a greedy verification's accepted length, bonus token excluded),
    over greedy traces. For each w in ``widths``, ``mean_accepted_within_top[w]`` is that
    run where the target's token need only be among the head's w likeliest at each depth:
    what a verification of the full tree of w branches a node, ``accept_k`` deep, would
    keep (the drafts along the target's path read the head's own states, as the chain's do).

    The drafts are teacher-forced on the trace's tokens (as they were when this drafted
    through the embedded engine's runner, whose figures these are): for a greedy
    verification that is drafting itself, since a token counts only after agreeing ones,
    and there the trace's tokens are the drafted ones (up to where the trace's number type
    rounded otherwise than the float32 states). A token outside ``vocab`` counts as never
    drafted, at any width."""
    w = target.model.get_output_embeddings().weight.float()
    max_d = max(*depths, accept_k)
    hits, seen = torch.zeros(max_d), torch.zeros(max_d)
    runs, n_runs = {top: 0 for top in (1, *widths)}, 0
    by_kind: dict[str, list[int]] = {}  # depth-1 [hits, seen] per kind of trace
    in_vocab = total = 0
    for i, ranks, drafted, target_top1 in _draft_ranks(head, w, vocab, traces, states, max_d, stride, batch_size):
        in_vocab += int(torch.isin(target_top1, vocab).sum())
        total += len(target_top1)
        if not len(ranks):  # an answer too short to draft from
            continue
        agree = (ranks == 0) & drafted
        hits += agree.sum(0)
        seen += drafted.sum(0)
        tally = by_kind.setdefault(traces[i].kind, [0, 0])
        tally[0] += int(agree[:, 0].sum())
        tally[1] += len(ranks)
        if traces[i].kind == "greedy":
            for top in runs:
                kept = (ranks[:, :accept_k] < top) & drafted[:, :accept_k]
                runs[top] += int(kept.long().cumprod(1).sum())  # each draft's leading run
            n_runs += len(ranks)
    mean = {top: r / n_runs if n_runs else None for top, r in runs.items()}
    return {
        "top1_by_depth": {str(d): float(hits[d - 1] / seen[d - 1]) if seen[d - 1] else None for d in depths},
        "positions_by_depth": {str(d): int(seen[d - 1]) for d in depths},
        "top1_depth1_by_kind": {kind: h / n for kind, (h, n) in sorted(by_kind.items())},
        "mean_accepted": mean[1], "accept_k": accept_k,
        "target_top1_in_vocab": in_vocab / max(total, 1), "traces": len(traces),
    } | ({"mean_accepted_within_top": {str(top): mean[top] for top in widths}} if widths else {})


def _draft_ranks(head: HeadModel, w: torch.Tensor, vocab: torch.Tensor, traces: list[Trace],
                 states: list[torch.Tensor], max_d: int, stride: int, batch_size: int):
    """Per trace: (its index, the ranks [drafts, max_d] of the target's top-1 among the head's
    tokens at each depth of each draft (``_ranks``), which of those depths the trace is long
    enough for, the target's top-1 after each answer position). A draft starts at every
    ``stride``-th answer position s: its depth d is ``unrolled_forward``'s level d at s + d,
    which predicts the token at s + d + 1."""
    in_head = torch.full((w.shape[0],), -1, dtype=torch.long)  # a token's row in the head's vocabulary
    in_head[vocab] = torch.arange(len(vocab))
    w_sub = w[vocab]
    depth = torch.arange(max_d)
    for idx, _ in padded_batches(traces, batch_size):
        ids, read, want, _ = _batch([traces[i] for i in idx], [states[i] for i in idx], 0.0, None)
        levels = head.unrolled_forward(read, ids, max_d)
        for r, i in enumerate(idx):
            t = traces[i]
            n = len(t.ids)
            top1 = (want[r, :n] @ w.T).argmax(-1)  # the target's choice after each position
            starts = torch.arange(t.prompt_len - 1, n - 2, stride)
            at = starts[:, None] + 1 + depth  # where each draft's depth d predicts from: s + d
            drafted = at <= n - 2
            at = at.clamp(max=n - 2)
            predicted = torch.stack([levels[d][r, at[:, d]] for d in range(max_d)], dim=1)  # [drafts, max_d, H]
            yield i, _ranks(predicted @ w_sub.T, in_head[top1[at]]), drafted, top1[t.prompt_len - 1: n - 1]


def _ranks(logits: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """0 where the head's argmax (the token it drafts) is ``want`` (rows into its vocabulary),
    else how many of its tokens it finds likelier than ``want`` (at least 1); ``NEVER_DRAFTED``
    where ``want`` is outside its vocabulary (-1). Among the head's w likeliest: rank < w."""
    likelier = (logits > logits.gather(-1, want.clamp(min=0)[..., None])).sum(-1).clamp(min=1)
    return torch.where(logits.argmax(-1) == want, 0, torch.where(want >= 0, likelier, NEVER_DRAFTED))
