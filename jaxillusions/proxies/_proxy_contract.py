"""The proxy contract (re-exported by jaxillusions/proxies/__init__.py, whose docstring says what
each member means): `Proxy`, what every proxy module defines, `SiteProxy` or `ModelProxy` by its
SITE, and `Hooks`, its optional hooks, with their DEFAULTS (proxies.hook resolves them)."""

from __future__ import annotations

from typing import Any, Protocol


class Proxy(Protocol):
    """What every proxy module defines (a module satisfies a Protocol as an instance would;
    see the module docstring for what each member means)."""

    STATISTIC: str | None  # "moments" | "samples" | "pairs" | "labelled" | "model" | None
    SITE: str  # "vector" | "pattern" | "model"

    def fit(self, stats, sizes: tuple[int, ...], *, key=None, **options) -> Any:
        """-> pytree, every leaf with leading axis len(sizes)."""


class SiteProxy(Proxy, Protocol):
    """A proxy of one site (SITE "vector" or "pattern")."""

    def apply(self, params, x):
        """One size's params (leading axis removed) -> x's shape and dtype."""


class ModelProxy(Proxy, Protocol):
    """A whole-model proxy (SITE "model", STATISTIC "model": the circuit)."""

    PASSES: int

    def families(self, proxy_cfg, model_cfg) -> list[tuple[str, tuple[int, ...], tuple]]:
        """[(target, sizes, options)]: its families."""

    def statistic(self, pass_index, model_params, tokens, valid, model_cfg, previous,
                  **options) -> dict:
        """One batch's sums of one pass."""

    def logits(self, params, model_params, tokens, model_cfg, **options):
        """One size's proxy model in place of model.forward: [batch, pos, vocab]."""


class Hooks(Protocol):
    """The optional hooks of a proxy module (`hook`; defaults in DEFAULTS)."""

    SIZES_KEY: str  # default "<name>_sizes" (`sizes_key`)
    SIZE_LABEL: str  # default "size"

    def input_site(self, site: str, model_cfg) -> str:
        """The site whose value apply() reads instead of the site's own, in the model
        `model_cfg`, visited earlier by forward (the transcoder's MLP input; uniform
        attention's scores)."""

    def input_of(self, model_params, model_cfg, site: str, value):
        """That input site's value -> apply()'s input (in the model `model_cfg`)."""

    def output_site(self, site: str, n_layers: int) -> str:
        """A lens's output site (the final residual stream), which it replaces."""

    def latents(self, params, x) -> tuple[Any, Any]:
        """(indices [..., K] int, active [..., K] bool): its sparse code (dictionary metrics)."""

    def settings(self, proxy_cfg, dim: int) -> tuple[tuple[int, ...], tuple]:
        """(sizes, fit() options) for a site of `dim` features (default: proxy_cfg[SIZES_KEY],
        no options: `settings_of`)."""

    def check(self, sizes, proxy_cfg, dim: int, target: str) -> None:
        """A one-line ValueError for sizes that cannot be fitted on `target` (validate)."""

    # Its own config keys: {key: config.fields.setting(...)}, fields of config.proxies (the
    # Proxies section gains them), e.g. sae's sae_k, sae_steps. Default: none.
    OPTIONS: dict[str, Any]


# The default of each optional hook (every name of `Hooks`); None: a proxy without the hook has
# none (`hook` gives None) or its default depends on the proxy (SIZES_KEY: `sizes_key`;
# settings: `settings_of`).
DEFAULTS: dict[str, Any] = {"SIZES_KEY": None, "SIZE_LABEL": "size", "input_site": None,
                            "input_of": None, "output_site": None,
                            "latents": None,
                            "settings": None, "check": None, "OPTIONS": {}}
