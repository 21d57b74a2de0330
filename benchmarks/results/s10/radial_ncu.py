"""conv_radial_fwd (segment = 1, max_terms = 64) and conv_fwd of mace_large under Nsight Compute
(issue 26, 2026-11-27): one forward each on 4,096 nodes x 32 in-edges, float32, Helion kernels.
    ncu -k regex:'conv_radial_fwd_0|conv_fwd_0' --section ... python3 benchmarks/results/s10/radial_ncu.py"""
import sys, tempfile, pathlib
import torch
ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "benchmarks/tools"))
import radial_torch_check as r
from eqdsl.codegen.generate import generate_files, write_package
text = (ROOT / "examples/specs/mace_large.toml").read_text()
tmp = pathlib.Path(tempfile.mkdtemp())
(tmp / "s.toml").write_text(r.sweep_spec(text, "n0", *r.parse_setting("16:32:4:sbm64")))
write_package(tmp / "pkg_n0", generate_files(tmp / "s.toml", tmp / "pkg_n0", triton=False))
_, conv = r.import_modules(tmp / "pkg_n0", "mace_large_n0")
n, deg = 4096, 32
g = torch.Generator().manual_seed(0)
d = torch.arange(n).repeat_interleave(deg).cuda()
s = torch.randint(0, n, (n * deg,), generator=g).cuda()
x, y = torch.randn(n, conv.DIM_IN1, device="cuda"), torch.randn(n * deg, conv.DIM_IN2, device="cuda")
rf, wr = torch.randn(n * deg, 64, device="cuda"), torch.randn(64, conv.WEIGHT_NUMEL, device="cuda") / 8
with torch.no_grad():
    for _ in range(2):
        conv.conv_radial(x, y, rf, wr, s, d, n, check=False)
        conv.conv(x, y, rf @ wr, s, d, n, check=False)
    torch.cuda.synchronize()
print("done")
