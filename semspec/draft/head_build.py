"""Build a draft head artifact end to end: traces -> target states -> training -> held-out
evaluation -> ``head.safetensors`` + ``head.json`` (``semjobs draft train --kind eagle``).
vLLM decodes the traces; the rest is plain torch on the target's transformers model.

Every stage caches under ``cache_dir`` (traces answer by answer, the states pass, training
checkpoints), so an interrupted build resumes, and a rebuild with the same settings and
thread count reproduces the artifact bit for bit (docs/draft.md).
"""

from __future__ import annotations

import gc
import hashlib
import json
import time
from pathlib import Path
from typing import Callable

import torch

from semspec.draft.config import DraftTrainConfig, HeadTrainConfig
from semspec.draft.head_data import Trace, build_traces, cached_target_states, selection_split, split_traces
from semspec.draft.head_train import evaluate_depths, resolve_train_dtype, select_vocab, train_head
from semspec.head import HeadModel, save_head, target_fingerprint
from semspec.engine.token_engine import VLLMEngine

Log = Callable[[str], None]
DRAFT_VOCAB = 8192  # the reduced vocabulary's size, as the layer draft's (docs/draft.md)
SELECT_K = 6  # drafted tokens per verification the selection scores (the bench's --draft-tokens)


def trace_engine(target_spec: str, cfg: HeadTrainConfig | DraftTrainConfig,
                 kv_cache_gb: float | None = None) -> VLLMEngine:
    """vLLM on the target, to decode the traces (a head's, or a layer draft's answers):
    ``cfg.gen_batch_size`` answers in flight,
    seeded with ``cfg.seed``, in the number type "auto" picks: bfloat16 on a GPU or a CPU with
    bfloat16 matrix instructions, float32 elsewhere, as the embedded engine picked for the
    recipe's 32 in flight (the shipped head's traces are bfloat16 ones; docs/draft.md).
    ``kv_cache_gb``: the KV cache's budget; None leaves it to ``token_engine.kv_budget_gb`` (a
    CPU's default budget on a CPU; on a GPU what vLLM's memory share leaves)."""
    return VLLMEngine.load(target_spec, batch_size=cfg.gen_batch_size, kv_cache_gb=kv_cache_gb, seed=cfg.seed)


def _traces(cfg: HeadTrainConfig, target_spec: str, cache_dir: str | None, log: Log,
            engine: VLLMEngine | None) -> tuple[list[Trace], str]:
    """The traces and the number type they were decoded in, on ``engine`` or on one started
    for them and shut down after."""
    if engine is not None:
        return build_traces(engine, cfg, cache_dir, log), engine.dtype
    own = trace_engine(target_spec, cfg)
    try:
        return build_traces(own, cfg, cache_dir, log), own.dtype
    finally:
        del own
        gc.collect()  # vLLM's KV cache and weights go before the target loads again


def build_head(cfg: HeadTrainConfig, out_dir: str | Path, target_spec: str = "embedded:smollm2-135m",
               cache_dir: str | None = None, log: Log | None = None, progress=None,
               engine: VLLMEngine | None = None) -> dict:
    """Train a head for ``target_spec`` and write its artifact to ``out_dir``; returns its
    metadata. ``engine``: a vLLM engine already running on ``target_spec`` to decode the
    traces (vLLM runs one engine per process, so a caller holding one passes it); without,
    one is started for the traces (``trace_engine``) and shut down before the target loads."""
    from semspec.models.loaded import load_model

    cfg = resolve_train_dtype(cfg)  # the checkpoint key and the metadata name the dtype used
    t_start = time.perf_counter()
    log = log or (lambda _m: None)

    torch.set_num_threads(cfg.threads)
    traces, trace_dtype = _traces(cfg, target_spec, cache_dir, log, engine)
    t_traces = time.perf_counter() - t_start
    # set after vLLM, which seeds torch's generator as it starts and decodes at the thread
    # count its engine was loaded with: the rest of the build is reproducible whatever ran it
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)

    target = load_model(target_spec, device="cpu", dtype=torch.float32)
    for p in target.model.parameters():
        p.requires_grad_(False)
    t0 = time.perf_counter()
    states = cached_target_states(target, traces, cache_dir, log=log)
    t_states = time.perf_counter() - t0

    train, held = split_traces(traces, cfg.eval_fraction)
    tok = target.tokenizer
    always = [t for t in (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id) if t is not None]
    vocab = select_vocab([traces[i] for i in train], DRAFT_VOCAB, always, target.vocab_size)
    w_sub = target.model.get_output_embeddings().weight[vocab].float()

    head = HeadModel(target.model, layers=cfg.layers)
    ckpt = None
    if cache_dir:
        key = hashlib.sha256(json.dumps([cfg.to_dict(), str(target.identity), [t.ids for t in traces]],
                                        sort_keys=True).encode()).hexdigest()[:16]
        ckpt = Path(cache_dir) / f"head-ckpt-{key}.safetensors"
    # model selection on a quarter of the held-out traces by what a greedy verification keeps
    # (the leading agreeing tokens among 6 drafted; depth-1 agreement where no trace is
    # greedy); the figures reported are measured on the other three quarters
    pick, report = selection_split(held)

    def select(h: HeadModel) -> float:
        ev = evaluate_depths(h, target, vocab, [traces[i] for i in pick], [states[i] for i in pick], depths=(1,),
                             stride=cfg.eval_stride, accept_k=SELECT_K)
        return ev["mean_accepted"] if ev["mean_accepted"] is not None else (ev["top1_by_depth"]["1"] or 0.0)

    summary = train_head(head, w_sub, [traces[i] for i in train], [states[i] for i in train], cfg, log=log,
                         progress=progress, checkpoint=ckpt, select=select if pick else None)
    t0 = time.perf_counter()
    ev = evaluate_depths(head, target, vocab, [traces[i] for i in report], [states[i] for i in report],
                         depths=cfg.eval_depths, stride=cfg.eval_stride)
    t_eval = time.perf_counter() - t0
    log(f"held-out top-1 by depth {ev['top1_by_depth']}, mean accepted (k={ev['accept_k']}) {ev['mean_accepted']}")
    meta = {
        "target": {"name": target_spec, "identity": str(target.identity), **target_fingerprint(target.model)},
        "config": cfg.to_dict(),
        "draft_vocab_size": int(len(vocab)),
        "training": {
            **summary,
            "traces": {"train": len(train), "selection": len(pick), "eval": len(report), "dtype": trace_dtype,
                       "train_response_tokens": int(sum(len(traces[i].ids) - traces[i].prompt_len for i in train))},
            "seconds": {"traces": t_traces, "states": t_states, "train": summary["train_seconds"], "eval": t_eval,
                        "total": time.perf_counter() - t_start},
            "torch_threads": torch.get_num_threads(), "torch_version": torch.__version__,
        },
        "eval": ev,
    }
    save_head(head, vocab, meta, out_dir)
    return meta
