"""TEST HELPER: vLLM's engine configuration for CUDA, built on a machine without a GPU.

    python -m tests.semspec.engine.vllm_cuda_config < cases.json    # a JSON list of EngineArgs kwargs

prints, for each case, the parts of vLLM's ``VllmConfig`` the tests read (``summary``). vLLM's
own ``EngineArgs.create_engine_config`` builds the whole configuration (model, cache,
parallel, scheduler, speculative, load, device), with vLLM's current platform passed off as
CUDA: 8 GPUs of 80 GiB. vLLM's CUDA platform class cannot be imported from its CPU build (its
kernels are missing), so the CPU platform stands in, answering as CUDA where
create_engine_config asks (device type, count, memory, name); its ``check_and_update_config``,
where the real CUDA platform picks kernels and a worker class, is left out: what is checked is
that vLLM's config classes take semjobs' arguments for CUDA, not what a GPU would then run.
A process of its own: modules vLLM imports while the platform says CUDA keep what they read
(its sampler's kernels among them), which no later engine in that process may see.
"""

from __future__ import annotations

import json
import sys


def pass_off_as_cuda() -> None:
    # imported as on a CPU first: on CUDA they import flash attention's kernels, missing here
    # (vLLM's inspection of a draft head's architecture imports them)
    import vllm.model_executor.model_loader  # noqa: F401
    import vllm.platforms as platforms
    from vllm.platforms.interface import PlatformEnum

    cpu = platforms.current_platform

    class CudaLike(type(cpu)):
        _enum = PlatformEnum.CUDA
        device_name = device_type = "cuda"
        dispatch_key = "CUDA"

        @classmethod
        def device_count(cls) -> int:
            return 8

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return 80 * 2**30

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "NVIDIA H100 80GB HBM3"

        @classmethod
        def check_and_update_config(cls, vllm_config) -> None:
            pass

    stub = CudaLike()
    # modules that imported `current_platform` by name hold the CPU one; later imports ask
    # vllm.platforms, which answers with _current_platform
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm") and getattr(module, "current_platform", None) is cpu:
            module.current_platform = stub
    platforms._current_platform = stub


def summary(cfg) -> dict:
    spec = cfg.speculative_config
    return {
        "device_type": cfg.device_config.device_type, "model": cfg.model_config.model,
        "dtype": str(cfg.model_config.dtype), "max_model_len": cfg.model_config.max_model_len,
        "enforce_eager": cfg.model_config.enforce_eager, "load_format": cfg.load_config.load_format,
        "tensor_parallel_size": cfg.parallel_config.tensor_parallel_size,
        "world_size": cfg.parallel_config.world_size,
        "max_num_seqs": cfg.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
        "scheduler_cls": cfg.scheduler_config.scheduler_cls if isinstance(cfg.scheduler_config.scheduler_cls, str)
        else None, "async_scheduling": cfg.scheduler_config.async_scheduling,
        "block_size": cfg.cache_config.block_size, "kv_cache_memory_bytes": cfg.cache_config.kv_cache_memory_bytes,
        "gpu_memory_utilization": cfg.cache_config.gpu_memory_utilization,
        "speculative_method": spec.method if spec else None,
        "num_speculative_tokens": spec.num_speculative_tokens if spec else None,
        "kv_connector": cfg.kv_transfer_config.kv_connector if cfg.kv_transfer_config else None,
    }


def main() -> None:
    cases = json.loads(sys.stdin.read())
    pass_off_as_cuda()
    from vllm.engine.arg_utils import EngineArgs

    print(json.dumps([summary(EngineArgs(**args).create_engine_config()) for args in cases]))


if __name__ == "__main__":
    main()
