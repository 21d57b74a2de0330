"""Where the host time of one eager call goes on the GPU machine (cProfile, top functions)."""
import cProfile, importlib, io, pstats, sys, time
import torch
sys.path.insert(0, ".")
ops = importlib.import_module("generated.mace_large.torch_ops")
dev = torch.device("cuda")
torch.manual_seed(0)
B, N, E = 16, 32, 512
x1 = torch.randn(B, ops.DIM_IN1, device=dev); x2 = torch.randn(B, ops.DIM_IN2, device=dev)
w = torch.randn(B, ops.WEIGHT_NUMEL, device=dev)
src = torch.randint(0, N, (E,), device=dev); dst = torch.sort(torch.randint(0, N, (E,), device=dev))[0]
x = torch.randn(N, ops.DIM_IN1, device=dev); y = torch.randn(E, ops.DIM_IN2, device=dev)
we = torch.randn(E, ops.WEIGHT_NUMEL, device=dev)
xg = x.clone().requires_grad_(); yg = y.clone().requires_grad_(); wg = we.clone().requires_grad_()
cases = {
    "tp": lambda: ops.tensor_product(x1, x2, w),
    "conv": lambda: ops.conv(x, y, we, src, dst, N, check=False),
    "conv_fwd_bwd": lambda: torch.autograd.grad(ops.conv(xg, yg, wg, src, dst, N, check=False).sum(), (xg, yg, wg)),
    "floor": lambda: x1 + 1,
}
for name, fn in cases.items():
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(200):
            fn()
        best = min(best, (time.perf_counter() - t) / 200 * 1e6)
        torch.cuda.synchronize()
    print(f"HOST {name}: {best:.1f} us per call (no sync)", flush=True)
for name in (sys.argv[1].split(",") if len(sys.argv) > 1 else ("tp", "conv")):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(500):
        cases[name]()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
    pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(45)
    print(f"== cProfile {name} (500 calls)\n" + s.getvalue(), flush=True)
