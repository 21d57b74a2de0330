"""Launch generated Helion kernels on CUDA without Helion's and Triton's per-call Python.

A call of a ``helion.Kernel`` goes through Helion's dispatch (a key over every
argument's dtype, shape, strides and device), the kernel's generated host function
(grid, sizes and strides), and Triton's ``JITFunction.run`` (argument binding,
specialization key, cache lookup, launch metadata). Measured on the H100 machine's host
(2026-11-22, helion 1.4.0, triton 3.6.0) that path took ~42 us per launch, above the
25 us per op the project aims at.

``HelionLaunch`` lets Helion generate the code of each specialization (its pinned config),
then calls that generated host function with a launcher that, after Triton has compiled
the kernel once through ``JITFunction.run``, hands the arguments straight to it
(``CompiledKernel.run``, its C launcher). What Triton would specialize on is recomputed
per call: each tensor's dtype and 16-byte alignment, each integer's ``== 1``, ``% 16 ==
0`` and 32-bit range (``triton.runtime.jit.specialize_impl``); a new combination goes
through ``JITFunction.run`` once and is cached. CPU tensors (Triton's interpreter), an
installed launch hook (profilers), or ``EQDSL_HELION_FAST_LAUNCH=0`` take Helion's path.
``triton_options`` (e.g. ``maxnreg``, which Helion accepts only on persistent kernels) are
added to every CUDA launch; Helion's own path launches without them.

Helion's code generation (tracing the kernel, then emitting Triton) took 10-22 s per
mace_large kernel on a 2-core CPU (2026-11-22) and happens again in every new process;
Triton keeps its compiled binaries on disk but Helion keeps no generated code. So the
module Helion generates (the ``@triton.jit`` kernel and its host function) is kept in
``$EQDSL_CACHE_DIR`` (default ``~/.cache/eqdsl/helion``), keyed by the kernel file's
contents, the kernel name, the Helion specialization of the arguments, the GPU's compute
capability and the helion, triton and torch versions. A process that finds it loads it
instead of calling Helion; Triton's own cache then makes the first launch cheap too.
``EQDSL_CACHE_DIR=`` (empty) turns the disk cache off.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import os
import tempfile
import types
from pathlib import Path

import torch

__all__ = ["HelionLaunch", "launchers", "triton_specialization"]

_INT32 = (-(2**31), 2**31 - 1)
_HELION_INT32_INDEX_LIMIT = 2**31 - 1


def triton_specialization(args: tuple) -> tuple:
    """What Triton's compile key depends on in ``args`` (tensors, ints, floats, None).

    A tensor contributes its dtype and whether its data pointer is 16-byte aligned; an
    int whether it is 1, divisible by 16, and fits in 32 bits (as
    ``triton.runtime.jit.specialize_impl`` decides for Triton 3.6). Raises ``TypeError``
    on anything else, so an unknown argument is never launched with a stale kernel.
    """
    spec = []
    for a in args:
        if isinstance(a, torch.Tensor):
            spec.append((a.dtype, a.data_ptr() % 16 == 0))
        elif type(a) is int:
            spec.append((a == 1, a % 16 == 0, _INT32[0] <= a <= _INT32[1]))
        elif type(a) is float or a is None:
            spec.append(type(a))
        else:
            raise TypeError(f"HelionLaunch: cannot specialize a launch argument of type {type(a).__name__}")
    return tuple(spec)


def _hooked(hook) -> bool:
    # Triton 3.6 keeps launch hooks in a HookChain that is never None (empty: no hook);
    # earlier versions hold None or a callable.
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return True if calls is None else bool(calls)


def _helion_key(args: tuple) -> tuple:
    # Helion (static_shapes=False) binds one kernel per dtype, per size bucketed to 0, 1
    # or more in every dimension, and per 32/64-bit indexing (helion.runtime.kernel._tensor_key).
    return tuple(
        (a.dtype, a.device, tuple([s if s < 2 else 2 for s in a.shape]), a.numel() > _HELION_INT32_INDEX_LIMIT)
        if isinstance(a, torch.Tensor)
        else (type(a), a)
        for a in args
    )


class HelionLaunch:
    """Call ``kernel(*args)`` (a ``helion.Kernel`` with a pinned config) at low host cost.

    Same arguments, same effect as calling the kernel; see the module docstring for what
    is skipped and when it falls back to Helion's path.
    """

    # The fast path's device type and current-device query (tests substitute both).
    fast_device_type = "cuda"
    current_device = staticmethod(torch.cuda.current_device)

    def __init__(self, kernel, *, triton_options: dict | None = None, enabled: bool | None = None):
        self.kernel = kernel
        self.triton_options = dict(triton_options or {})
        if enabled is None:
            enabled = os.environ.get("EQDSL_HELION_FAST_LAUNCH", "1") != "0"
        self.enabled = enabled
        self._host: dict[tuple, object] = {}
        self._exact: dict[tuple, object] = {}
        self._compiled: dict[tuple, object] = {}
        self._triton = None  # (knobs.runtime, get_current_stream, default_launcher), bound on first CUDA launch
        self._source_hash: str | None = None

    def __repr__(self) -> str:
        return f"HelionLaunch({getattr(self.kernel, 'name', self.kernel)!r})"

    def __call__(self, *args):
        if not self.enabled or args[0].device.type != self.fast_device_type:
            return self.kernel(*args)
        # exact shapes first (cheap to hash); Helion's bucketed key on a new shape
        exact = tuple([(a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor) else (type(a), a) for a in args])
        host = self._exact.get(exact)
        if host is None:
            host = self._host_for(args)
            if len(self._exact) >= 256:  # a run with ever-changing sizes (MD): keep it bounded
                self._exact.clear()
            self._exact[exact] = host
        return host(*args, _launcher=self._launch)

    def _host_for(self, args: tuple):
        """Helion's generated host function for ``args``' specialization (memory, disk, or Helion)."""
        key = _helion_key(args)
        host = self._host.get(key)
        if host is None:
            path = self._cache_path(key)
            host = _load_host(path, self.kernel.name) if path is not None else None
            if host is None:
                bound = self.kernel.bind(args)
                if bound._run is None:
                    bound.ensure_config_exists(args)  # Helion's code generation (pinned config)
                host = bound._run
                if path is not None:
                    _store_module(bound, path)
            self._host[key] = host
        return host

    def _cache_path(self, key: tuple) -> Path | None:
        root = os.environ.get("EQDSL_CACHE_DIR", str(Path.home() / ".cache" / "eqdsl"))
        if not root:
            return None
        if self._source_hash is None:
            self._source_hash = hashlib.sha256(Path(inspect.getsourcefile(self.kernel.fn)).read_bytes()).hexdigest()
        device = key[0][1]
        parts = (
            self._source_hash,
            self.kernel.name,
            repr([(k[0], k[2], k[3]) if len(k) == 4 else k for k in key]),  # without the device index
            repr(torch.cuda.get_device_capability(device)),
            *_versions(),
        )
        digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]
        return Path(root) / "helion" / f"{self.kernel.name}_{digest}.py"

    def _bind_triton(self):
        from helion.runtime import default_launcher
        from triton import knobs
        from triton.runtime import driver

        self._triton = (knobs.runtime, driver.active.get_current_stream, default_launcher)
        return self._triton

    def _launch(self, triton_kernel, grid, *args, num_warps, num_stages, **kwargs):
        runtime, current_stream, default_launcher = self._triton or self._bind_triton()
        if _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook):
            kwargs.update(self.triton_options)
            return default_launcher(triton_kernel, grid, *args, num_warps=num_warps, num_stages=num_stages, **kwargs)
        device = self.current_device()
        # num_warps, num_stages and kwargs are literals of the host code that passes triton_kernel
        key = (id(triton_kernel), device, triton_specialization(args))
        compiled = self._compiled.get(key)
        if compiled is None:
            kwargs.update(self.triton_options)
            compiled = default_launcher(triton_kernel, grid, *args, num_warps=num_warps, num_stages=num_stages, **kwargs)
            self._compiled[key] = compiled
            return compiled
        stream = current_stream(device)
        compiled.run(
            grid[0],
            grid[1] if len(grid) > 1 else 1,
            grid[2] if len(grid) > 2 else 1,
            stream,
            compiled.function,
            compiled.packed_metadata,
            None,
            None,
            None,
            *args,
        )
        return compiled


@functools.cache
def _versions() -> tuple[str, ...]:
    from importlib.metadata import version

    return tuple(version(p) for p in ("helion", "triton", "torch"))


def _load_host(path: Path, name: str):
    """The host function of a cached Helion module, or None (absent or unreadable)."""
    if not path.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location(f"eqdsl_helion_cache.{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return getattr(module, name)
    except Exception:  # a truncated or stale file: regenerate through Helion
        return None


def _store_module(bound, path: Path) -> None:
    """Copy the module Helion generated for ``bound`` to ``path`` (atomically; best effort)."""
    # one pinned config per kernel, so one generated module
    source = next(iter(getattr(bound, "_cache_path_map", {}).values()), None)
    if source is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(Path(source).read_bytes())
        os.replace(tmp, path)
    except OSError:
        pass


def launchers(module) -> types.SimpleNamespace:
    """A ``HelionLaunch`` for every ``helion.Kernel`` of a generated kernels module, by name,
    with the module's ``TRITON_OPTIONS`` for that kernel (e.g. ``{"maxnreg": 256}``)."""
    import helion

    return types.SimpleNamespace(
        **{
            name: HelionLaunch(obj, triton_options=getattr(module, "TRITON_OPTIONS", {}).get(name))
            for name, obj in vars(module).items()
            if isinstance(obj, helion.Kernel)
        }
    )
