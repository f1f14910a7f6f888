"""Options: fields of the frozen config dataclasses, and what is built from their declarations.

A config class declares each option once, with ``option(default, help, choices=...)``. From
those declarations come:

* flat keyword options (``LLM(model, kv_offload="flash", flash_path=...)``, vLLM style): a
  config may hold other option dataclasses as fields (a nested concern, e.g. the swap tier); their
  fields are addressed by their own names, which are unique across the whole tree;
* the command-line flags (``--flash-path``), with type, choices, help text and default.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import typing
from typing import Any, Iterator

def option(default: Any, help: str, *, choices: tuple | None = None, cli: bool = True,
           short: str | None = None):
    """A config field with its help text and, where the values are a fixed set, its choices.
    ``cli=False`` keeps an option (tests, experts) off the command line; ``short`` is a second
    flag for it (vLLM's ``-tp``)."""
    metadata = {"help": help, "choices": choices, "cli": cli, "short": short}
    if isinstance(default, (list, dict, set)):
        raise TypeError("option defaults must be immutable")
    return dataclasses.field(default=default, metadata=metadata)


MAX_GIB = 1 << 20  # sizes in GiB above 1 PiB are typos, and past float range is inf


def check_size_gib(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value <= MAX_GIB:  # also false for nan
        raise ValueError(f"{name} must be a number of GiB in (0, {MAX_GIB}], got {value!r}")


def canonical_json_object(name: str, value: Any) -> str | None:
    """``value`` (a dict, or a JSON object's text) as sorted JSON text; None for None or an
    empty object. ValueError for anything else."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object (a dict), got {type(value).__name__}")
    try:
        return json.dumps(value, sort_keys=True) if value else None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: {exc}") from None


def check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_config(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def nested_configs(cls) -> Iterator[tuple[str, type]]:
    """(field name, config class) of each nested option dataclass of ``cls``."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if _is_config(hints[f.name]):
            yield f.name, hints[f.name]


def option_fields(cls) -> Iterator[tuple[dataclasses.Field, Any]]:
    """(field, resolved type) of every plain option of ``cls`` and of its nested configs."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if _is_config(hints[f.name]):
            yield from option_fields(hints[f.name])
        elif f.init:
            yield f, hints[f.name]


def option_names(cls) -> set[str]:
    return {f.name for f, _ in option_fields(cls)}


def build(cls, options: dict[str, Any]):
    """``cls`` from flat options (nested configs built from the names they own). Unknown names
    raise TypeError listing the valid ones; values are validated by the classes themselves."""
    unknown = sorted(set(options) - option_names(cls))
    if unknown:
        raise TypeError(f"unknown engine option(s) {', '.join(unknown)}; valid options: "
                        f"{', '.join(sorted(option_names(cls)))}")
    return _build(cls, options)


def _build(cls, options: dict[str, Any]):
    nested = dict(nested_configs(cls))
    kwargs = {name: _build(sub, options) for name, sub in nested.items()}
    own = {f.name for f in dataclasses.fields(cls)} - set(nested)
    kwargs.update({k: v for k, v in options.items() if k in own})
    return cls(**kwargs)


def flatten(config) -> dict[str, Any]:
    """The flat options that ``build(type(config), ...)`` turns back into ``config``."""
    out: dict[str, Any] = {}
    nested = dict(nested_configs(type(config)))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in nested:
            out.update(flatten(value))
        elif f.init:
            out[f.name] = value
    return out


# ---- command line ------------------------------------------------------------------------------
def finite_float(text: str) -> float:
    """argparse type: a finite float (``inf`` and ``nan`` are not sizes or rates)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _scalar_type(tp: Any) -> type:
    """int / float / str / bool of an annotation like ``int | None``."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    base = args[0]
    if base not in (int, float, str, bool):
        raise TypeError(f"no command-line type for {tp!r}")
    return base


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_config_args(parser: argparse.ArgumentParser, cls, *, title: str,
                    defaults: dict[str, Any] | None = None,
                    skip: tuple[str, ...] = ()) -> None:
    """One flag per option of ``cls`` (a group per nested config). Flags left out on the command
    line stay None, so the config's own default applies; ``defaults`` overrides some of those
    (a benchmark's model, say)."""
    defaults = defaults or {}
    _add_group(parser, cls, title, defaults, skip)


def _add_group(parser, cls, title: str, defaults: dict[str, Any], skip) -> None:
    group = parser.add_argument_group(title)
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if _is_config(tp):
            _add_group(parser, tp, (tp.__doc__ or f.name).strip().splitlines()[0].rstrip("."),
                       defaults, skip)
            continue
        if not f.init or not f.metadata.get("cli", True) or f.name in skip:
            continue
        default = defaults.get(f.name, f.default)
        help_text = f.metadata.get("help", "")
        if default is not None and default is not dataclasses.MISSING:
            help_text += f" (default: {default})"
        kind = _scalar_type(tp)
        kwargs: dict[str, Any] = {"dest": f.name, "default": defaults.get(f.name),
                                  "help": help_text}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = finite_float if kind is float else kind
            if f.metadata.get("choices"):
                kwargs["choices"] = f.metadata["choices"]
        flags = [flag_of(f.name)] + ([f.metadata["short"]] if f.metadata.get("short") else [])
        group.add_argument(*flags, **kwargs)


def options_from_args(args: argparse.Namespace, cls) -> dict[str, Any]:
    """The options given on the command line (flags left out are not included)."""
    return {name: getattr(args, name) for name in option_names(cls)
            if getattr(args, name, None) is not None}
