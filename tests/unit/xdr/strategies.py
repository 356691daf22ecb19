"""Hypothesis strategies for any generated XDR type, built from the parsed specification."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from hypothesis import strategies as st

from nfsrdma.xdr.ast import Decl, Enum_, Kind, Spec, Struct, Typedef, Union
from nfsrdma.xdr.codegen import Generator, pyname

_INT_RANGES = {
    "int": (-(2**31), 2**31 - 1),
    "unsigned int": (0, 2**32 - 1),
    "hyper": (-(2**63), 2**63 - 1),
    "unsigned hyper": (0, 2**64 - 1),
}
MAX_ITEMS = 3
MAX_BYTES = 40


class Strategies:
    def __init__(self, spec: Spec, module: ModuleType) -> None:
        self.spec = spec
        self.mod = module
        self.gen = Generator(spec)
        self._cache: dict[str, st.SearchStrategy[Any]] = {}

    def for_type(self, name: str) -> st.SearchStrategy[Any]:
        if name not in self._cache:
            self._cache[name] = st.deferred(lambda: self._build_type(name))
        return self._cache[name]

    def _build_type(self, name: str) -> st.SearchStrategy[Any]:
        if name in _INT_RANGES:
            lo, hi = _INT_RANGES[name]
            return st.integers(lo, hi)
        if name == "bool":
            return st.booleans()
        t = self.spec.types[name]
        if isinstance(t, Enum_):
            return st.sampled_from(list(getattr(self.mod, name)))
        if isinstance(t, Typedef):
            return self.for_decl(t.decl)
        if isinstance(t, Struct):
            cls = getattr(self.mod, name)
            fields = t.fields[:-1] if name in self.gen.list_nodes else t.fields
            return st.builds(cls, *[self.for_decl(f, (name, f.name)) for f in fields])
        assert isinstance(t, Union)
        return self._union(t)

    def _list_node(self, name: str) -> st.SearchStrategy[Any]:
        t = self.spec.types[name]
        assert isinstance(t, Struct)
        rest = t.fields[:-1]
        if len(rest) == 1:
            elem = self.for_decl(rest[0])
        else:
            elem = st.builds(getattr(self.mod, name), *[self.for_decl(f) for f in rest])
        return st.lists(elem, max_size=MAX_ITEMS)

    def _union(self, u: Union) -> st.SearchStrategy[Any]:
        cls = getattr(self.mod, u.name)
        disc = self.gen.resolve(u.discriminant)
        options = []
        covered: set[int] = set()
        for arm in u.arms:
            covered.update(arm.cases)
            value = (
                st.none() if arm.decl.is_void else self.for_decl(arm.decl, (u.name, arm.decl.name))
            )
            options.append(st.builds(cls, self._disc_values(disc, arm.cases), value))
        if u.default is not None:
            others = self._disc_others(disc, covered)
            if others is not None:
                d = u.default
                value = st.none() if d.is_void else self.for_decl(d, (u.name, d.name))
                options.append(st.builds(cls, others, value))
        return st.one_of(options)

    def _disc_values(self, disc: Decl, cases: list[int]) -> st.SearchStrategy[Any]:
        t = self.spec.types.get(disc.type)
        if isinstance(t, Enum_):
            enum = getattr(self.mod, disc.type)
            return st.sampled_from([enum(c) for c in cases])
        if disc.type == "bool":
            return st.sampled_from([bool(c) for c in cases])
        return st.sampled_from(cases)

    def _disc_others(self, disc: Decl, covered: set[int]) -> st.SearchStrategy[Any] | None:
        t = self.spec.types.get(disc.type)
        if isinstance(t, Enum_):
            rest = [m for m in getattr(self.mod, disc.type) if m.value not in covered]
            return st.sampled_from(rest) if rest else None
        if disc.type == "bool":
            rest_b = [b for b in (False, True) if int(b) not in covered]
            return st.sampled_from(rest_b) if rest_b else None
        lo, hi = _INT_RANGES[disc.type]
        return st.integers(lo, hi).filter(lambda v: v not in covered)

    def for_decl(self, d: Decl, owner: tuple[str, str] | None = None) -> st.SearchStrategy[Any]:
        r = self.gen.resolve(d)
        if r.kind is Kind.OPTIONAL:
            if r.type in self.gen.list_nodes:
                return self._list_node(r.type)
            return st.none() | self.for_type(r.type)
        if r.type == "opaque":
            if r.kind is Kind.FIXED:
                assert r.size is not None
                return st.binary(min_size=r.size, max_size=r.size)
            return st.binary(max_size=min(r.size if r.size is not None else MAX_BYTES, MAX_BYTES))
        if r.type == "string":
            hi = min(r.size if r.size is not None else MAX_BYTES, MAX_BYTES)
            return st.text(st.characters(codec="ascii"), max_size=hi)
        if r.kind is Kind.PLAIN:
            return self.for_type(r.type)
        elem = self.for_type(r.type)
        if r.kind is Kind.FIXED:
            assert r.size is not None
            return st.lists(elem, min_size=r.size, max_size=r.size)
        hi = min(r.size if r.size is not None else MAX_ITEMS, MAX_ITEMS)
        return st.lists(elem, max_size=hi)


def codec(module: ModuleType, name: str) -> tuple[Any, Any]:
    return getattr(module, f"enc_{name}"), getattr(module, f"dec_{name}")


def type_names(spec: Spec) -> list[str]:
    return [n for n in spec.types if not n.startswith("_")]


__all__ = ["Strategies", "codec", "pyname", "type_names"]
