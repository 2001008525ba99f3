"""Render `docs/configuration.md` from the config models themselves, so it cannot drift from them.

Keys, types, defaults, required-ness and descriptions all come from the pydantic models at run
time; this module adds only what no model can hold: the prose about precedence, ids and
durations, the examples in `docs/examples/`, and the descriptions some fields still lack
(`SUPPLEMENTS`). After a model changes, `python -m infra.config_reference` regenerates the file;
`--check` exits 1 when it is stale.

Installed from the wheel, without the checkout's `docs/`, it renders the same reference from the
models and prints it (or writes `--output`); only the examples section then points to the
source repository instead of quoting `docs/examples/`.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel, BeforeValidator, SecretStr
from pydantic.fields import FieldInfo

from tenants.models import (
    ID_PATTERN,
    MetricSpec,
    RuleOverrides,
    SourceConfig,
    TenantConfig,
    WindowRules,
    parse_duration_ms,
)
from tenants.registry import SOURCES_FILE, TENANTS_DIR
from tenants.settings import ENV_PREFIX, AppSettings, KafkaSettings

ROOT = Path(__file__).resolve().parents[1]
# Both exist in a source checkout only; an installed wheel has no `docs/`.
REFERENCE_PATH = ROOT / "docs" / "configuration.md"
EXAMPLES_DIR = ROOT / "docs" / "examples"
EXAMPLES_SHOWN = "docs/examples"
# `--output -` prints the reference; the default where there is no checkout to write into.
STDOUT = "-"
REGENERATE_COMMAND = "python -m infra.config_reference"

# Descriptions for fields whose model has none yet. A model's own `description=` wins, so moving
# a text into the model is safe; the test checks that every key here still names a field.
SUPPLEMENTS: dict[tuple[type[BaseModel], str], str] = {
    (AppSettings, "kafka"): "Where records are read from: one topic shared by all tenants.",
    (AppSettings, "lake"): "Where the Delta tables are written.",
    (AppSettings, "stream"): "The streaming query: its identity, checkpoint and batch sizes.",
    (KafkaSettings, "topic"): "The topic every tenant's records arrive on.",
    (MetricSpec, "kind"): "The aggregate: `count` (of all records, or with `field` and `equals` "
    "of matching ones), or `sum`, `min`, `max`, `mean` of the numeric `field`.",
    (TenantConfig, "id"): "The tenant id that records carry; unique across all tenant files.",
    (TenantConfig, "sources"): "The sources this tenant sends, each with its rule overrides "
    "(`{}` for none). Records of a source not listed are quarantined (`unknown_source`).",
}

# A model whose fields mirror another's (an override of each rule) borrows the mirrored
# field's description rather than repeating it, so the two cannot say different things.
MIRRORS: dict[type[BaseModel], type[BaseModel]] = {RuleOverrides: WindowRules}

# What an unset (null) value means, where it is not simply "null".
UNSET_MEANS: dict[type[BaseModel], str] = {RuleOverrides: "the source's value"}

# Shown for durations; the largest unit that divides the value exactly, so it reads as written.
_DISPLAY_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000))
DURATION_EXAMPLES = ("500ms", "10s", "1m", "2h", "1d", "90000")
DURATION_COUNTER_EXAMPLES = ("1.5s", "1m30s", "10 min", "-5s")


@dataclass(frozen=True)
class ConfigFile:
    """One kind of config file and the model its content validates against."""

    path: str
    anchor: str
    root: type[BaseModel]
    # sources.yaml holds its models under one mapping key rather than at the top level.
    mapping_key: str | None = None
    # Settings files can be overridden from the environment; config directories cannot.
    env_prefix: str | None = None

    @property
    def root_path(self) -> str:
        if self.mapping_key is None:
            return ""
        return f"{self.mapping_key}.{_placeholder(self.mapping_key)}"


APP_FILE = ConfigFile("conf/app.yaml", "file-app-yaml", AppSettings, env_prefix=ENV_PREFIX)
SOURCES = ConfigFile(f"conf/{SOURCES_FILE}", "file-sources-yaml", SourceConfig, "sources")
TENANTS = ConfigFile(f"conf/{TENANTS_DIR}/*.yaml", "file-tenants-yaml", TenantConfig)
CONFIG_FILES = (APP_FILE, SOURCES, TENANTS)


@dataclass
class Section:
    """One model's part of the reference, under the first file it is found in."""

    model: type[BaseModel]
    file: ConfigFile
    # Set for a member of a discriminated union: the key and the value that select it.
    discriminator: str | None = None
    kind: str | None = None
    locations: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Row:
    key: str
    type_text: str
    required: bool
    default: str
    description: str
    env: str | None


