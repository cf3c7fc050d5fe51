"""Reading a dockflow process's ops port: its answers, its Prometheus exposition, and
readiness turning 503 when a shutdown begins."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

# Long enough that the 503 is seen before the process exits; the test never waits it out
# idly, it polls until the answer changes.
SHUTDOWN_DELAY_S = "10"


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as response:
        return response.status, await response.text()


def metric_samples(exposition: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Parse the exposition with prometheus_client's parser: name -> labels -> value."""
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[labels] = sample.value
    return samples


async def readiness_until_503(session: aiohttp.ClientSession, ops_url: str) -> tuple[int, str]:
    while True:
        status, body = await get(session, f"{ops_url}/readyz")
        if status != 200:
            return status, body
        await asyncio.sleep(0.05)
