"""The import rules of docs/architecture.md, checked against every import of the product.

A unit is a subpackage (`streaming.state`), a module at the root of `streaming/` or `infra/`
(`streaming.app`), or `tenants`. Every import counts: lazy ones inside functions and
`TYPE_CHECKING` ones too, since both are arrows a reader has to follow.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("tenants", "storage", "streaming", "infra")
"""Bottom to top: a unit may import its own layer or one below."""
RULES_DOCUMENT = PROJECT_ROOT / "docs" / "architecture.md"


@dataclass(frozen=True)
class Rule:
    may_import: frozenset[str]
    never: frozenset[str]


@dataclass(frozen=True)
class Arrow:
    source_unit: str
    target: str
    """A unit of the product, or a third-party top-level package."""
    where: str


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] == "tenants" or len(parts) == 1 else ".".join(parts[:2])


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules(root: Path = PROJECT_ROOT) -> dict[str, Path]:
    return {
        module_name(path, root): path
        for layer in LAYERS
        for path in sorted((root / layer).rglob("*.py"))
    }


def product_units(root: Path = PROJECT_ROOT) -> set[str]:
    """Every unit that holds code; the bare `streaming`, `storage`, `infra` only name layers."""
    return {unit_of(module) for module in product_modules(root) if module not in LAYERS[1:]}


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")
                package = package if is_package else package[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            yield base, node.lineno
            # `from streaming import state` imports the unit `streaming.state`.
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def product_arrows(root: Path = PROJECT_ROOT) -> list[Arrow]:
    arrows: list[Arrow] = []
    for module, path in product_modules(root).items():
        source_unit = unit_of(module)
        tree = ast.parse(path.read_text(), str(path))
        for target, line in imported_modules(tree, module, path.name == "__init__.py"):
            top = target.split(".")[0]
            where = f"{path.relative_to(root)}:{line}"
            if top not in LAYERS:
                arrows.append(Arrow(source_unit, top, where))
            elif target.count(".") >= 1 or top == "tenants":
                target_unit = unit_of(target)
                if target_unit != source_unit:
                    arrows.append(Arrow(source_unit, target_unit, where))
    return arrows


def read_rules(document: Path = RULES_DOCUMENT) -> dict[str, Rule]:
    """The rows of the import rules table: | `unit` | `a`, `b` | `never`, ... |."""
    rules: dict[str, Rule] = {}
    row = re.compile(r"^\| `([\w.]+)` \|([^|]*)\|([^|]*)\|\s*$")
    for line in document.read_text().splitlines():
        match = row.match(line)
        if match is None:
            continue
        unit, allowed, never = match.groups()
        rules[unit] = Rule(
            frozenset(re.findall(r"`([\w.]+)`", allowed)),
            frozenset(re.findall(r"`([\w.]+)`", never)),
        )
    return rules


def rule_violations(arrows: list[Arrow], rules: Mapping[str, Rule]) -> list[str]:
    """Imports the table does not allow, arrows back up, third parties a unit must not use."""
    problems: list[str] = []
    for arrow in arrows:
        rule = rules.get(arrow.source_unit)
        if rule is None:
            problems.append(f"{arrow.where}: unit {arrow.source_unit} is not in the rules table")
            continue
        if arrow.target in rule.never:
            problems.append(f"{arrow.where}: {arrow.source_unit} must never import {arrow.target}")
        if arrow.target.split(".")[0] not in LAYERS:
            continue
        source_layer = LAYERS.index(arrow.source_unit.split(".")[0])
        if LAYERS.index(arrow.target.split(".")[0]) > source_layer:
            problems.append(
                f"{arrow.where}: arrow back up, {arrow.source_unit} -> {arrow.target} "
                f"(layers go {' -> '.join(reversed(LAYERS))})"
            )
        elif arrow.target not in rule.may_import:
            problems.append(
                f"{arrow.where}: {arrow.source_unit} may not import {arrow.target} "
                "(docs/architecture.md, import rules)"
            )
    return sorted(set(problems))


def circles(arrows: list[Arrow]) -> list[list[str]]:
    """Every strongly connected group of more than one unit (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for arrow in arrows:
        if arrow.target.split(".")[0] in LAYERS:
            graph.setdefault(arrow.source_unit, set()).add(arrow.target)
            graph.setdefault(arrow.target, set())
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(unit: str) -> None:
        index[unit] = lowest[unit] = len(index)
        stack.append(unit)
        on_stack.add(unit)
        for target in sorted(graph[unit]):
            if target not in index:
                visit(target)
                lowest[unit] = min(lowest[unit], lowest[target])
            elif target in on_stack:
                lowest[unit] = min(lowest[unit], index[target])
        if lowest[unit] == index[unit]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == unit:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for unit in sorted(graph):
        if unit not in index:
            visit(unit)
    return found


def test_every_import_of_the_product_keeps_the_rules() -> None:
    arrows = product_arrows()
    assert len(arrows) > 100, "the scan found almost no imports: is PROJECT_ROOT right?"
    assert rule_violations(arrows, read_rules()) == []


def test_no_circle_between_units() -> None:
    assert circles(product_arrows()) == []


def test_every_unit_of_the_product_has_a_row_and_every_row_a_unit() -> None:
    assert set(read_rules()) == product_units()


# The checks themselves, on made-up arrows: each must catch what it is for.
RULES = {
    "tenants": Rule(frozenset(), frozenset({"pyspark"})),
    "storage.lake": Rule(frozenset({"tenants"}), frozenset()),
    "storage.query": Rule(frozenset({"storage.lake", "tenants"}), frozenset()),
    "streaming.state": Rule(frozenset({"storage.lake"}), frozenset()),
}


@pytest.mark.parametrize(
    ("arrow", "expected"),
    [
        (Arrow("storage.lake", "streaming.state", "a.py:1"), "arrow back up"),
        (Arrow("tenants", "storage.lake", "a.py:2"), "arrow back up"),
        (Arrow("storage.query", "storage.upkeep", "a.py:3"), "may not import storage.upkeep"),
        (Arrow("tenants", "pyspark", "a.py:4"), "must never import pyspark"),
        (Arrow("infra.cli", "tenants", "a.py:5"), "not in the rules table"),
    ],
)
def test_a_forbidden_arrow_is_reported_with_where_it_is(arrow: Arrow, expected: str) -> None:
    (problem,) = rule_violations([arrow], RULES)
    assert problem.startswith(f"{arrow.where}: ")
    assert expected in problem


def test_allowed_arrows_pass() -> None:
    allowed = [
        Arrow("storage.query", "storage.lake", "a.py:1"),
        Arrow("streaming.state", "storage.lake", "a.py:2"),
        Arrow("storage.lake", "pyarrow", "a.py:3"),
    ]
    assert rule_violations(allowed, RULES) == []


def test_a_circle_is_found_whichever_unit_it_starts_from() -> None:
    arrows = [
        Arrow("streaming.a", "streaming.b", "x"),
        Arrow("streaming.b", "streaming.c", "x"),
        Arrow("streaming.c", "streaming.a", "x"),
        Arrow("streaming.c", "storage.lake", "x"),
    ]
    assert circles(arrows) == [["streaming.a", "streaming.b", "streaming.c"]]
    assert circles(arrows[:2]) == []


def test_relative_and_lazy_imports_are_arrows(tmp_path: Path) -> None:
    package = tmp_path / "streaming" / "state"
    package.mkdir(parents=True)
    (tmp_path / "streaming" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "shell.py").write_text(
        "from ..windowing import key_state\n"
        "def later() -> None:\n"
        "    from storage.lake import tables\n"
        "    import infra.cli.main\n"
    )
    for layer in ("tenants", "storage", "infra"):
        (tmp_path / layer).mkdir()
    targets = {arrow.target for arrow in product_arrows(tmp_path)}
    assert {"streaming.windowing", "storage.lake", "infra.cli"} <= targets
