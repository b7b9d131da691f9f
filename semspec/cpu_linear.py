"""Linear layers that read their weights faster in passes of a few rows on a CPU.

A decoding pass over a few sequences, or a verification pass over a few drafted tokens,
reads every weight once and does little with it: in float32 on a CPU it is bound by how
fast the weights stream from memory. torch's kernels do poorly there on the development
machine (docs/batching.md, "Few-row passes on a CPU"): nn.Linear's reads the weights once
per row up to three rows, and its kernel for four rows and more runs at a fraction of the
machine's bandwidth. So each linear layer keeps a copy of its weight in a layout made for
such passes and, for passes of a few rows, reads that:

- the packed layout, read by the C kernel beside this file (``cpu_linear.c``: panels of
  16 output columns with AVX-512, else 8 with AVX2 + FMA, each streamed once for all the
  rows of the pass), compiled on first use with the system's C compiler (``$CC``, else
  ``cc``) for the CPU's vector width into ``~/.cache/semjobs/kernels``
  (``SEMJOBS_KERNEL_CACHE``). Each output is one chain of multiply-adds in a fixed order,
  so a row's result does not depend on the other rows of its pass, nor on the vector
  width. At one torch thread it serves every pass: in passes of many rows (prefills,
  verifications of a batch) it is bound by its multiply-adds, which it issues near the
  CPU's peak, and it measured 1.8-2.8x faster than torch's float32 kernel there (its AVX2
  build 0.95-1.5x). At more threads, up to 16 rows (the kernel runs on one thread;
  torch's own, on several, wins sooner).
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
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.autograd.forward_ad as forward_ad
import torch.nn.functional as F

log = logging.getLogger(__name__)

KERNEL_SOURCE = Path(__file__).with_name("cpu_linear.c")
BUILD_FLAGS = ("-O3", "-shared", "-fPIC")
AVX2_FLAGS = ("-mavx2", "-mfma")  # panels of 8 output columns
AVX512_FLAGS = (*AVX2_FLAGS, "-mavx512f")  # panels of 16
# the most rows a pass may have to read the packed copy, at one torch thread (None: any
# pass; from 32 to 512 rows the AVX-512 build measured 1.8-2.8x torch's float32 kernel, the
# AVX2 build 0.95-1.5x, docs/batching.md) / at more (torch's kernel then runs on several
# cores, the kernel on one)
PACKED_ROWS_ONE_THREAD, PACKED_ROWS_THREADS = None, 16
TRANSPOSED_ROWS = 3  # the same for the transposed copy, when the kernel is unavailable


def kernel_cache() -> Path:
    if "SEMJOBS_KERNEL_CACHE" in os.environ:
        return Path(os.environ["SEMJOBS_KERNEL_CACHE"])
    return Path.home() / ".cache" / "semjobs" / "kernels"


def isa_flags() -> tuple[str, ...] | None:
    """The instruction-set flags the kernel is built with for this CPU (its widest vectors:
    torch reports AVX2 + FMA as AVX2), or None where it cannot run."""
    return {"AVX2": AVX2_FLAGS, "AVX512": AVX512_FLAGS}.get(torch.backends.cpu.get_cpu_capability())


@dataclass(frozen=True)
class Kernel:
    """A build of the kernel: ``matmul`` is its ``packed_linear`` (x, packed, y, M, N, K),
    ``panel`` the output columns per panel of the layout it reads."""

    matmul: ctypes._CFuncPtr
    panel: int


def load_kernel(flags: tuple[str, ...], out_dir: Path | None = None) -> Kernel:
    """The kernel built with instruction-set ``flags`` (raises where it cannot be built)."""
    lib = ctypes.CDLL(str(_compile(KERNEL_SOURCE, out_dir or kernel_cache(), flags)))
    fn = lib.packed_linear
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 3
    fn.restype = None
    return Kernel(fn, int(lib.packed_panel()))


def _compile(source: Path, out_dir: Path, flags: tuple[str, ...]) -> Path:
    """The kernel's shared library, built once per source, compiler and flags (atomically:
    processes that start together may all build it; one file wins)."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise OSError(f"no C compiler {cc!r} on PATH")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, errors="replace", timeout=30).stdout
    flags = (*BUILD_FLAGS, *flags)
    key = hashlib.sha256("\0".join([source.read_text(), cc, version, *flags]).encode()).hexdigest()[:16]
    lib = out_dir / f"cpu_linear-{key}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".so.tmp")
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, str(source), "-o", tmp], capture_output=True, text=True,
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
def packed_kernel() -> Kernel | None:
    """The kernel built for this CPU's widest vectors (the AVX2 build where an AVX-512 one
    fails, e.g. with an old compiler), or None where it cannot run here (no AVX2 + FMA, no
    compiler, a failed build: said once in the log; the transposed copy serves)."""
    flags = isa_flags()
    if flags is None:
        log.info("few-row float32 kernel off: this CPU has no AVX2")
        return None
    for attempt in dict.fromkeys((flags, AVX2_FLAGS)):
        try:
            return load_kernel(attempt)
        except Exception as e:  # noqa: BLE001 -- whatever stops the build, the layers still work without it
            error = e
    log.warning("few-row float32 kernel unavailable (%s); few-row passes read a transposed copy", error)
    return None


