import sys, importlib, numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, "exp/" + sys.argv[1]); sys.path.insert(0, ".")
prob = sys.argv[2]
a = importlib.import_module(f"{prob}.jax_ops")
sys.path.pop(0)
for k in [k for k in sys.modules if k.startswith(prob)]: del sys.modules[k]
b = importlib.import_module(f"generated.{prob}.jax_ops")
assert a.__file__ != b.__file__, (a.__file__, b.__file__)
rng = np.random.default_rng(0)
n, e = 5, 12
s = jnp.asarray(rng.integers(0, n, e), jnp.int32); d = jnp.asarray(rng.integers(0, n, e), jnp.int32)
x = jnp.asarray(rng.standard_normal((n, a.DIM_IN1)), jnp.float32)
y = jnp.asarray(rng.standard_normal((e, a.DIM_IN2)), jnp.float32)
w = jnp.asarray(rng.standard_normal((e, a.WEIGHT_NUMEL)), jnp.float32)
g = jnp.asarray(rng.standard_normal((n, a.DIM_OUT)), jnp.float32)
res = []
for m in (a, b):
    out, vjp = jax.vjp(lambda x_, y_, w_: m.conv(x_, y_, w_, s, d, n), x, y, w)
    res.append([out, *vjp(g)])
    o2 = m.tensor_product(x[s], y, w)
    res[-1].append(o2)
for u, v in zip(*res):
    print(float(jnp.linalg.norm(u - v) / jnp.linalg.norm(v)))
