"""Probe calibration on vLLM: traces, sampled steps and pooled states from the engines that
decode with the probes (`semspec.engine.step_engine`), so the probes learn exactly the states they
read when they judge a drafted step (one forward path for calibration and decoding).

`VLLMModels(engine)` wraps a `VLLMStepEngine` loaded with the calibration's layers
(`VLLMModels.load`, or a worker's engine) as `semspec.calibration.collect.CalibrationModels`:

- a trace is one sampled request, cut into steps afterwards by the engine's step rule
  (sampling token by token, a step's end does not change what comes next);
- a prefix's N next steps are one request with ``n=N`` (a question's prefixes all in flight
  together), stopped at text that may end a step;
  the step rule decides on the tokens, and a sample vLLM stopped at a delimiter before any
  text goes on in a request of its own;
- a step's states are the stored layer's rows over the step, read by a one-token request of
  prefix + step whose prefix the sampling left in the prefix cache.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from semspec.calibration.collect import CollectConfig, SampledStep, layer_for
from semspec.steps import IncrementalText, StepDetector, step_spans


class VLLMModels:
    def __init__(self, engine: Any, roles: tuple[str, ...] | None = None):
        """``engine``: a ``VLLMStepEngine``; ``roles``: the models to sample from (default: the
        engine's, the target alone when it loaded no draft)."""
        if roles is None:
            roles = ("target",) if engine.draft is None else ("target", "draft")
        self.step_engine = engine
        self.served = {"target": engine.target, "draft": engine.draft}
        if "draft" in roles and engine.draft is None:
            raise ValueError("this engine loaded no draft; a calibration samples from both models of the pair")
        self.roles = roles
        self.engine = f"vllm {engine.version} {engine.dtype}"
        self.think_end = engine.think_end_marker

    @classmethod
    def load(cls, target: str | None, draft: str | None, cfg: CollectConfig, **engine_options) -> "VLLMModels":
        """Engines of the pair storing the layers ``cfg`` reads (``draft`` None: the target's
        half of the work alone)."""
        from semspec.engine.step_engine import VLLMStepEngine

        roles = ("target",) if draft is None else ("target", "draft")
        layers = {r: layer_for(cfg, r) for r in roles}
        engine = VLLMStepEngine.load(target, draft or "none", None, layers=layers, **engine_options)
        return cls(engine, roles)

    # ------------------------------------------------------------------ what it is
    def describe(self, role: str) -> dict:
        s = self.served[role]
        identity = s.shape.identity
        return {"identity": str(identity), "spec": identity.name, "hidden_size": s.shape.hidden_size,
                "num_layers": s.shape.num_layers}

    def tokenizer(self, role: str):
        return self.served[role].facts.tokenizer

    def eos(self, role: str) -> set[int]:
        return set(self.served[role].facts.eos)

    def layer(self, role: str, cfg: CollectConfig) -> int:
        """The layer ``cfg`` reads, which must be the one the engine stores."""
        s = self.served[role]
        want = layer_for(cfg, role)
        resolved = want + s.shape.num_layers + 1 if want < 0 else want
        if s.layer != resolved:
            stored = "no layer" if s.layer is None else f"hidden_states[{s.layer}]"
            raise ValueError(f"the {role}'s engine stores {stored}; this calibration reads hidden_states[{want}]: "
                             "load the engines with the calibration's layers")
        return want

    # ------------------------------------------------------------------ sampling
    def trace(self, prompt_ids: list[int], cfg: CollectConfig, seed: int) -> list[str]:
        s = self.served["target"]
        room = min(cfg.max_trace_tokens, s.facts.max_context - len(prompt_ids))
        if room < 1:
            return []
        (out,) = self._run(s, [(prompt_ids, self._params(s, cfg.trace_temperature, cfg.top_p, seed, room))])
        tokens = _until_eos(out.outputs[0].token_ids, s.facts.eos)
        spans = step_spans(s.facts.tokenizer, tokens, self._detector(cfg))[:cfg.max_trace_steps]
        return [s.facts.tokenizer.decode(tokens[a:b], skip_special_tokens=False) for a, b in spans]

    def sample(self, role: str, prefixes: list[tuple[list[int], int]], cfg: CollectConfig) -> list[list[SampledStep]]:
        """Each prefix's N steps: one request with ``n=N`` per prefix, all in flight together."""
        s = self.served[role]
        if any(not ids for ids, _ in prefixes):
            raise ValueError("sampling a step needs a non-empty prefix")
        detector = self._detector(cfg)
        n = cfg.samples if cfg.temperature > 0 else 1  # greedy steps are all one (vLLM refuses n > 1 greedy)
        limits = [min(cfg.max_step_tokens, s.facts.max_context - len(ids)) for ids, _ in prefixes]
        if min(limits) < 1:
            raise ValueError(f"a prefix of {max(len(ids) for ids, _ in prefixes)} tokens leaves no room for a step "
                             f"in the {role}'s context of {s.facts.max_context}")
        outs = self._run(s, [(ids, self._params(s, cfg.temperature, cfg.top_p, seed, limit, n=n, stop=self._stops(cfg)))
                             for (ids, seed), limit in zip(prefixes, limits)])
        steps = [[self._cut(s, detector, c.token_ids, limit, cfg) for c in out.outputs] * (cfg.samples // n)
                 for out, limit in zip(outs, limits)]
        # vLLM stops at any delimiter, the step rule only at one after some text: go on there
        for attempt in itertools.count(1):
            open_ = [(p, i) for p, row in enumerate(steps) for i, st in enumerate(row) if st.end is None]
            if not open_:
                break
            requests = [(prefixes[p][0] + steps[p][i].tokens,
                         self._params(s, cfg.temperature, cfg.top_p, prefixes[p][1] + attempt * cfg.samples + i,
                                      limits[p] - len(steps[p][i].tokens), stop=self._stops(cfg)))
                        for p, i in open_]
            for (p, i), more in zip(open_, self._run(s, requests)):
                steps[p][i] = self._cut(s, detector, steps[p][i].tokens + list(more.outputs[0].token_ids), limits[p], cfg)
        return steps

    def _detector(self, cfg: CollectConfig) -> StepDetector:
        return StepDetector(cfg.step_delimiter, self.think_end, cfg.max_step_tokens)

    def _cut(self, s: Any, detector: StepDetector, tokens, limit: int, cfg: CollectConfig) -> SampledStep:
        """The step the step rule reads in ``tokens`` (its end None while it has not ended)."""
        text = IncrementalText(s.facts.tokenizer)
        kept: list[int] = []
        end = None
        for token in tokens:
            if token in s.facts.eos:
                end = "eos"
                break
            kept.append(int(token))
            prev = len(text.text)
            text.push(token)
            ended = detector.ended(text.text, len(kept), prev)
            if ended is not None:
                end = ended.reason
                break
        if end is None and len(kept) >= limit:
            end = "cap" if limit >= cfg.max_step_tokens else "length"
        return SampledStep(kept, text.text, end)

    # ------------------------------------------------------------------ states
    def features(self, role: str, prefixes: list[tuple[list[int], list[list[int]]]], cfg: CollectConfig
                 ) -> list[torch.Tensor]:
        """Pooled stored-layer states over each step after its prefix -> ``[steps, H]`` per prefix."""
        from semspec.engine.states import STATES

        s = self.served[role]
        self.layer(role, cfg)
        if any(not steps or any(len(step) == 0 for step in steps) for _, steps in prefixes):
            raise ValueError("states of no step, or of an empty one")
        requests = [[(list(ids) + list(step), self._params(s, 0.0, 1.0, None, 1, states_from=len(ids)))
                     for step in steps] for ids, steps in prefixes]
        # each prefix's first step alone first: requests scheduled together each compute their
        # prefix, later ones find it cached
        firsts = self._run(s, [r[0] for r in requests])
        rest = iter(self._run(s, [x for r in requests for x in r[1:]]))
        return [torch.stack([s.features(o.kv_transfer_params[STATES], cfg.pooling)
                             for o in [first, *(next(rest) for _ in r[1:])]])
                for first, r in zip(firsts, requests)]

    # ------------------------------------------------------------------ vLLM
    def _stops(self, cfg: CollectConfig) -> list[str]:
        """Text at which vLLM stops a step's request (the step rule then decides)."""
        return [cfg.step_delimiter] + ([self.think_end] if self.think_end else [])

    @staticmethod
    def _params(s: Any, temperature: float, top_p: float, seed: int | None, max_tokens: int, n: int = 1,
                stop: list[str] | None = None, states_from: int | None = None):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from semspec.engine.states import STATES_FROM

        sampled = temperature > 0
        return SamplingParams(
            n=n, temperature=temperature if sampled else 0.0, top_p=top_p if sampled else 1.0,
            seed=seed if sampled else None, max_tokens=max_tokens, stop_token_ids=sorted(s.facts.eos),
            stop=stop, include_stop_str_in_output=True, detokenize=stop is not None,
            output_kind=RequestOutputKind.FINAL_ONLY,
            extra_args={"kv_transfer_params": {STATES_FROM: states_from}} if states_from is not None else None)

    def _run(self, s: Any, requests: list[tuple[list[int], Any]]) -> list[Any]:
        """Run ``requests`` (prompt ids, sampling parameters) on one engine to the end; their
        outputs in order. Whatever is left when this fails is aborted."""
        if not requests:
            return []
        torch.set_num_threads(self.step_engine.threads)  # as generate_many: vLLM's CPU attention plans for it
        ids: list[str] = []
        done: dict[str, Any] = {}
        try:
            for prompt, params in requests:
                rid = self.step_engine.request_id()
                s.llm.add_request(rid, s.llm.renderer.render_cmpl([{"prompt_token_ids": list(prompt)}])[0], params)
                ids.append(rid)
            while len(done) < len(ids):
                if not s.llm.has_unfinished_requests():
                    raise RuntimeError(f"vLLM finished {len(ids) - len(done)} requests without their outputs")
                for out in s.llm.step():
                    if out.finished:
                        done[out.request_id] = out
            return [done[r] for r in ids]
        finally:
            left = [r for r in ids if r not in done]
            if left:
                s.llm.abort_request(left)


def _until_eos(tokens, eos) -> list[int]:
    out = []
    for t in tokens:
        if t in eos:
            break
        out.append(int(t))
    return out
