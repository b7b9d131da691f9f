from __future__ import annotations

import copy
import os
import shutil

import pytest
import torch
import torch.autograd.forward_ad as forward_ad
import torch.nn.functional as F

from semspec import cpu_linear
from semspec.cpu_linear import SmallRowsLinear, use_small_rows_linears
from semspec.testing import tiny_model, tiny_tokenizer


def _linear(out_features=48, in_features=32, bias=True, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(in_features, out_features, bias=bias)
    lin.__class__ = SmallRowsLinear
    return lin


needs_kernel = pytest.mark.skipif(cpu_linear.packed_kernel() is None,
                                  reason="no C compiler or no AVX2 here: the packed kernel cannot run")
can_build = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None or cpu_linear.isa_flags() is None,
                               reason="no C compiler or no AVX2 here")


def _panel() -> int:
    return cpu_linear.packed_kernel().panel


@can_build
def test_the_packed_kernel_builds_where_there_is_a_compiler_and_avx2():
    assert cpu_linear.packed_kernel() is not None


@pytest.mark.parametrize("panel", [8, 16])
def test_pack_lays_out_panels_of_output_columns(panel):
    w = torch.arange(32 * 3, dtype=torch.float32).reshape(32, 3)
    p = cpu_linear.pack(w, panel)
    assert p.shape == (32 // panel, 3, panel) and p.is_contiguous()
    for n in range(32):
        for k in range(3):
            assert p[n // panel, k, n % panel] == w[n, k]


@can_build
def test_the_build_matches_the_cpus_widest_vectors():
    assert cpu_linear.packed_kernel().panel == (16 if cpu_linear.isa_flags() == cpu_linear.AVX512_FLAGS else 8)


@needs_kernel
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("in_features", [32, 37])  # a row length the 8-wide loads do not divide
def test_few_rows_read_the_packed_copy_and_match_linear(bias, in_features):
    lin = _linear(out_features=48, in_features=in_features, bias=bias)
    with torch.no_grad():
        for rows in range(1, (cpu_linear.fast_rows() or 40) + 1):
            x = torch.randn(rows, in_features)
            torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        # transformers' shape [batch, positions, features], and a strided view
        x = torch.randn(2, 3, in_features * 2)[..., ::2]
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lin._fast_weight, cpu_linear.pack(lin.weight, _panel()))


@needs_kernel
def test_a_rows_result_does_not_depend_on_the_other_rows_of_its_pass():
    # 7 panels: the four-panel path leaves a one-panel tail; up to 40 rows: one, two and
    # three balanced blocks of the one-panel path
    n = 7 * _panel()
    w = torch.randn(n, 40)
    packed = cpu_linear.pack(w, _panel())
    x = torch.randn(40, 40)
    alone = torch.cat([cpu_linear.packed_matmul(x[i:i + 1], packed, n) for i in range(len(x))])
    torch.testing.assert_close(alone, x @ w.t(), rtol=1e-5, atol=1e-5)
    for rows in range(1, len(x) + 1):
        assert torch.equal(cpu_linear.packed_matmul(x[:rows], packed, n), alone[:rows])


@pytest.mark.skipif(cpu_linear.isa_flags() != cpu_linear.AVX512_FLAGS or cpu_linear.packed_kernel() is None,
                    reason="no AVX-512 build here")
def test_the_avx512_build_computes_what_the_avx2_build_does_bit_for_bit(tmp_path):
    wide, narrow = cpu_linear.packed_kernel(), cpu_linear.load_kernel(cpu_linear.AVX2_FLAGS, tmp_path)
    assert (wide.panel, narrow.panel) == (16, 8)
    w, x = torch.randn(7 * 16, 40), torch.randn(40, 40)
    for rows in range(1, len(x) + 1):
        assert torch.equal(cpu_linear.packed_matmul(x[:rows], cpu_linear.pack(w, 16), len(w), wide),
                           cpu_linear.packed_matmul(x[:rows], cpu_linear.pack(w, 8), len(w), narrow))


@needs_kernel
def test_inputs_the_kernel_cannot_take_get_linears_answer():
    lin = _linear()
    with torch.no_grad():
        assert lin(torch.randn(0, 32)).shape == (0, 48)
        with pytest.raises(RuntimeError):
            lin(torch.randn(1, 64))  # the wrong row length: F.linear's error, not a read past the weight
        with torch.device("meta"):
            y = lin(torch.randn(1, 32, device="cpu"))
        assert y.device.type == "cpu"
    with pytest.raises(ValueError):
        cpu_linear.packed_matmul(torch.randn(1, 16), cpu_linear.pack(torch.randn(48, 32), _panel()), 48)
    x, t = torch.randn(1, 32), torch.randn(1, 32)
    lin.weight.requires_grad_(False)
    with torch.no_grad(), forward_ad.dual_level():  # forward-mode derivatives survive
        tangent = forward_ad.unpack_dual(lin(forward_ad.make_dual(x, t))).tangent
    torch.testing.assert_close(tangent, t @ lin.weight.t())


def test_without_the_kernel_few_rows_read_the_transposed_copy(monkeypatch):
    monkeypatch.setattr(cpu_linear, "packed_kernel", lambda: None)
    lin = _linear()
    with torch.no_grad():
        for rows in range(1, cpu_linear.TRANSPOSED_ROWS + 1):
            x = torch.randn(rows, 32)
            torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lin._fast_weight, lin.weight.t())
        x = torch.randn(cpu_linear.TRANSPOSED_ROWS + 1, 32)
        assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))


