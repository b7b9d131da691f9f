"""Probe calibration's sampling and states with transformers' forward: where vLLM is not
installed, and the reference the vLLM path was checked against (the same pooled states and
probe outputs in float32).

`TransformersModels(target, draft)` wraps two `semspec.models.loaded.LoadedModel`s (`draft` None
for the target's half alone) as `semspec.calibration.collect.CalibrationModels`.
"""

from __future__ import annotations

from typing import Sequence

import torch

from semspec.calibration.collect import CollectConfig, SampledStep, layer_for


class TransformersModels:
    def __init__(self, target, draft=None):
        self.models = {"target": target} if draft is None else {"target": target, "draft": draft}
        self.roles = tuple(self.models)
        self.engine = f"transformers {str(target.dtype).removeprefix('torch.')}"

    def describe(self, role: str) -> dict:
        m = self.models[role]
        return {"identity": str(m.identity), "spec": m.spec, "hidden_size": m.hidden_size,
                "num_layers": m.num_layers}

    def tokenizer(self, role: str):
        return self.models[role].tokenizer

    def eos(self, role: str) -> set[int]:
        return set(self.models[role].eos_token_ids)

    def layer(self, role: str, cfg: CollectConfig) -> int:
        return layer_for(cfg, role)

    def _generator(self, seed: int) -> torch.Generator:
        g = torch.Generator(device=self.models["target"].device)
        g.manual_seed(seed)
        return g

    def trace(self, prompt_ids: list[int], cfg: CollectConfig, seed: int) -> list[str]:
        return generate_trace(self.models["target"], prompt_ids, cfg, self._generator(seed))

    def sample(self, role: str, prefixes: list[tuple[list[int], int]], cfg: CollectConfig) -> list[list[SampledStep]]:
        """Each prefix's N steps in a batch of its own (N copies of its cache)."""
        return [sample_steps(self.models[role], ids, cfg.samples, cfg.temperature, cfg.top_p, cfg.step_delimiter,
                             cfg.max_step_tokens, self._generator(seed))
                for ids, seed in prefixes]

    def features(self, role: str, prefixes: list[tuple[list[int], list[list[int]]]], cfg: CollectConfig
                 ) -> list[torch.Tensor]:
        from semspec.probes import step_features

        lm = self.models[role]
        return [step_features(lm, ids, steps, layer_for(cfg, role), cfg.pooling) for ids, steps in prefixes]


@torch.inference_mode()
def sample_steps(
    loaded,
    prefix_ids: Sequence[int],
    n: int,
    temperature: float,
    top_p: float,
    delimiter: str = "\n\n",
    max_step_tokens: int = 48,
    generator: torch.Generator | None = None,
) -> list[SampledStep]:
    """N next steps after `prefix_ids`, sampled in one batch that shares the prefix cache.

    A step ends as in the engine (`StepDetector`: the delimiter after some non-blank text,
    the end-of-thinking marker, the token cap) or at EOS (not included in the step)."""
    if not prefix_ids:
        raise ValueError("sample_steps needs a non-empty prefix")
    first, advance = _cache_stepper(loaded, prefix_ids, n)
    max_ctx = loaded.max_context
    room = None if max_ctx is None else max_ctx - len(prefix_ids)
    return _sample_loop(loaded, first, advance, n, temperature, top_p, delimiter, max_step_tokens, room, generator)


def _cache_stepper(loaded, prefix_ids, n):
    """(logits after the prefix [n, V], advance) over a transformers cache copied n times."""
    from transformers import DynamicCache

    dev = loaded.device
    cache = DynamicCache(config=loaded.model.config)
    # next_token_logits: a reduced-vocabulary draft samples over its own vocabulary, as it decodes
    logits = loaded.next_token_logits(torch.tensor([list(prefix_ids)], device=dev), cache).repeat(n, 1)
    if n > 1:
        cache.batch_repeat_interleave(n)
    tok = loaded.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(loaded.eos_token_ids), 0)

    def advance(feed: dict[int, int]) -> torch.Tensor:
        ids = [feed.get(i, pad) for i in range(n)]  # every row steps; ended ones on padding
        return loaded.next_token_logits(torch.tensor(ids, device=dev).unsqueeze(1), cache)

    return logits, advance


def _sample_loop(loaded, logits, advance, n, temperature, top_p, delimiter, max_step_tokens, room, generator):
    from semspec.sampling import probs_from_logits
    from semspec.steps import StepDetector, detect_think_end

    tok = loaded.tokenizer
    detector = StepDetector(delimiter, detect_think_end(tok), max_step_tokens)
    eos = loaded.eos_token_ids
    toks: list[list[int]] = [[] for _ in range(n)]
    texts = [""] * n
    ends: list[str | None] = [None] * n
    for step in range(max_step_tokens):
        if room is not None and step >= room:
            for i in range(n):
                ends[i] = ends[i] or "length"
            break
        probs = probs_from_logits(logits, temperature, top_p)
        if temperature <= 0:
            nxt = probs.argmax(-1)
        else:
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        feed = {}
        for i in range(n):
            t = int(nxt[i])
            if ends[i] is None:
                if t in eos:
                    ends[i] = "eos"
                else:
                    toks[i].append(t)
                    prev = len(texts[i])
                    texts[i] = tok.decode(toks[i], skip_special_tokens=False)
                    e = detector.ended(texts[i], len(toks[i]), prev)
                    if e is not None:
                        ends[i] = e.reason
            if ends[i] is None:
                feed[i] = t
        if not feed:
            break
        logits = advance(feed)
    return [SampledStep(t, s, e or "cap") for t, s, e in zip(toks, texts, ends)]


def generate_trace(loaded, prompt_ids: list[int], cfg: CollectConfig, generator: torch.Generator | None = None
                   ) -> list[str]:
    """The target's reasoning trace after `prompt_ids`, as a list of step texts (each keeping
    its delimiter), one step per call of `sample_steps` with batch size 1."""
    ids = list(prompt_ids)
    steps: list[str] = []
    used = 0
    while used < cfg.max_trace_tokens and len(steps) < cfg.max_trace_steps:
        (s,) = sample_steps(
            loaded, ids, 1, cfg.trace_temperature, cfg.top_p, cfg.step_delimiter,
            min(cfg.max_step_tokens, cfg.max_trace_tokens - used), generator,
        )
        if s.tokens:
            steps.append(s.text)
            ids = ids + s.tokens
            used += len(s.tokens)
        if s.end in ("eos", "length") or not s.tokens:
            break
    return steps
