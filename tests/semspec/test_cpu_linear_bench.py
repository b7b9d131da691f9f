from __future__ import annotations

import importlib.util
from pathlib import Path

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
    out = bench._turns(fn("a"), fn("b"), 3, fn("c"))
    assert calls == ["a", "b", "c"] * 3
    assert out == {"linear_ms": 6.0, "transposed_ms": 2.0, "speedup": 2.0, "bfloat16_ms": 2.0}


def test_decode_passes_measure_both_layouts_and_restore_the_setting(tiny_dirs, tiny_cache):
    bench = _bench()
    shipped = cpu_linear.SMALL_ROWS
    out = bench.decode_passes(1, spec=str(tiny_dirs["target"]), cache_dir=str(tiny_cache))
    assert list(out) == [f"{n} sequences" for n in (1, 2, 3, 4)]
    assert all(v["linear_ms"] > 0 and v["transposed_ms"] > 0 and v["bfloat16_ms"] > 0 for v in out.values())
    assert cpu_linear.SMALL_ROWS == shipped
