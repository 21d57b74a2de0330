"""Print the Triton IR (text) of each __gpu$xla.gpu.triton call in a lowered StableHLO text file."""
import sys, re
from jax._src.lib.mlir import ir
from jax._src.lib import triton as _t  # noqa
from jaxlib.triton import dialect as tt_dialect
text = open(sys.argv[1]).read()
calls = re.findall(r'name = "([^"]*)"[^}]*?|ir = "((?:[^"\\]|\\.)*)"', text)
blobs = re.findall(r'ir = "((?:[^"\\]|\\.)*)"', text)
names = re.findall(r'__gpu\$xla\.gpu\.triton.*?name = "([^"]*)"', text)
def unescape(s):
    out = bytearray(); i = 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            nx = s[i+1]
            if nx in '"\\': out.append(ord(nx)); i += 2
            elif nx == 'n': out.append(10); i += 2
            elif nx == 't': out.append(9); i += 2
            else: out.append(int(s[i+1:i+3], 16)); i += 3
        else:
            out += c.encode(); i += 1
    return bytes(out)
for k, b in enumerate(blobs):
    ctx = ir.Context(); tt_dialect.register_dialect(ctx); ctx.allow_unregistered_dialects = True
    with ctx:
        m = ir.Module.parse(unescape(b))
        open(f"{sys.argv[2]}_{k}.ttir", "w").write(str(m))
    print(k, names[k] if k < len(names) else "?")