def anchor(model: type[BaseModel]) -> str:
    return f"model-{model.__name__.lower()}"


def format_duration(ms: int) -> str:
    """`3600000` as `1h`: a form `parse_duration_ms` reads back as the same value."""
    if ms == 0:
        return "0s"
    for unit, unit_ms in _DISPLAY_UNITS:
        if ms % unit_ms == 0:
            return f"{ms // unit_ms}{unit}"
    return f"{ms}ms"


def collect_sections(files: Sequence[ConfigFile] = CONFIG_FILES) -> dict[type[BaseModel], Section]:
    """Every model reachable from the files' roots, in the order a reader meets them."""
    sections: dict[type[BaseModel], Section] = {}
    for config_file in files:
        _visit(config_file.root, config_file.root_path, None, None, config_file, sections, ())
    return sections


def _visit(
    model: type[BaseModel],
    path: str,
    discriminator: str | None,
    kind: str | None,
    config_file: ConfigFile,
    sections: dict[type[BaseModel], Section],
    stack: tuple[type[BaseModel], ...],
) -> None:
    if model in stack:  # a self-referencing model is documented once, not walked forever
        return
    section = sections.setdefault(model, Section(model, config_file, discriminator, kind))
    if (config_file.path, path) not in section.locations:
        section.locations.append((config_file.path, path))
    for name, info in model.model_fields.items():
        child_path = _join(path, yaml_key(name, info))
        for child, child_at, child_disc, child_kind in _models_in(
            info.annotation, _field_metadata(info), child_path
        ):
            _visit(child, child_at, child_disc, child_kind, config_file, sections, (*stack, model))


def _models_in(
    annotation: Any, metadata: Sequence[Any], path: str
) -> Iterator[tuple[type[BaseModel], str, str | None, str | None]]:
    annotation, metadata = _unwrap(annotation, metadata)
    origin = get_origin(annotation)
    if _is_union(annotation):
        discriminator = _discriminator(metadata)
        for member in get_args(annotation):
            if discriminator is not None and _is_model(member):
                yield member, path, discriminator, _kind_of(member, discriminator)
            else:
                yield from _models_in(member, (), path)
    elif origin is dict:
        _key_type, value_type = get_args(annotation)
        key = path.rsplit(".", 1)[-1]
        yield from _models_in(value_type, (), f"{path}.{_placeholder(key)}")
    elif origin in (list, tuple, set, frozenset):
        for item_type in get_args(annotation):
            if item_type is not Ellipsis:
                yield from _models_in(item_type, (), f"{path}[]")
    elif _is_model(annotation):
        yield annotation, path, None, None


def yaml_key(name: str, info: FieldInfo) -> str:
    """The key a YAML file uses: the alias where there is one (`size` for `size_ms`)."""
    return info.alias or name


def field_description(model: type[BaseModel], name: str) -> str:
    """The model's description, else a supplement, else one derived from the field's type."""
    info = model.model_fields[name]
    if info.description:
        return " ".join(info.description.split())
    for owner in _lineage(model):
        supplement = SUPPLEMENTS.get((owner, name))
        if supplement is not None:
            return supplement
    mirrored = MIRRORS.get(model)
    if mirrored is not None and name in mirrored.model_fields:
        return field_description(mirrored, name)
    annotation, _metadata = _unwrap(info.annotation, ())
    if get_origin(annotation) is Literal and len(get_args(annotation)) == 1:
        return f"Always `{get_args(annotation)[0]}`: selects this kind."
    for model_type in _model_types(annotation):
        doc = _docstring(model_type)
        if doc:
            return doc.split("\n\n")[0].replace("\n", " ")
    return ""


