"""Linear layers that read their weights faster in passes of a few rows on a CPU.

A decoding pass over a few sequences, or a verification pass over a few drafted tokens,
reads every weight once and does little with it: in float32 on a CPU it is bound by how
fast the weights stream from memory. torch's kernels do poorly there on the development
machine (docs/batching.md, "Few-row passes on a CPU"): nn.Linear's reads the weights once
per row up to three rows, and its kernel for four rows and more runs at a fraction of the
machine's bandwidth. So each linear layer keeps a copy of its weight in a layout made for
such passes and, for passes of a few rows, reads that:

- the packed layout, read by the C kernel beside this file (``cpu_linear.c``: panels of 8
  output columns, each streamed once for all the rows of the pass), compiled on first use
  with the system's C compiler (``$CC``, else ``cc``) into ``~/.cache/semjobs/kernels``
  (``SEMJOBS_KERNEL_CACHE``). Each output is one chain of multiply-adds in a fixed order,
  so a row's result does not depend on the other rows of its pass. Up to 32 rows at one
  torch thread, 16 at more (the kernel runs on one thread; torch's own, on several, wins
  sooner).
- without a compiler or AVX2 + FMA, or for an output size the panels do not divide: the
  transposed copy (``x @ Wt``), which torch's kernel reads faster for one to three rows.

The copy costs memory (about the size of the weights again) and is only made where it
pays: float32 on a CPU (in bfloat16 torch's kernels are faster), with no gradient wanted
(the kernel has no backward, forward-mode or functorch rule: such passes use F.linear).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch
import torch.autograd.forward_ad as forward_ad
import torch.nn.functional as F

log = logging.getLogger(__name__)

KERNEL_SOURCE = Path(__file__).with_name("cpu_linear.c")
KERNEL_FLAGS = ("-O3", "-mavx2", "-mfma", "-shared", "-fPIC")
PANEL = 8  # output columns per panel of the packed layout
# the most rows a pass may have to read the packed copy, at one torch thread / at more
PACKED_ROWS_ONE_THREAD, PACKED_ROWS_THREADS = 32, 16
TRANSPOSED_ROWS = 3  # the same for the transposed copy, when the kernel is unavailable


def kernel_cache() -> Path:
    if "SEMJOBS_KERNEL_CACHE" in os.environ:
        return Path(os.environ["SEMJOBS_KERNEL_CACHE"])
    return Path.home() / ".cache" / "semjobs" / "kernels"


def has_avx2() -> bool:
    """Whether this CPU runs the kernel's instructions (AVX2 and FMA; torch reports both as
    AVX2, and AVX-512 hosts have them too)."""
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _compile(source: Path, out_dir: Path) -> Path:
    """The kernel's shared library, built once per source, compiler and flags (atomically:
    processes that start together may all build it; one file wins)."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise OSError(f"no C compiler {cc!r} on PATH")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, errors="replace", timeout=30).stdout
    key = hashlib.sha256("\0".join([source.read_text(), cc, version, *KERNEL_FLAGS]).encode()).hexdigest()[:16]
    lib = out_dir / f"cpu_linear-{key}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".so.tmp")
    os.close(fd)
    try:
        done = subprocess.run([cc, *KERNEL_FLAGS, str(source), "-o", tmp], capture_output=True, text=True,
                              errors="replace", timeout=120)
        if done.returncode != 0:
            raise OSError(f"{cc} failed: {done.stderr.strip()[-500:]}")
        os.chmod(tmp, 0o755)  # mkstemp's 0600 would keep a shared cache from other users
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


@lru_cache(maxsize=1)
def packed_kernel():
    """The compiled ``packed_linear`` function, or None where it cannot run here (no AVX2 +
    FMA, no compiler, a failed build: said once in the log; the transposed copy serves)."""
    if not has_avx2():
        log.info("few-row float32 kernel off: this CPU has no AVX2")
        return None
    try:
        fn = ctypes.CDLL(str(_compile(KERNEL_SOURCE, kernel_cache()))).packed_linear
    except Exception as e:  # noqa: BLE001 -- whatever stops the build, the layers still work without it
        log.warning("few-row float32 kernel unavailable (%s); few-row passes read a transposed copy", e)
        return None
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 3
    fn.restype = None
    return fn


def fast_rows() -> int:
    """The most rows a float32 CPU pass may have to read the packed copy, at the current
    torch thread count."""
    return PACKED_ROWS_ONE_THREAD if torch.get_num_threads() == 1 else PACKED_ROWS_THREADS


def pack(w: torch.Tensor) -> torch.Tensor:
    """``w`` [N, K] as panels of ``PANEL`` output columns: [N / PANEL, K, PANEL], contiguous."""
    n, k = w.shape
    return w.reshape(n // PANEL, PANEL, k).transpose(1, 2).contiguous()


def packed_matmul(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """``x`` [..., K] (float32, on the CPU, at least one row) times the weight ``packed``
    holds: [..., out_features]."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    if packed.shape != (out_features // PANEL, rows.shape[1], PANEL) or not packed.is_contiguous():
        raise ValueError(f"packed weight {tuple(packed.shape)} does not fit {out_features} x {rows.shape[1]}")
    y = torch.empty(rows.shape[0], out_features, dtype=torch.float32, device="cpu")
    packed_kernel()(rows.data_ptr(), packed.data_ptr(), y.data_ptr(), rows.shape[0], out_features, rows.shape[1])
    return y.reshape(*x.shape[:-1], out_features)


class SmallRowsLinear(torch.nn.Linear):
    """nn.Linear with a copy of its weight in the fast layout for passes of a few rows. The
    copy is remade when the weight's storage or version changes (a replaced weight, an
    optimizer step, ``load_state_dict``, a deep copy) and dropped when the module is moved
    or cast; writes through ``weight.data`` bypass the version counter and are not noticed."""

    _fast_weight: torch.Tensor | None = None
    _copied: tuple[int, int, bool] | None = None  # (storage address, version, packed) of the copy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (x.dtype != torch.float32 or w.dtype != torch.float32 or w.device.type != "cpu"
                or x.device.type != "cpu" or x.layout != torch.strided or w.is_inference()
                or x.numel() == 0 or x.shape[-1] != w.shape[1]  # F.linear's own result or error
                or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))
                or torch._C._functorch.is_functorch_wrapped_tensor(x) or forward_ad.unpack_dual(x).tangent is not None):
            return F.linear(x, w, self.bias)
        packed = packed_kernel() is not None and w.shape[0] % PANEL == 0
        if x.numel() > (fast_rows() if packed else TRANSPOSED_ROWS) * x.shape[-1]:
            return F.linear(x, w, self.bias)
        key = (w.data_ptr(), w._version, packed)
        if self._copied != key:
            self._fast_weight = pack(w.detach()) if packed else w.detach().t().contiguous()
            self._copied = key
        y = packed_matmul(x, self._fast_weight, w.shape[0]) if packed else x @ self._fast_weight
        return y if self.bias is None else y + self.bias

    def _apply(self, fn, *args, **kwargs):
        self._fast_weight = self._copied = None
        return super()._apply(fn, *args, **kwargs)


def use_small_rows_linears(model: torch.nn.Module) -> int:
    """Make the plain nn.Linear layers of ``model`` SmallRowsLinear, in place (the modules,
    their parameters and tied weights stay what they are); returns how many. Only for
    float32 models on a CPU: elsewhere it changes nothing."""
    params = list(model.parameters())
    if not params or params[0].device.type != "cpu" or params[0].dtype != torch.float32:
        return 0
    n = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = SmallRowsLinear
            n += 1
    return n
