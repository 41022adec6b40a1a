"""Simplified proxies for activations, one module per proxy (adding one = adding one file).

Each proxy module defines:
  STATISTIC: "moments" | "samples" | None  what fit() consumes (svd.moments sums, a
             {"x": [N, F], "valid": bool [N]} sample, or nothing).
  SITE: "vector" | "pattern"               [..., F] activations or [..., T, T] attention.
  fit(stats, sizes, *, key, **options)     -> pytree, every leaf with leading axis len(sizes).
  apply(params, x)                         one size's params (leading axis removed) -> x's
                                           shape and dtype.
Sizes are python ints (static); fit/apply are pure and work under jax.vmap / jax.jit.
"""

import importlib
import pkgutil
import types


def available() -> tuple[str, ...]:
    """Names of the proxy modules in this package, sorted."""
    names = (m.name for m in pkgutil.iter_modules(__path__))
    return tuple(sorted(n for n in names if not n.startswith("_")))


def get(name: str) -> types.ModuleType:
    """The proxy module called `name`; ValueError listing the available ones if unknown."""
    names = available()
    if name not in names:
        raise ValueError(f"unknown proxy {name!r}; available proxies: {', '.join(names)}")
    return importlib.import_module(f"{__name__}.{name}")


def fit_without_data(stats: None, sizes: tuple[int, ...], *, key=None) -> dict:
    """fit() of a data-independent proxy (STATISTIC None): it has no parameters."""
    del stats, sizes, key
    return {}
