"""``eqdsl.runtime.helion_launch``: the fast launch path's caching, checked with stand-ins
for Helion's kernel and Triton's JIT function (CPU; the real launch is checked on the GPU
by every GPU kernel test, which runs through it)."""

import contextlib

import pytest
import torch

from eqdsl.runtime.helion_launch import HelionLaunch, triton_specialization


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch):
    monkeypatch.setenv("EQDSL_CACHE_DIR", "")


def test_specialization_alignment_ints_and_errors():
    x = torch.zeros(64)
    assert triton_specialization((x,)) == ((torch.float32, True),)
    assert triton_specialization((x[1:],)) == ((torch.float32, False),)  # 4-byte offset
    assert triton_specialization((x[4:].double(),))[0][0] == torch.float64
    assert triton_specialization((1, 16, 17, 2**31, -5)) == (
        (True, False, True),
        (False, True, True),
        (False, False, True),
        (False, True, False),
        (False, False, True),
    )
    assert triton_specialization((0.5, None)) == (float, type(None))
    with pytest.raises(TypeError, match="list"):
        triton_specialization(([1],))


class _Compiled:
    def __init__(self, log, spec):
        self.log, self.spec = log, spec
        self.function, self.packed_metadata = "fn", "meta"

    def run(self, g0, g1, g2, stream, function, packed, launch_metadata, enter, exit_, *args):
        self.log.append(("direct", self.spec, (g0, g1, g2), stream, args))


class _JIT:
    """Triton's JITFunction.run, as Helion's default launcher calls it."""

    def __init__(self, log):
        self.log = log

    def run(self, *args, grid, warmup, num_warps, num_stages, **kwargs):
        self.log.append(("jit", grid, args, num_warps, num_stages, kwargs))
        return _Compiled(self.log, triton_specialization(args))


class _Runtime:
    """triton.knobs.runtime: Triton 3.6 holds launch hooks in (possibly empty) HookChains."""

    def __init__(self):
        from triton.knobs import HookChain

        self.launch_enter_hook = HookChain()
        self.launch_exit_hook = HookChain(reversed=True)


def _default_launcher(triton_kernel, grid, *args, num_warps, num_stages, **kwargs):
    return triton_kernel.run(*args, grid=grid, warmup=False, num_warps=num_warps, num_stages=num_stages, **kwargs)


