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

Device. Triton launches on the *current* CUDA device (its stream, the binary loaded there,
its check that every pointer is usable there), so a kernel whose tensors are on
``cuda:1`` while device 0 is current failed ("Pointer argument (at 0) cannot be accessed
from Triton"). Every CUDA launch, Helion's path included, runs on its first tensor's
device: when that is not the current device, the call makes it current for its duration
(``torch.cuda.device``) and restores the previous one. Same device: one
``Tensor.get_device`` and one comparison per launch. The ops check beforehand that all
their tensors share one device.
``triton_options`` (e.g. ``maxnreg``, which Helion accepts only on persistent kernels) are
added to every CUDA launch; Helion's own path launches without them.

Replay. Helion's host function of our kernels is one ``_launcher(kernel, grid, *args)``
call whose arguments are the kernel's tensors and integers computed from their sizes and
strides (``x.size(0)``, ``out.stride(1)``, block-size constants). When its source says
exactly that (``_replay_sources``: an AST whitelist; anything else, e.g. a statement with
a side effect, a second launch or a value read from a tensor, keeps calling the host
function), the first call with a new *exact* key (each tensor's shape, strides, dtype,
device and 16-byte alignment, the current device) records the launch, and later calls
with that key rebuild only the argument list (the tensors in their slots, the recorded
integers) and call Triton's compiled launcher: no host function, no specialization key,
no grid arithmetic. The recorded integers and the compiled kernel depend only on what
the key holds, so a replay launches exactly what the host function would have.

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

import ast
import functools
import hashlib
import importlib.util
import inspect
import operator
import os
import tempfile
import textwrap
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

    Same arguments, same effect as calling the kernel (returns what the kernel returns;
    a replayed call returns ``None``, as our kernels' host functions do); see the module
    docstring for what is skipped and when it falls back to Helion's path.
    """

    # The fast path's device type, the current-device query, a tensor's device index and the
    # context manager that makes a device current for a launch (tests substitute them).
    fast_device_type = "cuda"
    current_device = staticmethod(torch.cuda.current_device)
    tensor_device = staticmethod(torch.Tensor.get_device)
    device_guard = torch.cuda.device
    # MD changes the edge count every step: the exact-key tables are emptied past this size
    max_entries = 256

    def __init__(self, kernel, *, triton_options: dict | None = None, enabled: bool | None = None):
        self.kernel = kernel
        self.triton_options = dict(triton_options or {})
        if enabled is None:
            enabled = os.environ.get("EQDSL_HELION_FAST_LAUNCH", "1") != "0"
        self.enabled = enabled
        self._host: dict[tuple, object] = {}
        self._exact: dict[tuple, object] = {}
        self._plans: dict[tuple, tuple] = {}
        self._sources: dict[object, tuple | None] = {}  # host function -> _replay_sources
        self._compiled: dict[tuple, object] = {}
        self._triton = None  # (knobs.runtime, get_current_stream, default_launcher), bound on first CUDA launch
        self._source_hash: str | None = None

    def __repr__(self) -> str:
        return f"HelionLaunch({getattr(self.kernel, 'name', self.kernel)!r})"

    def __call__(self, *args):
        # ``is_cuda`` costs a tenth of ``device.type``
        if not getattr(args[0], "is_" + self.fast_device_type, False):
            return self.kernel(*args)  # CPU: Triton's interpreter, no current device
        device = self.tensor_device(args[0])
        if device != self.current_device():
            # Triton launches on the current device: make it the tensors' for this call
            with self.device_guard(device):
                return self._call(device, args)
        return self._call(device, args)

    def _call(self, device: int, args: tuple):
        """A CUDA launch with ``device`` (the first tensor's) current."""
        if not self.enabled:
            return self.kernel(*args)
        # everything a replay depends on: the device Triton launches on, the layout, dtype
        # and alignment of every tensor, every other argument's value. (The other tensors'
        # devices are not: the ops check that all are on one, and Triton's C launcher
        # rejects a pointer it cannot use.)
        key = (
            device,
            *[
                (a.shape, a.stride(), a.dtype, a.data_ptr() & 15 == 0)
                if isinstance(a, torch.Tensor)
                else (type(a), a)
                for a in args
            ],
        )
        plan = self._plans.get(key)
        if plan is not None:
            runtime, current_stream, _ = self._triton
            # a profiler's launch hook sees every launch: through Triton while one is installed
            if not (_hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook)):
                launch, grid, head, getter, consts = plan
                launch(*grid, current_stream(key[0]), *head, *getter(args + consts))
                return None
        return self._slow(key, args)

    def _slow(self, key: tuple, args: tuple):
        """A call without a plan: through the host function, recording a plan when it can."""
        # exact shapes first (cheap to hash); Helion's bucketed key on a new shape
        exact = tuple([(a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor) else (type(a), a) for a in args])
        host = self._exact.get(exact)
        if host is None:
            host = self._host_for(args)
            if len(self._exact) >= self.max_entries:
                self._exact.clear()
            self._exact[exact] = host
        if host not in self._sources:
            self._sources[host] = _replay_sources(host)
        sources = self._sources[host]
        if sources is None:
            return host(*args, _launcher=self._launch)
        launches = []

        def record(triton_kernel, grid, *largs, **kwargs):
            compiled = self._launch(triton_kernel, grid, *largs, **kwargs)
            launches.append((grid, largs, compiled))
            return compiled

        result = host(*args, _launcher=record)
        if len(launches) == 1 and result is None:
            plan = _plan(sources, args, *launches[0])
            if plan is not None:
                if len(self._plans) >= self.max_entries:
                    self._plans.clear()
                self._plans[key] = plan
        return result

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


# ---------------------------------------------------------------- replay of a host function

# integer arithmetic a launch argument may use (on sizes, strides and constants)
_ARITH = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)
# methods of a kernel parameter whose value the exact key determines
_SHAPE_METHODS = {"size": 1, "stride": 1, "numel": 0, "dim": 0}
# host-side calls whose value the exact key (which holds the device) determines
_DEVICE_CALLS = {"helion.runtime.get_num_sm"}
# pure integer functions of their arguments: Helion's host code of a 2-D tile computes
# ``_RDIM_SIZE_2 = triton.next_power_of_2(_BLOCK_SIZE_0)``; without these every launch of
# such a kernel (mace_large's tp_fwd_0, the grid_c kernels) went through the host function
_INT_CALLS = {"triton.next_power_of_2", "triton.cdiv"}


def _dotted(node) -> str | None:
    """``a.b.c`` of a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _shape_expr(node, params: dict, local: set) -> bool:
    """Whether ``node`` is an integer computed only from constants, earlier such locals
    and the sizes/strides of the parameters (so fixed by the exact key)."""
    if isinstance(node, ast.Constant):
        return type(node.value) in (int, bool) or node.value is None
    if isinstance(node, ast.Name):
        return node.id in local
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, _ARITH) and _shape_expr(node.left, params, local) and _shape_expr(node.right, params, local)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, ast.USub) and _shape_expr(node.operand, params, local)
    if isinstance(node, ast.Call) and not node.keywords:
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in params:
            nargs = _SHAPE_METHODS.get(f.attr)
            return nargs == len(node.args) and all(
                isinstance(a, ast.Constant) and type(a.value) is int for a in node.args
            )
        if _dotted(f) in _INT_CALLS:
            return bool(node.args) and all(_shape_expr(a, params, local) for a in node.args)
        if _dotted(f) in _DEVICE_CALLS:
            return all(
                (isinstance(a, ast.Attribute) and a.attr == "device" and isinstance(a.value, ast.Name) and a.value.id in params)
                or (isinstance(a, ast.Constant) and type(a.value) is int)
                for a in node.args
            )
    return False


def _replay_sources(host) -> tuple | None:
    """Where each launch argument of ``host`` comes from, or None if a call cannot be replayed.

    ``host`` must be ``def f(<params>, *, _launcher=...)`` whose body is a docstring,
    assignments of names to key-determined integers (``_shape_expr``) and exactly one
    statement ``_launcher(kernel, grid, *args, **constants)``, with ``kernel`` a global
    (any name or attribute chain not rooted at a parameter or local), ``grid`` a tuple of
    key-determined integers and each arg a parameter or a key-determined integer. Returns
    one entry per arg after the grid: the parameter's position, or None for a value to
    record.
    """
    try:
        sig = inspect.signature(host)
        tree = ast.parse(textwrap.dedent(inspect.getsource(host)))
    except (TypeError, ValueError, OSError, SyntaxError):
        return None
    positional = []
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional.append(p.name)
        elif not (p.kind is p.KEYWORD_ONLY and p.name == "_launcher"):
            return None
    params = {name: i for i, name in enumerate(positional)}
    fn = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(fn, ast.FunctionDef) or fn.decorator_list:
        return None
    local: set = set()
    launch = None
    for i, stmt in enumerate(fn.body):
        if i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            continue  # docstring
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id not in params
            and _shape_expr(stmt.value, params, local)
        ):
            local.add(stmt.targets[0].id)
            continue
        if (
            launch is None
            and isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name)
            and stmt.value.func.id == "_launcher"
        ):
            launch = stmt.value
            continue
        return None
    if launch is None or len(launch.args) < 2:
        return None
    kernel, grid, *rest = launch.args
    root = _dotted(kernel)
    if root is None or root.split(".")[0] in params or root.split(".")[0] in local:
        return None
    if not (isinstance(grid, ast.Tuple) and 1 <= len(grid.elts) <= 3 and all(_shape_expr(g, params, local) for g in grid.elts)):
        return None
    if not all(k.arg is not None and isinstance(k.value, ast.Constant) for k in launch.keywords):
        return None
    sources = []
    for a in rest:
        if isinstance(a, ast.Name) and a.id in params:
            sources.append(params[a.id])
        elif _shape_expr(a, params, local):
            sources.append(None)
        else:
            return None  # a starred argument, a value read from a tensor, ...
    return tuple(sources)


def _plan(sources: tuple, args: tuple, grid, largs: tuple, compiled) -> tuple | None:
    """What a replay of one recorded launch needs: ``(launch, grid3, head, getter, consts)``,
    called as ``launch(*grid3, stream, *head, *getter(args + consts))``; None if the
    recording does not fit ``sources``."""
    if compiled is None or len(sources) != len(largs) or len(largs) < 2:
        return None
    if not (isinstance(grid, tuple) and 1 <= len(grid) <= 3 and all(type(g) is int for g in grid)):
        return None
    consts, index = [], []
    for src, value in zip(sources, largs):
        if src is None:
            index.append(len(args) + len(consts))
            consts.append(value)
        elif value is args[src]:
            index.append(src)
        else:
            return None
    grid3 = tuple(grid) + (1,) * (3 - len(grid))
    run = compiled.run  # Triton's launcher (a property: loads the binary once)
    raw = _raw_cuda_launch(run)
    if raw is not None:
        launch, coop, pdl = raw
        head = (compiled.function, coop, pdl, None, None, compiled.packed_metadata, None, None, None)
    else:
        launch, head = run, (compiled.function, compiled.packed_metadata, None, None, None)
    return launch, grid3, head, operator.itemgetter(*index), tuple(consts)


def _raw_cuda_launch(run) -> tuple | None:
    """``(launch, cooperative_grid, pdl)`` of Triton 3.6's ``CudaLauncher`` when calling its C
    ``launch`` directly is what ``CudaLauncher.__call__`` would do (no scratch buffers)."""
    # __call__ defines a closure and sizes two scratch buffers on every launch; our kernels
    # use none. Other Triton versions, other launchers: through __call__.
    if type(run).__name__ != "CudaLauncher" or not _versions()[1].startswith("3.6."):
        return None
    if getattr(run, "global_scratch_size", 1) != 0 or getattr(run, "profile_scratch_size", 1) != 0:
        return None
    try:
        return run.launch, run.launch_cooperative_grid, run.launch_pdl
    except AttributeError:
        return None


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
