"""YAML into nested dataclasses, with errors that name the file and the dotted key. Generic:
wim's sections are declared beside it; a `Literal[...]` field accepts only those values.
"""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from wim.errors import ConfigError


def build_dataclass(cls: type, data: Any, path: str, source: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{path or 'top level'}' must be a mapping, got {data!r}.")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in names:
            raise ConfigError(f"{source}: unknown key '{dotted}'. Known keys here: "
                              f"{', '.join(sorted(names))}. Check the spelling against "
                              "configs/quickstart.yaml.")
        kwargs[key] = _coerce(hints[key], value, dotted, source)
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, key: str, source: str):
    if dataclasses.is_dataclass(hint):
        return build_dataclass(hint, value or {}, key, source)
    union = get_origin(hint) in (Union, types.UnionType)
    if value is None:
        if union and type(None) in get_args(hint):
            return None
        raise ConfigError(f"{source}: '{key}' may not be null.")
    members = [a for a in get_args(hint) if a is not type(None)] if union else [hint]
    if len(members) > 1:  # e.g. int | Literal["auto"]: the first member that takes the value
        for member in members:
            try:
                return _coerce(member, value, key, source)
            except ConfigError:
                pass
        allowed = " or ".join(_describe(m) for m in members)
        raise ConfigError(f"{source}: '{key}' must be {allowed}, got {value!r}.")
    base = members[0]
    if dataclasses.is_dataclass(base):  # an optional section, e.g. `http.price`
        return build_dataclass(base, value, key, source)
    if get_origin(base) is Literal:
        if value not in get_args(base):
            allowed = ", ".join(map(str, get_args(base)))
            raise ConfigError(f"{source}: '{key}' must be one of {allowed}, got {value!r}.")
        return value
    origin = get_origin(base) or base
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {bool: isinstance(value, bool), int: number and isinstance(value, int), float: number,
          str: isinstance(value, str), list: isinstance(value, list),
          dict: isinstance(value, dict)}.get(origin, True)
    if origin is float and isinstance(value, str):
        # YAML 1.1 reads 1e-5 (no dot) as a string; accept it as the number it means.
        try:
            return float(value)
        except ValueError:
            pass
    if not ok:
        raise ConfigError(f"{source}: '{key}' must be of type {origin.__name__}, got {value!r}.")
    if origin is list and get_args(base):
        return [_coerce(get_args(base)[0], item, f"{key}[{i}]", source)
                for i, item in enumerate(value)]
    return float(value) if origin is float else value


def _describe(hint: Any) -> str:
    if get_origin(hint) is Literal:
        return " or ".join(map(repr, get_args(hint)))
    return f"of type {getattr(get_origin(hint) or hint, '__name__', hint)}"


def apply_overrides(data: dict[str, Any], overrides: list[str], source: str = "--set") -> dict:
    """Apply `section.key=value` strings (values parsed as YAML) to a raw config dict."""
    data = json.loads(json.dumps(data))  # deep copy
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{source}: '{item}' must look like section.key=value.")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{source}: '{key}' does not name a config field.")
        node[parts[-1]] = value
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist. Try configs/quickstart.yaml.")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err}).") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections.")
    return data or {}
