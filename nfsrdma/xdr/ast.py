"""The syntax tree of an XDR specification (RFC 4506 plus rpcgen program definitions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Kind(Enum):
    """How a declaration repeats its base type."""

    PLAIN = "plain"
    FIXED = "fixed"  # type name[n]
    VARIABLE = "variable"  # type name<n> / name<>
    OPTIONAL = "optional"  # type *name


# Base type names the language builds in. Everything else names a definition.
PRIMITIVES = frozenset(
    {"int", "unsigned int", "hyper", "unsigned hyper", "bool", "opaque", "string", "void"}
)


@dataclass(slots=True)
class Decl:
    """One declaration: a struct field, a union arm, a typedef, or a discriminant."""

    name: str
    type: str  # a primitive name or the name of a definition
    kind: Kind = Kind.PLAIN
    size: int | None = None  # the fixed length, or the maximum (None = unbounded)
    line: int = 0

    @property
    def is_void(self) -> bool:
        return self.type == "void"


@dataclass(slots=True)
class Const:
    name: str
    value: int
    line: int = 0


@dataclass(slots=True)
class Enum_:
    name: str
    members: list[tuple[str, int]]
    line: int = 0


@dataclass(slots=True)
class Struct:
    name: str
    fields: list[Decl]
    line: int = 0


@dataclass(slots=True)
class Arm:
    """One union arm: the case values that select it and its declaration (void allowed)."""

    cases: list[int]
    decl: Decl


@dataclass(slots=True)
class Union:
    name: str
    discriminant: Decl
    arms: list[Arm]
    default: Decl | None  # None: no default arm (unknown discriminants are errors)
    line: int = 0


@dataclass(slots=True)
class Typedef:
    decl: Decl
    line: int = 0

    @property
    def name(self) -> str:
        return self.decl.name


@dataclass(slots=True)
class Procedure:
    name: str
    number: int
    result: str
    args: list[str]


@dataclass(slots=True)
class Version:
    name: str
    number: int
    procedures: list[Procedure]


@dataclass(slots=True)
class Program:
    name: str
    number: int
    versions: list[Version]
    line: int = 0


Definition = Const | Enum_ | Struct | Union | Typedef | Program


@dataclass(slots=True)
class Spec:
    """A parsed specification: its definitions in source order, and every named value."""

    definitions: list[Definition] = field(default_factory=list)
    constants: dict[str, int] = field(default_factory=dict)  # consts and enum members
    types: dict[str, Enum_ | Struct | Union | Typedef] = field(default_factory=dict)

    @property
    def programs(self) -> list[Program]:
        return [d for d in self.definitions if isinstance(d, Program)]
