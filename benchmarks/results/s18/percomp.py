"""Variant: mul_ir blocks read and written one component at a time (strided columns), no tile + split."""
import os
from eqdsl.runtime import jax as rt
from eqdsl.runtime.jax import tiles


def load_tile(ref, start, *, mul, dim, pad):
    return [tiles.load_vec(ref, start + m, count=mul, pad=pad, stride=dim) for m in range(dim)]


def store_tile(ref, start, parts, *, mul, dim, pad):
    for m, p in enumerate(parts):
        tiles.store_vec(ref, start + m, p, count=mul, pad=pad, stride=dim)


if os.environ.get("PERCOMP") in ("1", "2"):
    rt.load_tile = tiles.load_tile = load_tile
if os.environ.get("PERCOMP") == "2":
    rt.store_tile = tiles.store_tile = store_tile
