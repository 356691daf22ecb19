"""A parser for the XDR language of RFC 4506, plus rpcgen ``program`` definitions.

``parse(text) -> Spec``. Lines starting with ``%`` or ``#`` are ignored, as are C comments.
Named values (constants, enum members) may be used wherever a number is expected and are
resolved after the whole text has been read, so their order does not matter.

Run as ``python -m nfsrdma.xdr.parser FILE.x`` to check a file and print a summary.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from nfsrdma.xdr.ast import (
    Arm,
    Const,
    Decl,
    Definition,
    Enum_,
    Kind,
    Procedure,
    Program,
    Spec,
    Struct,
    Typedef,
    Union,
    Version,
)


class XdrSyntaxError(Exception):
    def __init__(self, message: str, line: int) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r]+)
  | (?P<newline>\n)
  | (?P<comment>/\*.*?\*/|//[^\n]*)
  | (?P<directive>^[ \t]*[%\#][^\n]*)
  | (?P<number>-?(?:0[xX][0-9a-fA-F]+|[0-9]+))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[{}()\[\]<>;,:=*])
    """,
    re.VERBOSE | re.DOTALL | re.MULTILINE,
)

# A value as written: a number, or a name to resolve once everything is known.
Value = int | str
# Names every XDR compiler knows: the bool values (usable as case labels of a bool union).
_BUILTIN_VALUES = {"TRUE": 1, "FALSE": 0}


@dataclass(slots=True)
class _Tok:
    kind: str  # "number" | "ident" | "punct" | "eof"
    text: str
    line: int


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise XdrSyntaxError(f"unexpected character {text[pos]!r}", line)
        kind = m.lastgroup
        assert kind is not None
        chunk = m.group()
        if kind in ("number", "ident", "punct"):
            toks.append(_Tok(kind, chunk, line))
        line += chunk.count("\n")
        pos = m.end()
    toks.append(_Tok("eof", "", line))
    return toks


