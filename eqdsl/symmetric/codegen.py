"""Generated package of a symmetric contraction: ``generate_symmetric(ir, out_dir)``.

Writes ``out_dir/<name>/`` (``out_dir`` importable, as ``eqdsl.codegen.generate`` lays it out)::

    __init__.py                    metadata (irreps, correlation, weight layout, ...)
    helion_symmetric_kernels.py    the Helion kernels (``eqdsl.symmetric.helion``)
    torch_symmetric.py             the torch custom ops (``eqdsl.runtime.torch.symmetric``)

Every file starts with the regenerate header of ``eqdsl.codegen.generate``; the files are a
function of the IR, the block sizes and the header (deterministic); writing is atomic per
package and refuses a directory eqdsl did not write (``write_package``). No Triton code is
lowered ahead of time yet: the torch ops launch the Helion kernels through Helion.

Both frameworks in one package: ``write_package(out_dir, symmetric_files(ir, header=h) |
eqdsl.symmetric.pallas.jax_files(ir, header=h))`` (one header ``h`` for every file);
``generate_symmetric`` alone replaces the whole package with the torch half.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .. import __version__
from ..backends.render import render
from ..codegen.package import MARKER, write_package
from . import helion
from .ir import SymmetricContractionIR
from .terms import terms_file

__all__ = ["common_files", "symmetric_files", "generate_symmetric"]

_TORCH_DTYPES = {"float32": "torch.float32", "float64": "torch.float64"}


def _header(ir: SymmetricContractionIR, command: str | None) -> str:
    digest = hashlib.sha256(ir.to_json().encode()).hexdigest()
    command = command or f"eqdsl.symmetric.codegen.generate_symmetric(<IR {ir.name}>, <out_dir>)"
    return (f"{MARKER} {__version__} from the symmetric contraction IR {ir.name} (sha256 {digest[:16]}). "
            f"Do not edit.\n# Regenerate with: {command}\n")


def common_files(ir: SymmetricContractionIR, *, header: str | None = None) -> dict[str, str]:
    """``{"<name>/__init__.py": ..., "<name>/terms.py": ...}``: the files both halves of a package
    share, the metadata and the IR's nonzeros (``eqdsl.symmetric.terms``), from which each
    framework's runtime builds its kernels' tables."""
    header = header or _header(ir, None)
    init = render(
        "symmetric_init.py.j2", header=header, name=ir.name, irreps_in=repr(ir.irreps_in),
        irreps_out=repr(ir.irreps_out), mul=ir.mul, correlation=repr(ir.correlation),
        num_elements=ir.num_elements, num_params=repr(ir.num_params), weight_offsets=repr(ir.weight_offsets),
        weight_numel=ir.weight_numel, layout=repr(ir.layout), dtypes=repr(ir.dtypes), basis=repr(ir.basis),
        cg_convention=repr(ir.cg_convention))
    return {f"{ir.name}/__init__.py": init, f"{ir.name}/terms.py": terms_file(ir, header)}


def symmetric_files(ir: SymmetricContractionIR, *, header: str | None = None, block_b: int | None = None,
                    block_c: int | None = None, num_warps: int | None = None, num_stages: int = 1) -> dict[str, str]:
    """``{relative path: text}`` of ``ir``'s package (paths start with ``<name>/``).

    ``header``: the first lines of every file (default: the IR's hash and this function);
    ``block_b``, ``block_c``, ``num_warps``, ``num_stages``: the kernels' tile and Triton's
    software pipelining of their loops (``helion.build_kernels``).
    """
    header = header or _header(ir, None)
    kernels = helion.build_kernels(ir, block_b=block_b, block_c=block_c, num_warps=num_warps, num_stages=num_stages)
    namespace = f"eqdsl_sc_{ir.name}"
    ops = []
    for k in kernels:
        sig = ", ".join(helion.op_params(k.kind, k.k))
        ops.append(f"{helion.op_name(k.kind, k.k)}({sig}) -> {k.params[-1]}")
    common = dict(header=header, name=ir.name, irreps_in=ir.irreps_in, irreps_out=ir.irreps_out,
                  correlation=list(ir.correlation), num_elements=ir.num_elements, weight_numel=ir.weight_numel,
                  layout=ir.layout)
    kernel_ctx = [dict(name=k.name, params=k.params, doc=k.doc, config=k.config, lines=k.lines) for k in kernels]
    files = {
        "helion_symmetric_kernels.py": render(
            "helion_symmetric_kernels.py.j2", kernels=kernel_ctx, kernel_names=[k.name for k in kernels],
            n_terms=len(ir.terms), **common),
        "torch_symmetric.py": render(
            "torch_symmetric.py.j2", namespace=namespace, ops=ops, dim_in=ir.dim_in * ir.mul,
            dim_out=sum(ir.out_dims) * ir.mul, cg_convention=ir.cg_convention, dtypes=list(ir.dtypes),
            torch_dtypes="(" + "".join(_TORCH_DTYPES[d] + ", " for d in ir.dtypes) + ")",
            max_order=repr({kind: helion.max_order(ir, kind) for kind in helion.KINDS}),
            **{k: v for k, v in common.items() if k != "name"}, name=ir.name),
    }
    return {f"{ir.name}/{rel}": text for rel, text in files.items()}


def generate_symmetric(ir: SymmetricContractionIR, out_dir: str | Path, *, header: str | None = None,
                       **blocks) -> Path:
    """Write ``ir``'s package into ``out_dir/<ir.name>/`` atomically; return its directory.

    ``blocks``: ``block_b``, ``block_c``, ``num_warps`` (``symmetric_files``).

    Raises:
        eqdsl.codegen.generate.GenerateError: ``out_dir/<name>`` exists and was not written by eqdsl.
    """
    header = header or _header(ir, None)
    files = common_files(ir, header=header) | symmetric_files(ir, header=header, **blocks)
    (written,) = write_package(out_dir, files)
    return written
