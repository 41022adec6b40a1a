"""What the proxy stage fits: a `ProxySpec` names a proxy module (jaxillusions/proxies/NAME.py),
the sites it replaces (several sites are simplified together, each with its own proxy) and the
sizes (ranks, cluster counts) that are fitted and evaluated together in one batched call; the
specs a config asks for (`specs_from_config`), the sites they name (`resolve_site`,
`site_dim`), a spec checked against a model (`resolve_spec`) and the concept labels a labelled
statistic needs (`labels_for`).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Sequence

import numpy as np

from jaxillusions import model as model_lib
from jaxillusions import proxies, tasks
from jaxillusions.config import fields


@dataclasses.dataclass(frozen=True)
class ProxySpec:
    method: str  # a module of jaxillusions.proxies
    sites: tuple[str, ...]  # replaced together, each with its own fitted proxy
    sizes: tuple[int, ...] = (0,)  # ranks / cluster counts; (0,) for data-independent proxies
    options: tuple[tuple[str, object], ...] = ()  # keyword options of the proxy's fit()

    @property
    def target(self) -> str:
        return "+".join(self.sites)

    @property
    def module(self):
        return proxies.get(self.method)


def resolve_site(site: str, cfg: model_lib.ModelConfig) -> str:
    """'blocks.-1.attn.k' -> 'blocks.{n_layers-1}.attn.k'; checks that the site exists."""
    parts = site.split(".")
    if len(parts) > 1 and parts[0] == "blocks" and parts[1].lstrip("-").isdigit():
        layer = int(parts[1])
        parts[1] = str(layer + cfg.n_layers if layer < 0 else layer)
    return model_lib.check_site(cfg, ".".join(parts))


def resolve_spec(spec: ProxySpec, cfg: model_lib.ModelConfig) -> ProxySpec:
    """`spec` with its sites resolved (`resolve_site`) in the model `cfg`, as the library calls
    take it (collect, evaluate); a one-line ValueError where the configs' door would refuse it:
    a site of another kind than its proxy's (a vector proxy on an attention pattern or scores, a
    pattern proxy off blocks.<layer>.attn.pattern), or what its module's `check` refuses at the
    site's width (e.g. SVD ranks above it; of config.proxies that check reads the sizes alone:
    the other settings, and the config's rules of the sizes keys, are not a spec's, whose sizes
    may be coded, as the SAE's, or 0, as the geometry study's). A whole-model proxy's sites
    are labels, kept."""
    module, name = spec.module, f"ProxySpec({spec.method!r}, {spec.sites}, sizes={spec.sizes})"
    if module.SITE == "model":
        return spec
    sites = tuple(resolve_site(s, cfg) for s in spec.sites)
    for site in sites:
        if (site.endswith(".attn.pattern") if module.SITE == "pattern"
                else not site.endswith((".attn.pattern", ".attn.scores"))):
            continue
        raise ValueError(f"{name}: {site!r} is not a site of a {module.SITE} proxy ("
                         + ("blocks.<layer>.attn.pattern)" if module.SITE == "pattern" else
                            "[..., features]; attention patterns and scores are [..., T, T])"))
    key, dim = proxies.sizes_key(module), min(site_dim(cfg, s) for s in sites)
    check, read = proxies.hook(module, "check"), types.SimpleNamespace(**{key: spec.sizes})
    try:
        if check is not None:
            check(spec.sizes, read, dim, f"{'+'.join(sites)} (width {dim})")
    except AttributeError as err:  # a setting of config.proxies other than the sizes
        if err.obj is not read:
            raise
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    return dataclasses.replace(spec, sites=sites)


def site_dim(cfg: model_lib.ModelConfig, site: str) -> int:
    """Feature size of a vector site (per head for q/k/v/z and the rotated rot_q/rot_k)."""
    name = site.split(".")[-1]
    if name in ("q", "k", "v", "rot_q", "rot_k", "z"):
        return cfg.head_dim
    return cfg.d_mlp if name == "hidden" else cfg.vocab_size if name == "logits" else cfg.d_model


def targets_of(proxy_cfg, method: str) -> tuple[str, ...]:
    """A vector proxy's targets: proxies.<method>_targets if set (the transcoder's are MLP
    outputs, an SAE may add resid_mid), else proxies.targets."""
    return tuple(getattr(proxy_cfg, f"{method}_targets", ()) or proxy_cfg.targets)


def specs_from_config(proxy_cfg, cfg: model_lib.ModelConfig) -> list[ProxySpec]:
    """Every (method, target) pair the config asks for, with its sizes (sorted, each once) and
    options. validate.validate checks the settings with one-line errors first."""
    specs = []
    for method in proxy_cfg.methods:
        module = proxies.get(method)
        if module.SITE == "model":  # a whole-model proxy (a circuit): families of its own
            specs += [ProxySpec(method, (target,), sizes, options)
                      for target, sizes, options in module.families(proxy_cfg, cfg)]
            continue
        if module.SITE == "pattern":
            specs.append(ProxySpec(method, (resolve_site(proxy_cfg.pattern_site, cfg),)))
            continue
        for target in targets_of(proxy_cfg, method):
            sites = tuple(resolve_site(s, cfg) for s in target.split("+"))
            dim = min(site_dim(cfg, s) for s in sites)
            sizes, options = proxies.settings_of(module, proxy_cfg, dim)
            if not sizes:
                key = proxies.sizes_key(module)
                declared = {f.name: fields.rule(f) for f in dataclasses.fields(proxy_cfg)
                            } if dataclasses.is_dataclass(proxy_cfg) else {}
                rule = declared.get(key)  # its sizes: numbers, or names (erasure's concepts)
                raise ValueError(f"proxy {method!r} needs config.proxies.{key} "
                                 f"({rule.allowed if rule else 'its sizes'}; none by default)"
                                 + (f", e.g. --config.proxies.{key}='(32,64)'"
                                    if rule is None or rule.kind == fields.INTS else ""))
            # Sorted and deduplicated: a repeated size would give duplicate rows that aggregates
            # count twice (ml_collections joins repeated tuple overrides, so this happens).
            specs.append(ProxySpec(method, sites, tuple(sorted(set(sizes))), options))
    return specs


def labels_for(specs: Sequence[ProxySpec], config, split) -> np.ndarray | None:
    """The concept labels `collect` needs for `specs` on `split` (settings `config`: its task
    and proxies.concepts); None when no spec's statistic is "labelled"."""
    if not any(s.module.STATISTIC == "labelled" for s in specs):
        return None
    return tasks.concept_labels(tasks.get(config), split, config.proxies.concepts)
