"""``eqdsl generate`` / ``eqdsl check``: spec file -> generated package files.

Layout of an output directory ``DIR`` (importable itself)::

    DIR/__init__.py                 marker, created only if DIR has none
    DIR/<name>/__init__.py          metadata (irreps, e3nn instructions, weight_numel, layout)
    DIR/<name>/helion_kernels.py    Helion kernels        } from the helion backend
    DIR/<name>/torch_ops.py         torch custom ops      }
    DIR/<name>/pallas_kernels.py    Pallas kernels        } from the pallas backend
    DIR/<name>/jax_ops.py           jax functions         }
    DIR/<name>/triton_kernels/      the Triton code Helion writes for each kernel and dtype
                                    (``triton_lowering``; what the torch runtime launches)

Every file starts with a header (eqdsl version, spec hash, the command that
regenerates it). Writing is atomic per package (build in a temporary sibling, then
rename) and never touches anything outside ``DIR``; a package directory without our
header is never overwritten.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .. import __version__
from ..backends import check_tuning
from ..ir import TensorProductIR
from ..lower import lower
from ..errors import SpecError
from ..spec import TensorProductSpec, load_spec
from ..symmetric.codegen import common_files, symmetric_files
from ..symmetric.ir import SymmetricContractionIR
from ..symmetric.lower import lower as lower_symmetric
from ..symmetric.pallas import jax_files
from ..symmetric.spec import load_symmetric_specs
from . import triton_lowering
from .package import MARKER, GenerateError, write_package
from ..backends.render import render

__all__ = ["GenerateError", "generate_files", "write_package", "generate", "check", "MARKER"]

BACKENDS = ("eqdsl.backends.helion.assemble", "eqdsl.backends.pallas.assemble")
# the backends a spec's [tensor_product.tuning] table applies to (each reads its own keys)
TUNED_BACKENDS = frozenset(BACKENDS)




@dataclass(frozen=True)
class Header:
    spec_file: str
    spec_sha256: str
    command: str

    def lines(self) -> str:
        return (
            f"{MARKER} {__version__} from {self.spec_file} (sha256 {self.spec_sha256[:16]}). Do not edit.\n"
            f"# Regenerate with: {self.command}\n"
        )


def _posix(p: str | Path) -> str:
    return PurePosixPath(Path(p).as_posix()).as_posix()


def generate_files(spec_path: str | Path, out_dir: str | Path, *, triton: bool = True) -> dict[str, str]:
    """All files for every tensor product of ``spec_path``, as ``{relative path: text}``.

    Writes nothing outside a temporary directory (the Triton lowering's). ``triton=False``
    leaves out ``triton_kernels/`` (seconds per kernel on a CPU): the torch runtime then
    launches the Helion kernels through Helion. Raises ``SpecError`` for a bad spec,
    ``triton_lowering.LoweringError`` when Helion's lowering fails.
    """
    specs = load_spec(spec_path)
    digest = hashlib.sha256(Path(spec_path).read_bytes()).hexdigest()
    header = Header(_posix(spec_path), digest, f"eqdsl generate {_posix(spec_path)} -o {_posix(out_dir)}").lines()
    files: dict[str, str] = {}
    for spec in specs:
        ir = lower(spec)
        for rel, text in package_files(spec, ir, header, triton=triton).items():
            files[f"{spec.name}/{rel}"] = text
    for sc in load_symmetric_specs(spec_path):
        if sc.name in {s.name for s in specs}:
            raise SpecError(_posix(spec_path), None, "name", f"{sc.name!r} names both a tensor product and a "
                                                             "symmetric contraction: one package each, so one name each")
        files.update(symmetric_package_files(lower_symmetric(sc), header, triton=triton))
    return files


def symmetric_package_files(ir: SymmetricContractionIR, header: str, *, triton: bool = True) -> dict[str, str]:
    """Files of one symmetric-contraction package (``<name>/...``): the metadata, the Helion
    kernels and torch ops (``eqdsl.symmetric.codegen``), the Pallas kernels and JAX ops
    (``eqdsl.symmetric.pallas``) and, with ``triton``, the Triton code of the Helion kernels
    (``triton_kernels/``, as for a tensor product: ``triton_lowering``)."""
    common = common_files(ir, header=header)
    torch_files = symmetric_files(ir, header=header)
    jax_side = jax_files(ir, header=header)
    both = sorted((set(torch_files) & set(jax_side)) | (set(common) & (set(torch_files) | set(jax_side))))
    if both:
        raise AssertionError(f"two backends render {both}")
    files = common | torch_files | jax_side
    if triton:
        prefix = f"{ir.name}/"
        inside = {rel.removeprefix(prefix): text for rel, text in files.items()}
        lowered = triton_lowering.lower_package(inside, symmetric_operands(ir), header)
        files.update({prefix + rel: text for rel, text in lowered.items()})
    return files


def symmetric_operands(ir: SymmetricContractionIR) -> triton_lowering.Operands:
    """The lowering's operands of a symmetric contraction: its dtypes, no widths. The kernels
    loop over term tables, so their code does not depend on the irreps (only on the channel
    tile and configs, which are in the kernel file's code): without widths in the lowering
    cache's key, every contraction with the same kernel code shares its lowered modules."""
    return triton_lowering.Operands(0, 0, 0, 0, False, ir.dtypes)


def package_files(spec: TensorProductSpec, ir: TensorProductIR, header: str, *, triton: bool = True) -> dict[str, str]:
    """Files of one generated package, keyed by name inside the package (``triton``: as in
    ``generate_files``)."""
    check_tuning(spec)  # the backends' keys, before anything is generated
    files = {"__init__.py": render("package_init.py.j2", header=header, **metadata_context(spec, ir))}
    for mod in BACKENDS:
        backend = importlib.import_module(mod)
        options = {"tuning": spec.tuning} if mod in TUNED_BACKENDS else {}
        for rel, text in backend.render_files(ir, header, **options).items():
            if rel in files:
                raise AssertionError(f"two backends render {rel}")
            files[rel] = text
    if triton:
        operands = triton_lowering.Operands(ir.dim_in1, ir.dim_in2, ir.dim_out, ir.weight_numel, ir.shared_weights, ir.dtypes)
        files.update(triton_lowering.lower_package(files, operands, header))
    return files


def metadata_context(spec: TensorProductSpec, ir: TensorProductIR) -> dict:
    """Python literals (as source text) for the package's metadata."""
    return {
        "name": spec.name,
        "irreps_in1": repr(ir.irreps_in1),
        "irreps_in2": repr(ir.irreps_in2),
        "irreps_out": repr(ir.irreps_out),
        "instructions": [repr(ins.as_tuple()) for ins in spec.instructions],
        "path_weights": [repr(p.path_weight) for p in ir.paths],
        "weight_numel": ir.weight_numel,
        "shared_weights": repr(ir.shared_weights),
        "layout": repr(ir.layout),
        "irrep_normalization": repr(ir.irrep_normalization),
        "path_normalization": repr(ir.path_normalization),
        "dtypes": repr(ir.dtypes),
        "dim_in1": ir.dim_in1,
        "dim_in2": ir.dim_in2,
        "dim_out": ir.dim_out,
        "conv": repr(ir.conv),
        "conv_reduce": repr(ir.reduce),
        "conv_deterministic": repr(ir.deterministic),
        "radial_features": repr(ir.radial_features),
        "output_order": repr(spec.output_order),
        "instruction_order": repr(spec.instruction_order),
        "cg_convention": repr(ir.cg_convention),
    }




def generate(spec_path: str | Path, out_dir: str | Path, *, triton: bool = True) -> list[Path]:
    """Generate and write every package of ``spec_path`` into ``out_dir`` (``triton``: as
    in ``generate_files``)."""
    return write_package(out_dir, generate_files(spec_path, out_dir, triton=triton))


def check(spec_paths: list[Path], out_dir: str | Path, *, full: bool = False, triton: bool = True) -> list[str]:
    """Regenerate in memory and compare with ``out_dir``; return unified diffs (empty: fresh).

    The Triton modules (``triton_kernels/``) are lowered again only with ``full=True``
    (seconds per kernel); otherwise each must exist and start with the header and
    provenance line (Helion kernel file hash, helion and triton versions) that lowering
    the current Helion kernels would give it (without helion and triton installed: up to
    the kernel file's hash, their versions unknown). ``triton=False``: packages generated
    without them (``generate(..., triton=False)``), which must then have none.
    """
    problems = []
    out = Path(out_dir)
    for spec_path in spec_paths:
        files = generate_files(spec_path, out_dir, triton=triton and full)
        if triton and not full:
            files.update(_triton_stamps(spec_path, out_dir, files))
        for rel, text in sorted(files.items()):
            path = out / rel
            have = path.read_text(encoding="utf-8") if path.exists() else ""
            if isinstance(text, _Stamp):
                if not have.startswith(text.prefix):
                    problems.append(f"{path}: stale or missing (expected it to start with {text.prefix.splitlines()[-1]!r}; "
                                    f"regenerate with eqdsl generate)\n")
            elif have != text:
                problems.append(
                    "".join(difflib.unified_diff(have.splitlines(True), text.splitlines(True), str(path), f"{path} (expected)"))
                    or f"{path}: missing\n"
                )
        for name in {PurePosixPath(r).parts[0] for r in files}:
            for extra in sorted([*(out / name).glob("*.py"), *(out / name / triton_lowering.DIR).glob("*.py")]):
                if extra.relative_to(out).as_posix() not in files:
                    problems.append(f"{extra}: not produced by the generator any more\n")
    return problems


@dataclass(frozen=True)
class _Stamp:
    """A lowered module's expected first lines (``check`` without lowering again)."""

    prefix: str


def _triton_stamps(spec_path, out_dir, files: dict[str, str]) -> dict[str, object]:
    """Expected ``triton_kernels/`` contents of every package in ``files`` (without lowering)."""
    expected: dict[str, object] = {}
    for spec in load_spec(spec_path):
        pkg = {PurePosixPath(r).relative_to(spec.name).as_posix(): t for r, t in files.items() if r.startswith(spec.name + "/")}
        header = pkg["__init__.py"][: pkg["__init__.py"].index("\n", pkg["__init__.py"].index("\n") + 1) + 1]
        dtypes = lower(spec).dtypes
        versions = triton_lowering.toolchain_installed()  # else: the kernel file hashes alone
        for rel, (source, kernel, dtype) in triton_lowering.modules(pkg, dtypes).items():
            expected[f"{spec.name}/{rel}"] = _Stamp(triton_lowering.stamp(header, pkg[source], source, kernel, dtype,
                                                                           versions=versions))
        expected[f"{spec.name}/{triton_lowering.DIR}/__init__.py"] = triton_lowering.index(pkg, dtypes, header)
    for sc in load_symmetric_specs(spec_path):
        pkg = {PurePosixPath(r).relative_to(sc.name).as_posix(): t for r, t in files.items() if r.startswith(sc.name + "/")}
        header = pkg["__init__.py"][: pkg["__init__.py"].index("\n", pkg["__init__.py"].index("\n") + 1) + 1]
        versions = triton_lowering.toolchain_installed()
        for rel, (source, kernel, dtype) in triton_lowering.modules(pkg, sc.dtypes).items():
            expected[f"{sc.name}/{rel}"] = _Stamp(triton_lowering.stamp(header, pkg[source], source, kernel, dtype,
                                                                        versions=versions))
        expected[f"{sc.name}/{triton_lowering.DIR}/__init__.py"] = triton_lowering.index(pkg, sc.dtypes, header)
    return expected