def _number(text: str) -> int:
    neg = text.startswith("-")
    body = text[1:] if neg else text
    if body.lower().startswith("0x"):
        n = int(body, 16)
    elif len(body) > 1 and body.startswith("0"):
        n = int(body, 8)
    else:
        n = int(body)
    return -n if neg else n


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokenize(text)
        self.i = 0
        # Deferred values: (holder, attribute or index, raw value, line).
        self.pending_sizes: list[tuple[Decl, str]] = []
        self.pending_cases: list[tuple[Arm, list[Value], int]] = []
        self.pending_consts: list[tuple[str, Value, int]] = []
        self.pending_enums: list[tuple[Enum_, list[tuple[str, Value | None]], int]] = []
        self.pending_programs: list[tuple[Program, list[tuple[Version, Value]], Value, int]] = []
        self.pending_procs: list[tuple[Procedure, Value, int]] = []

    # -- token helpers -------------------------------------------------------------------
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, text: str) -> _Tok:
        t = self.take()
        if t.text != text:
            raise XdrSyntaxError(f"expected {text!r}, found {t.text or 'end of file'!r}", t.line)
        return t

    def accept(self, text: str) -> bool:
        if self.tok.text == text and self.tok.kind != "eof":
            self.i += 1
            return True
        return False

    def ident(self) -> str:
        t = self.take()
        if t.kind != "ident":
            raise XdrSyntaxError(f"expected a name, found {t.text or 'end of file'!r}", t.line)
        return t.text

    def value(self) -> Value:
        t = self.take()
        if t.kind == "number":
            return _number(t.text)
        if t.kind == "ident":
            return t.text
        raise XdrSyntaxError(f"expected a value, found {t.text or 'end of file'!r}", t.line)

    # -- grammar -------------------------------------------------------------------------
    def specification(self) -> list[Definition]:
        defs: list[Definition] = []
        while self.tok.kind != "eof":
            defs.append(self.definition())
        return defs

    def definition(self) -> Definition:
        t = self.tok
        word = t.text
        if word == "const":
            self.take()
            name = self.ident()
            self.expect("=")
            raw = self.value()
            self.expect(";")
            c = Const(name, 0, t.line)
            self.pending_consts.append((name, raw, t.line))
            return c
        if word == "typedef":
            self.take()
            decl = self.declaration()
            self.expect(";")
            return Typedef(decl, t.line)
        if word == "enum":
            self.take()
            name = self.ident()
            e = self.enum_body(name, t.line)
            self.expect(";")
            return e
        if word == "struct":
            self.take()
            name = self.ident()
            s = Struct(name, self.struct_body(), t.line)
            self.expect(";")
            return s
        if word == "union":
            self.take()
            name = self.ident()
            u = self.union_body(name, t.line)
            self.expect(";")
            return u
        if word == "program":
            return self.program()
        raise XdrSyntaxError(f"expected a definition, found {word or 'end of file'!r}", t.line)

    def enum_body(self, name: str, line: int) -> Enum_:
        self.expect("{")
        raw: list[tuple[str, Value | None]] = []
        while True:
            member = self.ident()
            raw.append((member, self.value() if self.accept("=") else None))
            if self.accept("}"):
                break
            self.expect(",")
        e = Enum_(name, [], line)
        self.pending_enums.append((e, raw, line))
        return e

    def struct_body(self) -> list[Decl]:
        self.expect("{")
        fields: list[Decl] = []
        while not self.accept("}"):
            fields.append(self.declaration())
            self.expect(";")
        if not fields:
            raise XdrSyntaxError("empty struct", self.tok.line)
        return fields

    def union_body(self, name: str, line: int) -> Union:
        self.expect("switch")
        self.expect("(")
        disc = self.declaration()
        self.expect(")")
        self.expect("{")
        arms: list[Arm] = []
        default: Decl | None = None
        while not self.accept("}"):
            if self.accept("default"):
                self.expect(":")
                default = self.declaration()
                self.expect(";")
                continue
            cases: list[Value] = []
            case_line = self.tok.line
            while self.accept("case"):
                cases.append(self.value())
                self.expect(":")
            if not cases:
                raise XdrSyntaxError("expected 'case' or 'default'", self.tok.line)
            arm = Arm([], self.declaration())
            self.expect(";")
            self.pending_cases.append((arm, cases, case_line))
            arms.append(arm)
        return Union(name, disc, arms, default, line)

    def type_specifier(self) -> str:
        t = self.take()
        word = t.text
        if word == "unsigned":
            if self.tok.text in ("int", "hyper"):
                return "unsigned " + self.take().text
            return "unsigned int"
        if word in ("int", "hyper", "bool", "opaque", "string", "void"):
            return word
        if word in ("float", "double", "quadruple"):
            raise XdrSyntaxError(f"{word} is not supported", t.line)
        if word in ("struct", "union", "enum"):
            if self.tok.text == "{":
                raise XdrSyntaxError(f"anonymous {word} bodies are not supported: name it", t.line)
            return self.ident()
        if t.kind != "ident":
            raise XdrSyntaxError(f"expected a type, found {word or 'end of file'!r}", t.line)
        return word

    def declaration(self) -> Decl:
        line = self.tok.line
        typ = self.type_specifier()
        if typ == "void":
            return Decl("", "void", line=line)
        if self.accept("*"):
            return Decl(self.ident(), typ, Kind.OPTIONAL, line=line)
        name = self.ident()
        if self.accept("["):
            decl = Decl(name, typ, Kind.FIXED, line=line)
            self._defer_size(decl, self.value())
            self.expect("]")
        elif self.accept("<"):
            decl = Decl(name, typ, Kind.VARIABLE, line=line)
            if not self.accept(">"):
                self._defer_size(decl, self.value())
                self.expect(">")
        else:
            decl = Decl(name, typ, line=line)
        if typ == "string" and decl.kind is not Kind.VARIABLE:
            raise XdrSyntaxError("string must be declared with <>", line)
        if typ == "opaque" and decl.kind not in (Kind.FIXED, Kind.VARIABLE):
            raise XdrSyntaxError("opaque must be declared with [] or <>", line)
        return decl

    def _defer_size(self, decl: Decl, raw: Value) -> None:
        if isinstance(raw, int):
            decl.size = raw
        else:
            self.pending_sizes.append((decl, raw))

    def program(self) -> Program:
        line = self.take().line
        name = self.ident()
        self.expect("{")
        versions: list[tuple[Version, Value]] = []
        while not self.accept("}"):
            self.expect("version")
            vname = self.ident()
            self.expect("{")
            procs: list[Procedure] = []
            while not self.accept("}"):
                result = self.type_specifier()
                pname = self.ident()
                self.expect("(")
                args = [self.type_specifier()]
                while self.accept(","):
                    args.append(self.type_specifier())
                self.expect(")")
                self.expect("=")
                proc = Procedure(pname, 0, result, [a for a in args if a != "void"])
                self.pending_procs.append((proc, self.value(), self.tok.line))
                self.expect(";")
                procs.append(proc)
            self.expect("=")
            version = Version(vname, 0, procs)
            versions.append((version, self.value()))
            self.expect(";")
        self.expect("=")
        prog = Program(name, 0, [v for v, _ in versions], line)
        self.pending_programs.append((prog, versions, self.value(), line))
        self.expect(";")
        return prog