def rows(section: Section) -> list[Row]:
    model = section.model
    _file_path, model_path = section.locations[0]
    env_prefix = section.file.env_prefix
    result = []
    for name, info in model.model_fields.items():
        key = yaml_key(name, info)
        metadata = _field_metadata(info)
        is_model = any(True for _ in _models_in(info.annotation, metadata, key))
        if name == section.discriminator and section.kind is not None:
            # A discriminated union needs its tag even though the member model defaults it.
            result.append(
                Row(key, f"`{section.kind}`", True, "", field_description(model, name), None)
            )
            continue
        env = None
        if env_prefix is not None and not is_model:
            env = env_prefix + _join(model_path, key).upper().replace(".", "__")
        result.append(
            Row(
                key=key,
                type_text=type_text(info.annotation, metadata),
                required=info.is_required(),
                default=_default_text(model, info, metadata),
                description=field_description(model, name),
                env=env,
            )
        )
    return result


def type_text(annotation: Any, metadata: Sequence[Any] = ()) -> str:
    """A reader's name for a type: `duration (> 0)`, `` `a` or `b` ``, a link to a model."""
    annotation, metadata = _unwrap(annotation, metadata)
    if _is_union(annotation):
        members = get_args(annotation)
        present = [member for member in members if member is not type(None)]
        discriminator = _discriminator(metadata)
        nullable = len(present) < len(members)
        if discriminator is not None and all(_is_model(member) for member in present):
            links = [
                f"[`{_kind_of(member, discriminator)}`](#{anchor(member)})" for member in present
            ]
            parts = [f"by `{discriminator}`: {_either(links)}"]
        else:
            # Constraints outside the union (e.g. `gt=0` on `int | None`) bind its members.
            parts = [type_text(member, metadata) for member in present]
        if not nullable:
            return _either(parts)
        if len(parts) == 1 and (" or " in parts[0] or ", " in parts[0]):
            # `a or b or null` would read as three choices of one level; keep null apart.
            return f"{parts[0]}; or `null`"
        return _either([*parts, "`null`"])
    base = _base_text(annotation, metadata)
    constraints = _constraints(metadata)
    return f"{base} ({', '.join(constraints)})" if constraints else base


def _base_text(annotation: Any, metadata: Sequence[Any]) -> str:
    if _is_duration(metadata):
        return "[duration](#durations)"
    if any(getattr(item, "pattern", None) == ID_PATTERN for item in metadata):
        return "[id](#ids)"
    origin = get_origin(annotation)
    if origin is Literal:
        return _one_of([f"`{_scalar(value)}`" for value in get_args(annotation)])
    if origin is dict:
        key_type, value_type = get_args(annotation)
        return f"mapping of {type_text(key_type)} to {type_text(value_type)}"
    if origin in (list, tuple, set, frozenset):
        item_types = [item for item in get_args(annotation) if item is not Ellipsis]
        return "list of " + _either([type_text(item) for item in item_types])
    if isinstance(annotation, type):
        if issubclass(annotation, Enum):
            return _one_of([f"`{_scalar(member)}`" for member in annotation])
        if issubclass(annotation, BaseModel):
            return f"[{annotation.__name__}](#{anchor(annotation)})"
        # bool before int: a bool is an int to issubclass.
        for python_type, name in _TYPE_NAMES:
            if issubclass(annotation, python_type):
                return name
    return f"`{getattr(annotation, '__name__', annotation)}`"


_TYPE_NAMES: tuple[tuple[type, str], ...] = (
    (SecretStr, "string (secret)"),
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (PurePath, "path"),
)


def _either(parts: Sequence[str]) -> str:
    """`a`, `a or b`, `a, b or c`."""
    if len(parts) <= 2:
        return " or ".join(parts)
    return f"{', '.join(parts[:-1])} or {parts[-1]}"


