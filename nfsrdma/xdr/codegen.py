"""Generate typed Python codecs from a parsed XDR specification.

For every type T the output has a class (``@dataclass(slots=True)`` for structs and unions,
``IntEnum`` for enums, an alias for typedefs) and two functions::

    enc_T(w: Writer, v: T) -> None
    dec_T(r: Reader, off: int) -> tuple[T, int]

Speed comes from doing per-type work once, at generation time:
- runs of consecutive fixed-size fields (integers, bools, enums, fixed opaques, and structs made
  only of those) are packed and unpacked with one precompiled ``struct.Struct``;
- variable-length items are coded inline, with bounds checked before anything is allocated;
- unions with few cases (``SMALL_UNION_CASES``: the NFSv4 results) are coded inline, one branch
  per case, the discriminant packed together with the arm's first fixed-size run (and with the
  operation number in COMPOUND's per-operation encoders); larger unions (COMPOUND's operations)
  dispatch through dictionaries built at import time, encoding through one function per case;
  ``_enc_any_U`` / ``_dec_any_U`` keep the dictionary-driven codec of every union, which the
  inline code falls back on for the default arm and for errors (and the tests compare against);
- fixed-size runs are unpacked straight into locals, and a struct of plain values is built from
  the unpacked tuple; DDP-eligible items are coded inline when no chunk is involved;
- the linked-list idiom ``struct S { ...; S *next; }`` becomes a Python ``list`` and is coded
  with a loop, never recursion.

Decoders raise ``XdrError`` (and nothing else) on bad input; encoders raise ``XdrError`` on values
that cannot be encoded (bounds, lengths, integer ranges).

On request (``Options``) the generator also writes: operation tables (``OperationTable``: one
typed ``runtime.Operation`` per case of an argument/result union pair, and the table by number);
``peek_T`` / ``enc_T_head`` for structs ending in an array (a COMPOUND's header without its
operations); and extra sections such as the attribute-mask codecs of ``fattrgen``.
"""

from __future__ import annotations

import ast
import keyword
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from nfsrdma.xdr.ast import Arm, Decl, Enum_, Kind, Spec, Struct, Typedef, Union
from nfsrdma.xdr.runtime import U32_ARRAYS

_INT_FMT = {"int": "i", "unsigned int": "I", "hyper": "q", "unsigned hyper": "Q"}
INLINE_DEPTH = 3  # how deep struct/union codecs are inlined into their users
_FIXED_ARRAY_FUSE_LIMIT = 16
U32_ARRAY_MAX = len(U32_ARRAYS)  # arrays of unsigned ints shorter than this: precompiled
SMALL_UNION_CASES = 4  # unions with at most this many cases are coded inline, case by case
# Fixed-size items written before a declaration: (struct format, literal value) pairs.
Head = tuple[tuple[str, str], ...]


def pyname(name: str) -> str:
    return name + "_" if keyword.iskeyword(name) or name in ("value",) else name


@dataclass(slots=True)
class Fixed:
    """A fixed-size layout: one struct format and the number of values it yields."""

    fmt: str
    size: int
    items: int


@dataclass(frozen=True)
class OperationTable:
    """A pair of unions switched on operation numbers (COMPOUND's ``nfs_argop4`` /
    ``nfs_resop4``): the generator writes one typed ``Operation`` per case and a table of them.

    ``{prefix}{member name without strip}`` names each operation (``OPERATION_READ``), ``name``
    the table (``OPERATIONS: dict[int, Operation]``)."""

    name: str
    enum: str  # the enum naming the operation numbers
    args: str  # union of the arguments
    results: str  # union of the results
    strip: str  # removed from the enum member's name
    prefix: str  # put before it


@dataclass
class Options:
    """Per-spec generation options."""

    # (type name, field or arm name) pairs whose variable-length opaque is DDP-eligible.
    ddp_fields: set[tuple[str, str]] = field(default_factory=set)
    module_doc: str = ""
    operation_tables: tuple[OperationTable, ...] = ()
    # Structs ending in a variable-length array that get ``peek_T`` and ``enc_T_head``: every
    # field but the array, and the array's element count, the elements coded apart (COMPOUND
    # headers, read before the operations, written before the results).
    peeks: tuple[str, ...] = ()
    # Extra generated sections: each is given the generator and returns its lines.
    sections: tuple[Callable[[Generator], list[str]], ...] = ()


