"""Corrections for two bugs of vLLM's CPU build that break sampling, applied in the process that
runs an engine (``start_engine`` calls :func:`apply`; the ``vllm.general_plugins`` entry point
does it in engine processes vLLM starts itself). Each is applied only where the bug is there,
found by looking at the running vLLM, not by its version number, so a release that fixes one
gets none of this.

1. **Seeded requests whose prompt is prefilled over several engine steps** (any prompt longer
   than what one step schedules, or a batch of long prompts): a step that ends inside a
   prompt still samples a token, which vLLM throws away, and then rewinds the request's
   generator (``GPUModelRunner._bookkeeping_sync``) with ``Generator.set_offset``, which only
   CUDA's Philox generators have: on a CPU the step raises "CPU Generator does not use
   offset" and every request in flight fails (vLLM 0.32.0). Here the rewind is a snapshot
   of each such request's generator state taken before sampling and put back after it, so
   a seeded sample is the same whether its prompt was prefilled whole or in chunks.
2. **Sampled speculative decoding** (vllm#55005): without Triton's CPU backend vLLM runs C++
   shims in place of Triton kernels; the shim behind ``expand_batch_to_tokens``
   (``vllm/v1/sample/rejection_sampler.py``) converts its float output to int64 and writes
   into the copy, so every drafted position's temperature, top-k and top-p are read from
   uninitialised memory: drafts are judged against garbage (``token_sd`` at T 0.6 ran at
   0.46x ``ar``) and seeded runs differ. Here the function is a plain torch expansion.
"""

from __future__ import annotations

import functools
import inspect

import torch

_applied: set[str] = set()


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0,
                           replace_to: int = 0) -> torch.Tensor:
    """vLLM's ``expand_batch_to_tokens`` in torch: request i's value repeated for each of its
    tokens (``cu_num_tokens``: cumulative tokens per request), ``replace_from`` values as
    ``replace_to``."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return torch.repeat_interleave(values, counts, output_size=num_tokens)


def expansion_is_broken() -> bool:
    """Whether vLLM's own ``expand_batch_to_tokens`` gets a small CPU case wrong (the shim's bug)."""
    from vllm.v1.sample import rejection_sampler

    x, cu = torch.tensor([0.6, 0.25, -1.0]), torch.tensor([2, 5, 6], dtype=torch.int32)
    try:
        got = rejection_sampler.expand_batch_to_tokens(x, cu, 6, replace_from=-1, replace_to=1)
    except Exception:  # noqa: BLE001 -- a shim that cannot run at all is as broken
        return True
    return not torch.equal(got, expand_batch_to_tokens(x, cu, 6, replace_from=-1, replace_to=1))


def rewinds_by_offset() -> bool:
    """Whether vLLM's model runner rewinds a discarded sample's generator with ``set_offset``, in
    the shape the correction is written for (0.32.0's: a ``discard_request_mask``)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    try:
        source = inspect.getsource(GPUModelRunner._bookkeeping_sync)
    except (AttributeError, OSError, TypeError):
        return False
    # the correction reads the discarded rows where this runner keeps them
    return "set_offset" in source and "discard_request_mask" in source and hasattr(GPUModelRunner, "_sample")


def _fix_expansion() -> None:
    from vllm.v1.sample import rejection_sampler

    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens


def _discarded_cpu_generators(runner) -> dict[int, torch.Generator]:
    """The CPU generators of the rows whose sampled token this step throws away."""
    rows = runner.discard_request_mask.np[:runner.input_batch.num_reqs].nonzero()[0]
    generators = runner.input_batch.generators
    return {int(i): generators[int(i)] for i in rows
            if int(i) in generators and generators[int(i)].device.type == "cpu"}


def _fix_rewind() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    sample, bookkeeping = GPUModelRunner._sample, GPUModelRunner._bookkeeping_sync

    @functools.wraps(sample)
    def _sample(self, *args, **kwargs):
        saved = {i: g.get_state() for i, g in _discarded_cpu_generators(self).items()}
        try:
            return sample(self, *args, **kwargs)
        finally:  # the discarded draw never happened
            for i, state in saved.items():
                self.input_batch.generators[i].set_state(state)

    @functools.wraps(bookkeeping)
    def _bookkeeping_sync(self, *args, **kwargs):
        # rewound already (_sample): hide them from the offset rewind, which CPU generators lack
        hidden = _discarded_cpu_generators(self)
        generators = self.input_batch.generators
        for i in hidden:
            del generators[i]
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            generators.update(hidden)

    GPUModelRunner._sample, GPUModelRunner._bookkeeping_sync = _sample, _bookkeeping_sync


def apply() -> tuple[str, ...]:
    """Correct the bugs this process's vLLM has, once (idempotent); names what was corrected.
    Nothing on a GPU build: both bugs are the CPU build's."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        if "seeded_chunked_prefill" not in _applied and rewinds_by_offset():
            _fix_rewind()
            _applied.add("seeded_chunked_prefill")
        if "expand_batch_to_tokens" not in _applied and expansion_is_broken():
            _fix_expansion()
            _applied.add("expand_batch_to_tokens")
    return tuple(sorted(_applied))
