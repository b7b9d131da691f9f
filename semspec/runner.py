"""A model runner: one forward pass over a ragged batch of sequences, with slot-owned KV memory.

Each sequence holds a *slot*: rows of the runner's key/value tensors (one pair per layer,
``[slots, kv_heads, capacity, head_dim]``) and a length, the number of its tokens cached.
A pass takes, for any subset of slots, the tokens each feeds this tick (1 to decode, a
drafted step to verify, a whole prompt to prefill), runs them packed as one ``[tokens,
hidden]`` matrix through every projection and MLP (no padding there), and writes their keys
and values at each slot's own positions. Rolling back a rejected draft is setting a length:
nothing is copied, the next pass overwrites what lay beyond it.

Attention is the only part that needs each row's own context. Single-token rows (decodes)
share one call over the slot-major layout, each query against its own slot's keys under a
length mask; rows feeding several tokens get one call each with a causal mask offset by their
length. The forward is our own over the modules transformers loaded (norms, projections,
rotary embedding, MLP are called as they are), because transformers' caches keep one length
for the whole batch and re-concatenate keys at every token; transformers stays the reference
(tests compare logits and tapped states with its own forward).

Served layouts: Llama (SmolLM2, Mistral-style), Qwen2 (biased q/k/v projections) and Qwen3
(per-head q/k norms). Anything else is refused at construction with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .models import LoadedModel
from .head import project_qkv

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class UnsupportedModel(ValueError):
    pass


class ContextOverflow(ValueError):
    pass


@dataclass
class Feed:
    """What one slot feeds in a pass."""

    slot: int
    tokens: list[int]
    # offsets into ``tokens`` whose next-token logits are wanted (the row at offset i predicts
    # the token after tokens[i]); empty for none
    logit_rows: list[int] = field(default_factory=list)
    tap: bool = False  # return the tapped layer's states for every fed token
    states: bool = False  # return the final-norm states (what the LM head reads) of every fed token
    # a draft head's inputs: the target state it reads at each fed token [n, H] (see semspec.head)
    head_inputs: torch.Tensor | None = None


@dataclass
class PassOut:
    # [sum of logit rows, V] float32, feeds' rows in order; ``row_start[i]`` is feed i's first
    logits: torch.Tensor | None
    row_start: list[int]
    hidden: list[torch.Tensor | None]  # per feed: [n, H] float32 tapped states, or None
    states: list[torch.Tensor | None]  # per feed: [n, H] float32 final-norm states, or None


def _split(rows: torch.Tensor | None, feeds: list[Feed], which: list[int]) -> list[torch.Tensor | None]:
    """Per feed, its slice of ``rows`` (the fed tokens of the feeds in ``which``, in order)."""
    out: list[torch.Tensor | None] = [None] * len(feeds)
    if rows is not None:
        at = 0
        for i in which:
            n = len(feeds[i].tokens)
            out[i] = rows[at:at + n]
            at += n
    return out


class ModelRunner:
    def __init__(self, lm: LoadedModel, slots: int, tap_layer: int | None = None, capacity: int = 256):
        cfg = lm.model.config
        if cfg.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModel(
                f"the batched runner serves {', '.join(SUPPORTED_MODEL_TYPES)} models; "
                f"this one is {cfg.model_type!r}"
            )
        if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
            raise UnsupportedModel("sliding-window attention is not served by the batched runner")
        self.lm = lm
        base = lm.model.get_decoder()
        self.embed = base.embed_tokens
        self.layers = list(base.layers[: cfg.num_hidden_layers])
        self.norm = base.norm
        self.rotary = base.rotary_emb
        # a draft head (semspec.head) fuses each token's embedding with a state it is given
        self.fuse = getattr(base, "fuse_inputs", None)
        attn = self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(cfg.num_key_value_heads)
        self.scaling = float(attn.scaling)
        self.num_layers = len(self.layers)
        # tap_layer indexes transformers' hidden_states tuple: 0 the embeddings, i < L the
        # input of layer i, L the last layer after the final norm (negative from the end)
        if tap_layer is not None and tap_layer < 0:
            tap_layer += self.num_layers + 1
        if tap_layer is not None and not 0 <= tap_layer <= self.num_layers:
            raise ValueError(f"tap layer {tap_layer} outside 0..{self.num_layers}")
        self.tap_layer = tap_layer
        self.slots = int(slots)
        self.max_context = lm.max_context
        self.device, self.dtype = lm.device, lm.dtype
        self.capacity = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._grow(capacity)
        self.lengths = [0] * self.slots
        self._free = list(range(self.slots - 1, -1, -1))
        self.passes = 0

    # ------------------------------------------------------------------ slots
    def alloc(self) -> int:
        if not self._free:
            raise RuntimeError("no free slot")
        s = self._free.pop()
        self.lengths[s] = 0
        return s

    def free(self, slot: int) -> None:
        self.lengths[slot] = 0
        self._free.append(slot)

    def overflow(self, feed: Feed) -> ContextOverflow | None:
        """The error feeding ``feed`` would raise, if its sequence outgrows the context."""
        end = self.lengths[feed.slot] + len(feed.tokens)
        if self.max_context is not None and end > self.max_context:
            return ContextOverflow(f"sequence of {end} tokens exceeds the model's context of {self.max_context}")
        return None

    @torch.inference_mode()  # the cache grows inside passes, so its tensors are inference tensors
    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Give slot ``dst`` the first ``length`` cached tokens of slot ``src`` (a shared
        prompt prefix): keys and values are copied, so both slots stay independent."""
        if not 0 <= length <= self.lengths[src]:
            raise ValueError(f"slot {src} holds {self.lengths[src]} tokens, cannot copy {length}")
        for k, v in zip(self.k, self.v):
            k[dst, :, :length] = k[src, :, :length]
            v[dst, :, :length] = v[src, :, :length]
        self.lengths[dst] = length

    def set_length(self, slot: int, length: int) -> None:
        """Roll a slot back (or keep it): only ``length`` cached tokens remain valid."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"slot {slot} holds {self.lengths[slot]} tokens, cannot set length {length}")
        self.lengths[slot] = length

    def _grow(self, need: int) -> None:
        cap = max(need, 2 * self.capacity, 64)
        if self.max_context is not None:
            cap = min(cap, self.max_context)
        shape = (self.slots, self.n_kv, cap, self.head_dim)
        for i in range(self.num_layers):
            k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            v = torch.zeros(shape, dtype=self.dtype, device=self.device)
            if self.capacity:
                k[:, :, : self.capacity] = self.k[i]
                v[:, :, : self.capacity] = self.v[i]
                self.k[i], self.v[i] = k, v
            else:
                self.k.append(k)
                self.v.append(v)
        self.capacity = cap

    # ------------------------------------------------------------------ the pass
    @torch.inference_mode()
    def forward(self, feeds: list[Feed]) -> PassOut:
        if not feeds:
            raise ValueError("a pass needs at least one feed")
        dev = self.device
        starts = [self.lengths[f.slot] for f in feeds]
        ends = [s + len(f.tokens) for s, f in zip(starts, feeds)]
        for f in feeds:
            if not f.tokens:
                raise ValueError(f"slot {f.slot} feeds no tokens")
            if self.fuse is not None and (f.head_inputs is None or len(f.head_inputs) != len(f.tokens)):
                raise ValueError(f"slot {f.slot}: a draft head needs one input state per fed token")
            error = self.overflow(f)
            if error is not None:
                raise error
        if max(ends) > self.capacity:
            self._grow(max(ends))
        ids = torch.tensor([t for f in feeds for t in f.tokens], dtype=torch.long, device=dev)
        pos_list = [p for s, e in zip(starts, ends) for p in range(s, e)]
        slot_list = [f.slot for f in feeds for _ in f.tokens]
        pos = torch.tensor(pos_list, dtype=torch.long, device=dev)
        tok_slot = torch.tensor(slot_list, dtype=torch.long, device=dev)
        n_tok = ids.numel()
        offsets = [0]  # where each feed's tokens start in the packed rows
        for f in feeds[:-1]:
            offsets.append(offsets[-1] + len(f.tokens))

        x = self.embed(ids)  # [T, H]
        if self.fuse is not None:
            x = self.fuse(torch.cat([f.head_inputs for f in feeds]).to(device=dev, dtype=x.dtype), x)
        cos, sin = self.rotary(x[None], pos[None])
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]  # [T, 1, d]
        plan = self._attention_plan(feeds, offsets, starts, ends)

        tap_rows = [i for i, f in enumerate(feeds) if f.tap]
        tap_idx = None
        if tap_rows and self.tap_layer is not None:
            tap_idx = torch.tensor([offsets[i] + j for i in tap_rows for j in range(len(feeds[i].tokens))],
                                   dtype=torch.long, device=dev)
        tapped = None
        for li, layer in enumerate(self.layers):
            if tap_idx is not None and li == self.tap_layer:
                tapped = x[tap_idx].float()
            x = x + self._attend(li, layer, x, cos, sin, pos, tok_slot, n_tok, plan)
            x = x + layer.mlp(layer.post_attention_layernorm(x))

        # logits rows, and the final-norm tap
        row_idx, row_start = [], []
        for f, off in zip(feeds, offsets):
            row_start.append(len(row_idx))
            row_idx.extend(off + r for r in f.logit_rows)
        logits = None
        if tap_idx is not None and self.tap_layer == self.num_layers:
            tapped = self.norm(x[tap_idx]).float()
        if row_idx:
            last = self.norm(x[torch.tensor(row_idx, device=dev)])
            logits = self.lm.head_logits(last)
        hidden = _split(tapped, feeds, tap_rows)
        state_rows = [i for i, f in enumerate(feeds) if f.states]
        states = [None] * len(feeds)
        if state_rows:
            idx = torch.tensor([offsets[i] + j for i in state_rows for j in range(len(feeds[i].tokens))], device=dev)
            states = _split(self.norm(x[idx]).float(), feeds, state_rows)
        for f, e in zip(feeds, ends):
            self.lengths[f.slot] = e
        self.passes += 1
        return PassOut(logits, row_start, hidden, states)

    def _attention_plan(self, feeds, offsets, starts, ends):
        """Which packed rows go to the shared single-token call and which get calls of their own,
        with the masks they need (built once per pass, used by every layer)."""
        dev = self.device
        singles = [i for i, f in enumerate(feeds) if len(f.tokens) == 1]
        multis = [i for i, f in enumerate(feeds) if len(f.tokens) > 1]
        plan = {"single": None, "multi": []}
        if singles:
            span = max(ends[i] for i in singles)
            slots = [feeds[i].slot for i in singles]
            n_used = max(slots) + 1
            # every slot up to the highest used gets a query row (zeros where the slot feeds
            # nothing this pass), so keys are read in place instead of gathered
            lens = torch.zeros(n_used, dtype=torch.long, device=dev)
            lens[torch.tensor(slots, device=dev)] = torch.tensor([ends[i] for i in singles], device=dev)
            lens.clamp_(min=1)  # idle rows attend to one key, so no row is all-masked (NaN)
            mask = torch.arange(span, device=dev)[None, :] < lens[:, None]
            plan["single"] = (
                torch.tensor([offsets[i] for i in singles], device=dev),
                torch.tensor(slots, device=dev), n_used, span, mask[:, None, None, :],
            )
        for i in multis:
            n, s0 = len(feeds[i].tokens), starts[i]
            q_pos = torch.arange(s0, s0 + n, device=dev)
            mask = torch.arange(s0 + n, device=dev)[None, :] <= q_pos[:, None]
            plan["multi"].append((offsets[i], n, feeds[i].slot, s0 + n, mask[None, None]))
        return plan

    def _attend(self, li, layer, x, cos, sin, pos, tok_slot, n_tok, plan):
        attn = layer.self_attn
        q, k, v = project_qkv(layer, x, cos, sin, self.n_heads, self.n_kv, self.head_dim)
        K, V = self.k[li], self.v[li]
        K[tok_slot, :, pos] = k.to(K.dtype)
        V[tok_slot, :, pos] = v.to(V.dtype)
        out = q.new_empty(n_tok, self.n_heads, self.head_dim)
        gqa = self.n_heads != self.n_kv
        single = plan["single"]
        if single is not None:
            rows, slots, n_used, span, mask = single
            qd = q.new_zeros(n_used, self.n_heads, 1, self.head_dim)
            qd[slots, :, 0] = q[rows]
            o = F.scaled_dot_product_attention(
                qd, K[:n_used, :, :span], V[:n_used, :, :span], attn_mask=mask,
                scale=self.scaling, enable_gqa=gqa,
            )
            out[rows] = o[slots, :, 0]
        for off, n, slot, span, mask in plan["multi"]:
            qm = q[off:off + n].transpose(0, 1)[None]  # [1, h, n, d]
            o = F.scaled_dot_product_attention(
                qm, K[slot:slot + 1, :, :span], V[slot:slot + 1, :, :span], attn_mask=mask,
                scale=self.scaling, enable_gqa=gqa,
            )
            out[off:off + n] = o[0].transpose(0, 1)
        return attn.o_proj(out.reshape(n_tok, self.n_heads * self.head_dim))
