"""Host cost split of eager calls (cProfile) and GPU kernel times of the small-graph step."""
import cProfile, io, os, pstats, sys, time
sys.path.insert(0, os.getcwd() + "/benchmarks"); sys.path.insert(0, os.getcwd())
import torch
import generated.mace_large as meta
import generated.mace_large.torch_ops as ops
import generated.mace_large.torch_conv as conv
from bench_small_graph import System, torch_energy
dev = "cuda"
n = 16
x1, x2, w = (torch.randn(n, d, device=dev) for d in (ops.DIM_IN1, ops.DIM_IN2, ops.WEIGHT_NUMEL))
for _ in range(20): ops.tensor_product(x1, x2, w)
torch.cuda.synchronize()
def loop(f, k):
    t = time.perf_counter()
    for _ in range(k): f()
    dt = (time.perf_counter() - t) / k * 1e6; torch.cuda.synchronize(); return dt
print(f"tensor_product host {loop(lambda: ops.tensor_product(x1, x2, w), 2000):.1f} us/call")
print(f"fwd_op host {loop(lambda: ops.fwd_op(x1, x2, w), 2000):.1f} us/call")
out = torch.empty(n, ops.DIM_OUT, device=dev)
print(f"_launch_fwd host {loop(lambda: ops._launch_fwd(x1, x2, w, out), 2000):.1f} us/call")
k = ops._k.tp_fwd_0
host, launcher = k._hosts[torch.float32]
print(f"host fn + launch {loop(lambda: host(x1, x2, w, out, _launcher=launcher), 2000):.1f} us/call")
print(f"x+1 {loop(lambda: x1 + 1, 2000):.1f} us/call")
pr = cProfile.Profile(); pr.enable()
for _ in range(3000): ops.tensor_product(x1, x2, w)
pr.disable(); torch.cuda.synchronize()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(28); print(s.getvalue()[-6000:])
system = System(meta, 32, 512)
energy, energy_forces = torch_energy(torch, system, lambda *a: conv.conv(*a, check=False), dev, torch.float32)
pos = torch.as_tensor(system.positions[0], device=dev)
for _ in range(5): energy_forces(pos)
torch.cuda.synchronize()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(10): energy_forces(pos)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
