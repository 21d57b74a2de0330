"""Every generated Pallas kernel goes through the real Pallas -> Triton lowering, on the CPU.

``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`` runs Pallas's Triton
lowering (jaxpr -> Triton IR, serialized into the HLO; jaxlib 0.10 compiles it to PTX only
on the GPU) without a GPU. That is where "Unimplemented primitive" (e.g. slicing a loaded
value) and "every array must have power-of-two size" are raised, so these tests catch
them before a device run does; interpret mode (the other CPU tests) accepts both.

Covered per spec: forward, the three backward kernels (``tensor_product_vjp``; for a
channelwise product the fused backward instead, and the three through its VJP), the
weighted-only kernels (second-order VJP through ``backward_w``) and, with ``conv = true``,
the four conv kernels. Not covered: Triton's own compilation (PTX, register allocation),
which only a GPU run shows.
"""

from __future__ import annotations

import re

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402

from eqdsl.runtime.jax import launch as rt  # noqa: E402
from test_jax_ops import EXAMPLES, MIXED, Built, build, spec_text  # noqa: E402

B = 64  # rows (a multiple of every default block)
S = jax.ShapeDtypeStruct


def _lower(fn, *args) -> str:
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _kernel_calls(text: str) -> int:
    return text.count("__gpu$xla.gpu.triton") + text.count("triton_kernel_call")


def _check_lowers(ops, dtype="float32"):
    wshape = (ops.WEIGHT_NUMEL,) if ops.SHARED_WEIGHTS else (B, ops.WEIGHT_NUMEL)
    x1, x2, w, g = S((B, ops.DIM_IN1), dtype), S((B, ops.DIM_IN2), dtype), S(wshape, dtype), S((B, ops.DIM_OUT), dtype)
    n = _kernel_calls(_lower(lambda a, b, c: ops.tensor_product(a, b, c, interpret=False), x1, x2, w))
    assert n >= 1, "no Triton kernel in the lowered forward"
    vjp = lambda a, b, c, d: ops.tensor_product_vjp(a, b, c, d, interpret=False)  # noqa: E731
    # a channelwise product's vjp is its fused backward (eqdsl.backends.pallas.fused), unless
    # the spec turns it off for the plain product (pallas_fuse_bwd = 0)
    fused = ops._kernels.BWD_FUSED_KERNELS if ops.KERNEL_OPS.bwd is not None else None
    assert _kernel_calls(_lower(vjp, x1, x2, w, g)) >= (len(fused) if fused else 3)
    if fused:  # and the forward's VJP calls it
        grads = jax.grad(lambda a, b, c: jnp.sum(ops.tensor_product(a, b, c, interpret=False)), argnums=(0, 1, 2))
        assert "bwd_fused_kernel" in _lower(grads, x1, x2, w)
    if ops.WEIGHT_NUMEL:
        # derivatives of <grad_W, c> run backward_w's VJP: the weighted-only kernels
        def second(a, b, c, d):
            return jax.grad(lambda a, b, d: jnp.sum(vjp(a, b, c, d)[2] * c), argnums=(0, 1, 2))(a, b, d)

        assert _kernel_calls(_lower(second, x1, x2, w, g)) >= 3
    if hasattr(ops, "conv"):
        nodes, edges = 16, B
        x = S((nodes, ops.DIM_IN1), dtype)
        y = S((edges, ops.DIM_IN2), dtype)
        cw = S((ops.WEIGHT_NUMEL,) if ops.SHARED_WEIGHTS else (edges, ops.WEIGHT_NUMEL), dtype)
        idx = S((edges,), jnp.int32)

        def energy_grads(a, b, c, s, d):
            e = lambda a, b, c: jnp.sum(ops.conv(a, b, c, s, d, nodes, interpret=False) ** 2)  # noqa: E731
            return jax.grad(e, argnums=(0, 1, 2))(a, b, c)

        text = _lower(energy_grads, x, y, cw, idx, idx)
        # forward + three backward kernels, or a channelwise conv's fused backward: forward,
        # the fused kernels and the segment sum of their dF/dx messages
        conv_fused = ops.CONV_OPS.bwd is not None
        assert _kernel_calls(text) >= (3 if conv_fused else 4)
        assert ("bwd_fused_kernel" in text) == conv_fused
        assert ("_segment_rows" in text) == conv_fused


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_kernels_lower_for_cuda(tmp_path_factory, path):
    _check_lowers(Built(path, tmp_path_factory.mktemp("lower")).ops)


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
@pytest.mark.parametrize("shared", [False, True])
def test_mixed_spec_kernels_lower_for_cuda(tmp_path_factory, layout, shared):
    """Every mode, unweighted paths, multiplicities 2, 3, 5 (padded lanes: masked stores)
    and strided uvu weights, in both layouts."""
    ops = build(spec_text("lower_mixed", **MIXED, shared=shared, layout=layout), tmp_path_factory.mktemp("lower")).ops
    _check_lowers(ops, "float64")


