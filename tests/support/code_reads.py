"""What a function reads of one of its arguments, found in the source along its calls.

`reads(function, parameter)` follows the argument through the product's code without running
it: attribute chains on it (`settings.kafka.topic` reads `kafka.topic`), aliases
(`kafka = settings.kafka`), calls that pass it on (into that function's parameter), objects that
keep it (`self.settings = settings`, then every method's `self.settings.lake`), and function-local
imports. Where it cannot follow (a call into a library, a container, a callee it cannot resolve),
it counts the whole value as read: the answer may say more is read than is, never less.

The CLI test uses it to ask, for each command, which of its flags its code path reads.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

PRODUCT_PACKAGES = frozenset({"infra", "streaming", "storage", "tenants"})
WHOLE = ""
"""The read path of the whole value."""


@dataclass
class ModuleIndex:
    name: str
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    """A local name -> (module, attribute), attribute None for a module."""


@cache
def module_index(name: str) -> ModuleIndex | None:
    if name.split(".")[0] not in PRODUCT_PACKAGES:
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    index = ModuleIndex(name)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            index.functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            index.classes[node.name] = node
    index.imports.update(_imports_in(tree, name))
    return index


def _imports_in(tree: ast.AST, module: str) -> dict[str, tuple[str, str | None]]:
    found: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.rsplit(".", node.level)[0]
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                found[alias.asname or alias.name] = (base, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    found[alias.asname] = (alias.name, None)
                else:
                    top = alias.name.split(".")[0]
                    found[top] = (top, None)
    return found


@dataclass(frozen=True)
class Callee:
    module: str
    function: ast.FunctionDef | ast.AsyncFunctionDef | None
    """None: a class with no `__init__` of its own (a dataclass, a pydantic model)."""
    owner: ast.ClassDef | None
    skip_first: bool
    """Its first parameter is `self` or `cls`, which the call does not pass."""


def _resolve_name(module: str, name: str, depth: int = 0) -> tuple[str, str] | None:
    """(module, name) of the function or class `name` means in `module`, through imports."""
    index = module_index(module)
    if index is None or depth > 5:
        return None
    if name in index.functions or name in index.classes:
        return module, name
    if name in index.imports:
        target, attribute = index.imports[name]
        if attribute is None:
            return None
        if module_index(f"{target}.{attribute}") is not None:
            return None  # a module, not a function
        return _resolve_name(target, attribute, depth + 1)
    return None


def _class_callee(module: str, class_name: str, method: str) -> Callee | None:
    index = module_index(module)
    if index is None or class_name not in index.classes:
        return None
    owner = index.classes[class_name]
    for node in owner.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == method:
            static = any(
                isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list
            )
            return Callee(module, node, owner, not static)
    if method == "__init__":
        return Callee(module, None, owner, False)
    return None


@dataclass
class Scope:
    """Where a call is: its module, the function's own imports, and its class if a method."""

    module: str
    local_imports: dict[str, tuple[str, str | None]]
    owner: ast.ClassDef | None


def _resolve_call(call: ast.Call, scope: Scope) -> Callee | None:
    target = call.func
    if isinstance(target, ast.Name):
        if target.id in scope.local_imports:
            imported, attribute = scope.local_imports[target.id]
            if attribute is None:
                return None
            resolved = _resolve_name(imported, attribute)
        else:
            resolved = _resolve_name(scope.module, target.id)
        if resolved is None:
            return None
        module, name = resolved
        index = module_index(module)
        assert index is not None
        if name in index.classes:
            return _class_callee(module, name, "__init__")
        return Callee(module, index.functions[name], None, False)
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
        base = target.value.id
        if base in {"self", "cls"} and scope.owner is not None:
            return _class_callee(scope.module, scope.owner.name, target.attr)
        imports = {**(module_index(scope.module) or ModuleIndex("")).imports}
        imports.update(scope.local_imports)
        if base in imports:
            imported, attribute = imports[base]
            if attribute is None:  # module.function
                resolved = _resolve_name(imported, target.attr)
                if resolved is None:
                    return None
                module, name = resolved
                index = module_index(module)
                assert index is not None
                if name in index.classes:
                    return _class_callee(module, name, "__init__")
                return Callee(module, index.functions[name], None, False)
            resolved = _resolve_name(imported, attribute)
        else:
            resolved = _resolve_name(scope.module, base)
        if resolved is not None:  # Class.method
            return _class_callee(resolved[0], resolved[1], target.attr)
    return None


