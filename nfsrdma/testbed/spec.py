"""What the host asks the guest to do, passed as a JSON file in the shared out directory
(no quoting through the kernel command line, no length limit)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


class SpecError(ValueError):
    """A spec file that is not what the host writes."""


@dataclass(frozen=True, slots=True)
class GuestSpec:
    """One guest session: set-up wanted, then either a command or an interactive shell."""

    out_dir: str
    cwd: str
    knfsd: bool = False
    command: tuple[str, ...] = ()
    shell: bool = False
    # Extra directories put first on PATH for the command (the venv's bin).
    path_prepend: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GuestSpec:
        try:
            raw: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"spec is not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise SpecError("spec must be a JSON object")
        try:
            spec = cls(
                out_dir=_str(raw["out_dir"]),
                cwd=_str(raw["cwd"]),
                knfsd=_bool(raw.get("knfsd", False)),
                command=tuple(_str(a) for a in _list(raw.get("command", []))),
                shell=_bool(raw.get("shell", False)),
                path_prepend=tuple(_str(p) for p in _list(raw.get("path_prepend", []))),
                env={_str(k): _str(v) for k, v in _dict(raw.get("env", {})).items()},
            )
        except KeyError as exc:
            raise SpecError(f"spec lacks {exc}") from exc
        if not spec.shell and not spec.command:
            raise SpecError("spec has neither a command nor shell=true")
        return spec

    @classmethod
    def load(cls, path: Path) -> GuestSpec:
        return cls.from_json(path.read_text(encoding="utf-8"))


def _str(v: object) -> str:
    if not isinstance(v, str):
        raise SpecError(f"expected a string, got {v!r}")
    return v


def _bool(v: object) -> bool:
    if not isinstance(v, bool):
        raise SpecError(f"expected a boolean, got {v!r}")
    return v


def _list(v: object) -> list[object]:
    if not isinstance(v, list):
        raise SpecError(f"expected a list, got {v!r}")
    return v


def _dict(v: object) -> dict[object, object]:
    if not isinstance(v, dict):
        raise SpecError(f"expected an object, got {v!r}")
    return v