def fast_rows() -> int | None:
    """The most rows a float32 CPU pass may have to read the packed copy, at the current
    torch thread count (None: no limit)."""
    return PACKED_ROWS_ONE_THREAD if torch.get_num_threads() == 1 else PACKED_ROWS_THREADS


def pack(w: torch.Tensor, panel: int) -> torch.Tensor:
    """``w`` [N, K] as panels of ``panel`` output columns: [N / panel, K, panel], contiguous."""
    n, k = w.shape
    return w.reshape(n // panel, panel, k).transpose(1, 2).contiguous()


def packed_matmul(x: torch.Tensor, packed: torch.Tensor, out_features: int,
                  kernel: Kernel | None = None) -> torch.Tensor:
    """``x`` [..., K] (float32, on the CPU, at least one row) times the weight ``packed``
    holds, read by ``kernel`` (default: this CPU's build): [..., out_features]."""
    kernel = kernel or packed_kernel()
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    panel = kernel.panel
    if packed.shape != (out_features // panel, rows.shape[1], panel) or not packed.is_contiguous():
        raise ValueError(f"packed weight {tuple(packed.shape)} does not fit {out_features} x {rows.shape[1]} "
                         f"in panels of {panel}")
    y = torch.empty(rows.shape[0], out_features, dtype=torch.float32, device="cpu")
    kernel.matmul(rows.data_ptr(), packed.data_ptr(), y.data_ptr(), rows.shape[0], out_features, rows.shape[1])
    return y.reshape(*x.shape[:-1], out_features)


class SmallRowsLinear(torch.nn.Linear):
    """nn.Linear with a copy of its weight in the fast layout for passes of a few rows. The
    copy is remade when the weight's storage or version changes (a replaced weight, an
    optimizer step, ``load_state_dict``, a deep copy) and dropped when the module is moved
    or cast; writes through ``weight.data`` bypass the version counter and are not noticed."""

    _fast_weight: torch.Tensor | None = None
    # (storage address, version, panel width; 0 for the transposed copy) of the copy
    _copied: tuple[int, int, int] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (x.dtype != torch.float32 or w.dtype != torch.float32 or w.device.type != "cpu"
                or x.device.type != "cpu" or x.layout != torch.strided or w.is_inference()
                or x.numel() == 0 or x.shape[-1] != w.shape[1]  # F.linear's own result or error
                or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))
                or torch._C._functorch.is_functorch_wrapped_tensor(x) or forward_ad.unpack_dual(x).tangent is not None):
            return F.linear(x, w, self.bias)
        kernel = packed_kernel()
        packed = kernel is not None and w.shape[0] % kernel.panel == 0
        limit = fast_rows() if packed else TRANSPOSED_ROWS
        if limit is not None and x.numel() > limit * x.shape[-1]:
            return F.linear(x, w, self.bias)
        key = (w.data_ptr(), w._version, kernel.panel if packed else 0)
        if self._copied != key:
            self._fast_weight = pack(w.detach(), kernel.panel) if packed else w.detach().t().contiguous()
            self._copied = key
        y = packed_matmul(x, self._fast_weight, w.shape[0], kernel) if packed else x @ self._fast_weight
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
