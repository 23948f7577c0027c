"""Whether an engine can take traffic (``readiness``, behind ``GET /readyz``): ready
when running, not once shutting down, and not while what it keeps cannot be committed,
ready again once it can."""

from __future__ import annotations

import asyncio

import pytest

from feeds.service import EngineService

from .conftest import MakeEngine, refuse_commits


async def test_a_running_engine_is_ready(engine: EngineService) -> None:
    ready = await engine.readiness(5.0)
    assert ready.problems == ()


async def test_an_engine_shutting_down_is_not_ready(make_engine: MakeEngine) -> None:
    engine = await make_engine()
    await engine.close()
    ready = await engine.readiness(5.0)
    assert ready.problems  # one line saying why
    assert all(line.strip() for line in ready.problems)


@pytest.mark.alone  # the cluster's masters refuse every write meanwhile
async def test_an_engine_that_cannot_commit_is_not_ready_until_it_can(
    restart: MakeEngine,
) -> None:
    engine = await restart()
    assert (await engine.readiness(5.0)).checked  # what it looked at: its commits
    async with refuse_commits(engine):
        ready = await engine.readiness(0.2)
        assert ready.problems, ready
        # concurrent asks share one test and agree
        both = await asyncio.gather(engine.readiness(0.2), engine.readiness(0.2))
        assert all(answer.problems for answer in both)
    deadline = asyncio.get_running_loop().time() + 10
    while (await engine.readiness(5.0)).problems:  # the probe's commit clears it
        assert asyncio.get_running_loop().time() < deadline, "never ready again"
        await asyncio.sleep(0.05)
