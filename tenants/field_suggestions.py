""" "Did you mean": the known field a misspelt config key is closest to.

pydantic reports an unknown key as `Extra inputs are not permitted` and nothing more. The
fields that were allowed at that place follow from the model and the error's location, so a
key a typo or two away from one of them is answered with its name, as the YAML spells it (the
alias where there is one: `allowed_lateness`, not `allowed_lateness_ms`).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_core import ErrorDetails

EXTRA_FORBIDDEN = "extra_forbidden"


def problem_message(model: type[BaseModel], detail: ErrorDetails) -> str:
    """pydantic's message for one error, with "did you mean" for an unknown key close to a
    known one."""
    message = detail["msg"]
    if detail["type"] != EXTRA_FORBIDDEN or not detail["loc"]:
        return message
    *parent, unknown = detail["loc"]
    suggestion = closest_field(str(unknown), field_names_at(model, parent))
    return message if suggestion is None else f"{message}; did you mean `{suggestion}`?"


def closest_field(unknown: str, known: Iterable[str]) -> str | None:
    """The known name within a short edit distance of `unknown` (the nearest; ties: the first
    in sorted order), or None. Short: a quarter of the name's length, at least 1, at most 3."""
    limit = min(3, max(1, len(unknown) // 4))
    scored = sorted((_edit_distance(unknown, name), name) for name in set(known))
    if scored and scored[0][0] <= limit:
        return scored[0][1]
    return None


def field_names_at(model: type[BaseModel], location: Sequence[int | str]) -> set[str]:
    """The keys the models at `location` (a pydantic error's `loc`, without its last part)
    accept, spelt as in YAML. Union members are all followed, since a union's tag in the
    location (`tumbling`) is no key of the data."""
    at: list[Any] = [model]
    for part in location:
        following = [step for annotation in at for step in _step(annotation, part)]
        # A part no annotation has is a union member's tag: the location stays where it was.
        at = following or at
    return {
        name
        for annotation in at
        for candidate in _unwrapped(annotation)
        if isinstance(candidate, type) and issubclass(candidate, BaseModel)
        for name in _yaml_names(candidate)
    }


def _step(annotation: Any, part: int | str) -> list[Any]:
    steps: list[Any] = []
    for candidate in _unwrapped(annotation):
        origin = typing.get_origin(candidate)
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            steps.extend(
                info.annotation
                for name, info in candidate.model_fields.items()
                if part in (name, info.alias)
            )
        elif origin in (dict, Mapping) or (
            isinstance(origin, type) and issubclass(origin, Mapping)
        ):
            steps.append(typing.get_args(candidate)[-1])
        elif origin in (list, tuple, set, frozenset) and isinstance(part, int):
            steps.append(typing.get_args(candidate)[0])
    return steps


def _unwrapped(annotation: Any) -> list[Any]:
    """`annotation` without `Annotated`, `X | None` and unions: the types it may be."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrapped(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [
            member
            for arg in typing.get_args(annotation)
            if arg is not type(None)
            for member in _unwrapped(arg)
        ]
    return [annotation]


def _yaml_names(model: type[BaseModel]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


def _edit_distance(a: str, b: str) -> int:
    """Levenshtein distance with adjacent transpositions (`lateness` / `latneess`: 1)."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            cost = 0 if char_a == char_b else 1
            best = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and char_a == b[j - 2] and a[i - 2] == char_b:
                best = min(best, previous2[j - 2] + 1)
            current.append(best)
        previous2, previous = previous, current
    return previous[-1]
