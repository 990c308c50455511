"""Frozen-dataclass configuration: defaults, then a YAML file, then `--set key=value` overrides.

Every stage and model has one frozen dataclass. Nested dataclasses are addressed with dotted
keys (`model.num_layers=2`). Unknown keys are errors that name the nearest valid one and list the
others, so a typo never silently trains the wrong model. Values are parsed as YAML scalars (`3`,
`1e-3`, `true`, `[1, 2]`) and checked against the field's declared type.

A registered section (`registered_field`) is a field whose dataclass the config's other values
choose: the training config's model section is the chosen model's own settings class, a
strategy's options the chosen strategy's (common/catalog.py names them). Its keys sit under a key
of their own (the model's name) or, with no key of their own, beside the config's (`strategy.gossip`).

Nothing here imports TensorFlow or numpy: the DAG's plan checks a run's settings with it.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import types
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from common.cli import split_assignment

T = TypeVar("T")
RESOLVE = "speechflow.resolve"  # field metadata: config -> the section's dataclass (or None: no section)
KEY = "speechflow.key"  # field metadata: config -> the section's key (None: flat, beside the config's own)
# field metadata: False on a model setting that fixes no weight's shape (a resumed run may change it)
ARCHITECTURE = "speechflow.architecture"


def registered_field(resolve: Callable[[Any], type | None], key: Callable[[Any], str] | None = None) -> Any:
    """A field whose frozen dataclass `resolve(config)` picks from the config's other values; its keys
    sit under `key(config)`, or with `key` None beside the config's own keys. Its default (None) is
    the chosen class' defaults: the owning class' `__post_init__` calls `fill_registered`."""
    return dataclasses.field(default=None, metadata={RESOLVE: resolve, KEY: key})


def fill_registered(config: Any) -> None:
    """In a frozen dataclass' `__post_init__`: each unset registered section becomes the defaults of
    the class the other values choose; one of another class is a ValueError naming both."""
    for field in dataclasses.fields(config):
        if RESOLVE in field.metadata:
            cls = field.metadata[RESOLVE](config)
            value = getattr(config, field.name)
            if value is None and cls is not None:
                object.__setattr__(config, field.name, cls())
            elif value is not None and (cls is None or not isinstance(value, cls)):
                wanted = cls.__name__ if cls else "none"
                raise ValueError(
                    f"{type(config).__name__}.{field.name} is a {type(value).__name__}, but the config's "
                    f"other values choose {wanted}"
                )


def _unknown(key: str, valid: Sequence[str]) -> ValueError:
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return ValueError(f"unknown config key {key!r}{hint}; valid keys here: {', '.join(valid)}")


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


def _choices(config: T, values: Mapping[str, Any], prefix: str = "") -> T:
    """`config` with the plain values of `values` (not the dataclass sections) applied: the choices,
    such as `model` or `strategy.name`, that say which class a registered section is. A registered
    section whose class they change starts anew."""
    hints = _field_types(type(config))
    changes = {}
    for field in dataclasses.fields(config):
        if (
            RESOLVE in field.metadata
            or field.name not in values
            or dataclasses.is_dataclass(getattr(config, field.name))
        ):
            continue
        changes[field.name] = _coerce(values[field.name], hints[field.name], prefix + field.name)
    if not changes:
        return config
    chosen = copy.copy(config)  # a private copy, never validated: only to ask the sections' classes
    for name, value in changes.items():
        object.__setattr__(chosen, name, value)
    for field in dataclasses.fields(config):
        current = getattr(config, field.name)
        if RESOLVE in field.metadata and current is not None:
            cls = field.metadata[RESOLVE](chosen)
            if cls is None or not isinstance(current, cls):
                changes[field.name] = None
    return dataclasses.replace(config, **changes)


def apply_overrides(config: T, values: Mapping[str, Any], prefix: str = "") -> T:
    """Returns a copy of `config` with `values` (nested mapping) applied; unknown keys raise,
    naming the nearest valid key."""
    config = _choices(config, values, prefix)
    cls = type(config)
    pending = dict(values)
    hints = _field_types(cls)
    fields = dataclasses.fields(config)
    changes: dict[str, Any] = {}
    for field in fields:
        if RESOLVE in field.metadata or field.name not in pending:
            continue
        value, current = pending.pop(field.name), getattr(config, field.name)
        if dataclasses.is_dataclass(current) and isinstance(value, Mapping):
            changes[field.name] = apply_overrides(current, value, prefix=f"{prefix}{field.name}.")
        else:
            changes[field.name] = _coerce(value, hints[field.name], prefix + field.name)
    config = dataclasses.replace(config, **changes) if changes else config
    valid = [prefix + f.name for f in fields if RESOLVE not in f.metadata]
    for field in fields:
        if RESOLVE not in field.metadata:
            continue
        current = getattr(config, field.name)  # of the class the values above chose (fill_registered)
        key = field.metadata[KEY](config) if field.metadata[KEY] else None
        if current is None:
            section = pending.pop(key, {}) if key else {}
        elif key:
            valid.append(prefix + key)
            section = pending.pop(key, {})
            if not isinstance(section, Mapping):
                raise ValueError(f"config key {prefix}{key!r}: expected a mapping of its settings, got {section!r}")
        else:
            names = [f.name for f in dataclasses.fields(current)]
            valid += [prefix + n for n in names]
            section = {k: pending.pop(k) for k in names if k in pending}
        if section:
            if current is None:
                raise ValueError(f"config keys under {prefix}{key}: this config has no such section")
            inner = f"{prefix}{key}." if key else prefix
            config = dataclasses.replace(config, **{field.name: apply_overrides(current, section, prefix=inner)})
    # A class may name the keys it ignores, each with the reason it warns with ("": silently).
    ignored = cls.ignored_keys(config) if hasattr(cls, "ignored_keys") else {}
    for key in pending:
        if key not in ignored:
            raise _unknown(prefix + key, valid)
        if ignored[key]:
            warnings.warn(f"config key '{prefix}{key}' {ignored[key]}: ignored", UserWarning, 2)
    return config


def _merged(base: dict[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `more` laid over it, nested mappings merged key by key."""
    out = dict(base)
    for key, value in more.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


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
    layers: list[Mapping[str, Any]] = []
    if yaml_path:
        path = Path(yaml_path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, Mapping):
            raise ValueError(f"config file {path} must hold a mapping at its top level")
        layers.append(loaded)
    if assignments:
        layers.append(parse_set(assignments))
    if flags:
        layers.append(_given(flags))
    # One pass over the layers merged: a section's keys are read once the model (or strategy) that
    # owns them is known, wherever in the layers it was chosen.
    return apply_overrides(config, functools.reduce(_merged, layers, {}))


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-friendly nested dict (tuples become lists), registered sections under their keys."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            value = to_dict(value)
        else:
            value = json.loads(json.dumps(value))
        if RESOLVE not in field.metadata:
            out[field.name] = value
        elif value is not None and field.metadata[KEY]:
            out[field.metadata[KEY](config)] = value
        elif value is not None:
            out.update(value)
    return out


def architecture_dict(settings: Any) -> dict[str, Any]:
    """`to_dict(settings)` without the fields marked `ARCHITECTURE: False`, at any depth."""
    out = {}
    for field in dataclasses.fields(settings):
        if field.metadata.get(ARCHITECTURE, True):
            value = getattr(settings, field.name)
            out[field.name] = architecture_dict(value) if dataclasses.is_dataclass(value) else value
    return json.loads(json.dumps(out))


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