def test_output_sizes_the_panels_do_not_divide_read_the_transposed_copy():
    lin = _linear(out_features=50)
    with torch.no_grad():
        x = torch.randn(2, 32)
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lin._fast_weight, lin.weight.t())
        x = torch.randn(cpu_linear.TRANSPOSED_ROWS + 1, 32)
        assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))


def test_at_several_threads_more_rows_use_linears_own_kernel_and_make_no_copy():
    lin = _linear()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert cpu_linear.fast_rows() == cpu_linear.PACKED_ROWS_THREADS
        x = torch.randn(cpu_linear.fast_rows() + 1, 32)
        with torch.no_grad():
            assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))
        assert lin._fast_weight is None
    finally:
        torch.set_num_threads(threads)


@needs_kernel
def test_at_one_thread_every_pass_reads_the_packed_copy():
    lin = _linear()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert cpu_linear.fast_rows() is None
        x = torch.randn(300, 32)  # a prefill's worth of rows
        with torch.no_grad():
            y = lin(x)
        assert lin._fast_weight is not None
        torch.testing.assert_close(y, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(cpu_linear.isa_flags() is None, reason="no AVX2 here: no build is tried")
@pytest.mark.parametrize("compiler", ["no-such-compiler", "false"])  # missing; present but failing
def test_a_failed_build_leaves_the_transposed_copy_and_says_why(monkeypatch, tmp_path, caplog, compiler):
    monkeypatch.setenv("CC", compiler)
    monkeypatch.setenv("SEMJOBS_KERNEL_CACHE", str(tmp_path))
    cpu_linear.packed_kernel.cache_clear()
    try:
        with caplog.at_level("WARNING"):
            assert cpu_linear.packed_kernel() is None
        assert compiler in caplog.text
        assert list(tmp_path.iterdir()) == []  # no half-written library left behind
    finally:
        cpu_linear.packed_kernel.cache_clear()


@pytest.mark.skipif(cpu_linear.isa_flags() != cpu_linear.AVX512_FLAGS or shutil.which("cc") is None,
                    reason="no AVX-512 here")
def test_where_the_avx512_build_fails_the_avx2_build_serves(monkeypatch, tmp_path):
    built = cpu_linear.load_kernel
    monkeypatch.setenv("SEMJOBS_KERNEL_CACHE", str(tmp_path))

    def no_avx512(flags, out_dir=None):
        if "-mavx512f" in flags:
            raise OSError("cc: unrecognized option -mavx512f")
        return built(flags, out_dir)

    monkeypatch.setattr(cpu_linear, "load_kernel", no_avx512)
    cpu_linear.packed_kernel.cache_clear()
    try:
        assert cpu_linear.packed_kernel().panel == 8
    finally:
        cpu_linear.packed_kernel.cache_clear()


@can_build
def test_the_build_is_made_once_per_source_compiler_and_flags(tmp_path):
    flags = cpu_linear.isa_flags()
    lib = cpu_linear._compile(cpu_linear.KERNEL_SOURCE, tmp_path, flags)
    stamp = lib.stat().st_mtime_ns
    assert cpu_linear._compile(cpu_linear.KERNEL_SOURCE, tmp_path, flags) == lib and lib.stat().st_mtime_ns == stamp
    other = tmp_path / "changed.c"
    other.write_text(cpu_linear.KERNEL_SOURCE.read_text() + "\n/* changed */\n")
    assert cpu_linear._compile(other, tmp_path, flags) != lib
    assert cpu_linear._compile(cpu_linear.KERNEL_SOURCE, tmp_path, (*flags, "-fno-unroll-loops")) != lib
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".c", ".so", ".so", ".so"]  # no temporary left


def test_the_copy_follows_the_weight():
    lin = _linear()
    x = torch.randn(1, 32)
    with torch.no_grad():
        lin(x)
        lin.weight.mul_(2.0)  # an optimizer step between two evaluations
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-6)
        lin.weight = torch.nn.Parameter(torch.randn(48, 32))  # the weight replaced
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-6)
        twin = copy.deepcopy(lin)  # its weight restarts at version 0: one step brings it to 1
        twin.weight.add_(1.0)
        torch.testing.assert_close(twin(x), F.linear(x, twin.weight, twin.bias), rtol=1e-5, atol=1e-6)
        lin.bfloat16().float()  # cast and back: other values, version 0 again
        assert lin._fast_weight is None
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-6)


def test_training_keeps_gradients():
    lin = _linear()
    y = lin(torch.randn(1, 32)).sum()
    y.backward()
    assert lin.weight.grad is not None and lin._fast_weight is None


def test_bfloat16_uses_linear():
    lin = _linear().to(torch.bfloat16)
    x = torch.randn(1, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))
    assert lin._fast_weight is None


def test_model_swap_keeps_tied_weights_and_outputs():
    tok = tiny_tokenizer()
    model = tiny_model(tok)
    model.lm_head.weight = model.model.embed_tokens.weight  # tie, as SmolLM2 does
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        before = model(ids).logits
        n = use_small_rows_linears(model)
        # 7 linear layers per decoder layer (q, k, v, o, gate, up, down) and the LM head
        assert n == 7 * model.config.num_hidden_layers + 1
        assert all(type(m) is SmallRowsLinear for m in model.modules() if isinstance(m, torch.nn.Linear))
        assert model.lm_head.weight is model.model.embed_tokens.weight
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(ids[:, :1]).logits, before[:, :1], rtol=1e-5, atol=1e-5)
    assert model.lm_head._fast_weight is not None  # the one-token pass read the copies
    assert use_small_rows_linears(tiny_model(tok).to(torch.bfloat16)) == 0


def test_loaded_models_swap(tiny_target):
    assert all(type(m) is SmallRowsLinear for m in tiny_target.model.modules() if isinstance(m, torch.nn.Linear))
