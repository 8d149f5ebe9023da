"""Reading a part's `/metrics` as Prometheus would: fetched over HTTP, parsed with
prometheus_client's own text parser."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Scrape:
    samples: list[Sample]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples called `name` whose labels include `labels` (0 if none)."""
        return sum(
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def names(self) -> set[str]:
        return {s.name for s in self.samples}


def parse(text: str) -> Scrape:
    samples = [
        Sample(s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    return Scrape(samples)


async def scrape(
    http: aiohttp.ClientSession, url: str, token: str | None = None, status: int = 200
) -> Scrape:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.get(url, headers=headers) as resp:
        text = await resp.text()
        assert resp.status == status, f"{url}: {resp.status} {text}"
        if status == 200:
            assert resp.headers["Content-Type"].startswith("text/plain")
        return parse(text) if status == 200 else Scrape([])
