"""The Pallas printer: kernel body statements (``stmts``, ``eqdsl.kernel_ir``) as Python source lines.

The one place where a Pallas kernel's code is written as text; the template
(``templates/pallas_kernels.py.j2``) pastes the lines it returns. The runtime helpers
named here (``rt.load_vec``, ``rt.store_vec``, ``rt.load_tile``, ``rt.store_tile``,
``rt.fma``, ``rt.radial_rows``, ``rt.radial_vec``) are ``eqdsl.runtime.jax``'s, imported as
``rt`` by the generated file.
"""

from __future__ import annotations

from ...kernel_ir import Assign, Sum
from .stmts import Comment, LoadTile, Loop, RadialRead, RadialRows, Read, StoreTile, Unflatten, Write

__all__ = ["print_body"]


def _vec_args(count: int, pad: int, stride: int) -> str:
    return f"count={count}, pad={pad}" + (f", stride={stride}" if stride != 1 else "")


def _comment(text: str) -> str:
    return f"  # {text}" if text else ""


def _sum(ind: str, target: str, s: Sum) -> list[str]:
    """``target = init + scale * (terms)``: one line for one term, else one line per term."""
    terms, prefix = s.terms_text(), s.prefix
    if len(terms) == 1:
        return [f"{ind}{target} = " + (f"{prefix}({terms[0]})" if prefix else terms[0])]
    return [f"{ind}{target} = {prefix}("] + [f"{ind}    {t}" for t in terms] + [f"{ind})"]


def print_body(stmts, ind: str) -> list[str]:
    """Source lines of ``stmts``, each indented by ``ind`` (loops nest by four spaces).

    Raises:
        TypeError: a statement of a type the printer does not know.
    """
    out: list[str] = []
    for s in stmts:
        if isinstance(s, Assign) and isinstance(s.value, Sum):
            out += _sum(ind, s.target.name, s.value)
        elif isinstance(s, Assign):
            out.append(f"{ind}{s.target} = {s.value}")
        elif isinstance(s, Read):
            if s.stride == 1 and s.count == s.pad:
                src = f"{s.ref}[:, pl.ds({s.start}, {s.pad})]"
            else:
                src = f"rt.load_vec({s.ref}, {s.start}, {_vec_args(s.count, s.pad, s.stride)})"
            out.append(f"{ind}{s.name} = {src}{_comment(s.comment)}")
        elif isinstance(s, Write):
            if s.stride == 1 and s.count == s.pad:
                out.append(f"{ind}{s.ref}[:, pl.ds({s.start}, {s.pad})] = {s.value}")
            else:
                out.append(f"{ind}rt.store_vec({s.ref}, {s.start}, {s.value}, {_vec_args(s.count, s.pad, s.stride)})")
        elif isinstance(s, LoadTile):
            out.append(f"{ind}{', '.join(s.names)} = rt.load_tile({s.ref}, {s.start}, mul={s.mul}, dim={s.dim}, "
                       f"pad={s.pad}){_comment(s.comment)}")
        elif isinstance(s, StoreTile):
            out.append(f"{ind}rt.store_tile({s.ref}, {s.start}, [{', '.join(map(str, s.values))}], mul={s.mul}, "
                       f"dim={s.dim}, pad={s.pad})")
        elif isinstance(s, RadialRows):
            cols = ("" if s.cols is None else f", cols={s.cols}") + (f", dot={s.dot}" if s.dot else "")
            out.append(f"{ind}{s.name} = rt.radial_rows({s.ref}, count={s.count}, pad={s.pad}{cols})")
        elif isinstance(s, RadialRead):
            out.append(f"{ind}{s.name} = rt.radial_vec({s.rows}, {s.ref}, {s.start}, "
                       f"{_vec_args(s.count, s.pad, s.stride)})")
        elif isinstance(s, Comment):
            out.append(f"{ind}# {s.text}")
        elif isinstance(s, Unflatten):
            out += [f"{ind}{s.u} = lax.div({s.t}, {s.m2})", f"{ind}{s.v} = {s.t} - {s.u} * {s.m2}"]
        elif isinstance(s, Loop):
            carry = "(" + ", ".join(s.carry) + ("," if len(s.carry) == 1 else "") + ")" if s.carry else "None"
            out += ["", f"{ind}def {s.fn}({s.var}, carry):"]
            if s.carry:
                out.append(f"{ind}    {carry} = carry")
            out += print_body(s.body, ind + "    ")
            out += [f"{ind}    return {carry if s.carry else 'carry'}", "",
                    f"{ind}{carry + ' = ' if s.carry else ''}lax.fori_loop(0, {s.count}, {s.fn}, {carry})"]
        else:
            raise TypeError(f"no Pallas printing for {type(s).__name__}")
    return out
