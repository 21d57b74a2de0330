"""Probe (device, 2026-11-28): the radial weight matmuls of conv_radial in float32, torch (cuBLAS,
TF32 off) against Triton tf32x3 and IEEE kernels and JAX dot algorithms, each against float64.

Shapes: 114,688 edges (bulk Si) x H -> weight_numel of mace_large (64 -> 2,176) and nequip_toluene
(128 -> 1,920); W = rf @ wr (forward), d_rf = gW @ wr^T and d_wr = rf^T @ gW (backward). Run on the
GPU machine: ``python3 benchmarks/tools/radial_matmul_probe.py`` (torch, triton; jax optional).
Result of 2026-11-28: ``results/s13/radial_matmul_probe.log``, read in docs/conv_radial.md.
"""
import os, sys, time, statistics
import torch, triton, triton.language as tl

@triton.jit
def mm_kernel(a, b, c, M, N, K: tl.constexpr, sam, sak, sbk, sbn, scm, scn,
              BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    # C[M, N] = A[M, K] @ B[K, N] with the whole (small) K in one dot
    pid_n = tl.program_id(0); pid_m = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM); rn = pid_n * BN + tl.arange(0, BN); rk = tl.arange(0, K)
    av = tl.load(a + rm[:, None] * sam + rk[None, :] * sak, mask=rm[:, None] < M, other=0.0)
    bv = tl.load(b + rk[:, None] * sbk + rn[None, :] * sbn, mask=rn[None, :] < N, other=0.0)
    acc = tl.dot(av, bv, input_precision=PREC)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

