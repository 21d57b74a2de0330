"""Where the first conv fwd/bwd/dbl seconds go (cubins installed), cProfile + wall parts."""
import cProfile, pstats, sys, time, io, os
T = {}
t = time.perf_counter()
import torch
T["import torch"] = time.perf_counter() - t; t = time.perf_counter()
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
T["cuda init"] = time.perf_counter() - t; t = time.perf_counter()
if os.environ.get("PREIMPORT") == "1":
    # what any first torch.library custom-op call costs (torch's lazy imports), paid here
    @torch.library.custom_op("probe::noop", mutates_args=())
    def noop(x: torch.Tensor) -> torch.Tensor:
        return x.clone()
    noop.register_autograd(lambda ctx, g: g)
    noop(torch.zeros(1, device="cuda", requires_grad=True)).sum().backward()
    torch.cuda.synchronize()
    T["torch custom-op first call"] = time.perf_counter() - t; t = time.perf_counter()
sys.path.insert(0, os.getcwd() + "/benchmarks")
from bench_startup import random_graph, scalar_columns
pr = cProfile.Profile(); pr.enable()
import generated.mace_large as meta
import generated.mace_large.torch_conv as conv
T["import package"] = time.perf_counter() - t; t = time.perf_counter()
src, dst = random_graph(256, 32)
g = torch.Generator().manual_seed(0)
x = torch.randn(256, meta.DIM_IN1, generator=g).cuda().requires_grad_()
y = torch.randn(len(src), meta.DIM_IN2, generator=g).cuda().requires_grad_()
w = torch.randn(len(src), meta.WEIGHT_NUMEL, generator=g).cuda().requires_grad_()
src = torch.as_tensor(src).cuda(); dst = torch.as_tensor(dst).cuda()
sc = torch.tensor(scalar_columns(meta.IRREPS_OUT), device="cuda")
torch.cuda.synchronize(); T["inputs"] = time.perf_counter() - t; t = time.perf_counter()
out = conv.conv(x, y, w, src, dst, 256); torch.cuda.synchronize()
T["fwd"] = time.perf_counter() - t; t = time.perf_counter()
gx, gy = torch.autograd.grad(out.index_select(1, sc).sum(), (x, y), create_graph=True); torch.cuda.synchronize()
T["bwd"] = time.perf_counter() - t; t = time.perf_counter()
(gw,) = torch.autograd.grad(gx.pow(2).sum() + gy.pow(2).sum(), (w,)); torch.cuda.synchronize()
T["dbl"] = time.perf_counter() - t; t = time.perf_counter()
out = conv.conv(x, y, w, src, dst, 256); torch.cuda.synchronize()
T["second fwd"] = time.perf_counter() - t
pr.disable()
print(" | ".join(f"{k} {v:.3f}" for k, v in T.items()))
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(45); print(s.getvalue()[-9000:])
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[-5000:])