def _resolve(spec: Spec, p: _Parser, defs: list[Definition]) -> None:
    names = spec.constants
    raw_consts = {name: (raw, line) for name, raw, line in p.pending_consts}
    resolving: set[str] = set()

    def value_of(raw: Value, line: int) -> int:
        if isinstance(raw, int):
            return raw
        if raw in names:
            return names[raw]
        if raw in _BUILTIN_VALUES and raw not in raw_consts:
            return _BUILTIN_VALUES[raw]
        if raw in raw_consts and raw not in resolving:
            resolving.add(raw)
            names[raw] = value_of(*raw_consts[raw])
            return names[raw]
        raise XdrSyntaxError(f"unknown value {raw!r}", line)

    for e, members, line in p.pending_enums:
        nxt = 0
        for member, raw in members:
            v = nxt if raw is None else value_of(raw, line)
            if member in names and names[member] != v:
                raise XdrSyntaxError(f"{member} redefined", line)
            names[member] = v
            e.members.append((member, v))
            nxt = v + 1
    for name, raw, line in p.pending_consts:
        names[name] = value_of(raw, line)
    for d in defs:
        if isinstance(d, Const):
            d.value = names[d.name]
    for decl, raw in p.pending_sizes:
        decl.size = value_of(raw, decl.line)
    for arm, cases, line in p.pending_cases:
        arm.cases = [value_of(c, line) for c in cases]
    for proc, raw, line in p.pending_procs:
        proc.number = value_of(raw, line)
    for prog, versions, raw, line in p.pending_programs:
        prog.number = value_of(raw, line)
        for version, vraw in versions:
            version.number = value_of(vraw, line)


def _check(spec: Spec) -> None:
    """Every referenced type exists; sizes are sane; union cases are unique."""
    known = set(spec.types) | {"int", "unsigned int", "hyper", "unsigned hyper", "bool"}
    known |= {"opaque", "string", "void"}

    def check_decl(d: Decl) -> None:
        if d.type not in known:
            raise XdrSyntaxError(f"unknown type {d.type!r}", d.line)
        if d.size is not None and d.size < 0:
            raise XdrSyntaxError(f"negative size for {d.name}", d.line)

    for t in spec.types.values():
        if isinstance(t, Struct):
            for f in t.fields:
                check_decl(f)
        elif isinstance(t, Union):
            check_decl(t.discriminant)
            seen: set[int] = set()
            for arm in t.arms:
                check_decl(arm.decl)
                for c in arm.cases:
                    if c in seen:
                        raise XdrSyntaxError(f"duplicate case {c} in {t.name}", t.line)
                    seen.add(c)
            if t.default is not None:
                check_decl(t.default)
        elif isinstance(t, Typedef):
            check_decl(t.decl)


def parse(text: str) -> Spec:
    p = _Parser(text)
    defs = p.specification()
    spec = Spec(defs)
    for d in defs:
        if isinstance(d, Enum_ | Struct | Union | Typedef):
            if d.name in spec.types:
                raise XdrSyntaxError(f"type {d.name} defined twice", d.line)
            spec.types[d.name] = d
    _resolve(spec, p, defs)
    _check(spec)
    return spec


def main(argv: list[str]) -> int:
    for path in argv:
        try:
            with open(path, encoding="utf-8") as f:
                spec = parse(f.read())
        except XdrSyntaxError as e:
            print(f"{path}: {e}", file=sys.stderr)
            return 1
        kinds: dict[str, int] = {}
        for d in spec.definitions:
            kinds[type(d).__name__.rstrip("_")] = kinds.get(type(d).__name__.rstrip("_"), 0) + 1
        summary = ", ".join(f"{n} {k.lower()}" for k, n in sorted(kinds.items()))
        print(f"{path}: {summary}; {len(spec.constants)} named values")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
