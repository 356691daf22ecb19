"""Test-suite wide set-up: ``async def`` tests run on a fresh event loop each.

Async fixtures are not used; tests enter async context managers themselves."""

from __future__ import annotations

import asyncio
import inspect

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    funcargs = pyfuncitem.funcargs
    args = {name: funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    with asyncio.Runner() as runner:
        runner.run(pyfuncitem.obj(**args))
    return True
