"""Which device and number type a transformers model runs in on this machine."""

from __future__ import annotations

import torch

# Against torch's float32 kernels, bfloat16 wins from about 4 sequences on wherever the CPU
# has bfloat16 matrix instructions (measured on a 2-core AMX CPU, one thread, SmolLM2-135M:
# a decode pass of 1 / 8 / 32 sequences 69 / 179 / 211 ms in float32, 89 / 73 / 137 ms in
# bfloat16).
BF16_MIN_BATCH = 4
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def pick_device(device: str | torch.device = "auto") -> tuple[torch.device, torch.dtype]:
    """``"auto"``: CUDA in bfloat16 when available, otherwise CPU in float32."""
    if str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    return dev, (torch.bfloat16 if dev.type == "cuda" else torch.float32)


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU has bfloat16 matrix instructions (AMX or AVX512-BF16) that torch's
    kernels use."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def pick_dtype(device: str | torch.device = "auto", batch_size: int = 1, choice: str = "auto") -> torch.dtype:
    """The number type the models run in: ``choice`` when it names one, else bfloat16 on
    CUDA, bfloat16 on a CPU with bfloat16 instructions once ``batch_size`` reaches
    ``BF16_MIN_BATCH``; float32 otherwise."""
    if choice != "auto":
        if choice not in DTYPES:
            raise ValueError(f"unknown dtype {choice!r}; one of auto, {', '.join(DTYPES)}")
        return DTYPES[choice]
    dev, _ = pick_device(device)
    if dev.type == "cuda":
        return torch.bfloat16
    if not cpu_has_fast_bf16():
        return torch.float32
    return torch.bfloat16 if batch_size >= BF16_MIN_BATCH else torch.float32
