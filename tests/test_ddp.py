"""``examples/train_ddp.py`` under ``torchrun``: DistributedDataParallel force training of
the main job's interaction layer gives, after the first backward, the gradients of one
process over the same molecules (float64, 1e-10 relative), on every rank; the ranks'
parameters stay equal through the optimizer steps.

CPU (CI): two processes, the gloo backend, Helion kernels in Triton's interpreter, a
small channelwise conv (``8x0e+8x1o`` x ``0e+1o``), four small molecules, one optimizer
step (rank 0 writes the package; each rank compiles the kernels it calls). GPU (marked
``gpu``): the same with NCCL, one GPU per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("helion")
pytest.importorskip("ase")
pytest.importorskip("e3nn")

ROOT = Path(__file__).resolve().parents[1]
SPEC = """
[[tensor_product]]
name = "ddp_small"
irreps_in1 = "8x0e+8x1o"
irreps_in2 = "0e+1o"
irreps_out = "0e+1o"
mode = "uvu"
shared_weights = false
layout = "mul_ir"
dtypes = ["float64"]
conv = true
{tuning}"""
# CPU: the backward as the three gradient kernels, no fused one (one kernel fewer for each
# process to generate in the interpreter; the fused backward is covered by test_torch_conv)
NO_FUSED = "\n[tensor_product.tuning]\nfuse_bwd = 0\n"
MOLECULES = "H2O,NH3,CH4,CH3OH"  # 18 atoms, 68 edges at 4 Å; rank 0: H2O and CH4, rank 1: NH3 and CH3OH


def run_ddp(tmp_path: Path, backend: str, nproc: int = 2) -> list[dict]:
    """Run the example under torchrun; returns each rank's saved tensors."""
    spec = tmp_path / "ddp_small.toml"
    spec.write_text(SPEC.format(tuning=NO_FUSED if backend == "gloo" else ""))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if backend == "gloo":
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(ROOT / "examples" / "train_ddp.py"), "--backend", backend, "--spec", str(spec),
           "--out", str(tmp_path / "gen" / "kernels"), "--molecules", MOLECULES, "--steps", "1", "--check",
           "--save", str(tmp_path / "saved")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    print(proc.stdout)
    assert "gradient check" in proc.stdout and "(ok," in proc.stdout, proc.stdout
    return [torch.load(tmp_path / "saved" / f"rank{r}.pt") for r in range(nproc)]


def check_saved(saved: list[dict]) -> None:
    """Rank 0's all-reduced gradients against its one-process gradients over all molecules
    (1e-10 relative, each parameter); every rank's equal to rank 0's; the parameters equal
    on every rank after the optimizer step, and moved."""
    grads, single = saved[0]["grads"], saved[0]["single"]
    assert set(grads) == set(single) == {"embedding", "radial.0.weight", "radial.0.bias", "radial.2.weight",
                                         "radial.2.bias", "readout"}
    for name, want in single.items():
        assert want.dtype == torch.float64 and want.abs().max() > 0, name
        err = (grads[name] - want).abs().max() / want.abs().max()
        assert err <= 1e-10, (name, float(err))
    for other in saved[1:]:
        for name in grads:
            assert torch.equal(other["grads"][name], grads[name]), name
            assert torch.equal(other["params"][name], saved[0]["params"][name]), name
    for name, start in saved[0]["initial"].items():
        assert not torch.equal(saved[0]["params"][name], start), name  # the optimizer stepped


def test_ddp_gloo_two_processes_match_one(tmp_path):
    check_saved(run_ddp(tmp_path, "gloo"))


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.device_count() >= 2), reason="needs two CUDA GPUs")
def test_ddp_nccl_two_gpus_match_one(tmp_path):
    check_saved(run_ddp(tmp_path, "nccl"))