@pytest.mark.parametrize("split,mode", [(False, "uvu"), (True, "uvu"), (True, "uvw")])
def test_fused_backward_kernels_lower_for_cuda(tmp_path_factory, monkeypatch, split, mode):
    """The fused backward of a channelwise product with multiplicities 4, 3 and 2 (padded
    lanes: ``load_vec`` / ``store_vec``), as one kernel and split over several; of a fully
    connected one (``uvw``: a loop over the x1 channel, one-column ``dF/dx1`` stores at a
    traced column) as a conv too, its loops unrolled (``pallas_unroll``)."""
    from eqdsl.backends.pallas import plan

    if split:
        monkeypatch.setattr(plan, "MAX_TERMS_PER_KERNEL", 100)
    out = "0e+1o+2e" if mode == "uvu" else "3x0e+2x1o+3x2e"
    text = spec_text("lower_fused", "4x0e+3x1o+2x2e", "0e+1o+2e", out, mode=mode, shared=False)
    if mode == "uvw":  # and its channel loops two steps per iteration
        text += "conv = true\n[tensor_product.tuning]\npallas_unroll = 2\n"
    ops = build(text, tmp_path_factory.mktemp("lower")).ops
    assert (len(ops._kernels.BWD_FUSED_KERNELS) > 1) == split
    _check_lowers(ops, "float64")


def test_lowering_check_catches_a_non_power_of_two_value():
    """The check above can fail: a kernel loading a (rows, 3) value does not lower."""
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[:, pl.ds(0, 3)] = x_ref[:, pl.ds(0, 3)]

    def f(x):
        return pl.pallas_call(kernel, out_shape=S((8, 4), x.dtype), grid=(1,),
                              in_specs=[pl.BlockSpec((8, 4), lambda i: (i, 0))],
                              out_specs=pl.BlockSpec((8, 4), lambda i: (i, 0)),
                              compiler_params=rt.compiler_params(False))(x)

    with pytest.raises(Exception, match="power of 2"):
        _lower(f, S((8, 4), jnp.float32))


def test_pallas_tuning_pairs_pin_block_batch_and_num_warps():
    """The ``pallas_*`` tuning keys become the generated module constants; a block batch that
    is not a power of two is refused before anything is generated (``eqdsl.backends.check_tuning``,
    with this backend's ``tuning.validate``)."""
    from eqdsl.backends.pallas import assemble, tuning
    from eqdsl.lower import lower
    from eqdsl.spec import load_spec

    ir = lower(load_spec(EXAMPLES[0])[0])
    text = assemble.render_files(ir, "", tuning=(("pallas_block_batch", 16), ("pallas_num_warps", 8)))
    assert "\nBLOCK_BATCH = 16\n" in text["pallas_kernels.py"] and "\nNUM_WARPS = 8\n" in text["pallas_kernels.py"]
    default = assemble.render_files(ir, "")["pallas_kernels.py"]
    assert f"\nNUM_WARPS = {tuning.DEFAULT_NUM_WARPS}\n" in default
    from eqdsl.backends import check_tuning
    from eqdsl.errors import SpecError
    from eqdsl.spec import parse_spec

    bad = EXAMPLES[0].read_text().split("[tensor_product.tuning")[0] + "\n[tensor_product.tuning]\npallas_block_batch = 12\n"
    with pytest.raises(SpecError, match="power of two"):
        check_tuning(parse_spec(bad, "bad.toml")[0])
    with pytest.raises(ValueError, match="power of two"):
        tuning.validate("pallas_block_batch", 12)
    tuning.validate("pallas_block_batch", 16)
    # per-dtype blocks: the same test, for one dtype's calls; a dtype eqdsl does not generate is an unknown key
    text = assemble.render_files(ir, "", tuning=(("pallas_block_batch_float64", 2), ("pallas_segment_edges_float64", 1)))
    assert '\nBLOCK_BATCH_BY_DTYPE = {"float64": 2}\n' in text["pallas_kernels.py"]
    assert '\nBLOCK_BATCH_BY_DTYPE = {}\n' in default
    with pytest.raises(SpecError, match="power of two"):
        check_tuning(parse_spec(bad.replace("pallas_block_batch = 12", "pallas_block_batch_float64 = 3"), "bad.toml")[0])
    f32_only = bad.replace('"float32", "float64"', '"float32"').replace("pallas_block_batch = 12", "pallas_block_batch_float64 = 2")
    assert f32_only != bad.replace("pallas_block_batch = 12", "pallas_block_batch_float64 = 2")
    with pytest.raises(SpecError, match="does not generate float64"):
        check_tuning(parse_spec(f32_only, "bad.toml")[0])
    # a per-dtype conv split accepts what pallas_conv_max_terms does (not a power of two)
    check_tuning(parse_spec(bad.replace("pallas_block_batch = 12", "pallas_conv_max_terms_float64 = 48"), "ok.toml")[0])
    with pytest.raises(SpecError, match="at least 1"):
        check_tuning(parse_spec(bad.replace("pallas_block_batch = 12", "pallas_conv_max_terms_float64 = 0"), "bad.toml")[0])
    with pytest.raises(SpecError, match="pallas_block_batch_float16"):
        check_tuning(parse_spec(bad.replace("pallas_block_batch = 12", "pallas_block_batch_float16 = 2"), "bad.toml")[0])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fma_chains_lower_for_cuda(tmp_path_factory, dtype):
    """``pallas_fma = 1``: every kernel's sums as ``rt.fma`` chains, inline PTX ``fma.rn`` on
    the GPU (``pltriton.elementwise_inline_asm``), through Pallas's Triton lowering; a
    conv spec with unweighted paths and every mode (plain, weighted-only and conv kernels);
    with ``pallas_factor = 1``, so the factored sums' narrow temporaries lower too."""
    text = spec_text("lower_fma", **MIXED) + 'conv = true\n[tensor_product.tuning]\npallas_fma = 1\npallas_factor = 1\n'
    ops = build(text, tmp_path_factory.mktemp("lower")).ops
    source = open(ops._kernels.__file__).read()
    assert "rt.fma(" in source and "nf1 = " in source
    _check_lowers(ops, dtype)


