"""A grid of settings that change the programs' shapes (the `grid` key): one run per point.

Members of one run share every shape: the per-member scalars (train.learning_rates,
train.weight_decays, train.init_scales, ...) vary inside its member axis. A setting that
changes shapes (model.n_layers, model.d_model, model.n_heads, ...) needs a program of its
own: `grid` names such keys with their values, e.g.

    config.grid = ("model.n_layers=1,2,3",)           # three runs
    config.grid = ("model.n_layers=1,2", "model.d_model=32,64")   # four runs (the product)

Each point is the config with those keys set (and `grid` empty), checked at the door like any
run, and run in its own directory, `<workdir>/<point name>` (e.g. `model.n_layers=2`): it is
the run the same config with those keys would be on its own, bit for bit. pipeline/grid.py
runs them in order and joins their results into one population table with a column per grid
key.
"""

from __future__ import annotations

import ast
import itertools
from typing import Any

# Keys no grid may set: the grid itself, and the CPU's split (fixed once JAX starts).
FORBIDDEN = ("grid", "cpu_devices")


def entry_ok(entry: str) -> bool:
    """An entry looks like key=v1,v2 (the rule of the `grid` key; axes() says what is wrong)."""
    key, sep, values = entry.partition("=")
    return bool(sep and key.strip() and values.strip())


def _value(text: str) -> Any:
    """A value as Python reads it (1, 0.5, True, 'rotary'), else the text itself."""
    text = text.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def axes(entries: tuple[str, ...]) -> list[tuple[str, tuple]]:
    """[(key, values)] of the `grid` entries; a one-line ValueError naming the entry for a
    malformed one, a repeated key or value, a forbidden key, or a grid of fewer than 2
    points."""
    out: list[tuple[str, tuple]] = []
    for entry in entries:
        key, sep, text = entry.partition("=")
        key = key.strip()
        if not (sep and key and text.strip()):
            raise ValueError(f"grid entry {entry!r}: must be key=value1,value2,... "
                             "(e.g. 'model.n_layers=1,2,3')")
        if key in FORBIDDEN:
            raise ValueError(f"grid entry {entry!r}: {key} cannot vary over a grid")
        if key in dict(out):
            raise ValueError(f"grid entry {entry!r}: {key} is already in the grid")
        values = tuple(_value(v) for v in text.split(","))
        if len(set(map(repr, values))) < len(values):
            raise ValueError(f"grid entry {entry!r}: a value is repeated")
        out.append((key, values))
    count = 1
    for _, values in out:
        count *= len(values)
    if entries and count < 2:
        raise ValueError(f"grid={tuple(entries)!r}: a grid needs at least 2 points (settings "
                         f"of its keys); it has {count}")
    return out


def name(point: dict[str, Any]) -> str:
    """The point's directory name: key=value pairs joined by commas."""
    return ",".join(f"{k}={v}" for k, v in point.items())


def points(entries: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every point of the grid ({key: value}), in the order of the product of its axes."""
    found = axes(entries)
    return [dict(zip([k for k, _ in found], combo, strict=True))
            for combo in itertools.product(*[values for _, values in found])]


def apply(raw: dict, point: dict[str, Any]) -> dict:
    """A nested config dict (Settings.to_dict()) with the point's keys set and `grid` empty."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    out["grid"] = ()
    for key, value in point.items():
        section, _, leaf = key.rpartition(".")
        (out.setdefault(section, {}) if section else out)[leaf] = value
    return out