def _one_of(values: Sequence[str]) -> str:
    return _either(values) if len(values) <= 2 else f"one of {', '.join(values)}"


def _constraints(metadata: Sequence[Any]) -> list[str]:
    found = []
    for item in metadata:
        if isinstance(item, annotated_types.Gt):
            found.append(f"> {item.gt}")
        elif isinstance(item, annotated_types.Ge):
            found.append(f"≥ {item.ge}")
        elif isinstance(item, annotated_types.Lt):
            found.append(f"< {item.lt}")
        elif isinstance(item, annotated_types.Le):
            found.append(f"≤ {item.le}")
        elif isinstance(item, annotated_types.MinLen):
            found.append("non-empty" if item.min_length == 1 else f"length ≥ {item.min_length}")
        elif isinstance(item, annotated_types.MaxLen):
            found.append(f"length ≤ {item.max_length}")
        else:
            pattern = getattr(item, "pattern", None)
            if pattern is not None and pattern != ID_PATTERN:
                found.append(f"matching `{pattern}`")
    return found


def _default_text(model: type[BaseModel], info: FieldInfo, metadata: Sequence[Any]) -> str:
    if info.is_required():
        return ""
    value = info.get_default(call_default_factory=True)
    if value is None:
        for owner in _lineage(model):
            if owner in UNSET_MEANS:
                return UNSET_MEANS[owner]
        return "`null`"
    if isinstance(value, BaseModel):
        return "its defaults"
    _annotation, metadata = _unwrap(info.annotation, metadata)
    if _is_duration(metadata) and isinstance(value, int):
        return f"`{format_duration(value)}`"
    return f"`{_scalar(value)}`"


def _scalar(value: object) -> str:
    """A value as YAML would be written, e.g. `true`, `every_pane`, `{}`."""
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, PurePath):
        value = str(value)
    if isinstance(value, str):
        return value
    return str(yaml.safe_dump(value, default_flow_style=True)).removesuffix("\n...\n").strip()


def _unwrap(annotation: Any, metadata: Sequence[Any]) -> tuple[Any, list[Any]]:
    """Strip `Annotated` layers, collecting their constraints (nested `Field`s flattened)."""
    collected = list(metadata)
    while get_origin(annotation) is Annotated:
        annotation, *extra = get_args(annotation)
        collected.extend(extra)
    flat: list[Any] = []
    for item in collected:
        if isinstance(item, FieldInfo):
            flat.extend(item.metadata)
            if isinstance(item.discriminator, str):
                flat.append(_Discriminator(item.discriminator))
        else:
            flat.append(item)
    return annotation, flat


@dataclass(frozen=True)
class _Discriminator:
    key: str


def _field_metadata(info: FieldInfo) -> list[Any]:
    # A top-level `Field(discriminator=...)` is kept on the FieldInfo, not in its metadata.
    extra = [_Discriminator(info.discriminator)] if isinstance(info.discriminator, str) else []
    return [*info.metadata, *extra]


def _discriminator(metadata: Sequence[Any]) -> str | None:
    return next((item.key for item in metadata if isinstance(item, _Discriminator)), None)


def _is_duration(metadata: Sequence[Any]) -> bool:
    return any(
        isinstance(item, BeforeValidator) and item.func is parse_duration_ms for item in metadata
    )


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _model_types(annotation: Any) -> list[type[BaseModel]]:
    return [model for model, _path, _disc, _kind in _models_in(annotation, (), "")]


def _lineage(model: type[BaseModel]) -> list[type[BaseModel]]:
    # SourceConfig inherits WindowRules' fields, and with them their supplements.
    return [owner for owner in model.__mro__ if _is_model(owner)]


def _kind_of(model: type[BaseModel], discriminator: str) -> str:
    tag, _metadata = _unwrap(model.model_fields[discriminator].annotation, ())
    return _scalar(get_args(tag)[0])


