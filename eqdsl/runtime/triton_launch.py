"""Launch a generated package's kernels from its shipped Triton code, through Triton's public API.

``eqdsl generate`` writes, for every Helion kernel and dtype, the Triton module Helion
produces (``<package>/triton_kernels/<kernel>_<dtype>.py``,
``eqdsl.codegen.triton_lowering``): a ``@triton.jit`` function and a *host function*
that computes the grid and launch arguments and calls the ``launcher`` it is given
(``launcher(jit_fn, grid, *args, num_warps=, num_stages=)``). ``kernels(package, source)`` gives one callable per kernel
that imports that module on first use and runs its host function with ``launch`` as the
launcher; nothing here imports Helion.

``launch`` on CUDA tensors goes through ``jit_fn[grid](*args, num_warps=, num_stages=)``
(``JITFunction.run``, Triton's public launch): Triton specializes each argument, looks the
variant up in its in-memory and on-disk caches and compiles it only when nothing matches.
MD and variable-size batches change a size every step: a new size is a cache lookup, no
compile once its specialization exists. Nothing of Triton's compiled-kernel objects is
kept or called here (their launch interface is not Triton's public API).

Device: Triton launches on the *current* CUDA device, so a call whose tensors live on
another device makes theirs current for the launch (``torch.cuda.device``).

CPU tensors run through Triton's interpreter (``TRITON_INTERPRET=1`` before the modules
are imported; tests). ``EQDSL_KERNELS=helion`` (read at import of each generated
package) calls the Helion kernels instead (debugging, ``eqdsl tune``), which needs
Helion and generates code in each process; so does a package generated without Triton
code (``eqdsl.codegen.generate.generate_files(..., triton=False)``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import types
from pathlib import Path

import torch

__all__ = ["kernels", "launch", "launch_override", "overriding", "use_helion"]

_INT32_INDEX_LIMIT = 2**31 - 1

_override: list = []  # the active launch_override callbacks (innermost last)
_prepared: set[str] = set()  # packages whose before_first_cuda_launch ran


def use_helion() -> bool:
    """Whether ``EQDSL_KERNELS=helion`` asks for the Helion kernels instead of the Triton code."""
    return os.environ.get("EQDSL_KERNELS", "triton") == "helion"


@contextlib.contextmanager
def launch_override(callback):
    """Within the block, every launch calls ``callback(jit_fn, grid, args, options)`` instead.

    ``options`` holds ``num_warps``, ``num_stages`` and the kernel's ``TRITON_OPTIONS``.
    Nothing is launched and outputs are left unwritten; tensors may be CPU tensors with
    ``TRITON_INTERPRET`` unset (``eqdsl build`` compiles each launch for a GPU this way).
    """
    _override.append(callback)
    try:
        yield
    finally:
        _override.remove(callback)


def overriding() -> bool:
    """Whether a ``launch_override`` is active (launches are recorded, not run)."""
    return bool(_override)


def launch(jit_fn, grid: tuple, *args, num_warps: int, num_stages: int, triton_options: dict | None = None,
           **kwargs):
    """Run ``jit_fn`` (a ``triton.JITFunction``) on ``grid`` with ``args`` (see the module docstring).

    ``triton_options`` are the module's ``TRITON_OPTIONS`` (extra compile options, e.g.
    ``maxnreg``), bound per module by ``kernels``.

    Raises ``ValueError`` for an operand of more than ``2**31 - 1`` elements (the
    shipped code indexes with 32-bit integers).
    """
    if _override:
        return _override[-1](jit_fn, grid, args, {"num_warps": num_warps, "num_stages": num_stages, **kwargs, **(triton_options or {})})
    _check_index_range(jit_fn, args)
    first = args[0]
    options = {**kwargs, **(triton_options or {})}
    if not first.is_cuda:  # Triton's interpreter (TRITON_INTERPRET=1); it ignores the options
        return jit_fn[grid](*args, num_warps=num_warps, num_stages=num_stages, **kwargs)
    device = first.get_device()
    if device != torch.cuda.current_device():
        with torch.cuda.device(device):
            return jit_fn[grid](*args, num_warps=num_warps, num_stages=num_stages, **options)
    return jit_fn[grid](*args, num_warps=num_warps, num_stages=num_stages, **options)


def _check_index_range(jit_fn, args) -> None:
    """Every operand's element count within 32-bit indexing (a loop over the arguments)."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.numel() > _INT32_INDEX_LIMIT:
            raise ValueError(
                f"{jit_fn.__name__}: an operand has {a.numel()} elements, more than "
                f"the kernels' 32-bit indexing allows ({_INT32_INDEX_LIMIT}); split the batch, or set "
                "EQDSL_KERNELS=helion (Helion generates 64-bit indexing for it)"
            )


