"""Linear layers that read their weights faster in passes of a few rows on a CPU.

A decoding pass over one or two sequences reads every weight once and does little with
it: in float32 on a CPU it is bound by memory bandwidth. torch's kernel for nn.Linear's
layout (``x @ W.T``, W stored [out, in]) streams W more slowly there than its kernel for
``x @ Wt`` with the transpose stored [in, out]: 1.5-2x faster for one to three rows on
the development machine's 2 CPU cores, but 0.7-0.95x from four rows on, where the
product is no longer bandwidth-bound (``benchmarks/cpu_linear.py``; docs/batching.md, "Few-row passes
on a CPU"). So each linear layer keeps both layouts: passes of at most ``SMALL_ROWS``
rows read the transposed copy, made on first use, and larger ones nn.Linear's own
kernel. The copy costs memory (about the size of the weights again) and is only made
where it pays: float32 on a CPU (in bfloat16 the transposed kernel is slower at every
size), with no gradient wanted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The most rows (tokens in one pass, over all its sequences) that read the transposed copy.
SMALL_ROWS = 3


class SmallRowsLinear(torch.nn.Linear):
    """nn.Linear with a transposed copy of its weight for passes of a few rows. The copy is
    remade when the weight's storage or version changes (a replaced weight, an optimizer
    step, ``load_state_dict``, a deep copy) and dropped when the module is moved or cast;
    writes through ``weight.data`` bypass the version counter and are not noticed."""

    _weight_t: torch.Tensor | None = None
    _copied: tuple[int, int] | None = None  # (storage address, version) of the weight copied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (x.numel() > SMALL_ROWS * x.shape[-1] or x.dtype != torch.float32 or w.dtype != torch.float32
                or w.device.type != "cpu" or w.is_inference() or (w.requires_grad and torch.is_grad_enabled())):
            return F.linear(x, w, self.bias)
        key = (w.data_ptr(), w._version)
        if self._copied != key:
            # a normal tensor even inside inference_mode, so later autograd passes may read it
            with torch.inference_mode(False):
                self._weight_t = w.detach().t().contiguous()
            self._copied = key
        y = x @ self._weight_t
        return y if self.bias is None else y + self.bias

    def _apply(self, fn, *args, **kwargs):
        self._weight_t = self._copied = None
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
