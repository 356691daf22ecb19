"""Attribute-mask codecs (bitmap4 + attribute values, RFC 8881 section 3.3.5 / 5), generated at
build time with the rest of a specification's codecs.

A ``fattr4`` is a bitmap and the values of the attributes it names, in attribute-number order,
each coded as the specification's ``fattr4_<name>`` typedef. The section written here gives:

* ``ATTRIBUTE_NAMES`` (number → name), ``ATTRIBUTE_DEC`` / ``ATTRIBUTE_ENC`` (number → the typedef's
  generated codec) and ``ATTRIBUTE_FIXED`` (number → struct format and value builder, for the
  attributes of fixed size);
* for the masks a table names (those clients send most), one decoder and one server encoder
  each, specialised the way the generated codecs are: every run of fixed-size values packed or
  unpacked by one precompiled ``struct.Struct``, constants baked in (``ATTRIBUTE_MASK_DECODERS``,
  ``ATTRIBUTE_MASK_ENCODERS``, keyed by the mask's words);
* for any other mask, on the server side: layers of attribute groups, each group a few
  attributes in number order with one encoder per subset (``SERVER_ATTRIBUTE_LAYERS``), so that
  any mask is coded with one call per group it touches; the table's layers group what clients
  combine most, and a last layer covers every encodable attribute. On the decoding side, the
  table's layers too (``ATTRIBUTE_DECODE_LAYERS``), and ``ATTRIBUTE_FIXED`` and
  ``ATTRIBUTE_DEC`` for a plan of any other mask.

The server's value sources are expressions over ``a`` (the object's attributes), ``fs`` (its
file system's statistics), ``fh`` (its filehandle), ``cfg`` (the server's limits) and ``err``
(rdattr_error); the table (``nfs4_fattr.py``) says which expression gives which attribute. The
formats and item counts come from the specification, and an expression that does not give as
many values as its attribute's XDR type holds is a generation error.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nfsrdma.xdr.ast import Const, Decl, Kind, Typedef

if TYPE_CHECKING:
    from nfsrdma.xdr.codegen import Generator


@dataclass(frozen=True)
class FattrTable:
    """What the generator needs beyond the specification: the server's value sources and the
    masks worth a specialised codec (attribute names are the ``fattr4_<name>`` suffixes)."""

    # name -> comma-separated expressions, one per XDR item of the attribute's fixed layout
    # ("*a.fsid" counts as the two it unpacks to: give the count after a '#').
    fixed: dict[str, str]
    # name -> expression giving the attribute's encoded XDR (variable-size attributes)
    variable: dict[str, str]
    # name -> the attributes of a constant bitmap4 value (supported_attrs, suppattr_exclcreat)
    bitmaps: dict[str, tuple[str, ...]]
    # mask name -> attribute names
    masks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Layers of ordered groups of attributes (each group's subsets get an encoder): those the
    # Linux client combines most; a last layer of every attribute in groups of group_size.
    layers: tuple[tuple[tuple[str, ...], ...], ...] = ()
    group_size: int = 5
    prefix: str = "FATTR4_"


def _words(numbers: list[int]) -> tuple[int, ...]:
    words: list[int] = []
    for n in numbers:
        while len(words) <= n >> 5:
            words.append(0)
        words[n >> 5] |= 1 << (n & 31)
    return tuple(words)


class _Section:
    def __init__(self, g: Generator, table: FattrTable) -> None:
        self.g = g
        self.t = table
        self.numbers: dict[str, int] = {}
        for d in g.spec.definitions:
            if isinstance(d, Const) and d.name.startswith(table.prefix):
                self.numbers[d.name[len(table.prefix) :].lower()] = d.value
        self.names = {n: name for name, n in self.numbers.items()}
        self.typedefs = {
            name for name in self.numbers if isinstance(g.spec.types.get(f"fattr4_{name}"), Typedef)
        }
        for name in [
            *table.fixed,
            *table.variable,
            *table.bitmaps,
            *sum(table.bitmaps.values(), ()),
        ]:
            if name not in self.typedefs:
                raise ValueError(f"fattr table: no attribute fattr4_{name} in the specification")
        self.bitmaps = {
            name: _words(sorted(self.numbers[x] for x in members))
            for name, members in table.bitmaps.items()
        }
        for name in table.fixed:
            self.server_items(name)  # checked against the specification's layout
        for name in table.variable:
            if self.fixed_layout(name) is not None:
                raise ValueError(f"fattr table: {name} is of fixed size")
        self.out: list[str] = []
        self.aliases: dict[str, str] = {}  # bound Struct methods the codecs call

    def bound(self, struct_var: str, method: str) -> str:
        """A module-level name for ``struct_var.method`` (no attribute lookup per call)."""
        name = f"_fattr4{struct_var}_{method}"
        self.aliases[name] = f"{struct_var}.{method}"
        return name

    # -- the layout of one attribute ---------------------------------------------------
    def fixed_layout(self, name: str) -> tuple[str, int] | None:
        fx = self.g.fixed_of_type(f"fattr4_{name}")
        return None if fx is None else (fx.fmt, fx.items)

    def server_items(self, name: str) -> list[str]:
        """The expressions of a fixed attribute's items, checked against its layout."""
        layout = self.fixed_layout(name)
        if layout is None:
            raise ValueError(f"fattr table: fattr4_{name} is not of fixed size")
        expr, _, count = self.t.fixed[name].partition("#")
        items = [e.strip() for e in _top_level_split(expr) if e.strip()]
        n = sum(int(count) if e.startswith("*") and count else 1 for e in items)
        if n != layout[1]:
            raise ValueError(
                f"fattr table: {name} gives {n} values, fattr4_{name} holds {layout[1]}"
            )
        return items

    def uses_fs(self, name: str) -> bool:
        return name in self.t.fixed and "fs." in self.t.fixed[name]

    # -- sections ------------------------------------------------------------------------
    def generate(self) -> list[str]:
        o = self.out
        g = self.g
        nums = sorted(self.names)
        o.append("# -- fattr4 attribute-mask codecs (nfsrdma.xdr.fattrgen) " + "-" * 30)
        o.append(
            "ATTRIBUTE_NAMES: dict[int, str] = {"
            + ", ".join(f"{n}: {self.names[n]!r}" for n in nums)
            + "}"
        )
        coded = [n for n in nums if self.names[n] in self.typedefs]
        o.append(
            "ATTRIBUTE_DEC: dict[int, _Callable[[_Reader, int], tuple[_Any, int]]] = {"
            + ", ".join(f"{n}: dec_fattr4_{self.names[n]}" for n in coded)
            + "}"
        )
        o.append(
            "ATTRIBUTE_ENC: dict[int, _Callable[[_Writer, _Any], None]] = {"
            + ", ".join(f"{n}: enc_fattr4_{self.names[n]}" for n in coded)
            + "}"
        )
        o += ["", ""]
        fixed_entries = []
        for n in coded:
            name = self.names[n]
            layout = self.fixed_layout(name)
            if layout is None:
                continue
            fmt = layout[0]
            build = g.build_type(f"fattr4_{name}", "_t", 0)
            if build == "_t[0]":
                builder = "None"
            else:
                builder = f"_fattr4_build_{name}"
                o += [f"def {builder}(_t: _Any) -> _Any:", f"    return {build}", "", ""]
            fixed_entries.append(f"{n}: ({fmt!r}, {builder})")
        o.append(
            "ATTRIBUTE_FIXED: dict[int, tuple[str, _Callable[[_Any], _Any] | None]] = {"
            + ", ".join(fixed_entries)
            + "}"
        )
        o += ["", ""]
        self.server_section()
        self.mask_section()
        o += [f"{name} = {target}" for name, target in sorted(self.aliases.items())]
        return [*o, "", ""]

    def server_section(self) -> None:
        """Encoders for any mask: the attributes the server encodes, in number order, cut into
        groups of ``group_size``; one encoder per non-empty subset of each group. A mask is
        then coded group by group, one call per group it touches."""
        o, t = self.out, self.t
        o += [
            "def _fattr4_opaque(data: bytes) -> bytes:",
            "    n = len(data)",
            "    return _U32.pack(n) + data + _PAD[n & 3]",
            "",
            "",
            "@_lru_cache(maxsize=4096)",
            "def _fattr4_decimal(ident: int) -> bytes:",
            "    return _fattr4_opaque(str(ident).encode('ascii'))",
            "",
            "",
        ]
        for name, members in t.bitmaps.items():
            nums = sorted(self.numbers[x] for x in members)
            o.append(
                f"SERVER_{name.upper()}: frozenset[int] = frozenset({{{', '.join(map(str, nums))}}})"
            )
        fs = sorted(self.numbers[name] for name in t.fixed if self.uses_fs(name))
        o.append(f"SERVER_ATTRIBUTE_FS: frozenset[int] = frozenset({{{', '.join(map(str, fs))}}})")
        o += ["", ""]
        servable = sorted(self.numbers[name] for name in {*t.fixed, *t.variable, *t.bitmaps})
        layers = [
            [sorted(self.numbers[name] for name in group) for group in layer] for layer in t.layers
        ]
        size = t.group_size
        layers.append([servable[i : i + size] for i in range(0, len(servable), size)])
        entries = []
        for li, groups in enumerate(layers):
            flat = [n for group in groups for n in group]
            if flat != sorted(flat) or not set(flat) <= set(servable):
                raise ValueError(f"fattr table: layer {li} is not ordered groups of servable ones")
            group_of = []
            tables = []
            for gi, group in enumerate(groups):
                subsets = []
                for subset in range(1, 1 << len(group)):
                    numbers = [n for k, n in enumerate(group) if subset >> k & 1]
                    fn = self.mask_encoder(f"l{li}g{gi}_{subset}", numbers)
                    subsets.append(f"{subset}: {fn}")
                tables.append("{" + ", ".join(subsets) + "}")
                group_of += [f"{n}: ({gi}, {1 << k})" for k, n in enumerate(group)]
            entries.append(f"({{{', '.join(group_of)}}}, ({', '.join(tables)},))")
        o += [
            "# Layers of attribute groups, each group's subsets with their encoders: a mask is",
            "# coded by the first layer holding all its attributes, one call per group it touches.",
            "# (attribute -> (group, bit in the group's subsets), group -> subset -> encoder)",
            "SERVER_ATTRIBUTE_LAYERS: tuple[tuple[dict[int, tuple[int, int]], "
            "tuple[dict[int, _Callable[[_Any, _Any, bytes, _Any, int], bytes]], ...]], ...] = ("
            + ", ".join(entries)
            + ",)",
            "",
            "",
        ]

    def mask_section(self) -> None:
        o, t = self.out, self.t
        decoders: list[str] = []
        encoders: list[str] = []
        for mask_name, names in t.masks.items():
            for name in names:
                if name not in self.numbers:
                    raise ValueError(f"fattr table: mask {mask_name} names unknown {name}")
            numbers = sorted(self.numbers[name] for name in names)
            key = _words(numbers)
            if all(self.names[n] in self.typedefs for n in numbers):
                decoders.append(f"{key}: {self.mask_decoder(mask_name, numbers)}")
            servable = {*t.fixed, *t.variable, *t.bitmaps}
            if all(self.names[n] in servable for n in numbers):
                encoders.append(f"{key}: {self.mask_encoder(mask_name, numbers)}")
        layers = []
        for li, layer in enumerate(t.layers):
            groups = [sorted(self.numbers[name] for name in group) for group in layer]
            if not all(self.names[n] in self.typedefs for group in groups for n in group):
                continue
            group_of = []
            tables = []
            for gi, group in enumerate(groups):
                subsets = []
                for subset in range(1, 1 << len(group)):
                    numbers = [n for k, n in enumerate(group) if subset >> k & 1]
                    fn = f"_fattr4_decode_l{li}g{gi}_{subset}"
                    body, values, _ = self.decoder_body(numbers)
                    self.out += [
                        f"def {fn}(r: _Reader, buf: _Any, off: int, out: dict[int, _Any]) -> int:",
                        *(line[4:] for line in body),
                        *(f"    out[{n}] = {v}" for n, v in values),
                        "    return off",
                        "",
                        "",
                    ]
                    subsets.append(f"{subset}: {fn}")
                tables.append("{" + ", ".join(subsets) + "}")
                group_of += [f"{n}: ({gi}, {1 << k})" for k, n in enumerate(group)]
            layers.append(f"({{{', '.join(group_of)}}}, ({', '.join(tables)},))")
        o += [
            "# The table's layers for decoding: (attribute -> (group, bit), group -> subset ->",
            "# decoder of those values at off into out, giving the new off).",
            "ATTRIBUTE_DECODE_LAYERS: tuple[tuple[dict[int, tuple[int, int]], "
            "tuple[dict[int, _Callable[[_Reader, _Any, int, dict[int, _Any]], int]], ...]], ...] = ("
            + ", ".join(layers)
            + ("," if layers else "")
            + ")",
            "ATTRIBUTE_MASK_DECODERS: dict[tuple[int, ...], _Callable[[_Buffer], dict[int, _Any]]] = {"
            + ", ".join(decoders)
            + "}",
            "ATTRIBUTE_MASK_ENCODERS: dict[tuple[int, ...], "
            "_Callable[[_Any, _Any, bytes, _Any, int], bytes]] = {" + ", ".join(encoders) + "}",
            "",
            "",
        ]

    def decoder_body(self, numbers: list[int]) -> tuple[list[str], list[tuple[int, str]], bool]:
        """Statements decoding ``numbers``' values at ``off`` of ``buf`` into locals: the
        statements, each attribute's local, and whether they need ``r`` (a Reader: for the
        generated codecs of variable-size values other than opaques and strings). Every run of
        fixed-size values is one unpack; conversions and builds happen right after it."""
        g = self.g
        body: list[str] = []
        values: list[tuple[int, str]] = []
        fmt: list[str] = []
        builds: list[tuple[int, str]] = []
        items = 0  # unpacked values so far: their locals are _t0, _t1, ...
        needs_reader = False

        def flush() -> None:
            nonlocal items
            if not fmt:
                return
            layouts = [self.fixed_layout(name) for _, name in builds]
            count = sum(layout[1] for layout in layouts if layout is not None)
            names = [f"_t{items + k}" for k in range(count)]
            target = f"({names[0]},)" if count == 1 else ", ".join(names)
            sv = self.bound(g.struct_var("".join(fmt)), "unpack_from")
            body.append(f"        {target} = {sv}(buf, off)")
            body.append(f"        off += {_struct_size(''.join(fmt))}")
            for (n, name), layout in zip(builds, layouts, strict=True):
                assert layout is not None
                build = g.build_type(f"fattr4_{name}", "_t", items)
                local = _TUPLE_ITEM.sub(lambda m: f"_t{int(m.group(1))}", build)
                if local != f"_t{items}" or layout[1] != 1:
                    body.append(f"        _v{n} = {local}")  # converted or built here
                    local = f"_v{n}"
                values.append((n, local))
                items += layout[1]
            fmt.clear()
            builds.clear()

        for n in numbers:
            name = self.names[n]
            layout = self.fixed_layout(name)
            if layout is not None:
                fmt.append(layout[0])
                builds.append((n, name))
                continue
            flush()
            d = g.resolve(Decl(f"fattr4_{name}", f"fattr4_{name}"))
            if d.kind is Kind.VARIABLE and d.type in ("opaque", "string"):
                # owner strings, file handles: inline, bounds checked as dec_fattr4_X does
                body += g.dec_stmts(d, f"_v{n}", False, "        ")
            else:
                needs_reader = True
                body.append(f"        _v{n}, off = dec_fattr4_{name}(r, off)")
            values.append((n, f"_v{n}"))
        flush()
        return body, values, needs_reader

    def mask_decoder(self, mask_name: str, numbers: list[int]) -> str:
        """A mask's decoder: the values into locals (``decoder_body``), and the dictionary
        built once at the end (one display instead of a store per attribute)."""
        fn = f"_fattr4_decode_{mask_name}"
        body, values, needs_reader = self.decoder_body(numbers)
        start = (
            ["    r = _Reader(data)", "    buf = r.buf"]
            if needs_reader
            else ["    buf = data if data.__class__ is bytes else memoryview(data)"]
        )
        self.out += [
            f"def {fn}(data: _Buffer) -> dict[int, _Any]:",
            *start,
            "    off = 0",
            "    try:",
            *body,
            "    except (_struct.error, KeyError, IndexError):",
            "        raise _XdrError('malformed attribute values', off) from None",
            "    if off != len(buf):",
            "        raise _XdrError('%d bytes after the attribute values' % (len(buf) - off), off)",
            f"    return {{{', '.join(f'{n}: {v}' for n, v in values)}}}",
            "",
            "",
        ]
        return fn

    def mask_encoder(self, mask_name: str, numbers: list[int]) -> str:
        g, t = self.g, self.t
        fn = f"_fattr4_encode_{mask_name}"
        pieces: list[str] = []
        fmt: list[str] = []
        args: list[str] = []

        def flush() -> None:
            if fmt:
                pieces.append(
                    f"{self.bound(g.struct_var(''.join(fmt)), 'pack')}({', '.join(args)})"
                )
                fmt.clear()
                args.clear()

        for n in numbers:
            name = self.names[n]
            if name in self.bitmaps:
                words = self.bitmaps[name]
                fmt.append("I" * (len(words) + 1))
                args += [str(len(words)), *map(str, words)]
            elif name in t.fixed:
                layout = self.fixed_layout(name)
                assert layout is not None
                fmt.append(layout[0])
                args += [e.split("#")[0] for e in self.server_items(name)]
            else:
                flush()
                pieces.append(t.variable[name])
        flush()
        body = " + ".join(pieces) if pieces else "b''"
        self.out += [
            f"def {fn}(a: _Any, fs: _Any, fh: bytes, cfg: _Any, err: int) -> bytes:",
            f"    return {body}",
            "",
            "",
        ]
        return fn


def _top_level_split(expr: str) -> list[str]:
    """``expr`` cut at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(expr):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    parts.append(expr[start:])
    return parts


_TUPLE_ITEM = re.compile(r"_t\[(\d+)\]")  # an item of the unpacked tuple, as a build names it


def _struct_size(fmt: str) -> int:
    return struct.calcsize(">" + fmt)


def section(table: FattrTable) -> Callable[[Generator], list[str]]:
    """The generator section writing ``table``'s attribute-mask codecs."""

    def write(g: Generator) -> list[str]:
        return _Section(g, table).generate()

    return write
