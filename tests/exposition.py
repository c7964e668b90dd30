"""A daemon's Prometheus /metrics read over HTTP, for tests."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def exposition(url: str) -> str:
    """The exposition text served at url."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics as {(sample name, sorted labels): value}."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposition(url))
        for sample in family.samples
    }
