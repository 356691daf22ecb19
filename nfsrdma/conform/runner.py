"""Running checks: each in its own time limit, its outcome classified, the exchanges of a
failing one kept in decoded form."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nfsrdma.conform.harness import (
    Exchange,
    Harness,
    WireRecord,
    op_name,
    result_status,
    status_name,
)
from nfsrdma.conform.registry import Check, Failed, Result, Skipped, Unsupported

MAX_FIELD = 400  # characters of one decoded argument or result in a report


@dataclass(slots=True)
class Outcome:
    check: Check
    result: Result
    detail: str = ""
    expected: str = ""
    got: str = ""
    seconds: float = 0.0
    exchanges: list[str] = field(default_factory=list)  # decoded, for failures
    wire: list[WireRecord] = field(default_factory=list)  # the raw messages, for failures


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= MAX_FIELD else text[: MAX_FIELD - 3] + "..."


def decode_exchange(x: Exchange) -> str:
    """A COMPOUND and its results, one operation a line."""
    lines = [f"  [{x.transport}] COMPOUND" + (f"  ({x.note})" if x.note else "")]
    if x.ops is None:
        lines.append("    > (hand-made arguments)")
    else:
        for o in x.ops:
            lines.append(
                f"    > {op_name(o.argop)} {_short(o.value) if o.value is not None else ''}"
            )
    if x.error:
        lines.append(f"    < {x.error}")
    elif x.res is not None:
        lines.append(f"    < status {status_name(x.res.status)}, {len(x.res.resarray)} results")
        for r in x.res.resarray:
            st = status_name(result_status(r.value))
            lines.append(f"    < {op_name(r.resop)} {st} {_short(r.value)}")
    return "\n".join(lines)


async def run_check(h: Harness, c: Check, limit: float) -> Outcome:
    if h.transport not in c.transports:
        return Outcome(c, Result.SKIP, f"not a {h.transport} check")
    t0 = time.monotonic()
    h.begin()
    out: Outcome
    try:
        async with asyncio.timeout(limit):
            await c.func(h)
        out = Outcome(c, Result.PASS)
    except Failed as e:
        out = Outcome(c, Result.FAIL, str(e), e.expected, e.got)
    except Unsupported as e:
        out = Outcome(c, Result.UNSUPPORTED, str(e))
    except Skipped as e:
        out = Outcome(c, Result.SKIP, str(e))
    except TimeoutError:
        out = Outcome(
            c, Result.FAIL, f"not finished in {limit} s", f"an end within {limit} s", "timeout"
        )
    except Exception as e:  # a server's bytes may break anything: report it
        out = Outcome(
            c, Result.FAIL, f"{type(e).__name__}: {e}", "no error", f"{type(e).__name__}: {e}"
        )
    out.seconds = time.monotonic() - t0
    if out.result is Result.FAIL:
        out.exchanges = [decode_exchange(x) for x in h.log]
        out.wire = list(h.wire)
    try:
        async with asyncio.timeout(limit):
            await h.end()
    except TimeoutError:
        pass
    return out


async def run_checks(
    h: Harness,
    checks: list[Check],
    *,
    limit: float = 60.0,
    progress: Callable[[int, int, Outcome], None] | None = None,
) -> list[Outcome]:
    outcomes = []
    try:
        for i, c in enumerate(checks):
            o = await run_check(h, c, limit)
            outcomes.append(o)
            if progress is not None:
                progress(i + 1, len(checks), o)
    finally:
        await h.aclose()
    return outcomes


def failed(outcomes: list[Outcome]) -> bool:
    return any(o.result is Result.FAIL for o in outcomes)
