"""Checks and their outcomes. A check is an async function ``f(h: Harness) -> None`` whose
docstring describes it; it passes by returning, and otherwise raises one of the exceptions
below. ``@check`` registers it under a stable ID."""

from __future__ import annotations

import enum
import fnmatch
import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nfsrdma.conform.harness import Harness

CheckFunc = Callable[["Harness"], Awaitable[None]]


class Result(enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    UNSUPPORTED = "UNSUPPORTED"  # an optional feature the server declines
    SKIP = "SKIP"  # a precondition is missing


class Failed(Exception):
    """The server did not do what the RFC requires."""

    def __init__(self, expected: str, got: str) -> None:
        super().__init__(f"expected {expected}, got {got}")
        self.expected = expected
        self.got = got


class Unsupported(Exception):
    """The server declines an optional feature the check needs."""


class Skipped(Exception):
    """A precondition of the check is missing (not the server's fault)."""


@dataclass(frozen=True, slots=True)
class Check:
    id: str  # stable: a requirement ID (SS-6.2) or CONF-<area>-<n>
    title: str
    rfc: str  # the section that decides it, e.g. "RFC 8881 §18.46.3"
    group: str  # the document: "rfc8881-sessions", "rfc8881-ops", ...
    func: CheckFunc
    transports: tuple[str, ...] = ("tcp", "rdma")

    @property
    def description(self) -> str:
        return inspect.cleandoc(self.func.__doc__ or self.title)


REGISTRY: dict[str, Check] = {}

CHECK_MODULES = (
    "nfsrdma.conform.checks_rfc8881_sessions",
    "nfsrdma.conform.checks_rfc8881_more_sessions",
    "nfsrdma.conform.checks_rfc8881_ops",
    "nfsrdma.conform.checks_rfc8881_errors",
    "nfsrdma.conform.checks_rfc8166",
    "nfsrdma.conform.checks_rfc8267",
    "nfsrdma.conform.checks_rfc8797",
)


def check(
    id: str, title: str, rfc: str, *, group: str, transports: tuple[str, ...] = ("tcp", "rdma")
) -> Callable[[CheckFunc], CheckFunc]:
    def register(func: CheckFunc) -> CheckFunc:
        if id in REGISTRY:
            raise ValueError(f"check {id} registered twice")
        if not func.__doc__:
            raise ValueError(f"check {id} has no docstring")
        REGISTRY[id] = Check(id, title, rfc, group, func, transports)
        return func

    return register


def all_checks() -> list[Check]:
    """Every registered check, in registration order (module by module)."""
    import importlib

    for name in CHECK_MODULES:
        importlib.import_module(name)
    return list(REGISTRY.values())


def _matches(c: Check, pattern: str) -> bool:
    """A glob (``SS-6*``) or a plain substring, case-insensitively, of the ID or the group."""
    p = pattern.lower()
    fields = (c.id.lower(), c.group.lower())
    if any(ch in p for ch in "*?["):
        return any(fnmatch.fnmatchcase(f, p) for f in fields)
    return any(p in f for f in fields)


def select(
    checks: Iterable[Check], only: list[str] | None, exclude: list[str] | None
) -> list[Check]:
    out = []
    for c in checks:
        if only and not any(_matches(c, p) for p in only):
            continue
        if exclude and any(_matches(c, p) for p in exclude):
            continue
        out.append(c)
    return out


def describe(c: Check) -> dict[str, Any]:
    return {
        "id": c.id,
        "title": c.title,
        "rfc": c.rfc,
        "group": c.group,
        "transports": list(c.transports),
        "description": c.description,
    }
