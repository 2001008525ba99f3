"""Every relative link of the documentation reaches a file that exists, and every `#anchor` a
heading (or an explicit `<a id>`) of the page it names, as GitHub renders them: pages move
between docs/ and its folders by kind, and a link that silently 404s is a page lost."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.support.paths import ROOT

PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "infra").rglob("README.md")]
)
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```[ \t]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(?P<text>.+?)[ \t]*#*[ \t]*$", re.M)
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"(?P<id>[^\"]+)\"")


def _prose(page: Path) -> str:
    """The page without its code blocks, whose `# comments` are not headings."""
    return FENCE.sub("", page.read_text())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores
    kept), spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    prose = _prose(page)
    seen: dict[str, int] = {}
    found = set(EXPLICIT_ANCHOR.findall(prose))
    for match in HEADING.finditer(prose):
        base = slug(match.group("text"))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def broken_links(page: Path) -> list[str]:
    broken = []
    for match in LINK.finditer(INLINE_CODE.sub("", _prose(page))):
        target = match.group("target")
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / unquote(path)).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert not broken_links(page), broken_links(page)


def test_the_slugs_are_githubs() -> None:
    assert slug("Errors and `--verbose`") == "errors-and---verbose"
    assert slug("Worked example: 50,000 tenants at 5,000 records/s") == (
        "worked-example-50000-tenants-at-5000-recordss"
    )
    assert slug("When a window's final pane is out") == "when-a-windows-final-pane-is-out"
    assert slug("§1. Input records") == "1-input-records"


def test_the_index_and_the_sizing_guide_are_on_the_readmes_first_screen() -> None:
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    linked = {match.group("target") for match in LINK.finditer(first_screen)}
    assert {"docs/README.md", "docs/sizing.md"} <= linked, linked
