"""Hidden states of one layer, per request, out of vLLM: what the probes read.

vLLM's ``extract_hidden_states`` speculative method stores, for every token a forward pass
computes, the states at chosen layers in a cache-only attention layer: they live in the paged
KV cache beside the keys and values, so prefix caching keeps them for cached tokens too (a
verification whose prefix is cached still has the states of the step's first tokens). A KV
connector reads them when a request finishes; vLLM's example connector writes files and needs
CUDA streams and pinned memory. :class:`StatesConnector` instead reads them synchronously when
the request finishes, before its blocks are freed, and returns them in the request's output
(``RequestOutput.kv_transfer_params["states"]``), only for the requests that ask:

    SamplingParams(..., extra_args={"kv_transfer_params": {STATES_FROM: 12}})

gives the rows of positions 12 .. (tokens fed - 1), a float32 ``[n, hidden]`` tensor (the last
token a request sampled is never fed, so it has no state).

The scheduler-side connector reads the worker's cache through the forward context both share:
vLLM's single-process executor runs the scheduler and the worker in one process (in this one
with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, else in its engine-core process, whence the tensor
travels to the client with the output). The worker-side connector does nothing: vLLM keeps one
per process, so every engine in a process shares it, and every engine is started with this
connector (``semspec.engine.token_engine.engine_arguments``), asked for states or not.

Layer numbering (``eagle_aux_hidden_state_layer_ids``) is transformers' ``hidden_states``
index: 0 the embeddings, k the output of layer k, except that vLLM's last (``num_layers``) is
taken before the final norm, which :func:`final_norm` applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                              KVConnectorRole, SupportsHMA)
from vllm.v1.core.sched.scheduler import Scheduler

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# the request's kv_transfer_params key: the first position whose states it wants
STATES_FROM = "semjobs_states_from"
# the output's kv_transfer_params key holding them
STATES = "states"


def scheduler_class() -> str:
    return f"{__name__}.StatesScheduler"


def connector_config() -> dict:
    """The ``kv_transfer_config`` an engine serving states is started with."""
    return {"kv_connector": "StatesConnector", "kv_connector_module_path": __name__, "kv_role": "kv_producer"}


def speculative_config(layer: int) -> dict:
    """The ``speculative_config`` that stores ``layer``'s states in the KV cache."""
    return {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [layer]}}}


class StatesScheduler(Scheduler):
    """vLLM's scheduler, minus the "drafts" of ``extract_hidden_states``: that method proposes
    each request's last sampled token as the next one's draft (it drafts nothing; it is
    there to store states), which would feed every decoding request two tokens per step
    instead of one. States are stored for every token fed either way."""

    def update_draft_token_ids(self, draft_token_ids) -> None:
        pass


def final_norm(rows: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as the model's final norm computes it (transformers' Llama), in float32."""
    x = rows.float()
    return weight.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


class _NoMetadata(KVConnectorMetadata):
    pass


class StatesConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._group = self._states_group(kv_cache_config)
        self._cache: torch.Tensor | None = None

    def states_cache(self) -> torch.Tensor:
        """The cache-only layer's cache, ``[blocks, layers, block size, hidden]``: found through
        the forward context this engine's scheduler shares with its worker (one process)."""
        if self._cache is None:
            from vllm.config import get_layers_from_vllm_config
            from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer

            layers = list(get_layers_from_vllm_config(self._vllm_config, CacheOnlyAttentionLayer).values())
            if len(layers) != 1:
                raise ValueError(f"expected one cache-only layer, found {len(layers)}")
            self._cache = layers[0].kv_cache
        return self._cache

    def rows(self, block_ids: list[int], start: int, end: int) -> torch.Tensor:
        """The stored states of positions ``start`` .. ``end - 1`` (first stored layer), float32."""
        cache = self.states_cache()
        block = cache.shape[2]
        pos = torch.arange(start, end)
        blocks = torch.tensor(block_ids, dtype=torch.long)[pos // block]
        return cache[blocks, 0, pos % block].float().cpu()

    @staticmethod
    def _states_group(kv_cache_config: "KVCacheConfig | None") -> int | None:
        """The cache group holding the states; None for an engine that stores none (its
        requests never ask)."""
        from vllm.v1.kv_cache_interface import HiddenStateCacheSpec

        if kv_cache_config is None:
            return 0
        groups = [i for i, g in enumerate(kv_cache_config.kv_cache_groups)
                  if isinstance(g.kv_cache_spec, HiddenStateCacheSpec)]
        if len(groups) > 1:
            raise ValueError(f"expected one hidden-states cache group, found {len(groups)}")
        if groups:
            return groups[0]
        return 0 if len(kv_cache_config.kv_cache_groups) == 1 else None  # one group holds every layer

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        pass  # the scheduler side reads the cache (states_cache); see the module's doc

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass  # nothing is ever loaded

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        pass  # the cache-only layer stored the states already

    def wait_for_save(self) -> None:
        pass

    # ------------------------------------------------------------------ scheduler side
    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: "Request", blocks: Any, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return _NoMetadata()

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict | None]:
        start = (request.kv_transfer_params or {}).get(STATES_FROM)
        if start is None:
            return False, None
        fed = min(request.num_computed_tokens, len(request.all_token_ids) - 1)
        return False, {STATES: self.rows(block_ids, start, fed)}

    def request_finished_all_groups(self, request: "Request", block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, dict | None]:
        if self._group is None or self._group >= len(block_ids):
            return False, None
        return self.request_finished(request, block_ids[self._group])

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> str | None:
        return "LBNHC"  # each token's states together, as rows() reads them
