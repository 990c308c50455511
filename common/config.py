"""Frozen-dataclass configuration: defaults, then a YAML file, then `--set key=value` overrides.

Every stage and model has one frozen dataclass. Nested dataclasses are addressed with dotted
keys (`model.num_layers=2`). Unknown keys are errors that list the valid ones, so a typo never
silently trains the wrong model. Values are parsed as YAML scalars (`3`, `1e-3`, `true`,
`[1, 2]`) and checked against the field's declared type.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from common.cli import split_assignment

T = TypeVar("T")


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Checks `value` against `annotation`, converting where it is lossless (int -> float, list -> tuple)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(f"config key {key!r}: {value!r} matches none of {annotation}")
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"config key {key!r}: {value!r} is not one of {list(args)}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"config key {key!r}: expected a list, got {value!r}")
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], key) for v in value)
        if origin is tuple and args:
            if len(args) != len(value):
                raise ValueError(f"config key {key!r}: expected {len(args)} items, got {value!r}")
            return tuple(_coerce(v, a, key) for v, a in zip(value, args))
        inner = args[0] if args else Any
        return origin(_coerce(v, inner, key) for v in value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"config key {key!r}: expected true or false, got {value!r}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ValueError(f"config key {key!r}: expected a number, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"config key {key!r}: expected an integer, got {value!r}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"config key {key!r}: expected a string, got {value!r}")
    if dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"config key {key!r}: expected a mapping, got {value!r}")
        return from_dict(annotation, value, prefix=f"{key}.")
    return value


def from_dict(cls: type[T], values: Mapping[str, Any], prefix: str = "") -> T:
    """Builds `cls` from a (possibly nested) mapping; unknown keys raise ValueError."""
    return apply_overrides(cls(), values, prefix)


def apply_overrides(config: T, values: Mapping[str, Any], prefix: str = "") -> T:
    """Returns a copy of `config` with `values` (nested mapping) applied; unknown keys raise."""
    hints = _field_types(type(config))
    names = [f.name for f in dataclasses.fields(config)]
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in names:
            raise ValueError(
                f"unknown config key '{prefix}{key}'; valid keys here: {', '.join(prefix + n for n in names)}"
            )
        annotation = hints[key]
        current = getattr(config, key)
        if dataclasses.is_dataclass(current) and isinstance(value, Mapping):
            changes[key] = apply_overrides(current, value, prefix=f"{prefix}{key}.")
        else:
            changes[key] = _coerce(value, annotation, prefix + key)
    return dataclasses.replace(config, **changes)


def parse_set(assignments: Sequence[str]) -> dict[str, Any]:
    """Turns `["model.num_layers=2", "lr=1e-3"]` into a nested mapping of YAML-parsed values."""
    nested: dict[str, Any] = {}
    for item in assignments:
        key, raw = split_assignment(item, "--set")
        value = yaml.safe_load(raw) if raw.strip() else ""
        node = nested
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {item!r}: {part!r} is a value, not a section")
        node[parts[-1]] = value
    return nested


def _given(flags: Mapping[str, Any]) -> dict[str, Any]:
    """`flags` without the ones left out (None), nested mappings included."""
    out = {}
    for key, value in flags.items():
        if isinstance(value, Mapping):
            value = _given(value)
            if not value:
                continue
        if value is not None:
            out[key] = value
    return out


def load(
    cls: type[T],
    yaml_path: str | Path | None = None,
    assignments: Sequence[str] = (),
    base: T | None = None,
    flags: Mapping[str, Any] | None = None,
) -> T:
    """Resolves a config: `base` (or the dataclass defaults), then the YAML file, then `--set` items,
    then a stage's own flags (`flags`, nested like the config; None means the flag was not given)."""
    config = base if base is not None else cls()
    if yaml_path:
        path = Path(yaml_path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, Mapping):
            raise ValueError(f"config file {path} must hold a mapping at its top level")
        config = apply_overrides(config, loaded)
    if assignments:
        config = apply_overrides(config, parse_set(assignments))
    if flags:
        config = apply_overrides(config, _given(flags))
    return config


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-friendly nested dict (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"model": {"layers": 3}}` -> `{"model.layers": 3}` (for MLflow params)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def save(config: Any, path: str | Path) -> None:
    """Writes the resolved config as YAML (atomically), next to the outputs it produced."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    tmp.replace(path)