def _placeholder(key: str) -> str:
    # `sources.<source>` reads better than `sources.<key>`; the keys are plural nouns.
    return f"<{key.removesuffix('s')}>" if key.endswith("s") and len(key) > 1 else "<key>"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _docstring(model: type[BaseModel]) -> str:
    # Only the class's own docstring: pydantic's BaseModel docstring is not about this config.
    doc = model.__dict__.get("__doc__")
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or " "


# --- rendering -------------------------------------------------------------------------------


def render_reference() -> str:
    """The whole Markdown reference, from the models and the example files as they are now."""
    sections = collect_sections()
    out: list[str] = []
    out += _render_header()
    out += _render_conventions(sections)
    intros: dict[str, Callable[[dict[type[BaseModel], Section]], list[str]]] = {
        APP_FILE.path: _app_intro,
        SOURCES.path: _sources_intro,
        TENANTS.path: _tenants_intro,
    }
    for config_file in CONFIG_FILES:
        out += [f'<a id="{config_file.anchor}"></a>', "", f"## `{config_file.path}`", ""]
        out += intros[config_file.path](sections)
        for section in sections.values():
            if section.file is config_file:
                out += _render_section(section)
    out += _render_examples()
    return "\n".join(out).rstrip("\n") + "\n"


def _render_header() -> list[str]:
    return [
        "# Configuration reference",
        "",
        "Generated from the config models in `tenants/models.py` and `tenants/settings.py` by "
        f"`{REGENERATE_COMMAND}`: edit a model's `description=` (or the prose in "
        "`infra/config_reference.py`) and regenerate. "
        "`tests/unit/infra/test_config_reference.py` fails when this file is stale.",
        "",
        "| File | Holds | Top-level model |",
        "| --- | --- | --- |",
        f"| [`{APP_FILE.path}`](#{APP_FILE.anchor}) | settings of the stream process: Kafka, "
        f"lake, checkpoint | [AppSettings](#{anchor(AppSettings)}) |",
        f"| [`{SOURCES.path}`](#{SOURCES.anchor}) | each source's event time and default "
        f"window rules | [SourceConfig](#{anchor(SourceConfig)}) per source |",
        f"| [`{TENANTS.path}`](#{TENANTS.anchor}) | one tenant a file: its sources and rule "
        f"overrides | [TenantConfig](#{anchor(TenantConfig)}) |",
        "",
        "Check a config directory with `tenant-windows tenants validate --conf DIR`: it exits 0, "
        "or 2 and names the file, the field and the problem. [Examples](#examples) of every "
        "file are at the end.",
        "",
        "The same models give the JSON Schemas in `conf/schema/` (`tenant-windows config "
        "schema`), which editors with the YAML language server check each file against as it "
        "is typed, from the file's first line: "
        "`# yaml-language-server: $schema=../schema/tenant.schema.json` (docs/tenants.md).",
        "",
    ]


def _render_conventions(sections: dict[type[BaseModel], Section]) -> list[str]:
    out = ["## Conventions", "", '<a id="durations"></a>', "", "### Durations", ""]
    out += [
        "A duration is a whole number with one unit, `ms`, `s`, `m`, `h` or `d`, or a bare "
        "integer of milliseconds. Defaults below are shown in the largest unit that fits.",
        "",
        "| Written | Milliseconds |",
        "| --- | --- |",
    ]
    out += [f"| `{text}` | {parse_duration_ms(_as_yaml(text)):,} |" for text in DURATION_EXAMPLES]
    rejected = ", ".join(f"`{text}`" for text in DURATION_COUNTER_EXAMPLES)
    out += ["", f"Not accepted: {rejected} (write `1500ms` or `90s` instead).", ""]

    out += ['<a id="ids"></a>', "", "### Ids", ""]
    out += [
        f"Ids match `{ID_PATTERN}`: lowercase letters, digits, `_` and `-`, starting with a "
        "letter or digit, at most 63 characters. An id becomes a Delta partition value and a "
        "path component, so nothing else is accepted. Ids are:",
        "",
    ]
    out += [f"- {place}" for place in _id_places(sections)]
    out += ["", "### Unknown keys", ""]
    lenient = [model.__name__ for model in sections if model.model_config.get("extra") != "forbid"]
    if lenient:
        out.append(f"Unknown keys are rejected, except in {', '.join(lenient)}.")
    else:
        out.append(
            "Unknown keys are rejected, so a misspelt key is an error rather than a silently "
            "kept default."
        )
    return [*out, ""]