class _Kernel:
    """One kernel of a generated package: its Triton host function per dtype, imported on first use."""

    def __init__(self, package: str, name: str, modules: dict[str, str]):
        self.package, self.name, self.modules = package, name, modules
        self._hosts: dict[torch.dtype, tuple] = {}

    def __repr__(self) -> str:
        return f"triton_launch kernel {self.package}.{self.name}"

    def __call__(self, *args):
        dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point())
        entry = self._hosts.get(dtype)
        if entry is None:
            entry = self._load(dtype)
        host, launcher = entry
        if args[0].is_cuda and self.package not in _prepared and not _override:
            _before_first_cuda_launch(self.package)
        return host(*args, launcher=launcher)

    def _load(self, dtype: torch.dtype):
        name = str(dtype).removeprefix("torch.")
        module_name = self.modules.get(name)
        if module_name is None:
            raise TypeError(f"{self.package}.{self.name}: no Triton code for dtype {dtype}")
        module = importlib.import_module(f"{self.package}.triton_kernels.{module_name}")
        options = dict(module.TRITON_OPTIONS)
        entry = (getattr(module, self.name), functools.partial(launch, triton_options=options) if options else launch)
        self._hosts[dtype] = entry
        return entry


def _before_first_cuda_launch(package: str) -> None:
    """Install the package's prebuilt binaries, if any, into Triton's cache (once; tensor
    products and convolutions only, the packages ``eqdsl build`` builds)."""
    _prepared.add(package)
    from . import cubins

    directory = Path(importlib.import_module(package).__file__).parent
    if not (directory / "torch_ops.py").is_file():  # a symmetric contraction: eqdsl build makes no cubins for it
        return
    cubins.install(directory)


def kernels(package: str, source: str) -> types.SimpleNamespace:
    """The kernels of ``<package>.<source>`` (``helion_kernels`` or ``helion_conv_kernels``).

    Each attribute is callable like the Helion kernel of that name: with the Triton code
    of ``<package>.triton_kernels`` (launched by ``launch``), or the Helion kernel itself
    when ``EQDSL_KERNELS=helion`` or the package has no Triton code.
    """
    try:
        index = importlib.import_module(f"{package}.triton_kernels")
    except ModuleNotFoundError:
        index = None
    if index is None or use_helion():
        return _helion_kernels(package, source)
    by_kernel: dict[str, dict[str, str]] = {k: {} for k in index.SOURCES[source]}
    for (kernel, dtype), module in index.KERNELS.items():
        if kernel in by_kernel:
            by_kernel[kernel][dtype] = module
    return types.SimpleNamespace(**{k: _Kernel(package, k, m) for k, m in by_kernel.items()})


def _helion_kernels(package: str, source: str) -> types.SimpleNamespace:
    """The Helion kernels of ``<package>.<source>`` (Helion's own launch path)."""
    from .versions import check

    check("helion")
    import helion

    module = importlib.import_module(f"{package}.{source}")
    found = {n: k for n, k in vars(module).items() if isinstance(k, helion.Kernel)}
    twins: dict[str, dict[torch.dtype, object]] = {}  # <kernel>__<dtype>: that dtype's tuning of <kernel>
    for n, k in found.items():
        base, sep, dtype = n.rpartition("__")
        if sep and base in found and hasattr(torch, dtype):
            twins.setdefault(base, {})[getattr(torch, dtype)] = k
    out = dict(found)
    for base, by_dtype in twins.items():
        out[base] = _ByDtype(found[base], by_dtype)
    return types.SimpleNamespace(**out)


class _ByDtype:
    """A Helion kernel and its copies tuned for some dtypes (``<kernel>__<dtype>``): each
    call runs the copy of its floating arguments' dtype, else the kernel."""

    def __init__(self, kernel, by_dtype: dict):
        self.kernel, self.by_dtype = kernel, by_dtype

    def __call__(self, *args):
        dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point())
        return self.by_dtype.get(dtype, self.kernel)(*args)