@triton.jit
def mm_kloop(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    # C = A @ B, loop over K (d_rf = gW @ wr^T: K = weight_numel)
    pid_n = tl.program_id(0); pid_m = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM); rn = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        av = tl.load(a + rm[:, None] * sam + rk[None, :] * sak, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        bv = tl.load(b + rk[:, None] * sbk + rn[None, :] * sbn, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(av, bv, acc, input_precision=PREC)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

@triton.jit
def mm_splitk(a, b, c, M, N, K, sam, sak, sbk, sbn, scs, scm, scn, CHUNK,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    # partial C[s] = A[:, s-chunk] @ B[s-chunk, :] (d_wr = rf^T @ gW: K = edges, M = H)
    pid_n = tl.program_id(0); pid_m = tl.program_id(1); s = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM); rn = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    k_lo = s * CHUNK
    for k0 in range(k_lo, tl.minimum(k_lo + CHUNK, K), BK):
        rk = k0 + tl.arange(0, BK)
        av = tl.load(a + rm[:, None] * sam + rk[None, :] * sak, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        bv = tl.load(b + rk[:, None] * sbk + rn[None, :] * sbn, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(av, bv, acc, input_precision=PREC)
    tl.store(c + s * scs + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

def fwd_mm(rf, wr, prec, BM, BN, warps, stages=1):
    M, K = rf.shape; N = wr.shape[1]
    out = rf.new_empty((M, N))
    mm_kernel[(triton.cdiv(N, BN), triton.cdiv(M, BM))](rf, wr, out, M, N, K, *rf.stride(), *wr.stride(), *out.stride(),
                                                         BM=BM, BN=BN, PREC=prec, num_warps=warps, num_stages=stages)
    return out

def drf_mm(gw, wr, prec, BM, BN, BK, warps, stages):
    M, K = gw.shape; N = wr.shape[0]
    out = gw.new_empty((M, N)); wt = wr.t()
    mm_kloop[(triton.cdiv(N, BN), triton.cdiv(M, BM))](gw, wt, out, M, N, K, *gw.stride(), *wt.stride(), *out.stride(),
                                                       BM=BM, BN=BN, BK=BK, PREC=prec, num_warps=warps, num_stages=stages)
    return out

def dwr_mm(rf, gw, prec, BM, BN, BK, warps, stages, splits):
    E, H = rf.shape; N = gw.shape[1]
    a = rf.t()
    chunk = triton.cdiv(triton.cdiv(E, splits), BK) * BK
    s = triton.cdiv(E, chunk)
    part = rf.new_empty((s, H, N))
    mm_splitk[(triton.cdiv(N, BN), triton.cdiv(H, BM), s)](a, gw, part, H, N, E, *a.stride(), *gw.stride(), *part.stride(), chunk,
                                                            BM=BM, BN=BN, BK=BK, PREC=prec, num_warps=warps, num_stages=stages)
    return part.sum(0)

def bench(fn, reps=30):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts)

def rel(a, ref):
    return float((a.double() - ref).norm() / ref.norm())

torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"
rows = []
for name, E, H, N in (("mace_large bulk", 114688, 64, 2176), ("nequip_toluene bulk", 114688, 128, 1920)):
    g = torch.Generator(device=dev).manual_seed(0)
    rf = torch.randn(E, H, device=dev, generator=g); wr = torch.randn(H, N, device=dev, generator=g) / H ** 0.5
    gw = torch.randn(E, N, device=dev, generator=g)
    ref_f = rf.double() @ wr.double(); ref_drf = gw.double() @ wr.double().t(); ref_dwr = rf.double().t() @ gw.double()
    bytes_f = (E * H + H * N + E * N) * 4
    t = bench(lambda: rf @ wr); rows.append((name, "W = rf @ wr", "torch fp32 (cuBLAS)", t, rel(rf @ wr, ref_f), bytes_f / t / 1e3))
    for prec in ("tf32x3", "ieee"):
        best = None
        for BM, BN, warps in ((64, 128, 4), (128, 128, 8), (128, 64, 4), (64, 256, 8), (128, 256, 8)):
            try:
                t = bench(lambda: fwd_mm(rf, wr, prec, BM, BN, warps))
            except Exception as ex:
                print(name, prec, BM, BN, "failed", type(ex).__name__, str(ex)[:100]); continue
            if best is None or t < best[0]: best = (t, BM, BN, warps)
        t, BM, BN, warps = best
        out = fwd_mm(rf, wr, prec, BM, BN, warps)
        rows.append((name, "W = rf @ wr", f"triton {prec} {BM}x{BN}/{warps}w", t, rel(out, ref_f), bytes_f / t / 1e3))
    bytes_b = (E * N + H * N + E * H) * 4
    t = bench(lambda: gw @ wr.t()); rows.append((name, "d_rf = gW @ wr^T", "torch fp32", t, rel(gw @ wr.t(), ref_drf), bytes_b / t / 1e3))
    t = bench(lambda: rf.t() @ gw); rows.append((name, "d_wr = rf^T @ gW", "torch fp32", t, rel(rf.t() @ gw, ref_dwr), bytes_b / t / 1e3))
    for prec in ("tf32x3",):
        best = None
        for BM, BN, BK, warps, st in ((64, 64, 64, 4, 3), (128, 64, 32, 4, 3), (128, 64, 64, 8, 3), (64, 128, 64, 4, 3)):
            if BN > H and BN != 64: continue
            try:
                t = bench(lambda: drf_mm(gw, wr, prec, BM, min(BN, H), BK, warps, st))
            except Exception as ex:
                print("drf", prec, "failed", type(ex).__name__, str(ex)[:100]); continue
            if best is None or t < best[0]: best = (t, BM, min(BN, H), BK, warps, st)
        t, *cfg = best
        rows.append((name, "d_rf = gW @ wr^T", f"triton {prec} {cfg}", t, rel(drf_mm(gw, wr, prec, *cfg), ref_drf), bytes_b / t / 1e3))
        best = None
        for BM, BN, BK, warps, st, sp in ((64, 128, 64, 4, 3, 132), (64, 64, 64, 4, 3, 66), (64, 128, 32, 4, 3, 264), (64, 256, 32, 8, 3, 132)):
            BM = H if H <= 128 else BM
            try:
                t = bench(lambda: dwr_mm(rf, gw, prec, BM, BN, BK, warps, st, sp))
            except Exception as ex:
                print("dwr", prec, "failed", type(ex).__name__, str(ex)[:100]); continue
            if best is None or t < best[0]: best = (t, BM, BN, BK, warps, st, sp)
        t, *cfg = best
        rows.append((name, "d_wr = rf^T @ gW", f"triton {prec} {cfg}", t, rel(dwr_mm(rf, gw, prec, *cfg), ref_dwr), bytes_b / t / 1e3))
    del gw, ref_f, ref_drf, ref_dwr
    torch.cuda.empty_cache()

# JAX: HIGHEST vs the TF32_TF32_F32_X3 dot algorithm
jrows = []
try:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax, jax.numpy as jnp, numpy as np
    for name, E, H, N in (("mace_large bulk", 114688, 64, 2176),):
        k1, k2 = jax.random.split(jax.random.PRNGKey(0))
        rf = jax.random.normal(k1, (E, H), jnp.float32); wr = jax.random.normal(k2, (H, N), jnp.float32) / 8
        ref = np.asarray(rf, np.float64) @ np.asarray(wr, np.float64)
        for label, prec in (("HIGHEST", jax.lax.Precision.HIGHEST), ("TF32_TF32_F32_X3", jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3),
                            ("BF16_BF16_F32_X6", jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X6)):
            try:
                f = jax.jit(lambda a, b, p=prec: jnp.matmul(a, b, precision=p))
                out = f(rf, wr).block_until_ready()
                ts = []
                for _ in range(20):
                    t0 = time.perf_counter(); f(rf, wr).block_until_ready(); ts.append((time.perf_counter() - t0) * 1e6)
                err = float(np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref))
                jrows.append((name, label, statistics.median(ts), err))
            except Exception as ex:
                jrows.append((name, label, float("nan"), f"{type(ex).__name__}: {str(ex)[:120]}"))
except Exception as ex:
    print("jax failed", ex)

print(torch.cuda.get_device_name(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
print(f"{'problem':22s} {'product':18s} {'impl':42s} {'us':>8s} {'rel err':>9s} {'GB/s':>6s}")
for r in rows:
    print(f"{r[0]:22s} {r[1]:18s} {r[2]:42s} {r[3]:8.1f} {r[4]:9.2e} {r[5]:6.0f}")
for r in jrows:
    print(f"{r[0]:22s} jax matmul {r[1]:20s} {r[2]:8.1f} us  err {r[3]}")