def _as_yaml(text: str) -> object:
    # The table shows what a YAML file holds: `90000` there is an int, not a string.
    loaded: object = yaml.safe_load(text)
    return loaded


def _id_places(sections: dict[type[BaseModel], Section]) -> list[str]:
    places = []
    for config_file in CONFIG_FILES:
        if config_file.mapping_key is not None:
            places.append(f"keys of `{config_file.mapping_key}` in `{config_file.path}`")
    for section in sections.values():
        file_path, model_path = section.locations[0]
        for name, info in section.model.model_fields.items():
            key_path = _join(model_path, yaml_key(name, info))
            annotation, metadata = _unwrap(info.annotation, _field_metadata(info))
            if _is_union(annotation):
                annotation = next(
                    (arg for arg in get_args(annotation) if arg is not type(None)), annotation
                )
                annotation, metadata = _unwrap(annotation, metadata)
            if any(getattr(item, "pattern", None) == ID_PATTERN for item in metadata):
                places.append(f"`{key_path}` in `{file_path}`")
            elif get_origin(annotation) is dict:
                key_type, _value_type = get_args(annotation)
                _key, key_metadata = _unwrap(key_type, ())
                if any(getattr(item, "pattern", None) == ID_PATTERN for item in key_metadata):
                    places.append(f"keys of `{key_path}` in `{file_path}`")
    return places


def _app_intro(sections: dict[type[BaseModel], Section]) -> list[str]:
    return [
        "Settings of the stream process: where records come from, where tables and the "
        "checkpoint go, and where the tenant config is (`conf_dir`). Every key is optional; "
        "without the file (`--app-config` names another) every default applies. Relative "
        "paths are relative to the working directory.",
        "",
        "Precedence, highest first:",
        "",
        "1. a command-line flag (e.g. `--topic`; see `tenant-windows run --help`),",
        f"2. an environment variable `{ENV_PREFIX}<SECTION>__<FIELD>`, e.g. "
        f"`{ENV_PREFIX}STREAM__TRIGGER_INTERVAL=10s`; a top-level key is `{ENV_PREFIX}<FIELD>`. "
        "The value is read as the YAML value would be; each key's variable is in the tables "
        "below,",
        f"3. `{APP_FILE.path}`,",
        "4. the defaults below.",
        "",
    ]


def _sources_intro(sections: dict[type[BaseModel], Section]) -> list[str]:
    return [
        f"Data sources: where each source's event time is, and the window rules of every "
        f"tenant that sends it. The file has one key, `{SOURCES.mapping_key}`: a mapping of "
        f"source [id](#ids) to [SourceConfig](#{anchor(SourceConfig)}).",
        "",
        "Precedence: a tenant's override for the source (`conf/tenants/*.yaml`) > the source's "
        "value here > the default in the table.",
        "",
        "The running stream re-reads `conf/` between micro-batches, so there is no restart: a "
        "changed rule applies to windows opened after the change. An invalid change is refused "
        "and logged, and the stream keeps its last good config; an invalid config at start "
        "stops it.",
        "",
    ]


def _tenants_intro(sections: dict[type[BaseModel], Section]) -> list[str]:
    fixed = [
        yaml_key(name, info)
        for name, info in SourceConfig.model_fields.items()
        if name not in RuleOverrides.model_fields
    ]
    fixed_text = ", ".join(f"`{key}`" for key in fixed)
    return [
        "One tenant a file (`*.yaml` or `*.yml`); the tenant's id is in the file, the file name "
        "does not matter, and two files with one id are an error. Records of a tenant or source "
        "that is not configured are quarantined (`unknown_tenant`, `unknown_source`), never "
        "dropped.",
        "",
        "`sources: [web, billing]` is shorthand for `sources: {web: {}, billing: {}}`: sources "
        "without overrides.",
        "",
        "Per source, a tenant may override the source's window rules with "
        f"[RuleOverrides](#{anchor(RuleOverrides)}). Each key that is set replaces the "
        "source's value as a whole: `window` replaces kind and sizes together, and `metrics` "
        "replaces the source's mapping (repeat a source metric to keep it). Keys left out keep "
        f"the source's value. Not overridable: {fixed_text or 'nothing'}.",
        "",
    ]


