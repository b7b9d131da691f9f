"""Steps that draft nothing on vLLM's CPU build, at the cost of steps without speculation;
applied in the process that runs an engine (``start_engine``; the ``vllm.general_plugins``
entry point in engine processes vLLM starts itself).

Beside other requests a CPU engine drafts only while few run
(``semspec.engine.token_engine.CPU_SPECULATION_MAX_BATCH``, through vLLM's
``num_speculative_tokens_per_batch_size``). Above that a step verifies no drafted token and
schedules none for the next, yet vLLM 0.32.0's model runner still

1. samples it through the rejection sampler (a copy of the rows' logits and its bookkeeping
   around the plain sampler's draw), and
2. runs the draft's pass over the step's tokens, proposing nothing, to keep the draft's KV cache
   whole for when the request drafts again (3.5 ms of an 81 ms step at 32 rows).

A `token_sd` engine in flight so cost up to a fifth of `ar`'s speed (docs/benchmarks.md,
"What the CPU patches of vLLM buy"). Here (1) a step
without a drafted token, where no request asks for log-probabilities, is sampled by the plain
sampler, the same draw the rejection sampler makes for it; (2) when the schedule gives the
next step no draft, a drafter that runs a model (a head of the EAGLE family, ``draft_model``)
skips its pass. Its KV cache then misses those positions: a request that drafts again later,
once few run, drafts from a cache with holes and keeps fewer of its drafts; what it keeps is
verified as ever, so the text is still the target's. The step engine's states target
(``extract_hidden_states``, which stores the probes' states in its pass) keeps its pass.

Only where the runner is the one this was written for, and only on a CPU: on a GPU vLLM drafts
at every batch size unless told, and its asynchronous scheduling and CUDA graphs shape the
drafter's buffers.
"""

from __future__ import annotations

import functools

import torch

_applied = False


def skips_drafts(speculative_config) -> bool:
    """Whether the drafter of ``speculative_config`` runs a model pass this module skips when the
    schedule asks for no draft (not extract_hidden_states', which stores states in it)."""
    if speculative_config is None:
        return False
    return speculative_config.use_eagle() or speculative_config.uses_draft_model()


def apply() -> bool:
    """Patch vLLM's model runner as the module says (idempotent); whether it is patched."""
    global _applied
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    shaped = all(hasattr(GPUModelRunner, name) for name in ("_sample", "sample_tokens", "propose_draft_token_ids"))
    if _applied or not current_platform.is_cpu() or not shaped:
        return _applied
    _plain_sampler_without_drafts(GPUModelRunner)
    _no_draft_pass_without_drafts(GPUModelRunner)
    _applied = True
    return True


def _plain_sampler_without_drafts(runner_class) -> None:
    sample = runner_class._sample

    @functools.wraps(sample)
    def _sample(self, logits, spec_decode_metadata):
        metadata = self.input_batch.sampling_metadata
        if spec_decode_metadata is not None and spec_decode_metadata.max_spec_len == 0 \
                and metadata.max_num_logprobs is None:
            # the runner's own plain sampling (through what wraps it: vllm_cpu_fixes' rewind
            # of a discarded sample's generator), not the sampler called directly
            spec_decode_metadata = None
        return sample(self, logits, spec_decode_metadata)

    runner_class._sample = _sample


def _no_draft_pass_without_drafts(runner_class) -> None:
    sample_tokens, propose = runner_class.sample_tokens, runner_class.propose_draft_token_ids

    @functools.wraps(sample_tokens)
    def sample_tokens_(self, grammar_output):
        state = self.execute_model_state  # this step's, read before vLLM clears it
        self._semjobs_no_draft = state is not None and skips_drafts(self.speculative_config) \
            and getattr(state.scheduler_output, "num_spec_tokens_to_schedule", None) == 0
        return sample_tokens(self, grammar_output)

    @functools.wraps(propose)
    def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
        if getattr(self, "_semjobs_no_draft", False):
            return torch.empty((self.input_batch.num_reqs, 0), dtype=torch.int32)  # no draft, no pass
        return propose(self, scheduler_output, *args, **kwargs)

    runner_class.sample_tokens = sample_tokens_
    runner_class.propose_draft_token_ids = propose_draft_token_ids