class Generator:
    def __init__(self, spec: Spec, options: Options | None = None) -> None:
        self.spec = spec
        self.opts = options or Options()
        self.out: list[str] = []
        self.structs_fmt: dict[str, str] = {}  # format string -> Struct variable name
        self.list_nodes = self._find_list_nodes()
        self._fixed_cache: dict[str, Fixed | None] = {}
        self._min_cache: dict[str, int] = {}
        self.helpers: list[str] = []  # extra functions (union arms), emitted after their users
        self.helper_names: set[str] = set()
        self.classes: set[str] = set()  # classes generated so far (aliases may name them)
        self._tmp = 0

    # -- type analysis -----------------------------------------------------------------
    def _find_list_nodes(self) -> set[str]:
        nodes = set()
        for t in self.spec.types.values():
            if isinstance(t, Struct) and len(t.fields) >= 2:
                last = t.fields[-1]
                if last.kind is Kind.OPTIONAL and last.type == t.name:
                    nodes.add(t.name)
        return nodes

    def resolve(self, d: Decl) -> Decl:
        """Follow PLAIN typedef chains so that codecs can be inlined."""
        seen = 0
        while d.kind is Kind.PLAIN:
            t = self.spec.types.get(d.type)
            if not isinstance(t, Typedef):
                return d
            td = t.decl
            d = Decl(d.name, td.type, td.kind, td.size, d.line)
            seen += 1
            if seen > 64:
                raise ValueError(f"typedef loop at {d.type}")
        return d

    def base_kind(self, typ: str) -> str:
        """'prim', 'enum', 'struct', 'union' or 'typedef' for a type name."""
        if typ in _INT_FMT or typ in ("bool", "opaque", "string", "void"):
            return "prim"
        t = self.spec.types[typ]
        return {Enum_: "enum", Struct: "struct", Union: "union", Typedef: "typedef"}[type(t)]

    def fixed_of_type(self, typ: str) -> Fixed | None:
        """The fixed layout of a whole named type, if it has one."""
        if typ in self._fixed_cache:
            return self._fixed_cache[typ]
        self._fixed_cache[typ] = None  # recursion guard
        res: Fixed | None = None
        if typ in _INT_FMT:
            res = Fixed(_INT_FMT[typ], 8 if "hyper" in typ else 4, 1)
        elif typ == "bool":
            res = Fixed("I", 4, 1)
        elif typ not in ("opaque", "string", "void"):
            t = self.spec.types[typ]
            if isinstance(t, Enum_):
                res = Fixed("i", 4, 1)
            elif isinstance(t, Typedef):
                res = self.fixed_of_decl(t.decl)
            elif isinstance(t, Struct) and t.name not in self.list_nodes:
                parts = [self.fixed_of_decl(f) for f in t.fields]
                if all(p is not None for p in parts):
                    fixed = [p for p in parts if p is not None]
                    res = Fixed(
                        "".join(p.fmt for p in fixed),
                        sum(p.size for p in fixed),
                        sum(p.items for p in fixed),
                    )
        self._fixed_cache[typ] = res
        return res

    def fixed_of_decl(self, d: Decl) -> Fixed | None:
        d = self.resolve(d)
        if d.kind is Kind.PLAIN:
            return self.fixed_of_type(d.type)
        if d.kind is Kind.FIXED:
            assert d.size is not None
            if d.type == "opaque":
                pad = -d.size & 3
                return Fixed(f"{d.size}s" + "x" * pad, d.size + pad, 1)
            elem = self.fixed_of_type(d.type)
            if elem is not None and d.size <= _FIXED_ARRAY_FUSE_LIMIT:
                return Fixed(elem.fmt * d.size, elem.size * d.size, elem.items * d.size)
        return None

    def min_size(self, d: Decl) -> int:
        """The fewest bytes a value of this declaration can occupy (for allocation guards)."""
        d = self.resolve(d)
        if d.kind is Kind.OPTIONAL:
            return 4
        if d.kind is Kind.VARIABLE:
            return 4
        if d.kind is Kind.FIXED:
            assert d.size is not None
            if d.type == "opaque":
                return d.size + (-d.size & 3)
            return d.size * self.min_size_type(d.type)
        return self.min_size_type(d.type)

    def min_size_type(self, typ: str) -> int:
        if typ in self._min_cache:
            return self._min_cache[typ]
        self._min_cache[typ] = 4
        fx = self.fixed_of_type(typ)
        if fx is not None:
            n = fx.size
        elif typ == "void":
            n = 0
        else:
            t = self.spec.types[typ]
            if isinstance(t, Struct):
                fields = t.fields[:-1] if t.name in self.list_nodes else t.fields
                n = sum(self.min_size(f) for f in fields)
            elif isinstance(t, Union):
                n = 4
            elif isinstance(t, Typedef):
                n = self.min_size(t.decl)
            else:
                n = 4
        self._min_cache[typ] = n
        return n

    # -- python names and annotations --------------------------------------------------
    def list_elem(self, node: str) -> tuple[str, Decl | None]:
        """A list node's element annotation; the single remaining field if it unwraps."""
        t = self.spec.types[node]
        assert isinstance(t, Struct)
        rest = t.fields[:-1]
        if len(rest) == 1:
            return self.annotation(rest[0]), rest[0]
        return node, None

    def annotation(self, d: Decl, ddp: bool = False) -> str:
        r = self.resolve(d)
        if r.kind is Kind.OPTIONAL:
            if r.type in self.list_nodes:
                return f"list[{self.list_elem(r.type)[0]}]"
            return f"{self.base_annotation(r.type)} | None"
        if r.type == "opaque":
            return "_Buffer" if ddp else "bytes"
        if r.type == "string":
            return "str"
        if r.kind in (Kind.FIXED, Kind.VARIABLE):
            return f"list[{self.base_annotation(r.type)}]"
        return self.base_annotation(r.type)

    def base_annotation(self, typ: str) -> str:
        if typ in _INT_FMT:
            return "int"
        if typ == "bool":
            return "bool"
        if typ == "opaque":
            return "bytes"
        if typ == "string":
            return "str"
        if typ == "void":
            return "None"
        t = self.spec.types[typ]
        if isinstance(t, Typedef):
            return self.annotation(t.decl)
        if isinstance(t, Struct) and t.name in self.list_nodes:
            return f"list[{self.list_elem(t.name)[0]}]"
        return typ

    def int_type(self, typ: str) -> bool:
        """Whether ``typ`` is a plain integer type (directly or through typedefs)."""
        return self.resolve(Decl("", typ)).type in _INT_FMT

    @staticmethod
    def array_struct(fmt: str) -> str:
        """The ``struct.Struct`` of ``_n`` integers of format ``fmt``: precompiled for the
        short arrays (bitmaps) when ``fmt`` is an unsigned int, else from struct's cache."""
        if fmt == "I":
            return f"(_U32_ARRAYS[_n] if _n < {U32_ARRAY_MAX} else _struct.Struct('>%dI' % _n))"
        return f"_struct.Struct('>%d{fmt}' % _n)"

    def struct_var(self, fmt: str) -> str:
        if fmt not in self.structs_fmt:
            self.structs_fmt[fmt] = f"_S{len(self.structs_fmt)}"
        return self.structs_fmt[fmt]

    # -- fixed layouts: building and flattening ----------------------------------------
    def build_fixed(self, d: Decl, t: str, i: int) -> str:
        """A Python expression building declaration ``d``'s value from tuple ``t`` at ``i``."""
        d = self.resolve(d)
        if d.kind is Kind.FIXED:
            assert d.size is not None
            if d.type == "opaque":
                return f"{t}[{i}]"
            elem = self.fixed_of_type(d.type)
            assert elem is not None
            parts = []
            for k in range(d.size):
                parts.append(self.build_type(d.type, t, i + k * elem.items))
            return "[" + ", ".join(parts) + "]"
        return self.build_type(d.type, t, i)

    def build_type(self, typ: str, t: str, i: int) -> str:
        if typ in _INT_FMT:
            return f"{t}[{i}]"
        if typ == "bool":
            return f"_BOOL[{t}[{i}]]"
        td = self.spec.types[typ]
        if isinstance(td, Enum_):
            return f"_{typ}_MAP[{t}[{i}]]"
        if isinstance(td, Typedef):
            return self.build_fixed(td.decl, t, i)
        assert isinstance(td, Struct)
        args = []
        for f in td.fields:
            fx = self.fixed_of_decl(f)
            assert fx is not None
            args.append(self.build_fixed(f, t, i))
            i += fx.items
        return f"{typ}({', '.join(args)})"

    def flatten_fixed(self, d: Decl, expr: str, checks: list[str]) -> list[str]:
        """Pack arguments for declaration ``d`` whose value is ``expr``; adds length checks."""
        d = self.resolve(d)
        if d.kind is Kind.FIXED:
            assert d.size is not None
            if d.type == "opaque":
                checks.append(
                    f"if len({expr}) != {d.size}: "
                    f"raise _XdrError('fixed opaque {d.name} must be {d.size} bytes', len(w))"
                )
                return [expr]
            checks.append(
                f"if len({expr}) != {d.size}: "
                f"raise _XdrError('array {d.name} must have {d.size} elements', len(w))"
            )
            out: list[str] = []
            for k in range(d.size):
                out += self.flatten_type(d.type, f"{expr}[{k}]", checks)
            return out
        return self.flatten_type(d.type, expr, checks)

    def flatten_type(self, typ: str, expr: str, checks: list[str]) -> list[str]:
        if typ in _INT_FMT or typ == "bool":
            return [expr]
        td = self.spec.types[typ]
        if isinstance(td, Enum_):
            return [expr]
        if isinstance(td, Typedef):
            return self.flatten_fixed(td.decl, expr, checks)
        assert isinstance(td, Struct)
        out: list[str] = []
        for f in td.fields:
            out += self.flatten_fixed(f, f"{expr}.{pyname(f.name)}", checks)
        return out

    # -- statements for one declaration ------------------------------------------------
    def dec_stmts(self, d: Decl, target: str, ddp: bool, ind: str, depth: int = 0) -> list[str]:
        """Statements decoding declaration ``d`` at ``off`` into local ``target``.

        Structs and unions used by value are decoded inline (no call, no tuple) up to
        ``INLINE_DEPTH`` levels deep."""
        r = self.resolve(d)
        lines: list[str] = []
        bound = "None" if r.size is None else str(r.size)
        if r.kind is Kind.OPTIONAL:
            if r.type in self.list_nodes:
                lines.append(f"{target}, off = _dec_list_{r.type}(r, off)")
                return [ind + x for x in lines]
            lines += [
                "(_p,) = _U32.unpack_from(buf, off)",
                "off += 4",
                "if _p == 1:",
                f"    {target}, off = dec_{r.type}(r, off)",
                "elif _p == 0:",
                f"    {target} = None",
                "else:",
                "    raise _XdrError('optional-data flag is not a bool', off - 4)",
            ]
            return [ind + x for x in lines]
        fx = self.fixed_of_decl(r)
        if fx is not None:
            return [ind + x for x in self.fixed_dec_lines([(target, r)])]
        if r.type == "opaque" and r.kind is Kind.VARIABLE:
            if ddp:
                # Reader.take_ddp, inline for data that came in the stream (no chunks).
                lines += [
                    "if r.ordered or r.chunks:",
                    f"    {target}, off = r.take_ddp(off, {bound})",
                    "else:",
                    "    if off + 4 > len(buf):",
                    "        raise _XdrError('truncated opaque length', off)",
                    "    (_n,) = _U32.unpack_from(buf, off)",
                ]
                if bound != "None":
                    lines += [
                        f"    if _n > {bound}:",
                        f"        raise _XdrError(f'opaque of {{_n}} bytes exceeds its bound "
                        f"{bound}', off)",
                    ]
                lines += [
                    "    off += 4",
                    "    _e = off + _n",
                    "    if _e + (-_n & 3) > len(buf):",
                    "        raise _XdrError(f'opaque of {_n} bytes runs past the end', off)",
                    f"    {target} = (buf if isinstance(buf, memoryview) else memoryview(buf))"
                    "[off:_e]",
                    "    off = _e + (-_n & 3)",
                ]
                return [ind + x for x in lines]
            lines += self._dec_len(r, bound)
            lines += [
                "_e = off + _n",  # within buf: _dec_len checked the length
                f"{target} = bytes(buf[off:_e])",
                "off = _e + (-_n & 3)",
            ]
            return [ind + x for x in lines]
        if r.type == "string":
            lines += self._dec_len(r, bound)
            lines += [
                "_e = off + _n",  # within buf: _dec_len checked the length
                f"{target} = str(buf[off:_e], 'utf-8', 'surrogateescape')",
                "off = _e + (-_n & 3)",
            ]
            return [ind + x for x in lines]
        if r.kind is Kind.PLAIN:
            if r.type in self.list_nodes:
                raise ValueError(f"{r.type} (a list node) used without '*' at line {r.line}")
            t = self.spec.types.get(r.type)
            if depth < INLINE_DEPTH and isinstance(t, Struct):
                return self.inline_struct_dec(t, target, ind, depth)
            if depth < INLINE_DEPTH and isinstance(t, Union):
                if self.small_union(t):
                    return [ind + x for x in self.small_union_dec_lines(t, target, depth)]
                return [ind + x for x in self.union_dec_lines(t, target)]
            lines.append(f"{target}, off = dec_{r.type}(r, off)")
            return [ind + x for x in lines]
        # Arrays (fixed that could not be fused, or variable).
        if r.kind is Kind.VARIABLE:
            lines += self._dec_len(r, bound, elem_min=self.min_size_type(r.type))
        else:
            lines.append(f"_n = {r.size}")
        elem = self.fixed_of_type(r.type)
        if elem is not None and elem.items == 1 and self.int_type(r.type):
            lines += [
                f"_t = {self.array_struct(elem.fmt)}.unpack_from(buf, off)",
                f"off += {elem.size} * _n",
                f"{target} = list(_t)",
            ]
        else:
            self._tmp += 1
            x = f"_x{self._tmp}"
            lines.append(f"{target} = []")
            # The count in its own variable: an element's decoder sets _n again, and mypyc
            # (setup.py) reads a range's bound on every iteration.
            lines.append(f"_c{self._tmp} = _n")
            lines.append(f"for _ in range(_c{self._tmp}):")
            lines += self.dec_stmts(Decl("", r.type), x, False, "    ", depth + 1)
            lines.append(f"    {target}.append({x})")
        return [ind + x for x in lines]

    def _dec_len(self, d: Decl, bound: str, elem_min: int = 1) -> list[str]:
        lines = ["(_n,) = _U32.unpack_from(buf, off)"]
        if bound != "None":
            lines += [
                f"if _n > {bound}:",
                f"    raise _XdrError('{d.name or d.type}: length %d exceeds {bound}' % _n, off)",
            ]
        lines.append("off += 4")
        guard = max(elem_min, 1)
        lines += [
            f"if _n * {guard} > len(buf) - off:" if guard > 1 else "if _n > len(buf) - off:",
            "    raise _XdrError('length %d exceeds the remaining input' % _n, off - 4)",
        ]
        return lines

    def enc_stmts(
        self,
        d: Decl,
        expr: str,
        ddp: bool,
        ind: str,
        depth: int = 0,
        head: Head = (),
    ) -> list[str]:
        """Statements encoding declaration ``d`` whose value is ``expr`` onto ``w``.

        ``head`` holds fixed items (discriminants) to write first: they are packed together
        with ``d``'s first fixed-size run or length word where there is one."""
        r = self.resolve(d)
        bound = "None" if r.size is None else str(r.size)
        lines: list[str] = []
        if r.kind is Kind.OPTIONAL:
            lines += self.emit_head(head)
            if r.type in self.list_nodes:
                lines.append(f"_enc_list_{r.type}(w, {expr})")
                return [ind + x for x in lines]
            lines += [
                f"if {expr} is None:",
                "    w += _FALSE",
                "else:",
                "    w += _TRUE",
                f"    enc_{r.type}(w, {expr})",
            ]
            return [ind + x for x in lines]
        fx = self.fixed_of_decl(r)
        if fx is not None:
            checks: list[str] = []
            args = self.flatten_fixed(r, expr, checks)
            lines += checks
            lines.append(self.pack_line(head, fx.fmt, args))
            return [ind + x for x in lines]
        if r.type == "opaque" and r.kind is Kind.VARIABLE:
            if ddp:
                lines += [f"_dv = {expr}", "_n = len(_dv)"]
                # Writer.put_ddp, inline: the length word stays, the data is recorded aside.
                if bound != "None":
                    lines += [
                        f"if _n > {bound}:",
                        f"    raise _XdrError(f'opaque of {{_n}} bytes exceeds its bound {bound}', "
                        "len(w))",
                    ]
                lines.append(self.pack_line(head, "I", ["_n"]))
                lines.append("w.ddp.append(_DdpItem(len(w), _dv, w.ddp_tag))")
                return [ind + x for x in lines]
            lines += [f"_v = {expr}", "_n = len(_v)"]
            lines += self._enc_bound(r, bound)
            lines += [self.pack_line(head, "I", ["_n"]), "w += _v", "w += _PAD[_n & 3]"]
            return [ind + x for x in lines]
        if r.type == "string":
            lines += [f"_v = {expr}.encode('utf-8', 'surrogateescape')", "_n = len(_v)"]
            lines += self._enc_bound(r, bound)
            lines += [self.pack_line(head, "I", ["_n"]), "w += _v", "w += _PAD[_n & 3]"]
            return [ind + x for x in lines]
        if r.kind is Kind.PLAIN:
            t = self.spec.types.get(r.type)
            if depth < INLINE_DEPTH and isinstance(t, Struct) and r.type not in self.list_nodes:
                self._tmp += 1
                v = f"_s{self._tmp}"
                lines.append(f"{v} = {expr}")
                body = self.gen_struct_body_enc(t.name, t.fields, v, "", depth + 1, head)
                return [ind + x for x in lines + body]
            if isinstance(t, Union) and depth < INLINE_DEPTH and self.small_union(t):
                return [ind + x for x in self.small_union_enc_lines(t, expr, depth, head)]
            lines += self.emit_head(head)
            if isinstance(t, Union) and not self.small_union(t):
                self._tmp += 1
                u, f = f"_u{self._tmp}", f"_f{self._tmp}"
                lines += [
                    f"{u} = {expr}",
                    f"{f} = _{t.name}_ENCX.get({u}.{pyname(t.discriminant.name)})",
                    f"if {f} is None:",
                    f"    enc_{r.type}(w, {u})",
                    "else:",
                    f"    {f}(w, {u}.value)",
                ]
                return [ind + x for x in lines]
            lines.append(f"enc_{r.type}(w, {expr})")
            return [ind + x for x in lines]
        self._tmp += 1
        a, x = f"_a{self._tmp}", f"_x{self._tmp}"
        lines += [f"{a} = {expr}", f"_n = len({a})"]
        if r.kind is Kind.VARIABLE:
            lines += self._enc_bound(r, bound)
            lines.append(self.pack_line(head, "I", ["_n"]))
        else:
            lines += [
                f"if _n != {r.size}:",
                f"    raise _XdrError('array {r.name} must have {r.size} elements', len(w))",
            ]
            lines += self.emit_head(head)
        elem = self.fixed_of_type(r.type)
        if elem is not None and elem.items == 1 and self.int_type(r.type):
            lines.append(f"w += {self.array_struct(elem.fmt)}.pack(*{a})")
        else:
            lines.append(f"for {x} in {a}:")
            lines += self.enc_stmts(Decl("", r.type), x, False, "    ", depth + 1)
        return [ind + x for x in lines]

    def pack_line(self, head: Head, fmt: str, args: list[str]) -> str:
        """``w += ...`` packing the head's items and then ``args`` (format ``fmt``)."""
        fmt = "".join(f for f, _ in head) + fmt
        return f"w += {self.struct_var(fmt)}.pack({', '.join([*(a for _, a in head), *args])})"

    def emit_head(self, head: Head) -> list[str]:
        """The head alone, as a bytes constant (its items are literals)."""
        if not head:
            return []
        fmt = "".join(f for f, _ in head)
        data = struct.pack(">" + fmt, *(int(a) for _, a in head))
        return [f"w += {data!r}"]

    def small_union(self, u: Union) -> bool:
        """Unions with few cases are coded inline, one branch per case; larger ones (COMPOUND's
        operations) dispatch through dictionaries."""
        return sum(len(a.cases) for a in u.arms) <= SMALL_UNION_CASES

    def case_value(self, disc: Decl, case: int) -> str:
        """The decoded discriminant for ``case``, as a constant expression."""
        r = self.resolve(disc)
        if r.type == "bool":
            return "True" if case else "False"
        t = self.spec.types.get(r.type)
        if isinstance(t, Enum_):
            for member, value in t.members:
                if value == case:
                    return member
        return self.build_fixed(r, f"({case},)", 0)

    def small_union_enc_lines(self, u: Union, expr: str, depth: int, head: Head) -> list[str]:
        """Encode small union ``u`` (value ``expr``): a branch per case, each writing the head
        and the discriminant with the arm's first fixed-size run; anything else (the default
        arm, values that are no case) goes through the dictionary-driven ``_enc_any_U``."""
        disc = self.resolve(u.discriminant)
        fx = self.fixed_of_decl(disc)
        assert fx is not None and fx.items == 1, f"bad discriminant in {u.name}"
        self._tmp += 1
        uv, d, v = f"_u{self._tmp}", f"_d{self._tmp}", f"_w{self._tmp}"
        # one declaration for all branches (mypyc refuses a local annotated twice)
        lines = [f"{uv} = {expr}", f"{d} = {uv}.{pyname(u.discriminant.name)}", f"{v}: _Any"]
        kw = "if"
        for arm in u.arms:
            ddp = (u.name, arm.decl.name) in self.opts.ddp_fields
            for case in arm.cases:
                lines.append(f"{kw} {d} == {case}:")
                kw = "elif"
                h: Head = (*head, (fx.fmt, str(case)))
                if arm.decl.is_void:
                    lines += ["    " + x for x in self.emit_head(h)]
                else:
                    lines.append(f"    {v} = {uv}.value")
                    lines += self.enc_stmts(arm.decl, v, ddp, "    ", depth + 1, h)
        lines.append("else:")
        lines += ["    " + x for x in self.emit_head(head)]
        lines.append(f"    _enc_any_{u.name}(w, {uv})")
        return lines

    def small_union_dec_lines(self, u: Union, target: str, depth: int) -> list[str]:
        """Decode small union ``u`` into ``target``: a branch per arm; anything else goes
        through the dictionary-driven ``_dec_any_U`` (the default arm, or the error)."""
        disc = self.resolve(u.discriminant)
        fx = self.fixed_of_decl(disc)
        assert fx is not None and fx.items == 1, f"bad discriminant in {u.name}"
        sv = self.struct_var(fx.fmt)
        self._tmp += 1
        d, v = f"_d{self._tmp}", f"_v{self._tmp}"
        # the arms' values differ in type: one declaration (compiled code checks local types)
        lines = [f"{v}: _Any", f"({d},) = {sv}.unpack_from(buf, off)", f"off += {fx.size}"]
        kw = "if"
        for arm in u.arms:
            if len(arm.cases) == 1:
                cond = f"{d} == {arm.cases[0]}"
                value = self.case_value(disc, arm.cases[0])
            else:
                cond = f"{d} in ({', '.join(str(c) for c in arm.cases)})"
                value = self.build_fixed(disc, f"({d},)", 0)
            lines.append(f"{kw} {cond}:")
            kw = "elif"
            if arm.decl.is_void:
                lines.append(f"    {target} = {u.name}({value}, None)")
            else:
                ddp = (u.name, arm.decl.name) in self.opts.ddp_fields
                lines += self.dec_stmts(arm.decl, v, ddp, "    ", depth + 1)
                lines.append(f"    {target} = {u.name}({value}, {v})")
        lines += ["else:", f"    {target}, off = _dec_any_{u.name}(r, off - {fx.size})"]
        return lines

    def _enc_bound(self, d: Decl, bound: str) -> list[str]:
        if bound == "None":
            return []
        return [
            f"if _n > {bound}:",
            f"    raise _XdrError('{d.name or d.type}: length %d exceeds {bound}' % _n, len(w))",
        ]

    # -- definitions ---------------------------------------------------------------------
    def field_groups(self, fields: list[Decl]) -> list[list[Decl]]:
        """Consecutive fixed-size fields grouped for one struct operation each."""
        groups: list[list[Decl]] = []
        run: list[Decl] = []
        for f in fields:
            if self.fixed_of_decl(f) is not None:
                run.append(f)
                continue
            if run:
                groups.append(run)
                run = []
            groups.append([f])
        if run:
            groups.append(run)
        return groups

    def inline_struct_dec(self, t: Struct, target: str, ind: str, depth: int) -> list[str]:
        self._tmp += 1
        prefix = f"_i{self._tmp}_"
        fields = t.fields
        lines = self.gen_struct_body_dec(t.name, fields, ind, prefix, depth + 1)
        args = ", ".join(prefix + f.name for f in fields)
        lines.append(f"{ind}{target} = {t.name}({args})")
        return lines

    def gen_struct_body_dec(
        self, name: str, fields: list[Decl], ind: str, prefix: str = "f_", depth: int = 0
    ) -> list[str]:
        lines: list[str] = []
        for group in self.field_groups(fields):
            fxs = [self.fixed_of_decl(f) for f in group]
            if all(fx is not None for fx in fxs) and len(group) > 1:
                run = [(f"{prefix}{f.name}", f) for f in group]
                lines += [ind + x for x in self.fixed_dec_lines(run)]
            else:
                f = group[0]
                ddp = (name, f.name) in self.opts.ddp_fields
                lines += self.dec_stmts(f, f"{prefix}{f.name}", ddp, ind, depth)
        return lines

    def fixed_dec_lines(self, run: list[tuple[str, Decl]]) -> list[str]:
        """Decode a run of fixed-size declarations into their targets with one ``unpack_from``
        whose values go straight into locals (a struct made of plain values is built from the
        unpacked tuple directly)."""
        fxs = [self.fixed_of_decl(d) for _, d in run]
        fmt = "".join(fx.fmt for fx in fxs if fx is not None)
        size = sum(fx.size for fx in fxs if fx is not None)
        sv = self.struct_var(fmt)
        items: list[str] = []  # what each unpacked value is stored in
        after: list[str] = []  # values that are built from several items or converted
        i = 0
        for (target, d), fx in zip(run, fxs, strict=True):
            assert fx is not None
            build = self.build_fixed(d, "_t", i)
            if build == f"_t[{i}]":
                items.append(target)
            elif len(run) == 1 and build == _call_of(build, fx.items):
                # one struct of plain values: built from the tuple as it comes
                callee = build.split("(", 1)[0]
                return [f"{target} = {callee}(*{sv}.unpack_from(buf, off))", f"off += {size}"]
            else:
                items += [f"_t{i + k}" for k in range(fx.items)]
                built = _TUPLE_ITEM.sub(r"_t\1", build)
                after.append(f"{target} = {built}")
            i += fx.items
        names = f"({items[0]},)" if len(items) == 1 else ", ".join(items)
        lines = [f"{names} = {sv}.unpack_from(buf, off)"]
        lines.append(f"off += {size}")
        return lines + after

    def gen_struct_body_enc(
        self, name: str, fields: list[Decl], v: str, ind: str, depth: int = 0, head: Head = ()
    ) -> list[str]:
        """Encode ``fields`` of ``v``; ``head`` (see ``enc_stmts``) goes with the first."""
        lines: list[str] = []
        if not fields:
            return [ind + x for x in self.emit_head(head)]
        for group in self.field_groups(fields):
            fxs = [self.fixed_of_decl(f) for f in group]
            if all(fx is not None for fx in fxs) and len(group) > 1:
                checks: list[str] = []
                args: list[str] = []
                for f in group:
                    args += self.flatten_fixed(f, f"{v}.{pyname(f.name)}", checks)
                fmts = "".join(fx.fmt for fx in fxs if fx is not None)
                lines += [ind + c for c in checks]
                lines.append(ind + self.pack_line(head, fmts, args))
            else:
                f = group[0]
                ddp = (name, f.name) in self.opts.ddp_fields
                lines += self.enc_stmts(f, f"{v}.{pyname(f.name)}", ddp, ind, depth, head)
            head = ()
        return lines

    def wrap(self, kind: str, name: str, body: list[str], ret: str | None) -> list[str]:
        """Wrap a codec body so that low-level errors become XdrError at the value's offset."""
        if kind == "dec":
            head = ["    buf = r.buf", "    o0 = off", "    try:"]
            tail = [
                "    except (_struct.error, KeyError, IndexError, UnicodeError):",
                f"        raise _XdrError('invalid or truncated {name}', o0) from None",
            ]
            if ret:
                tail.append(f"    return {ret}, off")
        else:
            head = ["    try:"]
            tail = [
                "    except (_struct.error, TypeError, AttributeError, UnicodeError) as _e:",
                f"        raise _XdrError(f'cannot encode {name}: {{_e}}', len(w)) from None",
            ]
        if not body:
            body = ["        pass"]
        return head + body + tail

    def gen_struct(self, s: Struct) -> None:
        node = s.name in self.list_nodes
        fields = s.fields[:-1] if node else s.fields
        o = self.out
        o.append("@_dataclass(slots=True)")
        o.append(f"class {s.name}:")
        for f in fields:
            o.append(
                f"    {pyname(f.name)}: {self.annotation(f, (s.name, f.name) in self.opts.ddp_fields)}"
            )
        o.append("")
        o.append("")
        names = ", ".join(f"f_{f.name}" for f in fields)
        # The node codecs (one element, without the link).
        o.append(f"def enc_{s.name}(w: _Writer, v: {s.name}) -> None:")
        o += self.wrap(
            "enc", s.name, self.gen_struct_body_enc(s.name, fields, "v", "        "), None
        )
        o.append("")
        o.append("")
        o.append(f"def dec_{s.name}(r: _Reader, off: int) -> tuple[{s.name}, int]:")
        if not node and fields and self.fixed_of_type(s.name) is not None:
            # all of it fixed-size: one unpack, the struct built from its values
            run = [("_u", Decl("", s.name))]
            body = ["        " + x for x in self.fixed_dec_lines(run)]
            o += self.wrap("dec", s.name, body, "_u")
        else:
            body = self.gen_struct_body_dec(s.name, fields, "        ")
            o += self.wrap("dec", s.name, body, f"{s.name}({names})")
        o.append("")
        o.append("")
        if node:
            self.gen_list_codecs(s, fields)

    def gen_list_codecs(self, s: Struct, fields: list[Decl]) -> None:
        ann, single = self.list_elem(s.name)
        o = self.out
        o.append(f"def _enc_list_{s.name}(w: _Writer, items: list[{ann}]) -> None:")
        o.append("    for _i in items:")
        o.append("        w += _TRUE")
        if single is not None:
            o += self.enc_stmts(single, "_i", False, "        ")
        else:
            o.append(f"        enc_{s.name}(w, _i)")
        o.append("    w += _FALSE")
        o.append("")
        o.append("")
        o.append(f"def _dec_list_{s.name}(r: _Reader, off: int) -> tuple[list[{ann}], int]:")
        o.append("    buf = r.buf")
        o.append(f"    items: list[{ann}] = []")
        o.append("    while True:")
        o.append("        if off + 4 > len(buf):")
        o.append(f"            raise _XdrError('truncated list of {s.name}', off)")
        o.append("        (_p,) = _U32.unpack_from(buf, off)")
        o.append("        off += 4")
        o.append("        if _p == 0:")
        o.append("            return items, off")
        o.append("        if _p != 1:")
        o.append("            raise _XdrError('list link is not a bool', off - 4)")
        if single is not None:
            o.append("        o0 = off")
            o.append("        try:")
            o += self.dec_stmts(single, "_x", False, "            ")
            o.append("        except (_struct.error, KeyError, IndexError, UnicodeError):")
            o.append(f"            raise _XdrError('invalid or truncated {s.name}', o0) from None")
            o.append("        items.append(_x)")
        else:
            o.append(f"        _x, off = dec_{s.name}(r, off)")
            o.append("        items.append(_x)")
        o.append("")
        o.append("")

    def gen_enum(self, e: Enum_) -> None:
        o = self.out
        o.append(f"class {e.name}(_IntEnum):")
        for m, v in e.members:
            o.append(f"    {m} = {v}")
        o.append("")
        o.append("")
        o.append(f"_{e.name}_MAP: _Final[dict[int, {e.name}]] = {{m.value: m for m in {e.name}}}")
        for m, _ in e.members:
            o.append(f"{m} = {e.name}.{m}")
        o.append("")
        o.append("")
        o.append(f"def enc_{e.name}(w: _Writer, v: {e.name}) -> None:")
        o.append("    try:")
        o.append(f"        w += _I32.pack(_{e.name}_MAP[v])")
        o.append("    except (KeyError, TypeError, _struct.error):")
        o.append(f"        raise _XdrError(f'{{v!r}} is not a {e.name}', len(w)) from None")
        o.append("")
        o.append("")
        o.append(f"def dec_{e.name}(r: _Reader, off: int) -> tuple[{e.name}, int]:")
        o.append("    try:")
        o.append(f"        return _{e.name}_MAP[_I32.unpack_from(r.buf, off)[0]], off + 4")
        o.append("    except (KeyError, _struct.error):")
        o.append(f"        raise _XdrError('invalid or truncated {e.name}', off) from None")
        o.append("")
        o.append("")

    def gen_typedef(self, t: Typedef) -> None:
        o = self.out
        d = t.decl
        ann = self.annotation(d)
        if ann in self.classes:
            o.append(f"{t.name} = {ann}")  # a real alias: the class can be built under this name
        else:
            o.append(f'{t.name}: _TypeAlias = "{ann}"')
        o.append("")
        o.append("")
        o.append(f"def enc_{t.name}(w: _Writer, v: {t.name}) -> None:")
        o += self.wrap("enc", t.name, self.enc_stmts(d, "v", False, "        "), None)
        o.append("")
        o.append("")
        o.append(f"def dec_{t.name}(r: _Reader, off: int) -> tuple[{t.name}, int]:")
        body = self.dec_stmts(d, "_v", False, "        ")
        o += self.wrap("dec", t.name, body, "_v")
        o.append("")
        o.append("")

    def arm_codec(self, u: Union, arm_decl: Decl) -> tuple[str, str, str]:
        """(encoder, decoder, annotation) names for a union arm."""
        if arm_decl.is_void:
            return "_void_encode", "_void_decode", "None"
        ddp = (u.name, arm_decl.name) in self.opts.ddp_fields
        r = self.resolve(arm_decl)
        ann = self.annotation(arm_decl, ddp)
        named = r.kind is Kind.PLAIN and self.base_kind(r.type) in ("struct", "union")
        if named and not ddp and r.type not in self.list_nodes:
            return f"enc_{r.type}", f"dec_{r.type}", ann
        if arm_decl.kind is Kind.PLAIN and not ddp and arm_decl.type in self.spec.types:
            td = self.spec.types[arm_decl.type]
            if isinstance(td, Typedef | Enum_):
                return f"enc_{arm_decl.type}", f"dec_{arm_decl.type}", ann
        base = f"_{u.name}_{arm_decl.name}"
        if base not in self.helper_names:
            self.helper_names.add(base)
            h = self.helpers
            h.append(f"def enc{base}(w: _Writer, v: {ann}) -> None:")
            h += self.wrap(
                "enc",
                f"{u.name}.{arm_decl.name}",
                self.enc_stmts(arm_decl, "v", ddp, "        "),
                None,
            )
            h.append("")
            h.append("")
            h.append(f"def dec{base}(r: _Reader, off: int) -> tuple[{ann}, int]:")
            body = self.dec_stmts(arm_decl, "_v", ddp, "        ")
            h += self.wrap("dec", f"{u.name}.{arm_decl.name}", body, "_v")
            h.append("")
            h.append("")
        return f"enc{base}", f"dec{base}", ann

    def gen_union(self, u: Union) -> None:
        o = self.out
        disc = self.resolve(u.discriminant)
        disc_ann = self.annotation(u.discriminant)
        codecs: list[tuple[Arm | None, tuple[str, str, str]]] = [
            (arm, self.arm_codec(u, arm.decl)) for arm in u.arms
        ]
        default = self.arm_codec(u, u.default) if u.default is not None else None
        anns = []
        for _, (_, _, a) in codecs + ([(None, default)] if default else []):
            for part in a.split(" | "):
                if part != "None" and part not in anns:
                    anns.append(part)
        value_ann = " | ".join([*anns, "None"])
        dname = pyname(u.discriminant.name)
        o.append("@_dataclass(slots=True)")
        o.append(f"class {u.name}:")
        o.append(f"    {dname}: {disc_ann}")
        o.append(f"    value: {value_ann} = None")
        o.append("")
        o.append("")
        enc_map = ", ".join(f"{c}: {e}" for arm, (e, _, _) in codecs if arm for c in arm.cases)
        dec_map = ", ".join(f"{c}: {d}" for arm, (_, d, _) in codecs if arm for c in arm.cases)
        o.append(
            f"_{u.name}_ENC: _Final[dict[int, _Callable[[_Writer, _Any], None]]] = {{{enc_map}}}"
        )
        o.append(
            f"_{u.name}_DEC: _Final[dict[int, _Callable[[_Reader, int], tuple[_Any, int]]]] = "
            f"{{{dec_map}}}"
        )
        disc_t = self.resolve(u.discriminant)
        arms_map = ", ".join(
            f"{c}: ({self.build_fixed(disc_t, f'({c},)', 0)}, {d})"
            for arm, (_, d, _) in codecs
            if arm
            for c in arm.cases
        )
        o.append(f"_{u.name}_ARMS: _Final[dict[int, tuple[_Any, _Any]]] = {{{arms_map}}}")
        o.append("")
        o.append("")
        # Discriminant coding: an enum is validated, bool must be 0/1, ints are as they are.
        disc_fx = self.fixed_of_decl(disc)
        assert disc_fx is not None and disc_fx.items == 1, f"bad discriminant in {u.name}"
        sv = self.struct_var(disc_fx.fmt)
        small = self.small_union(u)
        # The dictionary-driven codecs: the whole union for large ones, the default arm and
        # the errors for small ones (whose cases are coded inline).
        o.append(f"def _enc_any_{u.name}(w: _Writer, v: {u.name}) -> None:")
        o.append("    try:")
        o.append(f"        _d = v.{dname}")
        if default:
            o.append(f"        _f = _{u.name}_ENC.get(_d, {default[0]})")
        else:
            o.append(f"        _f = _{u.name}_ENC.get(_d)")
            o.append("        if _f is None:")
            o.append(f"            raise _XdrError(f'{{_d!r}} is not a case of {u.name}', len(w))")
        if self.base_kind(disc.type) == "enum":
            o.append(f"        _d = _{disc.type}_MAP[_d]")
        o.append(f"        w += {sv}.pack(_d)")
        o.append("        _f(w, v.value)")
        o.append("    except (_struct.error, TypeError, AttributeError, KeyError) as _e:")
        o.append(f"        raise _XdrError(f'cannot encode {u.name}: {{_e!r}}', len(w)) from None")
        o.append("")
        o.append("")
        name = f"_dec_any_{u.name}" if small else f"dec_{u.name}"
        o.append(f"def {name}(r: _Reader, off: int) -> tuple[{u.name}, int]:")
        body = ["        " + x for x in self.union_dec_lines(u, "_u")]
        o += self.wrap("dec", u.name, body, "_u")
        o.append("")
        o.append("")
        enc_errors = "(_struct.error, TypeError, AttributeError, KeyError, UnicodeError)"
        if small:
            o.append(f"def enc_{u.name}(w: _Writer, v: {u.name}) -> None:")
            o.append("    try:")
            o += ["        " + x for x in self.small_union_enc_lines(u, "v", 0, ())]
            o.append(f"    except {enc_errors} as _e:")
            o.append(
                f"        raise _XdrError(f'cannot encode {u.name}: {{_e!r}}', len(w)) from None"
            )
            o.append("")
            o.append("")
            o.append(f"def dec_{u.name}(r: _Reader, off: int) -> tuple[{u.name}, int]:")
            body = ["        " + x for x in self.small_union_dec_lines(u, "_u", 0)]
            o += self.wrap("dec", u.name, body, "_u")
            o.append("")
            o.append("")
            return
        # Large unions: one encoder per case writes the discriminant with the arm's first
        # fixed-size run (``_U_ENCX``); the default arm and the errors go to ``_enc_any_U``.
        entries: list[str] = []
        for arm, (_, _, ann) in codecs:
            assert arm is not None
            ddp = (u.name, arm.decl.name) in self.opts.ddp_fields
            for case in arm.cases:
                fn = f"_enc_{u.name}_{case}"
                entries.append(f"{case}: {fn}")
                # A void arm's value is ignored, whatever it is, as ``_void_encode`` ignores
                # it (typed None, compiled code would refuse any other value).
                param = "_Any" if arm.decl.is_void else ann
                o.append(f"def {fn}(w: _Writer, v: {param}) -> None:")
                h: Head = ((disc_fx.fmt, str(case)),)
                if arm.decl.is_void:
                    body = ["        " + x for x in self.emit_head(h)]
                else:
                    body = self.enc_stmts(arm.decl, "v", ddp, "        ", 1, h)
                o += self.wrap("enc", f"{u.name}.{arm.decl.name}", body, None)
                o.append("")
                o.append("")
        o.append(
            f"_{u.name}_ENCX: _Final[dict[int, _Callable[[_Writer, _Any], None]]] = "
            f"{{{', '.join(entries)}}}"
        )
        o.append("")
        o.append("")
        o.append(f"def enc_{u.name}(w: _Writer, v: {u.name}) -> None:")
        o.append("    try:")
        o.append(f"        _f = _{u.name}_ENCX.get(v.{dname})")
        o.append("        if _f is None:")
        o.append(f"            _enc_any_{u.name}(w, v)")
        o.append("        else:")
        o.append("            _f(w, v.value)")
        o.append("    except (TypeError, AttributeError) as _e:")
        o.append(f"        raise _XdrError(f'cannot encode {u.name}: {{_e!r}}', len(w)) from None")
        o.append("")
        o.append("")

    def union_dec_lines(self, u: Union, target: str) -> list[str]:
        """Decode union ``u`` at ``off`` into ``target``: one lookup gives the validated
        discriminant and the arm's decoder; unknown values take the default arm or fail."""
        disc = self.resolve(u.discriminant)
        fx = self.fixed_of_decl(disc)
        assert fx is not None
        sv = self.struct_var(fx.fmt)
        self._tmp += 1
        d, a, f, v = (f"_{x}{self._tmp}" for x in "dafv")
        lines = [
            f"{v}: _Any",
            f"{f}: _Callable[[_Reader, int], tuple[_Any, int]]",
            f"({d},) = {sv}.unpack_from(buf, off)",
            f"{a} = _{u.name}_ARMS.get({d})",
            f"if {a} is None:",
        ]
        if u.default is not None:
            default = self.arm_codec(u, u.default)[1]
            lines += [f"    {d} = {self.build_fixed(disc, f'({d},)', 0)}", f"    {f} = {default}"]
        else:
            lines.append(f"    raise _XdrError('%r is not a case of {u.name}' % ({d},), off)")
        lines += [
            "else:",
            f"    {d}, {f} = {a}",
            f"{v}, off = {f}(r, off + {fx.size})",
            f"{target} = {u.name}({d}, {v})",
        ]
        return lines

    def gen_peek(self, name: str) -> list[str]:
        """``peek_T(r, off) -> (T_head, off)`` and ``enc_T_head(w, head)``: the fields before the
        final array, and its count."""
        t = self.spec.types.get(name)
        if not isinstance(t, Struct) or not t.fields or t.fields[-1].kind is not Kind.VARIABLE:
            raise ValueError(f"peek: {name} is not a struct ending in a variable-length array")
        fields, last = t.fields[:-1], t.fields[-1]
        o = ["@_dataclass(slots=True)", f"class {name}_head:"]
        o += [f"    {pyname(f.name)}: {self.annotation(f)}" for f in fields]
        o.append(f"    {pyname(last.name)}: int  # the number of elements that follow")
        o += ["", ""]
        o.append(f"def peek_{name}(r: _Reader, off: int) -> tuple[{name}_head, int]:")
        body = self.gen_struct_body_dec(name, fields, "        ")
        body += [
            "        (f_count,) = _U32.unpack_from(buf, off)",
            "        off += 4",
        ]
        names = ", ".join([*(f"f_{f.name}" for f in fields), "f_count"])
        o += self.wrap("dec", f"{name} header", body, f"{name}_head({names})")
        o += ["", ""]
        o.append(f"def enc_{name}_head(w: _Writer, v: {name}_head) -> None:")
        enc = self.gen_struct_body_enc(name, fields, "v", "        ")
        enc.append(f"        w += _U32.pack(v.{pyname(last.name)})")
        o += self.wrap("enc", f"{name} header", enc, None)
        return [*o, "", ""]

    def gen_operations(self, table: OperationTable) -> list[str]:
        """One ``Operation[Args, Res]`` per operation of an argument/result union pair."""
        enum = self.spec.types.get(table.enum)
        args = self.spec.types.get(table.args)
        results = self.spec.types.get(table.results)
        if not (isinstance(enum, Enum_) and isinstance(args, Union) and isinstance(results, Union)):
            raise ValueError(f"operation table {table.name}: needs an enum and two unions")
        arg_arms = {c: arm.decl for arm in args.arms for c in arm.cases}
        res_arms = {c: arm.decl for arm in results.arms for c in arm.cases}
        o: list[str] = []
        entries: list[tuple[int, str]] = []
        for member, number in enum.members:
            if number not in arg_arms or number not in res_arms:
                continue
            adecl, rdecl = arg_arms[number], res_arms[number]
            enc_a, dec_a, ann_a = self.arm_codec(args, adecl)
            enc_r, dec_r, ann_r = self.arm_codec(results, rdecl)
            rtype = self.resolve(rdecl).type
            status, error = self._status_codecs(rtype)
            const = table.prefix + member.removeprefix(table.strip)
            o.append(
                f"{const}: _Operation[{ann_a}, {ann_r}] = _Operation({member}, {member!r}, "
                f"{not adecl.is_void}, {dec_a}, {enc_a}, {dec_r}, {enc_r}, {status}, {error})"
            )
            entries.append((number, const))
        o.append("")
        items = ", ".join(f"{n}: {c}" for n, c in entries)
        o.append(f"{table.name}: dict[int, _Operation[_Any, _Any]] = {{{items}}}")
        return [*o, "", ""]

    def _status_codecs(self, rtype: str) -> tuple[str, str]:
        """(status getter, error-result constructor) for an operation's result type: the
        status is a union's discriminant or a struct's first field; an error result has the
        other struct fields empty."""
        t = self.spec.types.get(rtype)
        if isinstance(t, Union):
            status, empties = t.discriminant.name, []  # the error arm: void
        elif isinstance(t, Struct) and t.fields:
            status, empties = t.fields[0].name, [self._empty(f) for f in t.fields[1:]]
        else:
            raise ValueError(f"operation result {rtype} has no status")
        fn = f"_error_{rtype}"
        if fn not in self.helper_names:
            self.helper_names.add(fn)
            self.helpers += [
                f"def {fn}(status: _Any) -> {rtype}:",
                f"    return {rtype}({', '.join(['status', *empties])})",
                "",
                "",
            ]
        return f"_attrgetter({pyname(status)!r})", fn

    def _empty(self, d: Decl) -> str:
        r = self.resolve(d)
        if r.kind is Kind.VARIABLE and r.type not in ("opaque", "string"):
            return "[]"
        if r.kind is Kind.OPTIONAL:
            return "[]" if r.type in self.list_nodes else "None"
        if r.type == "opaque" and r.kind is Kind.VARIABLE:
            return "b''"
        if r.type == "string":
            return "''"
        if r.kind is Kind.PLAIN and r.type in _INT_FMT:
            return "0"
        raise ValueError(f"no empty value for {d.name} ({d.type})")

    def _pieces(self) -> tuple[list[str], list[list[str]], list[list[str]]]:
        """(constants, the pieces of the types/peeks/operation tables in order, the extra
        sections): each piece is whole top-level statements."""
        pieces: list[list[str]] = []
        for d in self.spec.definitions:
            self.out = []
            self.helpers = []
            if isinstance(d, Struct):
                self.gen_struct(d)
                self.classes.add(d.name)
            elif isinstance(d, Union):
                self.gen_union(d)
                self.classes.add(d.name)
            elif isinstance(d, Enum_):
                self.gen_enum(d)
                self.classes.add(d.name)
            elif isinstance(d, Typedef):
                self.gen_typedef(d)
            else:
                continue
            pieces.append(self.helpers + self.out)
        for name in self.opts.peeks:
            self.helpers = []
            out = self.gen_peek(name)
            pieces.append(self.helpers + out)
        for table in self.opts.operation_tables:
            self.helpers = []
            out = self.gen_operations(table)
            pieces.append(self.helpers + out)
        sections: list[list[str]] = []
        for section in self.opts.sections:
            self.helpers = []
            out = section(self)
            sections.append(self.helpers + out)
        consts: list[str] = []
        enum_members = {
            m for t in self.spec.types.values() if isinstance(t, Enum_) for m, _ in t.members
        }
        for name, value in self.spec.constants.items():
            if name not in enum_members:
                consts.append(f"{name} = {value}")
        for prog in self.spec.programs:
            consts.append(f"{prog.name} = {prog.number}")
            for ver in prog.versions:
                consts.append(f"{ver.name} = {ver.number}")
                for proc in ver.procedures:
                    consts.append(f"{proc.name} = {proc.number}")
        return consts, pieces, sections

    def _head(self, doc: str) -> list[str]:
        return [
            "# Generated by nfsrdma.xdr.codegen from the .x specification named below.",
            "# Do not edit: change the specification and run `python -m nfsrdma.xdr.regen`.",
            f'"""{doc}"""',
            "# ruff: noqa",
            '# mypy: disable-error-code="no-redef,assignment,misc"',
            "",
            "from __future__ import annotations",
            "",
            "import struct as _struct",
            "from collections.abc import Callable as _Callable",
            "from dataclasses import dataclass as _dataclass",
            "from enum import IntEnum as _IntEnum",
            "from functools import lru_cache as _lru_cache",
            "from operator import attrgetter as _attrgetter",
            "from typing import Any as _Any, Final as _Final, TypeAlias as _TypeAlias",
            "",
            "from nfsrdma.xdr.runtime import (",
            "    BOOL as _BOOL,",
            "    FALSE as _FALSE,",
            "    I32 as _I32,",
            "    PAD as _PAD,",
            "    TRUE as _TRUE,",
            "    U32 as _U32,",
            "    U32_ARRAYS as _U32_ARRAYS,",
            "    Operation as _Operation,",
            "    Buffer as _Buffer,",
            "    DdpItem as _DdpItem,",
            "    Reader as _Reader,",
            "    Writer as _Writer,",
            "    XdrError as _XdrError,",
            "    void_decode as _void_decode,",
            "    void_encode as _void_encode,",
            ")",
            "",
            "",
        ]

    def generate(self) -> str:
        consts, pieces, sections = self._pieces()
        head = self._head(self.opts.module_doc)
        head += [*consts, ""]
        for fmt, var in self.structs_fmt.items():
            head.append(f"{var}: _Final = _struct.Struct('>{fmt}')")
        head += ["", ""]
        body = [line for piece in pieces + sections for line in piece]
        return "\n".join(head + body).rstrip() + "\n"

    def generate_split(self, package: str, module: str, parts: int) -> dict[str, str]:
        """The codecs as several modules, for a specification too large for one (mypyc
        analyses a module's top level as one function, and its memory grows faster than that
        function: NFSv4's 4,900 top-level statements took more than 24 GB): ``_{module}_0``
        for the constants, ``_{module}_1`` to ``_{module}_{parts}`` for groups of consecutive
        types, ``_{module}_s{j}`` for each extra section, and ``{module}`` re-exporting every
        name of them, so that users import from it as from one module. Each part imports the
        names it uses from the earlier parts and defines the ``struct.Struct`` it uses."""
        consts, pieces, sections = self._pieces()
        groups: list[list[list[str]]] = [[]]
        total = sum(len(p) for p in pieces)
        size = 0
        for piece in pieces:
            if size >= total * len(groups) / parts and len(groups) < parts:
                groups.append([])
            groups[-1].append(piece)
            size += len(piece)
        bodies = [[*consts, ""]] + [[ln for p in g for ln in p] for g in groups]
        bodies += sections
        names = [f"_{module}_{i}" for i in range(len(groups) + 1)]
        names += [f"_{module}_s{j}" for j in range(len(sections))]
        struct_of = {var: fmt for fmt, var in self.structs_fmt.items()}
        defined: dict[str, str] = {}  # name -> the part defining it
        out: dict[str, str] = {}
        exports: list[tuple[str, list[str]]] = []
        for name, body in zip(names, bodies, strict=True):
            text = "\n".join(body)
            own = _top_level_names(text)
            used = set(_IDENT.findall(text))
            lines = self._head(f"{self.opts.module_doc} Part {name} of {module}.")
            by_part: dict[str, list[str]] = {}
            for ident in sorted(used - set(own)):
                if ident in defined:
                    by_part.setdefault(defined[ident], []).append(ident)
            for part, idents in by_part.items():
                lines.append(f"from {package}.{part} import (")
                lines += [f"    {i}," for i in idents]
                lines.append(")")
            lines.append("")
            lines += [
                f"{var}: _Final = _struct.Struct('>{struct_of[var]}')"
                for var in sorted(used & set(struct_of), key=lambda v: int(v[2:]))
            ]
            lines += ["", ""]
            out[name] = "\n".join(lines + body).rstrip() + "\n"
            for ident in own:
                defined.setdefault(ident, name)
            exports.append((name, own))
        facade = self._head(self.opts.module_doc)[:6]
        facade.append(f"# The codecs live in {', '.join(names)} (see codegen.generate_split).")
        facade.append("")
        for name, own in exports:
            facade.append(f"from {package}.{name} import (")
            facade += [f"    {i} as {i}," for i in own if defined[i] == name]
            facade.append(")")
        out[module] = "\n".join(facade) + "\n"
        return out


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TUPLE_ITEM = re.compile(r"_t\[(\d+)\]")


def _call_of(build: str, items: int) -> str:
    """``build`` if it calls a constructor with ``_t[0]``, ..., ``_t[items-1]`` in order."""
    callee = build.split("(", 1)[0]
    args = ", ".join(f"_t[{k}]" for k in range(items))
    return f"{callee}({args})" if callee.isidentifier() else ""


def _top_level_names(text: str) -> list[str]:
    """The names that top-level statements of ``text`` bind, in order."""
    names: list[str] = []
    for stmt in ast.parse(text).body:
        if isinstance(stmt, ast.FunctionDef | ast.ClassDef):
            names.append(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names += [t.id for t in stmt.targets if isinstance(t, ast.Name)]
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names.append(stmt.target.id)
    return list(dict.fromkeys(names))


def generate(spec: Spec, options: Options | None = None) -> str:
    return Generator(spec, options).generate()
