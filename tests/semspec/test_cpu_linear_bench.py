from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from semspec import cpu_linear

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_linear.py"


def _bench():
    spec = importlib.util.spec_from_file_location("cpu_linear_bench", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_turns_alternate_and_take_medians():
    bench = _bench()
    calls = []
    times = iter([4.0, 2.0, 1.0, 6.0, 3.0, 2.0, 8.0, 2.0, 5.0])
    fn = lambda name: lambda: calls.append(name) or next(times)  # noqa: E731
    out = bench._turns({"a": fn("a"), "b": fn("b"), "c": fn("c")}, 3)
    assert calls == ["a", "b", "c"] * 3
    assert out == {"a_ms": 6.0, "b_ms": 2.0, "c_ms": 2.0, "b_speedup": 2.0, "c_speedup": 3.0}


def test_layouts_are_forced_for_the_block_and_restored():
    bench = _bench()
    lin = torch.nn.Linear(32, 48)
    lin.__class__ = cpu_linear.SmallRowsLinear
    x = torch.randn(2, 32)
    kernel = cpu_linear.packed_kernel
    with torch.no_grad():
        with bench.layout("linear"):
            lin(x)
            assert lin._fast_weight is None
        with bench.layout("transposed"):
            lin(x)
            assert lin._fast_weight.shape == (32, 48)
        if kernel() is not None:
            panel = kernel().panel
            with bench.layout("packed"):
                lin(x)
                assert lin._fast_weight.shape == (48 // panel, 32, panel)
        if "packed_avx2" in bench.layouts():
            with bench.layout("packed_avx2"):
                lin(x)
                assert lin._fast_weight.shape == (6, 32, 8)
    assert cpu_linear.packed_kernel is kernel and cpu_linear.TRANSPOSED_ROWS == 3


def test_model_passes_measure_every_layout(tiny_dirs, tiny_cache):
    bench = _bench()
    out = bench.model_passes(1, spec=str(tiny_dirs["target"]), cache_dir=str(tiny_cache))
    assert list(out) == [f"{n} sequences x 1 tokens" for n in (1, 2, 3, 4, 8)] + [
        f"1 sequences x {t} tokens" for t in (4, 8, 16, 24)]
    for v in out.values():
        assert all(v[f"{name}_ms"] > 0 for name in bench.layouts())
        assert set(v) == {f"{n}_ms" for n in bench.layouts()} | {f"{n}_speedup" for n in bench.layouts()[1:]}
