"""Which draft head shape reads the target best? Small, equal training runs side by side.

Trains one head per ``--variants`` entry with the build's recipe
(``semspec.draft.head_train.train_head``) on the same traces, steps and seed:

- ``final``: one layer reading the target's final-norm state (the shipped shape);
- ``fused``: one layer reading a trained linear fusion (3H -> H, started as "pass the final
  state through") of the target's hidden states after a low layer, a middle layer and the
  final norm, as EAGLE-3 does;
- ``layers2``: two layers (initialised from the target's last two) reading the final state.

Held-out top-1 agreement with the target at draft depths 1..``--depths`` is measured on the
build's report traces with the head's unrolled forward: its level d at position j is the
d-th token the head drafts after it last read a target state at j - d + 1
(``tests/semspec/test_head.py`` checks that against the batched runner), so every answer
position is a draft start at once.

The traces come from the build's cache (``semjobs draft train --kind eagle --cache-dir``,
docs/draft.md); the layers' states are computed here, float32, for the traces used.

    python benchmarks/head_variants.py --cache-dir ~/.cache/semjobs/head-train --variants final,fused \
        --train-traces 500 --steps 300 --threads 1 --out docs/benchmarks/head/variants_fusion.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_json  # noqa: E402
from semspec.draft.config import HeadTrainConfig  # noqa: E402
from semspec.draft.head_build import DRAFT_VOCAB  # noqa: E402
from semspec.draft.head_data import build_traces, padded_batches, selection_split, split_traces  # noqa: E402
from semspec.draft.head_train import select_vocab, train_head  # noqa: E402
from semspec.head import HeadModel  # noqa: E402
from semspec.models import load_model  # noqa: E402


VARIANT_LAYERS = {"final": 1, "layers2": 2}  # decoder layers of the variants that read the final state
VARIANTS = ("final", "fused", "layers2")


class FusedHead(HeadModel):
    """A head whose target reads are [low, middle, final] states (3H), fused to H by a trained
    linear layer; its own predictions (H) are read as they are. For the training loss its
    predictions are padded to 3H with zeros in front, so the final state (the last H columns
    of what it is trained on) is what they are compared with."""

    def __init__(self, target_model, layers: int = 1):
        super().__init__(target_model, layers=layers)
        h = int(self.config.hidden_size)
        self.fuse3 = nn.Linear(3 * h, h, bias=False)
        with torch.no_grad():
            self.fuse3.weight.zero_()
            self.fuse3.weight[:, 2 * h:].copy_(torch.eye(h))

    def fuse_inputs(self, states, embeds):
        if states.shape[-1] != embeds.shape[-1]:
            states = self.fuse3(states.to(embeds.dtype))
        return super().fuse_inputs(states, embeds)

    def unrolled_forward(self, states_in, ids, levels=1):
        preds = super().unrolled_forward(states_in, ids, levels)
        if states_in.shape[-1] == preds[0].shape[-1]:
            return preds
        pad = states_in.shape[-1] - preds[0].shape[-1]
        return [torch.cat([p.new_zeros(*p.shape[:-1], pad), p], dim=-1) for p in preds]


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


@torch.inference_mode()
def layer_states(target, traces, layers: tuple[int, int], batch_size: int = 8):
    """Per trace [len, 3H] float16: RMS-normalised hidden states after ``layers`` (transformers'
    hidden_states indices) and the final-norm state."""
    out = [None] * len(traces)
    for idx, ids in padded_batches(traces, batch_size):
        hs = target.model(input_ids=ids, output_hidden_states=True).hidden_states
        feats = torch.cat([_rms(hs[layers[0]]), _rms(hs[layers[1]]), hs[-1]], dim=-1)
        for r, i in enumerate(idx):
            out[i] = feats[r, : len(traces[i].ids)].to(torch.float16).clone()
    return out


@torch.inference_mode()
def agreement_by_depth(head, traces, states, w_sub, vocab, w_full, depths: int) -> list[float]:
    """Top-1 agreement with the target's full-vocabulary choice at draft depths 1..depths,
    over drafts that start inside each trace's answer."""
    hits, seen = torch.zeros(depths), torch.zeros(depths)
    h = w_full.shape[1]
    for t, s in zip(traces, states):
        s = s.float()
        n = len(t.ids)
        read = torch.cat([torch.zeros(1, s.shape[1]), s[: n - 1]])[None]
        preds = head.unrolled_forward(read, torch.tensor([t.ids]), depths)
        want = (s[:, -h:] @ w_full.T).argmax(-1)  # the target's choice after each position
        for d, pred in enumerate(preds):
            j = torch.arange(t.prompt_len - 1 + d, n - 1)  # the draft started at j - d, inside the answer
            if len(j) == 0:
                continue
            guess = vocab[(pred[0, j, -h:] @ w_sub.T).argmax(-1)]
            hits[d] += (guess == want[j]).sum()
            seen[d] += len(j)
    return [float(x) for x in hits / seen.clamp(min=1)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", required=True, help="the head build's cache (its traces are read from there)")
    ap.add_argument("--variants", default="final,fused", help=f"comma-separated, of: {', '.join(VARIANTS)}")
    ap.add_argument("--train-traces", type=int, default=500, help="training traces used (the first ones)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--unroll", type=int, default=1, help="training-time test levels, every head")
    ap.add_argument("--layers", default="3,15", help="the low and middle layers fused (hidden_states indices)")
    ap.add_argument("--depths", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    torch.set_num_threads(args.threads)
    from semspec.engine import Engine

    cfg = dataclasses.replace(HeadTrainConfig(), steps=args.steps, stop_after=None, unroll=args.unroll, select_every=0)
    engine = Engine.load("embedded:smollm2-135m", draft="none", probes="none", batch_size=cfg.gen_batch_size)
    traces = build_traces(engine, cfg, args.cache_dir)
    del engine
    train, held = split_traces(traces, cfg.eval_fraction)
    _, report = selection_split(held)
    train = train[: args.train_traces]
    target = load_model("embedded:smollm2-135m", device="cpu", dtype=torch.float32)
    for p in target.model.parameters():
        p.requires_grad_(False)
    tok = target.tokenizer
    always = [t for t in (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id) if t is not None]
    vocab = select_vocab([traces[i] for i in train], DRAFT_VOCAB, always, target.vocab_size)
    w_full = target.model.get_output_embeddings().weight.float()
    w_sub = w_full[vocab]
    low_mid = tuple(int(x) for x in args.layers.split(","))
    t0 = time.perf_counter()
    use = train + report
    feats = dict(zip(use, layer_states(target, [traces[i] for i in use], low_mid)))
    result = {"states_seconds": time.perf_counter() - t0, "layers": [*low_mid, "final norm"],
              "train_traces": len(train), "report_traces": len(report), "steps": args.steps, "unroll": args.unroll,
              "heads": {}}
    h = target.hidden_size
    for name in args.variants.split(","):
        torch.manual_seed(cfg.seed)
        fused = name == "fused"
        head = FusedHead(target.model) if fused else HeadModel(target.model, layers=VARIANT_LAYERS[name])
        # the fused head's padded predictions spread the regression over 3H columns: scale it back
        run_cfg = dataclasses.replace(cfg, reg_weight=cfg.reg_weight * (3 if fused else 1))
        w_train = torch.cat([w_sub.new_zeros(len(vocab), 2 * h), w_sub], dim=1) if fused else w_sub
        st = {i: (feats[i] if fused else feats[i][:, -h:]) for i in use}
        t0 = time.perf_counter()
        train_head(head, w_train, [traces[i] for i in train], [st[i] for i in train], run_cfg)
        secs = time.perf_counter() - t0
        agree = agreement_by_depth(head, [traces[i] for i in report], [st[i] for i in report], w_sub, vocab, w_full,
                                   args.depths)
        result["heads"][name] = {"top1_by_depth": agree, "train_seconds": secs}
        print(name, [round(a, 3) for a in agree], f"{secs:.0f}s", flush=True)
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