def test_conv_kernel_families_per_dtype_lower_for_cuda(tmp_path_factory):
    """``pallas_conv_max_terms_float64`` (a conv family of float64's own, one output group per
    kernel) lowers in float64: a float64 conv launches its kernels, as one launch over a
    (node, kernel) grid (``launch.SEGMENT_PARTS``), a float32 one the conv's, one kernel."""
    text = spec_text("lower_dtype_conv", **MIXED) + 'conv = true\n[tensor_product.tuning]\npallas_conv_max_terms_float64 = 1\n'
    ops = build(text, tmp_path_factory.mktemp("lower")).ops
    assert len(ops._kernels.CONV_FLOAT64_FWD_KERNELS) > 1 == len(ops._kernels.CONV_FWD_KERNELS)
    _check_lowers(ops, "float64")
    nodes, edges = 16, B
    idx = S((edges,), jnp.int32)
    for dtype, family in (("float64", True), ("float32", False)):
        x, y = S((nodes, ops.DIM_IN1), dtype), S((edges, ops.DIM_IN2), dtype)
        text = _lower(lambda a, b, c, s, d: ops.conv(a, b, c, s, d, nodes, interpret=False), x, y,
                      S((edges, ops.WEIGHT_NUMEL), dtype), idx, idx)
        assert ("_conv_float64_fwd_kernel_" in text) == family, dtype
        assert ("_parts" in text) == family, dtype


def test_num_warps_per_dtype_lower_for_cuda(tmp_path_factory):
    """``pallas_num_warps_float64 = 2``: every kernel a float64 call launches (plain product and
    conv, forward and backward) is compiled with 2 warps, every float32 one with
    ``pallas_num_warps`` (8 here)."""
    text = spec_text("lower_dtype_warps", **MIXED) + ('conv = true\n[tensor_product.tuning]\npallas_num_warps = 8\n'
                                                       'pallas_num_warps_float64 = 2\n')
    ops = build(text, tmp_path_factory.mktemp("lower")).ops
    nodes, edges = 16, B
    idx = S((edges,), jnp.int32)
    for dtype, warps in (("float64", 2), ("float32", 8)):
        x1, x2, w, g = (S((B, ops.DIM_IN1), dtype), S((B, ops.DIM_IN2), dtype), S((B, ops.WEIGHT_NUMEL), dtype),
                        S((B, ops.DIM_OUT), dtype))
        x = S((nodes, ops.DIM_IN1), dtype)

        def everything(a, b, c, d, xn, s, t):
            tp = jax.vjp(lambda a, b, c: ops.tensor_product(a, b, c, interpret=False), a, b, c)[1](d)
            e = lambda xn, b, c: jnp.sum(ops.conv(xn, b, c, s, t, nodes, interpret=False) ** 2)  # noqa: E731
            return tp, jax.grad(e, argnums=(0, 1, 2))(xn, b, c)

        lowered = _lower(everything, x1, x2, w, g, x, idx, idx)
        found = re.findall(r"num_warps = (\d+) : i32", lowered)
        assert len(found) == _kernel_calls(lowered) >= 4, dtype
        assert set(found) == {str(warps)}, (dtype, set(found))
