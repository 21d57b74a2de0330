"""Compile a Triton IR file for sm_90 with the local Triton (no GPU) and print registers, spills and SASS opcode counts."""
import sys, re, collections, subprocess, tempfile, os
import triton
from triton.backends.compiler import GPUTarget
path, warps = sys.argv[1], int(sys.argv[2])
k = triton.compile(path, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 1})
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
with tempfile.NamedTemporaryFile(suffix=".ptx", delete=False, mode="w") as f:
    f.write(k.asm["ptx"])
v = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", "/dev/null"], capture_output=True, text=True)
print(" ".join(l.strip() for l in v.stderr.splitlines() if "registers" in l or "spill" in l))
cubin = k.asm["cubin"]
from triton.backends.nvidia.compiler import get_ptxas  # noqa
tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
    f.write(cubin)
sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
open(path + ".sass", "w").write(sass)
ops = collections.Counter()
for line in sass.splitlines():
    m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
    if m:
        ops[m.group(2).split(".")[0]] += 1
print("static instructions", sum(ops.values()))
print(ops.most_common(25))
ttgir = k.asm["ttgir"]
open(path + ".ttgir", "w").write(ttgir)
# ops inside scf.for bodies (by nesting depth of braces after an scf.for line)
inside = collections.Counter(); outside = collections.Counter(); depth = 0; loop_depths = []
for line in ttgir.splitlines():
    m = re.search(r"=\s*([a-z_]+\.[a-z_]+)", line) or re.search(r"^\s*([a-z_]+\.[a-z_]+)", line)
    if m:
        (inside if loop_depths else outside)[m.group(1)] += 1
    if "scf.for" in line:
        loop_depths.append(depth)
    depth += line.count("{") - line.count("}")
    while loop_depths and depth <= loop_depths[-1]:
        loop_depths.pop()
print("in loops:", inside.most_common(20))
print("outside:", outside.most_common(12))
