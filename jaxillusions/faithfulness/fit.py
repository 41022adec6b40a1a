"""Fitting: one vmapped call per (spec, site), over seeds and heads (`fit`, `fit_one`), and the
fitted proxy of one seed and size as an intervention of the model's forward pass
(`make_intervention`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from jaxillusions import model as model_lib
from jaxillusions import proxies
from jaxillusions.faithfulness import dictionary_metrics
from jaxillusions.faithfulness.collect import Chunking, over_seed_chunks, seed_chunk
from jaxillusions.faithfulness.specs import ProxySpec, resolve_spec
from jaxillusions.runtime import distributed
from jaxillusions.training import memory


@dataclasses.dataclass
class FittedProxy:
    """Fitted params per site: leaves [S, G, R, ...] (seed, head, size) for data-dependent
    proxies; [R, ...] (no seed or head axis) for data-independent ones."""

    spec: ProxySpec
    params: dict

    @property
    def num_seeds(self) -> int | None:
        """The seeds it was fitted for (None: data-independent, one proxy for every seed)."""
        return None if self.spec.module.STATISTIC is None else \
            jax.tree.leaves(self.params)[0].shape[0]

    def resolved(self, model_cfg: model_lib.ModelConfig) -> FittedProxy:
        """This proxy with its spec checked and its sites resolved in `model_cfg`
        (specs.resolve_spec: blocks.-1 -> the last layer)."""
        spec = resolve_spec(self.spec, model_cfg)
        return FittedProxy(spec, {site: self.params[given] for given, site in
                                  zip(self.spec.sites, spec.sites, strict=True)})

    def intervention(self, seed_index: int, size_index: int, model_params: dict | None = None,
                     model_cfg: model_lib.ModelConfig | None = None) -> model_lib.Intervention:
        """This proxy for one seed at one size, as an intervention for `model.forward`
        (model_params: that seed's, for a proxy that reads or writes another site: the
        transcoder, the lenses; model_cfg: the model's config, for the transcoder, whose input
        site and layer norm depend on the architecture; with it, sites named by a negative layer
        are resolved). A whole-model proxy (the circuit) has none: ValueError, as for an index
        out of range."""
        if self.spec.module.SITE == "model":
            raise ValueError(f"{self.spec.method} replaces the whole forward pass, not a site: "
                             f"call its module's logits() instead of an intervention")
        for arg, index, count in (("seed_index", seed_index, self.num_seeds),
                                  ("size_index", size_index, len(self.spec.sizes))):
            if count is not None and not 0 <= index < count:
                raise ValueError(f"{arg}={index}: {self.spec.method} on {self.spec.target} has "
                                 f"{count} {arg[:4]}s (indices 0..{count - 1})")
        proxy = self if model_cfg is None else self.resolved(model_cfg)
        if any(".-" in site for site in proxy.spec.sites):
            raise ValueError(f"{self.spec.target}: a negative layer needs the model: pass "
                             "model_cfg to intervention()")
        if self.spec.module.STATISTIC is None:
            params = jax.tree.map(lambda x: x[size_index], proxy.params)
        else:
            params = jax.tree.map(lambda x: x[seed_index, :, size_index], proxy.params)
        return make_intervention(self.spec.module, params, model_params=model_params,
                                 model_cfg=model_cfg)


@functools.partial(jax.jit, static_argnames=("method", "sizes", "options"))
def _fit_seeds_and_heads(stats, keys, *, method: str, sizes: tuple[int, ...], options: tuple):
    """Each device fits its own seeds (shard_map over the seed axis): a fit's decompositions
    loop over matrices one at a time (runtime.linalg), and a loop over a sharded axis would
    otherwise be run whole on every device."""
    fit_one = functools.partial(proxies.get(method).fit, sizes=sizes, **dict(options))
    seeds = jax.sharding.PartitionSpec(distributed.AXIS)
    return jax.shard_map(jax.vmap(jax.vmap(lambda st, k: fit_one(st, key=k))),
                         mesh=distributed.mesh(), in_specs=seeds, out_specs=seeds,
                         check_vma=False)(stats, keys)


def fit(specs: Sequence[ProxySpec], stats: dict, key: jax.Array, num_seeds: int, *,
        chunking: Chunking = Chunking()) -> list[FittedProxy]:  # noqa: B008 - frozen
    """Fits every spec for every seed and head (one batched call per spec and site)."""
    return [fit_one(spec, index, stats, key, num_seeds, chunking=chunking)
            for index, spec in enumerate(specs)]


def fit_one(spec: ProxySpec, spec_index: int, stats: dict, key: jax.Array, num_seeds: int, *,
            chunking: Chunking = Chunking()) -> FittedProxy:  # noqa: B008 - frozen
    """fit() of the spec at position `spec_index` of its list alone (same random keys). Seeds
    run in sequential chunks as in `collect`; each seed's fit uses its own statistics and
    keys."""
    module, per_site = spec.module, {}
    static = dict(method=spec.method, sizes=spec.sizes, options=spec.options)
    for site_index, site in enumerate(spec.sites):
        if module.STATISTIC is None:
            per_site[site] = module.fit(None, spec.sizes, key=key)
            continue
        if module.STATISTIC not in stats.get(site, {}):
            raise ValueError(f"fit: stats have no {module.STATISTIC!r} of {site} for "
                             f"{spec.method}: collect them with this spec")
        site_stats = stats[site][module.STATISTIC]
        if (count := jax.tree.leaves(site_stats)[0].shape[0]) != num_seeds:
            raise ValueError(f"fit: num_seeds={num_seeds}, but the stats of {site} are of "
                             f"{count} seeds")
        num_groups = jax.tree.leaves(site_stats)[0].shape[1]
        keys = jax.random.split(jax.random.fold_in(key, 1000 * spec_index + site_index),
                                num_seeds * num_groups).reshape(num_seeds, num_groups, -1)
        chunk_size = seed_chunk(
            lambda w, st=site_stats, k=keys: memory.compiled_bytes(
                _fit_seeds_and_heads, memory.seed_shapes(st, w), memory.seed_shapes(k, w),
                **static),
            num_seeds, chunking, what=f"fitting {spec.method} on {site}",
            lower="proxies.kmeans_samples" if module.STATISTIC in ("samples", "pairs")
            else "the number of seeds")
        per_site[site] = over_seed_chunks(
            lambda st, k: _fit_seeds_and_heads(st, k, **static), [site_stats, keys],
            num_seeds, chunk_size)
    return FittedProxy(spec, per_site)


def make_intervention(module, site_params: dict, active: dict | None = None,
                      model_params: dict | None = None,
                      model_cfg: model_lib.ModelConfig | None = None) -> model_lib.Intervention:
    """Intervention replacing each site by the proxy with ONE seed's, ONE size's params.

    Data-dependent proxies carry a head axis G first (one proxy per head); others have none.
    `active` ({site: traced bool}, optional): a site whose flag is False passes through
    unchanged, so one compiled program serves every family of a proxy method (see `evaluate`).
    A proxy with `input_site` maps the value of input_site(site, model_cfg), kept when forward
    visits it, to the site's value: uniform attention its layer's scores; the transcoder (a
    "pairs" proxy) its MLP's input, for which it needs the seed's `model_params` and the
    model's `model_cfg` (which residual stream its MLP reads, its epsilon). A proxy with
    `output_site` (a lens) leaves its site unchanged and writes the proxy of the site's value
    at output_site (visited later); it needs `model_params` too (for the number of layers).
    """
    reads_input = proxies.hook(module, "input_site") is not None
    if reads_input and module.STATISTIC == "pairs" and (model_params is None
                                                          or model_cfg is None):
        raise ValueError(f"{module.__name__}: a proxy that reads another site needs the seed's "
                         "model_params and the model's model_cfg")
    input_for = {module.input_site(s, model_cfg): s for s in site_params} if reads_input else {}
    inputs = {}  # site -> its proxy's input, in the forward pass being traced

    def replace(name: str, x: jax.Array, value: jax.Array) -> jax.Array:
        if module.STATISTIC is None:  # (x: the site's value, or input_site's)
            return module.apply(site_params[name], x)
        return dictionary_metrics.apply_grouped(module, site_params[name], x, value)

    if proxies.hook(module, "output_site") is not None:
        if model_params is None:
            raise ValueError(f"{module.__name__}: a lens needs the seed's model_params")
        n_layers = len(model_params["blocks"])
        writers = {s: module.output_site(s, n_layers) for s in site_params}
        written = {}  # site -> the lens of its value, until its output site is visited

        def lens(name: str, value: jax.Array) -> jax.Array:
            if name in writers:
                written[name] = replace(name, value, value)
            for site in [s for s, out in writers.items() if out == name and s in written]:
                # At most one family's flag is on: the others pass the value on.
                value = written.pop(site) if active is None else jnp.where(
                    active[site], written.pop(site), value)
            return value

        return lens

    def intervention(name: str, value: jax.Array) -> jax.Array:
        if name in input_for:
            inputs[input_for[name]] = module.input_of(model_params, model_cfg, input_for[name],
                                                      value)
        if name not in site_params:
            return value
        if not reads_input:
            if active is None:
                return replace(name, value, value)
            return jax.lax.cond(active[name], lambda v: replace(name, v, v), lambda v: v, value)
        x = inputs.pop(name)
        if active is None:
            return replace(name, x, value)
        return jax.lax.cond(active[name], functools.partial(replace, name),
                            lambda x, v: v, x, value)

    return intervention