def _render_section(section: Section) -> list[str]:
    model = section.model
    title = model.__name__ + (
        f" (`{section.discriminator}: {section.kind}`)" if section.kind else ""
    )
    out = [f'<a id="{anchor(model)}"></a>', "", f"### {title}", ""]
    doc = _docstring(model)
    for paragraph in doc.split("\n\n") if doc else []:
        out += [" ".join(paragraph.split()), ""]
    where = "; ".join(
        f"`{path}` in `{file_path}`" if path else f"the top level of `{file_path}`"
        for file_path, path in section.locations
    )
    out += [f"Where: {where}.", ""]
    table_rows = rows(section)
    with_env = any(row.env for row in table_rows)
    header = ["Key", "Type", "Required", "Default", "Description"]
    if with_env:
        header.insert(4, "Environment")
    out += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in table_rows:
        cells = [
            f"`{row.key}`",
            row.type_text,
            "yes" if row.required else "no",
            row.default,
            row.description,
        ]
        if with_env:
            cells.insert(4, f"`{row.env}`" if row.env else "")
        out.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return [*out, ""]


def example_files() -> list[Path]:
    """The example config, top-level files first, so a reader meets `sources.yaml` first.

    None outside a source checkout: the wheel does not ship `docs/`.
    """
    if not EXAMPLES_DIR.is_dir():
        return []
    return sorted(
        EXAMPLES_DIR.rglob("*.yaml"),
        key=lambda path: (len(path.relative_to(EXAMPLES_DIR).parts), path.as_posix()),
    )


def _render_examples() -> list[str]:
    examples = EXAMPLES_SHOWN
    out = ['<a id="examples"></a>', "", "## Examples", ""]
    files = example_files()
    if not files:
        return [
            *out,
            f"A complete example config directory, `{examples}/`, is in the source repository "
            "of tenant-windows; this copy of the reference was rendered where it is not.",
        ]
    out += [
        f"A complete config directory, `{examples}/`; the tests load it, and every block "
        "below, as config (`tests/unit/infra/test_config_reference.py`). Validate it with "
        f"`tenant-windows tenants validate --conf {examples}`; run a stream on it with "
        f"`tenant-windows run --app-config "
        f"{examples}/app.yaml`.",
        "",
    ]
    for path in files:
        text = path.read_text(encoding="utf-8")
        shown = f"{examples}/{path.relative_to(EXAMPLES_DIR).as_posix()}"
        out += [f"### `{shown}`", "", "```yaml", text.rstrip("\n"), "```", ""]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=REGENERATE_COMMAND, description="Regenerate the configuration reference."
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the file differs; write nothing"
    )
    in_checkout = REFERENCE_PATH.parent.is_dir()
    parser.add_argument(
        "--output",
        default=str(REFERENCE_PATH) if in_checkout else STDOUT,
        help=f"file to write, or {STDOUT} to print (default: {REFERENCE_PATH.name} in a "
        "checkout's docs/, else print)",
    )
    args = parser.parse_args(argv)
    text = render_reference()
    if args.output == STDOUT:
        if args.check:
            print("--check compares with a file: give --output FILE", file=sys.stderr)
            return 2
        sys.stdout.write(text)
        return 0
    output = Path(args.output)
    if args.check:
        current = output.read_text(encoding="utf-8") if output.exists() else None
        if current != text:
            print(f"{output} is stale: run `{REGENERATE_COMMAND}`", file=sys.stderr)
            return 1
        print(f"{output} is up to date")
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8", newline="\n")
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
