"""Scrape a Prometheus endpoint as Prometheus would (over HTTP, in the text format), and read
the samples back by name and label."""

from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""(sample name, its labels sorted) to the value."""


def scrape(url: str, check_content_type: bool = False, timeout_s: float = 30) -> Samples:
    """Every sample `url` answers with; with `check_content_type`, the answer must be the text
    format's `text/plain`."""
    answer = requests.get(url, timeout=timeout_s)
    assert answer.status_code == 200
    if check_content_type:
        assert answer.headers["Content-Type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def by_outcome(samples: Samples, name: str) -> dict[str, float]:
    """The values of `name`'s samples by their `outcome` label."""
    return {
        dict(labels)["outcome"]: value
        for (found, labels), value in samples.items()
        if found == name
    }