def _join(prefix: str, attribute: str) -> str:
    return f"{prefix}.{attribute}" if prefix else attribute


@dataclass
class Reader:
    """Follows one value; `sources` are functions whose result is the whole value (e.g. the
    CLI's `settings_from`), `opaque` functions that read nothing of it when it is passed."""

    sources: frozenset[str] = frozenset()
    opaque: frozenset[str] = frozenset()
    reads: set[str] = field(default_factory=set)
    wholes: list[tuple[str, int]] = field(default_factory=list)
    """Where the whole value was counted as read (module, line): for a failing test's message."""
    _seen: set[tuple[int, str, str]] = field(default_factory=set)

    def follow(
        self,
        module: str,
        function: ast.FunctionDef | ast.AsyncFunctionDef,
        tracked: dict[str, str],
        owner: ast.ClassDef | None = None,
        self_tracked: dict[str, str] | None = None,
    ) -> None:
        key = (
            id(function),
            repr(sorted(tracked.items())),
            repr(sorted((self_tracked or {}).items())),
        )
        if key in self._seen:
            return
        self._seen.add(key)
        scope = Scope(module, _imports_in(function, module), owner)
        names = dict(tracked)
        attributes = dict(self_tracked or {})
        # Aliases first (`kafka = settings.kafka`, `self.settings = settings`), to a fixed point.
        for _ in range(5):
            before = (len(names), len(attributes))
            for node in ast.walk(function):
                if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                    path = self._path(node.value, names, attributes, scope)
                    if path is None:
                        continue
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        if isinstance(target, ast.Name):
                            names.setdefault(target.id, path)
                        elif (
                            isinstance(target, ast.Attribute)
                            and isinstance(target.value, ast.Name)
                            and target.value.id == "self"
                        ):
                            attributes.setdefault(target.attr, path)
            if (len(names), len(attributes)) == before:
                break
        consumed: set[int] = set()
        parents = {
            id(child): parent
            for parent in ast.walk(function)
            for child in ast.iter_child_nodes(parent)
        }
        for node in ast.walk(function):
            if isinstance(node, ast.Call):
                self._call(node, names, attributes, scope, consumed)
        for node in ast.walk(function):
            if id(node) in consumed:
                continue
            path = self._path(node, names, attributes, scope, calls=False)
            if path is None:
                continue
            parent = parents.get(id(node))
            if isinstance(parent, ast.Attribute) and parent.value is node:
                continue  # the longer chain is the read
            if (
                isinstance(parent, ast.Call)
                and parent.func is node
                and isinstance(node, ast.Attribute)
            ):
                path = path.rsplit(".", 1)[0] if "." in path else WHOLE  # a method of the value
            if self._is_alias_source(node, parent):
                continue
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                continue
            self._read(path, scope, node)
        if owner is not None and attributes and function.name == "__init__":
            for member in owner.body:
                if (
                    isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef)
                    and member is not function
                ):
                    self.follow(module, member, {}, owner, attributes)

    def _read(self, path: str, scope: Scope, node: ast.AST) -> None:
        self.reads.add(path)
        if path == WHOLE:
            self.wholes.append((scope.module, getattr(node, "lineno", 0)))

    @staticmethod
    def _is_alias_source(node: ast.AST, parent: ast.AST | None) -> bool:
        if not isinstance(parent, ast.Assign | ast.AnnAssign) or parent.value is not node:
            return False
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        return all(
            isinstance(t, ast.Name)
            or (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
            )
            for t in targets
        )

    def _path(
        self,
        node: ast.AST,
        names: dict[str, str],
        attributes: dict[str, str],
        scope: Scope,
        calls: bool = True,
    ) -> str | None:
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.Attribute):
            if (
                isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr in attributes
            ):
                return attributes[node.attr]
            base = self._path(node.value, names, attributes, scope, calls)
            return None if base is None else _join(base, node.attr)
        if calls and isinstance(node, ast.Call) and self._called_name(node) in self.sources:
            return WHOLE
        return None

    @staticmethod
    def _called_name(call: ast.Call) -> str | None:
        if isinstance(call.func, ast.Name):
            return call.func.id
        if isinstance(call.func, ast.Attribute):
            return call.func.attr
        return None

    def _call(
        self,
        call: ast.Call,
        names: dict[str, str],
        attributes: dict[str, str],
        scope: Scope,
        consumed: set[int],
    ) -> None:
        called = self._called_name(call)
        passed: list[tuple[int | str, ast.expr, str]] = []
        for position, argument in enumerate(call.args):
            path = self._path(argument, names, attributes, scope)
            if path is not None:
                passed.append((position, argument, path))
        for keyword in call.keywords:
            path = self._path(keyword.value, names, attributes, scope)
            if path is not None and keyword.arg is not None:
                passed.append((keyword.arg, keyword.value, path))
        if not passed:
            return
        if called in self.opaque or called in self.sources:
            consumed.update(id(argument) for _, argument, _ in passed)
            return
        callee = _resolve_call(call, scope)
        if callee is not None and callee.function is None and callee.owner is not None:
            self._construct(callee, passed, consumed)
            return
        for where, argument, path in passed:
            consumed.add(id(argument))
            parameter = self._parameter(callee, where)
            if callee is None or callee.function is None or parameter is None:
                self._read(path, scope, argument)
                continue
            self.follow(callee.module, callee.function, {parameter: path}, callee.owner)

    def _construct(
        self, callee: Callee, passed: list[tuple[int | str, ast.expr, str]], consumed: set[int]
    ) -> None:
        """A dataclass built with the value: its fields, in order, then its methods."""
        assert callee.owner is not None
        fields = [
            node.target.id
            for node in callee.owner.body
            if isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and "init=False" not in ast.unparse(node)
            and "ClassVar" not in ast.unparse(node.annotation)
        ]
        kept: dict[str, str] = {}
        for where, argument, path in passed:
            consumed.add(id(argument))
            name = (
                where if isinstance(where, str) else fields[where] if where < len(fields) else None
            )
            if name is None or path != WHOLE:
                # A part of the value kept in a field is there to be read (`LoadSpec(count=
                # args.count)`); the whole value is followed into the class's methods.
                self.reads.add(path)
            else:
                kept[name] = path
        for member in callee.owner.body:
            if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                self.follow(callee.module, member, {}, callee.owner, kept)

    @staticmethod
    def _parameter(callee: Callee | None, where: int | str) -> str | None:
        if callee is None or callee.function is None:
            return None
        arguments = callee.function.args
        positional = [a.arg for a in [*arguments.posonlyargs, *arguments.args]]
        if callee.skip_first:
            positional = positional[1:]
        if isinstance(where, str):
            every = positional + [a.arg for a in arguments.kwonlyargs]
            return where if where in every else None
        if where < len(positional):
            return positional[where]
        return None


def reads_of(
    module: str,
    function: str,
    parameter: str | None,
    sources: frozenset[str] = frozenset(),
    opaque: frozenset[str] = frozenset(),
) -> set[str]:
    """The paths `module.function` reads of its `parameter` (or, with None, of what the
    `sources` return), following its calls."""
    index = module_index(module)
    assert index is not None, module
    reader = Reader(sources, opaque)
    reader.follow(
        module, index.functions[function], {} if parameter is None else {parameter: WHOLE}
    )
    return reader.reads


def covers(reads: set[str], path: str) -> bool:
    """Whether reading `reads` reads `path`: the path itself, a part of it, or all of it."""
    return any(
        read in (path, WHOLE) or path.startswith(f"{read}.") or read.startswith(f"{path}.")
        for read in reads
    )