class _Kernel:
    """A helion.Kernel: ``__call__`` (Helion's path) and ``bind(args)._run`` (the host code)."""

    def __init__(self, log):
        self.jit = _JIT(log)
        self.log = log
        self.binds = 0

    def host(self, x, out, *, _launcher=_default_launcher):
        _launcher(self.jit, ((x.size(0) + 15) // 16,), x, out, x.size(0), out.stride(0), num_warps=4, num_stages=1)

    def __call__(self, *args):
        self.log.append(("helion",))
        self.host(*args)

    def bind(self, args):
        self.binds += 1
        return type("Bound", (), {"_run": staticmethod(self.host)})()  # the pinned config, already set


class _Devices:
    """Stand-ins for the current CUDA device (``current``), a tensor's device index (its
    attribute ``fake_device``, default 0) and ``torch.cuda.device`` (``guard``: makes a
    device current inside, records it in ``entered``, restores the previous one)."""

    def __init__(self, launch):
        self.current = 0
        self.entered = []
        launch.current_device = lambda: self.current
        launch.tensor_device = lambda t: getattr(t, "fake_device", 0)
        launch.device_guard = self.guard

    @contextlib.contextmanager
    def guard(self, device):
        previous, self.current = self.current, device
        self.entered.append(device)
        try:
            yield
        finally:
            self.current = previous


def _fast(log):
    k = _Kernel(log)
    launch = HelionLaunch(k, triton_options={"maxnreg": 256}, enabled=True)
    launch.fast_device_type = "cpu"
    _Devices(launch)
    launch._triton = (_Runtime(), lambda device: f"stream{device}", _default_launcher)
    return k, launch


def test_first_call_through_triton_then_direct():
    log = []
    k, launch = _fast(log)
    x, out = torch.zeros(40, 8), torch.zeros(40, 16)
    launch(x, out)  # Helion's generated host code, Triton's JITFunction.run (compiles), kept
    assert [e[0] for e in log] == ["jit"]
    assert log[0][5] == {"maxnreg": 256}  # the kernel's Triton options reach the compile
    launch(x, out)  # direct
    launch(x, out)
    assert [e[0] for e in log] == ["jit", "direct", "direct"]
    assert log[-1][2] == (3, 1, 1) and log[-1][3] == "stream0"
    assert log[-1][4] == (x, out, 40, 16)
    assert k.binds == 1


def test_new_specialization_goes_through_triton_once():
    log = []
    k, launch = _fast(log)
    x, out = torch.zeros(48, 8), torch.zeros(48, 16)
    for _ in range(3):
        launch(x, out)
    assert [e[0] for e in log] == ["jit", "direct", "direct"]
    n = len(log)
    y, out2 = torch.zeros(33, 8), torch.zeros(33, 16)  # 33 % 16 != 0: another Triton key
    launch(y, out2)
    launch(y, out2)
    assert [e[0] for e in log[n:]] == ["jit", "direct"]
    assert log[-1][2] == (3, 1, 1)
    z = torch.zeros(49 * 8)[1:385].view(48, 8)  # misaligned data pointer: another Triton key
    launch(z, out)
    launch(z, out)
    assert [e[0] for e in log[n + 2 :]] == ["jit", "direct"]
    assert k.binds == 1  # same Helion specialization (sizes >= 2, one dtype) all along


def test_batch_one_rebinds_helion_and_hooks_fall_back():
    log = []
    k, launch = _fast(log)
    launch(torch.zeros(5, 8), torch.zeros(5, 16))
    launch(torch.zeros(1, 8), torch.zeros(1, 16))  # Helion buckets size 1 apart
    assert [e[0] for e in log] == ["jit", "jit"] and k.binds == 2
    runtime = launch._triton[0]
    hook = lambda metadata: None  # noqa: E731  (a profiler's)
    runtime.launch_enter_hook.add(hook)  # every launch goes through Triton while it is installed
    for _ in range(2):
        launch(torch.zeros(5, 8), torch.zeros(5, 16))
    assert [e[0] for e in log[2:]] == ["jit", "jit"]
    runtime.launch_enter_hook.remove(hook)
    runtime.launch_exit_hook = None  # older Triton: None when no hook
    launch(torch.zeros(5, 8), torch.zeros(5, 16))
    assert log[-1][0] == "direct"


def test_cpu_tensors_take_helions_path():
    log = []
    k = _Kernel(log)
    launch = HelionLaunch(k, enabled=True)
    for _ in range(2):
        launch(torch.zeros(4, 8), torch.zeros(4, 16))
    assert [e[0] for e in log] == ["helion", "jit"] * 2 and k.binds == 0


def test_helions_path_runs_on_the_tensors_device():
    """With the fast launch off, Helion's path too runs with the tensors' device current
    (Triton's JITFunction.run launches on the current device), restored afterwards; a
    tensor on the current device enters no guard."""
    log = []
    k = _Kernel(log)
    launch = HelionLaunch(k, enabled=False)
    launch.fast_device_type = "cpu"
    devices = _Devices(launch)
    seen = []
    real_host = k.host

    def host(x, out, *, _launcher=_default_launcher):
        seen.append(devices.current)
        real_host(x, out, _launcher=_launcher)

    k.host = host
    x, out = torch.zeros(4, 8), torch.zeros(4, 16)
    launch(x, out)
    x.fake_device = out.fake_device = 1
    launch(x, out)
    assert [e[0] for e in log] == ["helion", "jit"] * 2
    assert seen == [0, 1] and devices.entered == [1] and devices.current == 0


_MODULE = '''
CALLS = []


def {name}(x, out, *, _launcher=None):
    CALLS.append(x.shape[0])
    _launcher(JIT, ((x.size(0) + 15) // 16,), x, out, x.size(0), out.stride(0), num_warps=4, num_stages=1)
'''


class _CachingKernel(_Kernel):
    """A helion.Kernel whose bound kernel records the file of its generated module."""

    name = "k_demo"

    def __init__(self, log, module_dir, src_file):
        super().__init__(log)
        self.fn = src_file.read_text  # inspect.getsourcefile needs a function defined in src_file
        self.module_file = module_dir / "generated_module.py"
        self.module_file.write_text(_MODULE.format(name=self.name))

    def bind(self, args):
        bound = super().bind(args)
        bound._cache_path_map = {"config": str(self.module_file)}
        return bound


def test_generated_module_cached_on_disk(tmp_path, monkeypatch):
    import builtins
    import sys

    import eqdsl.runtime.helion_launch as hl_mod

    monkeypatch.setenv("EQDSL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(hl_mod.torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    src = tmp_path / "kernels_src.py"
    src.write_text("def f():\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        src_mod = __import__("kernels_src")
        log = []

        def make():
            k = _CachingKernel(log, tmp_path, src)
            k.fn = src_mod.f
            launch = HelionLaunch(k, enabled=True)
            launch.fast_device_type = "cpu"
            _Devices(launch)
            launch._triton = (_Runtime(), lambda device: "s", _default_launcher)
            return k, launch

        k1, l1 = make()
        x, out = torch.zeros(32, 8), torch.zeros(32, 16)
        l1(x, out)
        cached = list((tmp_path / "cache" / "helion").glob("k_demo_*.py"))
        assert len(cached) == 1 and cached[0].read_text() == k1.module_file.read_text()
        # a new process: the module comes from the disk cache, Helion is not called
        k2, l2 = make()
        log.clear()
        monkeypatch.setattr(builtins, "JIT", k2.jit, raising=False)  # the cached module's global JIT
        l2(x, out)
        l2(x, out)
        assert [e[0] for e in log] == ["jit", "direct"] and k2.binds == 0
        # another kernel source: another cache entry
        src.write_text("def f():\n    return 1\n")
        k3, l3 = make()
        l3(x, out)
        assert len(list((tmp_path / "cache" / "helion").glob("k_demo_*.py"))) == 2 and k3.binds == 1
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("kernels_src", None)


# ---------------------------------------------------------------- GPU (device machine)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled kernels)")
@pytest.mark.parametrize("spec", ["nequip_water", "tetris_poly_1"])
def test_fast_launch_matches_helion_on_gpu(spec, tmp_path, monkeypatch):
    """Every call after the first launches Triton directly: same bits as Helion's launch,
    for new batch sizes, misaligned operands, and a module loaded from the disk cache."""
    import importlib

    import helion.runtime

    monkeypatch.setenv("EQDSL_CACHE_DIR", str(tmp_path))
    through_triton = []  # launches that went through JITFunction.run, not directly
    real_launcher = helion.runtime.default_launcher

    def counting_launcher(*a, **k):
        through_triton.append(1)
        return real_launcher(*a, **k)

    monkeypatch.setattr(helion.runtime, "default_launcher", counting_launcher)
    ops = importlib.import_module(f"generated.{spec}.torch_ops")
    kernels = importlib.import_module(f"generated.{spec}.helion_kernels")
    dev = torch.device("cuda")
    for batch in (64, 33, 1, 64):
        shared = ops.SHARED_WEIGHTS
        x1 = torch.randn(batch, ops.DIM_IN1, device=dev)
        x2 = torch.randn(batch, ops.DIM_IN2, device=dev)
        w = torch.randn(*(() if shared else (batch,)), ops.WEIGHT_NUMEL, device=dev)
        pad = torch.randn(batch * ops.DIM_IN1 + 1, device=dev)[1:].view(batch, ops.DIM_IN1)  # 4-byte offset
        pad.copy_(x1)
        for name in (n for n in dir(kernels) if n.startswith("tp_fwd_")):
            helion_path = getattr(kernels, name)
            for a in (x1, pad):
                want = torch.empty(batch, ops.DIM_OUT, device=dev)
                helion_path(a, x2, w, want)
                fresh = HelionLaunch(helion_path)  # Helion's path, then the disk cache's module
                before = len(through_triton)
                for _ in range(3):
                    got = torch.full_like(want, float("nan"))
                    fresh(a, x2, w, got)
                    assert torch.equal(got, want)
                assert len(through_triton) == before + 1  # the first launch only; then direct
        out = ops.fwd_op(x1, x2, w)
        for _ in range(2):
            assert torch.equal(ops.fwd_op(x1, x2, w), out)
    assert list(tmp_path.glob("helion/tp_fwd_*.py"))


# ---------------------------------------------------------------- replay of the host function

# Helion 1.4.0's host function of generated/nequip_water's tp_fwd_0 (CPU, pinned config),
# as it writes it: what a replay must reproduce.
_HELION_HOST = '''
import torch

_helion_tp_fwd_0 = object()
_default_launcher = None


def tp_fwd_0(x1: torch.Tensor, x2: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, *, _launcher=_default_launcher):
    """Forward (dF/dg): g blocks 0-9; paths 0-9."""
    # src[helion_kernels.py:40]: for tile_b in hl.tile(x1.size(0), block_size=16):
    _BLOCK_SIZE_0 = 16
    _launcher(_helion_tp_fwd_0, ((x1.size(0) + _BLOCK_SIZE_0 - 1) // _BLOCK_SIZE_0,), x1, x2, weights, out, x1.size(0), out.stride(0), out.stride(1), weights.stride(0), weights.stride(1), x1.stride(0), x1.stride(1), x2.stride(0), x2.stride(1), num_warps=4, num_stages=1)
'''

_NOT_REPLAYABLE = {
    "side effect": "    CALLS.append(1)\n    _launcher(K, (x.size(0),), x, out, num_warps=4, num_stages=1)\n",
    "two launches": "    _launcher(K, (1,), x, out, num_warps=4, num_stages=1)\n    _launcher(K, (1,), out, x, num_warps=4, num_stages=1)\n",
    "value read from a tensor": "    _launcher(K, (1,), x, out, int(x[0]), num_warps=4, num_stages=1)\n",
    "grid from a tensor": "    n = x.sum()\n    _launcher(K, (n,), x, out, num_warps=4, num_stages=1)\n",
    "a view of a parameter": "    _launcher(K, (1,), x.view(-1), out, num_warps=4, num_stages=1)\n",
    "allocation": "    tmp = torch.empty_like(x)\n    _launcher(K, (1,), x, tmp, num_warps=4, num_stages=1)\n",
    "return value": "    _launcher(K, (1,), x, out, num_warps=4, num_stages=1)\n    return out\n",
    "reassigned parameter": "    x = out\n    _launcher(K, (1,), x, out, num_warps=4, num_stages=1)\n",
    "non-constant keyword": "    _launcher(K, (1,), x, out, num_warps=x.size(0), num_stages=1)\n",
    "integer helper of a tensor value": "    n = triton.next_power_of_2(int(x[0]))\n    _launcher(K, (n,), x, out, num_warps=4, num_stages=1)\n",
}


def _load(tmp_path, name, text):
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_replay_sources_of_helions_host_function(tmp_path):
    from eqdsl.runtime.helion_launch import _replay_sources

    host = _load(tmp_path, "helion_host", _HELION_HOST).tp_fwd_0
    # x1, x2, weights, out in their slots; the 9 sizes and strides recorded
    assert _replay_sources(host) == (0, 1, 2, 3) + (None,) * 9
    # a 2-D tile's host code also computes a reduction size with triton's integer helpers
    two_d = _HELION_HOST.replace("import torch\n", "import torch\nimport triton\n").replace(
        "    _BLOCK_SIZE_0 = 16\n",
        "    _BLOCK_SIZE_0 = 16\n    _RDIM_SIZE_2 = triton.next_power_of_2(_BLOCK_SIZE_0)\n"
        "    _GRID = triton.cdiv(x1.size(0), _RDIM_SIZE_2)\n",
    )
    assert "_RDIM_SIZE_2 = triton.next_power_of_2" in two_d
    assert _replay_sources(_load(tmp_path, "helion_host_2d", two_d).tp_fwd_0) == (0, 1, 2, 3) + (None,) * 9
    for i, (why, body) in enumerate(_NOT_REPLAYABLE.items()):
        text = f"import torch\nimport triton\nK = object()\nCALLS = []\n\n\ndef k(x, out, *, _launcher=None):\n{body}"
        assert _replay_sources(_load(tmp_path, f"bad{i}", text).k) is None, why
    assert _replay_sources(lambda x, *, _launcher=None: _launcher(K, (1,), x)) is None  # noqa: F821 (no source of its own)


class _CountingKernel(_Kernel):
    """Counts the calls of the host function: a replay makes none."""

    def __init__(self, log):
        super().__init__(log)
        self.host_calls = 0

    def host(self, x, out, *, _launcher=_default_launcher):
        """Like Helion's: constants, then one launch of sizes and strides."""
        _BLOCK = 16
        _launcher(self.jit, ((x.size(0) + _BLOCK - 1) // _BLOCK,), x, out, x.size(0), out.stride(0), num_warps=4, num_stages=1)

    def bind(self, args):
        kernel = self

        def counted(*a, _launcher):
            kernel.host_calls += 1
            return kernel.host(*a, _launcher=_launcher)

        counted.__wrapped__ = self.host  # inspect.signature / getsource see the host function
        self.binds += 1
        return type("Bound", (), {"_run": staticmethod(counted)})()


def test_replay_skips_the_host_function_and_launches_the_same():
    log = []
    k = _CountingKernel(log)
    launch = HelionLaunch(k, triton_options={"maxnreg": 256}, enabled=True)
    launch.fast_device_type = "cpu"
    devices = _Devices(launch)
    launch._triton = (_Runtime(), lambda device: f"stream{device}", _default_launcher)
    x, out = torch.zeros(40, 8), torch.zeros(40, 16)
    for _ in range(3):
        launch(x, out)
    assert k.host_calls == 1 and [e[0] for e in log] == ["jit", "direct", "direct"]
    assert log[-1][1:] == (triton_specialization((x, out, 40, 16)), (3, 1, 1), "stream0", (x, out, 40, 16))
    # other tensors of the same layout: the same plan, the new tensors in their slots
    x2, out2 = torch.ones(40, 8), torch.ones(40, 16)
    launch(x2, out2)
    assert k.host_calls == 1 and log[-1][4][0] is x2 and log[-1][4][1] is out2
    # another stride of out: recorded again (the host function's stride, not the old one)
    wide = torch.zeros(40, 32)[:, :16]
    launch(x, wide)
    launch(x, wide)
    assert k.host_calls == 2 and log[-1][4] == (x, wide, 40, 32) and log[-1][0] == "direct"
    # another batch: another grid
    y, out3 = torch.zeros(70, 8), torch.zeros(70, 16)
    launch(y, out3)
    launch(y, out3)
    assert k.host_calls == 3 and log[-1][2] == (5, 1, 1) and log[-1][4] == (y, out3, 70, 16)
    # the tensors' device made current for the launch only: no guard on the current device
    assert devices.entered == []
    # tensors on another device than the current one: recorded again (the key holds the
    # device), launched on that device's stream with that device current, then restored
    y1, out1 = y.clone(), out3.clone()
    y1.fake_device = out1.fake_device = 1
    launch(y1, out1)
    launch(y1, out1)
    assert k.host_calls == 4 and log[-1][0] == "direct" and log[-1][3] == "stream1"
    assert devices.entered == [1, 1] and devices.current == 0
    # the current device changed, the tensors on device 0: device 0 made current, its plan
    devices.current = 1
    launch(y, out3)
    assert k.host_calls == 4 and log[-1][3] == "stream0" and devices.entered == [1, 1, 0] and devices.current == 1
    devices.current = 0
    # a profiler's hook: every launch through the host function and Triton while installed
    hook = lambda metadata: None  # noqa: E731
    launch._triton[0].launch_enter_hook.add(hook)
    n = len(log)
    launch(y, out3)
    assert k.host_calls == 5 and [e[0] for e in log[n:]] == ["jit"]
    launch._triton[0].launch_enter_hook.remove(hook)
    launch(y, out3)
    assert k.host_calls == 5 and log[-1][0] == "direct"


def test_replay_tables_stay_bounded():
    log = []
    k = _CountingKernel(log)
    launch = HelionLaunch(k, enabled=True)
    launch.fast_device_type = "cpu"
    _Devices(launch)
    launch._triton = (_Runtime(), lambda device: "s", _default_launcher)
    launch.max_entries = 4
    for n in range(2, 12):  # MD: a new edge count each step
        launch(torch.zeros(n, 8), torch.zeros(n, 16))
    assert len(launch._plans) <= 4 and len(launch._exact) <= 4
