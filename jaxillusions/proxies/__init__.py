"""Simplified proxies for activations, one module per proxy (adding one = adding one file).

The contract is typed in _proxy_contract.py: `Proxy` (every proxy), `SiteProxy` or `ModelProxy`
(by SITE), and the optional `Hooks`, which the shared code resolves in one place,
`hook(module, name)` (the proxy's own, else its default). `available()` finds the modules.

Each proxy module defines:
  STATISTIC: "moments" | "samples" | "pairs" | "labelled" | "model" | None
                                           what fit() consumes (svd.moments sums, a
             {"x": [N, F], "valid": bool [N]} sample, a sample of (input, site value) pairs
             {"x", "y", "valid"} at the same positions, the sample with the task's concept
             classes at its positions {"x", "valid", "z": int [N, C]} (C = len(proxies.concepts),
             < 0 where a concept is undefined; tasks.concept_labels), or nothing).
  SITE: "vector" | "pattern" | "model"     [..., F] activations, [..., T, T] attention, or
                                           the whole forward pass (below).
  fit(stats, sizes, *, key, **options)     -> pytree, every leaf with leading axis len(sizes).
  apply(params, x)                         one size's params (leading axis removed) -> x's
                                           shape and dtype.
Sizes are python ints (static); fit/apply are pure and work under jax.vmap / jax.jit.

A proxy may replace a site by a function of another site's value (the transcoder, a "pairs"
proxy: of the MLP's input; uniform attention: of its layer's scores):
  input_site(site, model_cfg) -> str       the site it reads in that model (visited earlier by
                                           forward; it may depend on the architecture).
  input_of(model_params, model_cfg, site, value)
                                           that site's value -> apply()'s input.
A lens (logit_lens, tuned_lens) reads its site and writes another one, visited later:
  output_site(site, n_layers) -> str       the site it replaces (the final residual stream) by
                                           apply(params, the site's value); the site itself is
                                           left unchanged. Its "pairs" are {"x": the site's
                                           values, "y": the output site's}. Lenses get no
                                           dictionary metrics (nothing is reconstructed).
A proxy with latents (sae, transcoder, kmeans) may define, for the dictionary metrics l0, dead:
  latents(params, x) -> (indices [..., K] int, active [..., K] bool)   its sparse code.
Every vector proxy may have its own targets, config.proxies.<name>_targets.

A whole-model proxy (SITE "model", STATISTIC "model": the circuit) replaces the forward pass
rather than one site, and computes its own statistics from the model:
  families(proxy_cfg, model_cfg) -> [(target, sizes, options)]
                                           its families; the target is a label (the rows'
                                           `site`), not a model site.
  PASSES: int                              passes over the fit split.
  statistic(pass_index, model_params, tokens, valid, model_cfg, previous, **options) -> sums
                                           one batch's sums of one pass (valid: non-PAD
                                           [batch, pos]; previous: the earlier passes' sums,
                                           merged into one dict, which fit() gets as stats).
  logits(params, model_params, tokens, model_cfg, **options) -> [batch, pos, vocab]
                                           one size's proxy model in place of model.forward.
  An option `sentences` > 0 caps the fit split's sentences its statistics read (the first).
faithfulness collects, fits and evaluates it like any proxy (its stats and params carry one
group); it has no intervention (FittedProxy.intervention does not apply).

A proxy with sizes (STATISTIC not None) may also define, to own its config settings:
  SIZES_KEY: str                           the config.proxies key listing its sizes
                                           (default "<name>_sizes").
  SIZE_LABEL: str                          what a size is called in figures (default "size").
  settings(proxy_cfg, dim) -> (sizes, options)
                                           its sizes and fit() options for a site of `dim`
                                           features (default: proxy_cfg[SIZES_KEY], no options).
  check(sizes, proxy_cfg, dim, target)     raises a one-line ValueError for sizes that cannot
                                           be fitted on `target` (run by validate).
  OPTIONS: {key: config.fields.setting(...)}
                                           its own keys of config.proxies (e.g. sae_k): the
                                           Proxies section gains them (config/settings.py).
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
import types
from typing import Any

from jaxillusions.proxies._proxy_contract import DEFAULTS as DEFAULTS
from jaxillusions.proxies._proxy_contract import Hooks as Hooks
from jaxillusions.proxies._proxy_contract import ModelProxy as ModelProxy
from jaxillusions.proxies._proxy_contract import Proxy as Proxy
from jaxillusions.proxies._proxy_contract import SiteProxy as SiteProxy


def hook(module: types.ModuleType, name: str) -> Any:
    """The optional hook `name` of a proxy module (a name of `Hooks`): its own, else the
    default (DEFAULTS). KeyError for a name that is no hook."""
    if name not in DEFAULTS:
        raise KeyError(f"{name!r} is not an optional proxy hook (proxies.Hooks): "
                       f"{', '.join(DEFAULTS)}")
    return getattr(module, name, DEFAULTS[name])


def available() -> tuple[str, ...]:
    """Names of the proxy modules in this package, sorted. The listing is read again when a
    folder of the package changes (a module dropped in), not at every call: a config's check
    asks for it dozens of times."""
    return _listing(tuple((d, os.stat(d).st_mtime_ns) for d in __path__))


@functools.lru_cache(maxsize=4)
def _listing(folders: tuple[tuple[str, int], ...]) -> tuple[str, ...]:
    names = (m.name for m in pkgutil.iter_modules([d for d, _ in folders]))
    return tuple(sorted(n for n in names if not n.startswith("_")))


def get(name: str) -> types.ModuleType:
    """The proxy module called `name`; ValueError listing the available ones if unknown."""
    names = available()
    if name not in names:
        raise ValueError(f"unknown proxy {name!r}; available proxies: {', '.join(names)}")
    return importlib.import_module(f"{__name__}.{name}")


def sizes_key(module: types.ModuleType) -> str:
    """The config.proxies key that lists the sizes of a proxy module."""
    return hook(module, "SIZES_KEY") or f"{module.__name__.rsplit('.', 1)[-1]}_sizes"


def size_label(name: str) -> str:
    """What a size of proxy `name` is called in figures ("rank", "clusters k", ...)."""
    return hook(get(name), "SIZE_LABEL")


def settings_of(module: types.ModuleType, proxy_cfg, dim: int) -> tuple[tuple[int, ...], tuple]:
    """(sizes, fit() options) of a proxy with sizes for a site of `dim` features: its hook
    `settings`, by default config.proxies[sizes_key(module)] (none: ()) and no options."""
    own = hook(module, "settings")
    if own is not None:
        return own(proxy_cfg, dim)
    return tuple(getattr(proxy_cfg, sizes_key(module), ())), ()


def fit_without_data(stats: None, sizes: tuple[int, ...], *, key=None) -> dict:
    """fit() of a data-independent proxy (STATISTIC None): it has no parameters."""
    del stats, sizes, key
    return {}
