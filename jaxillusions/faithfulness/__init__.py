"""Fit simplified proxies of trained models and measure how faithfully they reproduce them.

The three steps, each batched over the leading seed axis of `params`:

    stats  = collect(params, splits["train"], model_cfg, specs)       # training split only
    fitted = fit(specs, stats, key)                                   # one entry per spec
    rows   = evaluate(params, model_cfg, splits, fitted)              # tidy dict rows

A `ProxySpec` names a proxy module (jaxillusions/proxies/NAME.py), the sites it replaces (several
sites are simplified together, each with its own proxy) and the sizes (ranks, cluster counts) that
are fitted and evaluated together in one batched call.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import model as model_lib
from jaxillusions import proxies, tasks
from jaxillusions.faithfulness import dictionary_metrics as dictionaries
from jaxillusions.faithfulness import metrics
from jaxillusions.runtime import distributed, schema, watchdog
from jaxillusions.runtime.chunks import padded_chunks
from jaxillusions.training import memory

# A quantile q of n positions is reported only where n (1 - q) >= 1, so that at least one
# position lies beyond it: below, np.quantile interpolates between the largest values, the
# split's maximum under another name (p95: 20 positions, p99: 100). Elsewhere NaN.
JSD_MIN_POSITIONS = {name: math.ceil(round(1 / (1 - q), 6))
                     for name, q in schema.JSD_QUANTILES.items()}


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
            if hasattr(module, "settings"):
                sizes, options = module.settings(proxy_cfg, dim)
            else:
                sizes, options = tuple(getattr(proxy_cfg, proxies.sizes_key(module), ())), ()
            if not sizes:
                key = proxies.sizes_key(module)
                raise ValueError(f"proxy {method!r} needs config.proxies.{key} (its sizes; "
                                 f"none by default), e.g. --config.proxies.{key}='(32,64)'")
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


@dataclasses.dataclass(frozen=True)
class Chunking:
    """How a proxy-stage call (collect, fit, fit_one, evaluate) runs the seed axis: in
    sequential chunks of `seed_chunk_size` seeds (0: as many as fit the device, planned per call
    by memory.plan_seed_chunk), the plan's line printed with `say` (None: not printed). A seed's
    numbers depend on that seed alone, so the chunks change none of them."""

    seed_chunk_size: int = 0
    say: Callable[[str], object] | None = print


PAIR_INPUT = "input:"  # prefix of a "pairs" site's sampled inputs in _collect_chunk
PAIR_OUTPUT = "output:"  # prefix of a lens's sampled output site (the final residual stream)


# ---------------------------------------------------------------------------------------------
# Collection: streamed second moments and a sample of vectors, per seed and head, training only.


def _grouped(x: jax.Array) -> jax.Array:
    """Site value [B, T, F] or [B, T, H, F] -> [B*T, G, F] (G heads, or 1)."""
    if x.ndim == 3:
        x = x[:, :, None, :]
    return x.reshape(-1, *x.shape[2:])


@functools.partial(jax.jit, static_argnames=("model_cfg", "sites", "with_vectors", "pairs"))
def _collect_chunk(params, tokens, *, model_cfg, sites: tuple[str, ...], with_vectors: bool,
                   pairs: tuple[tuple[str, str], ...] = ()):
    """pairs: (site, method) of the "pairs" statistic: the method's input of the site (e.g. a
    transcoder's MLP input) is sampled too, as vectors[PAIR_INPUT + site]."""
    valid = (tokens != tasks.PAD).reshape(-1)
    svd = proxies.get("svd")
    inputs = {s: proxies.get(m).input_site(s) for s, m in pairs
              if hasattr(proxies.get(m), "input_site")}
    outputs = {s: proxies.get(m).output_site(s, model_cfg.n_layers) for s, m in pairs
               if hasattr(proxies.get(m), "output_site")}

    def one_seed(p):
        _, cache = model_lib.forward(p, tokens, model_cfg, cache=tuple(dict.fromkeys(
            sites + tuple(inputs.values()) + tuple(outputs.values()))))
        vectors = {s: _grouped(cache[s]) for s in sites}
        moments = {s: jax.vmap(svd.moments, in_axes=(1, None))(v, valid)
                   for s, v in vectors.items()}
        if with_vectors:
            vectors |= {PAIR_INPUT + s: _grouped(proxies.get(m).input_of(p, s, cache[inputs[s]]))
                        for s, m in pairs if s in inputs}
            vectors |= {PAIR_OUTPUT + s: _grouped(cache[o]) for s, o in outputs.items()}
        # Vectors leave the device only while k-means samples are still being gathered.
        return moments, vectors if with_vectors else {}

    return jax.vmap(one_seed)(params)


def collection_groups(specs: Sequence[ProxySpec]) -> list[list[int]]:
    """Indices of the data-dependent specs, grouped so that each group's statistics are
    collected by one program (faithfulness.collect of the group's specs): the methods whose
    families cover the same sites (svd, pca and kmeans on proxies.targets) share one, and a
    method with its own targets (proxies.<method>_targets) has its own. A site's statistics
    then do not depend on the sites another method adds: XLA may round a program that caches
    more sites differently, so adding a method changes no number of the others."""
    sites: dict[str, set] = {}
    for spec in specs:
        if spec.module.STATISTIC is not None:
            sites.setdefault(spec.method, set()).update(spec.sites)
    groups: dict[tuple, list[int]] = {}
    for i, spec in enumerate(specs):
        if spec.module.STATISTIC is not None:
            key = (tuple(sorted(sites[spec.method])), spec.module.STATISTIC == "pairs")
            if spec.module.STATISTIC == "model":  # each family its own (its own passes)
                key += (spec.sites, spec.options)
            groups.setdefault(key, []).append(i)
    return list(groups.values())


def collect(params, train, model_cfg: model_lib.ModelConfig,
            specs: Sequence[ProxySpec], *, num_samples: int, batch_size: int,
            labels: np.ndarray | None = None, chunking: Chunking = Chunking()) -> dict:
    """Statistics of every site that a data-dependent spec needs, from the training split.

    Returns {site: {"moments": {...} [S, G, ...], "samples": {"x": [S, G, N, F], "valid": ...},
    "pairs": {"x": inputs, "y": the site's values, "valid"}}} (samples and pairs where needed;
    a lens's pairs: {"x": the site's values, "y": its output site's}; "labelled": the sample
    with "z" [S, G, N, C], the classes of `labels` (int [sentences, T, C], the task's concepts
    of train's tokens: tasks.concept_labels) at the sampled positions).
    Moments stream over all training sentences in fixed-size chunks (memory stays bounded);
    samples are the first `num_samples` non-PAD positions of the training sentences, which are
    i.i.d. draws, so this is a random sample of sentences (all positions of each).
    Seeds run in sequential chunks (`chunking`, see `Chunking` and `seed_chunk`); a seed's
    statistics depend on that seed alone.
    """
    whole = {spec.sites[0]: {"model": _collect_model(params, train, model_cfg, spec,
                                                     batch_size, chunking)}
             for spec in specs if spec.module.STATISTIC == "model"}
    if whole:
        others = [s for s in specs if s.module.STATISTIC != "model"]
        return {**collect(params, train, model_cfg, others, num_samples=num_samples,
                          batch_size=batch_size, labels=labels, chunking=chunking), **whole}
    needs, pairs = {}, {}
    for spec in specs:
        if spec.module.STATISTIC is not None:
            for site in spec.sites:
                needs.setdefault(site, set()).add(spec.module.STATISTIC)
                if spec.module.STATISTIC == "pairs":
                    pairs[site] = spec.method
    if not needs:
        return {}
    labelled = any("labelled" in n for n in needs.values())
    if labelled and (labels is None or labels.shape[:2] != train.tokens.shape):
        raise ValueError("collect: a labelled statistic (erasure) needs `labels` of the "
                         "training tokens' positions (tasks.concept_labels)")
    sites = tuple(sorted(needs))
    num_seeds = jax.tree.leaves(params)[0].shape[0]
    sampling = any(n & {"samples", "pairs", "labelled"} for n in needs.values())
    static = dict(model_cfg=model_cfg, sites=sites, with_vectors=sampling and num_samples > 0)
    if pairs:  # (the collection program of configs without a transcoder is unchanged)
        static["pairs"] = tuple(sorted(pairs.items()))
    tokens = jax.ShapeDtypeStruct((batch_size, train.tokens.shape[1]), train.tokens.dtype)
    chunk_size = seed_chunk(
        lambda w: memory.compiled_bytes(_collect_chunk, memory.seed_shapes(params, w), tokens,
                                        **static),
        num_seeds, chunking, what="activation collection",
        lower=f"proxies.collect_batch_size (now {batch_size})")

    reads = [s for s, m in pairs.items() if hasattr(proxies.get(m), "input_site")]
    writes = [s for s, m in pairs.items() if hasattr(proxies.get(m), "output_site")]

    def one_chunk(params):  # params: one chunk of seeds, placed
        totals, kept, classes = None, 0, []
        samples = {s: [] for s in (*sites, *(PAIR_INPUT + s for s in reads),
                                   *(PAIR_OUTPUT + s for s in writes))}
        chunks = [train.tokens] + ([labels] if labelled else [])
        for tokens, *chunk_labels in padded_chunks(chunks, batch_size):
            watchdog.progress()
            moments, vectors = _collect_chunk(
                params, tokens, **dict(static, with_vectors=sampling and kept < num_samples))
            moments = distributed.to_host(moments)  # summed on the host: no jit(add) per shape
            totals = moments if totals is None else jax.tree.map(np.add, totals, moments)
            if vectors:
                valid = (tokens != tasks.PAD).reshape(-1)
                take = np.flatnonzero(valid)[: num_samples - kept]
                for s in samples:
                    if s in vectors and needs.get(s, {"pairs"}) & {"samples", "pairs",
                                                                   "labelled"}:
                        samples[s].append(distributed.to_host(vectors[s])[:, take])
                if labelled:
                    classes.append(chunk_labels[0].reshape(len(valid), -1)[take])
                kept += len(take)
        def sample(s: str) -> dict:
            x = np.concatenate(samples[s], axis=1).transpose(0, 2, 1, 3)  # [S, G, N, F]
            return {"x": x, "valid": np.ones(x.shape[:3], bool)}

        stats = {}
        for s in sites:
            stats[s] = {"moments": distributed.to_host(totals[s])}  # [S, G, ...]
            if "samples" in needs[s]:
                stats[s]["samples"] = sample(s)
            if "pairs" in needs[s]:
                y = sample(PAIR_OUTPUT + s if s in writes else s)
                x = sample(PAIR_INPUT + s if s in reads else s)
                stats[s]["pairs"] = {**y, "x": x["x"], "y": y["x"]}
            if "labelled" in needs[s]:
                x = sample(s)
                z = np.concatenate(classes)  # the same positions for every seed and head
                stats[s]["labelled"] = {**x, "z": np.broadcast_to(z, (*x["x"].shape[:2], *z.shape))}
        return stats

    return over_seed_chunks(one_chunk, [params], num_seeds, chunk_size)


@functools.partial(jax.jit, static_argnames=("model_cfg", "method", "pass_index", "options"))
def _model_statistic(params, tokens, previous, *, model_cfg, method: str, pass_index: int,
                     options: tuple):
    """One batch's sums of a whole-model proxy's pass `pass_index`, per seed."""
    module, valid = proxies.get(method), tokens != tasks.PAD
    return jax.vmap(lambda p, prev: module.statistic(pass_index, p, tokens, valid, model_cfg,
                                                     prev, **dict(options)))(params, previous)


def _collect_model(params, train, model_cfg: model_lib.ModelConfig, spec: ProxySpec,
                   batch_size: int, chunking: Chunking) -> dict:
    """The statistics of a whole-model proxy (STATISTIC "model"): its module's PASSES passes
    over `train` (its first options["sentences"] sentences where that is > 0) in chunks of
    batch_size sentences, each pass's batch sums added on the host, every leaf [S, 1, ...]
    (one group, as fit_one expects). Seeds run in chunks of chunking.seed_chunk_size (0: all
    at once)."""
    static = dict(model_cfg=model_cfg, method=spec.method, options=spec.options)
    cap = dict(spec.options).get("sentences", 0)
    sentences = train.tokens[:cap] if cap else train.tokens

    def one_chunk(params):
        stats: dict = {}
        for pass_index in range(spec.module.PASSES):
            totals = None
            for (tokens,) in padded_chunks([sentences], batch_size):
                watchdog.progress()
                sums = distributed.to_host(_model_statistic(params, tokens, stats,
                                                            pass_index=pass_index, **static))
                totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
            stats = {**stats, **totals}
        return jax.tree.map(lambda x: x[:, None], stats)

    num_seeds = jax.tree.leaves(params)[0].shape[0]
    return over_seed_chunks(one_chunk, [params], num_seeds, chunking.seed_chunk_size)


def seed_chunk(bytes_for, num_seeds: int, chunking: Chunking, *, what: str, lower: str) -> int:
    """Seeds per chunk of a proxy-stage call: chunking.seed_chunk_size when set (> 0), else all
    of them, or as many as fit the device's memory (memory.plan_seed_chunk; printed with
    chunking.say)."""
    if chunking.seed_chunk_size > 0:
        return chunking.seed_chunk_size
    chunk, line = memory.plan_seed_chunk(bytes_for, num_seeds, what=what, lower=lower,
                                         force="proxies.seed_chunk_size")
    if line and chunking.say is not None:
        chunking.say(line)
    return chunk


def over_seed_chunks(run, trees: Sequence, num_seeds: int, chunk_size: int):
    """run(*trees) with the trees' leading seed axis in sequential chunks of `chunk_size` seeds
    (0: one chunk), each placed over the devices (distributed.shard_seeds, padded); returns the
    outputs (a pytree with a leading seed axis) as numpy, joined, the first `num_seeds`."""
    chunks = distributed.seed_chunks(num_seeds, chunk_size)
    if len(chunks) > 1:  # cut on the host (placed arrays may live on several processes)
        trees = [distributed.to_host(t) for t in trees]
    outs = []
    for index in chunks:
        part = trees if len(chunks) == 1 else [
            jax.tree.map(lambda x, i=index: x[i], t) for t in trees]
        outs.append(run(*[distributed.shard_seeds(t, len(index)) for t in part]))
    return distributed.concat_host(outs, num_seeds)


# ---------------------------------------------------------------------------------------------
# Fitting: one vmapped call per (spec, site), over seeds and heads.


@dataclasses.dataclass
class FittedProxy:
    """Fitted params per site: leaves [S, G, R, ...] (seed, head, size) for data-dependent
    proxies; [R, ...] (no seed or head axis) for data-independent ones."""

    spec: ProxySpec
    params: dict

    def intervention(self, seed_index: int, size_index: int,
                     model_params: dict | None = None) -> model_lib.Intervention:
        """This proxy for one seed at one size, as an intervention for `model.forward`
        (model_params: that seed's, for a proxy that reads or writes another site: the
        transcoder, the lenses). A whole-model proxy (the circuit) has none: ValueError."""
        if self.spec.module.SITE == "model":
            raise ValueError(f"{self.spec.method} replaces the whole forward pass, not a site: "
                             f"call its module's logits() instead of an intervention")
        if self.spec.module.STATISTIC is None:
            params = jax.tree.map(lambda x: x[size_index], self.params)
        else:
            params = jax.tree.map(lambda x: x[seed_index, :, size_index], self.params)
        return make_intervention(self.spec.module, params, model_params=model_params)


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
        chunking: Chunking = Chunking()) -> list[FittedProxy]:
    """Fits every spec for every seed and head (one batched call per spec and site)."""
    return [fit_one(spec, index, stats, key, num_seeds, chunking=chunking)
            for index, spec in enumerate(specs)]


def fit_one(spec: ProxySpec, spec_index: int, stats: dict, key: jax.Array, num_seeds: int, *,
            chunking: Chunking = Chunking()) -> FittedProxy:
    """fit() of the spec at position `spec_index` of its list alone (same random keys). Seeds
    run in sequential chunks as in `collect`; each seed's fit uses its own statistics and
    keys."""
    module, per_site = spec.module, {}
    static = dict(method=spec.method, sizes=spec.sizes, options=spec.options)
    for site_index, site in enumerate(spec.sites):
        if module.STATISTIC is None:
            per_site[site] = module.fit(None, spec.sizes, key=key)
            continue
        site_stats = stats[site][module.STATISTIC]
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
                      model_params: dict | None = None) -> model_lib.Intervention:
    """Intervention replacing each site by the proxy with ONE seed's, ONE size's params.

    Data-dependent proxies carry a head axis G first (one proxy per head); others have none.
    `active` ({site: traced bool}, optional): a site whose flag is False passes through
    unchanged, so one compiled program serves every family of a proxy method (see `evaluate`).
    A proxy with `input_site` (the transcoder) maps the value of input_site(site), kept when
    forward visits it, to the site's value; it needs the seed's `model_params`. A proxy with
    `output_site` (a lens) leaves its site unchanged and writes the proxy of the site's value
    at output_site (visited later); it needs `model_params` too (for the number of layers).
    """
    reads_input = hasattr(module, "input_site")
    input_for = {module.input_site(s): s for s in site_params} if reads_input else {}
    inputs = {}  # site -> its proxy's input, in the forward pass being traced

    def replace(name: str, x: jax.Array, value: jax.Array) -> jax.Array:
        if module.STATISTIC is None:
            return module.apply(site_params[name], value)
        return dictionaries.apply_grouped(module, site_params[name], x, value)

    if hasattr(module, "output_site"):
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
            inputs[input_for[name]] = module.input_of(model_params, input_for[name], value)
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


# ---------------------------------------------------------------------------------------------
# Evaluation: per-position metrics at the task's evaluated positions (Dyck: closing brackets),
# summed into (split, breakdown) bins.


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """All evaluation splits concatenated and padded to one length, with bin ids per position:
    for breakdown i of `breakdowns`, bins[..., i] = split index * per_split[i] + the bin."""

    split_names: tuple[str, ...]
    tokens: np.ndarray  # [N, T]
    evaluated: np.ndarray  # [N, T] bool: the prediction at t is scored (Dyck: closing brackets)
    bins: np.ndarray  # [N, T, B] bin id for breakdowns "all", then the task's BREAKDOWNS
    num_bins: tuple[int, ...]
    breakdowns: tuple[str, ...]  # ("all", *task.BREAKDOWNS)
    per_split: tuple[int, ...]  # bins allotted to each split, per breakdown
    widths: tuple[int, ...]  # the splits' own widths, sorted (see _eval_batches)


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """How `evaluate` lays out and runs its compiled programs (its docstring says why each);
    the rows agree within float32 rounding whatever these are.

    shared: the run's other families, when the caller evaluates one family at a time: a proxy
        method's program holds the sites of every family of the method here and in `fitted`.
    one_width: every chunk padded to the widest split (True), or a branch per split width
        (False); None: True on accelerators, False on CPU.
    share_prefix: each size's pass starts from the original pass's residual stream at the first
        replaced block (False: whole passes per size; for tests and benchmarks).
    chunking: the seed chunks and where their plan is said (`Chunking`)."""

    shared: Sequence[FittedProxy] = ()
    one_width: bool | None = None
    share_prefix: bool = True
    chunking: Chunking = Chunking()


@dataclasses.dataclass(frozen=True)
class EvalProgram:
    """What one compiled evaluation program is: _eval_chunk's static argument (hashable; each
    distinct value compiles once). `num_sizes` sizes of proxy `method`; `num_bins` per breakdown
    (EvalSet.num_bins); one branch per width of `widths`; the sizes' passes start at block
    `start_layer` (None: each runs the whole model)."""

    model_cfg: model_lib.ModelConfig
    method: str
    num_sizes: int
    num_bins: tuple[int, ...]
    widths: tuple[int, ...]
    start_layer: int | None
    options: tuple = ()  # a whole-model proxy's options (its spec's): logits(**options)


def make_eval_set(splits: dict, names: Sequence[str], task=None) -> EvalSet:
    """The splits `names` of a task's `splits` (task: a tasks module; default Dyck)."""
    task = task or tasks.get("dyck")
    missing = [n for n in names if n not in splits]
    if missing:
        raise ValueError(f"evaluation splits {missing} do not exist; have {sorted(splits)}")
    views = [task.view(splits[n]) for n in names]
    width = max(v.tokens.shape[1] for v in views)
    breakdowns = ("all", *task.BREAKDOWNS)
    per_split = (1, *(max(max(v.num_bins[b] for v in views), 1) for b in task.BREAKDOWNS))
    tokens, evaluated, bins = [], [], []
    for index, v in enumerate(views):
        pad = ((0, 0), (0, width - v.tokens.shape[1]))
        split = np.full((len(v.tokens), width), index)
        tokens.append(np.pad(v.tokens, pad))
        evaluated.append(np.pad(v.evaluated, pad))
        per = [split]
        for b, n in zip(task.BREAKDOWNS, per_split[1:], strict=True):
            value = np.pad(v.bins[b], pad)
            # A negative bin (position not in this breakdown) stays -1: one_hot ignores it.
            per.append(np.where(value >= 0, split * n + value, -1))
        bins.append(np.stack(per, axis=-1))
    n = len(names)
    return EvalSet(tuple(names), np.concatenate(tokens), np.concatenate(evaluated),
                   np.concatenate(bins).astype(np.int32), tuple(n * p for p in per_split),
                   breakdowns, per_split, tuple(sorted({v.tokens.shape[1] for v in views})))


@functools.partial(jax.jit, static_argnames=("program",))
def _eval_chunk(params, proxy_params, active, tokens, evaluated, bins, width_index, *,
                program: EvalProgram):
    """One chunk [B, T] of every seed and size. The program holds one branch per width of
    program.widths; `width_index` picks the one that runs, on the chunk's first `width` columns
    (the rest are padding: a causal model's values before them do not depend on them).
    program.start_layer: the sizes' passes start at this block from the original pass's
    residual stream (nothing before it is replaced: model.first_block); None: each runs the
    whole model.
    Returns ((binned sums, dictionary metric sums: {} for pattern proxies), per-position JSD)."""
    model_cfg, num_bins, start_layer = program.model_cfg, program.num_bins, program.start_layer
    module = proxies.get(program.method)
    extra = dictionaries.enabled(module)  # dictionary metrics (fvu, l0, dead, ce/kl_score)
    resume = () if start_layer is None else (model_lib.residual_site(model_cfg, start_layer),)

    def at_width(width: int, tokens, evaluated, bins):
        tokens, evaluated, bins = tokens[:, :width], evaluated[:, :width], bins[:, :width]
        targets = jnp.roll(tokens, -1, axis=1)
        weight = evaluated.astype(jnp.float32)

        def binned(values: jax.Array) -> list[jax.Array]:
            """values [B, T, M] -> per breakdown, sums [num_bins, M] over evaluated positions."""
            return [jnp.einsum("btm,btk->km", values * weight[..., None],
                               jax.nn.one_hot(bins[..., i], nb, dtype=jnp.float32))
                    for i, nb in enumerate(num_bins)]

        def one_seed(p, site_params):
            # The sites' original values too for the dictionary metrics, and the residual
            # stream where the sizes' passes start.
            sites = dictionaries.cache_sites(module, active) if extra else ()
            logits, cache = model_lib.forward(p, tokens, model_cfg, cache=sites + resume)
            if extra:
                batch = dictionaries.Batch(tokens=tokens, evaluated=evaluated,
                                           split_ids=bins[..., 0], num_splits=num_bins[0],
                                           logits=logits, targets=targets)
                seed_sums = dictionaries.seed_sums(p, model_cfg, active, cache, batch)
            acc_original = metrics.correct(logits, targets)
            start_at = (start_layer, cache[resume[0]]) if resume else None

            def one_size(size_params):
                if module.SITE == "model":  # one family per program: its one site
                    (whole,) = size_params.values()
                    proxy_logits = module.logits(jax.tree.map(lambda x: x[0], whole), p, tokens,
                                                 model_cfg, **dict(program.options))
                else:
                    proxy_logits, _ = model_lib.forward(
                        p, tokens, model_cfg, start_at=start_at,
                        intervention=make_intervention(module, size_params, active, p))
                values = jnp.stack([jnp.ones_like(weight), metrics.jsd(logits, proxy_logits),
                                    metrics.same_pred(logits, proxy_logits), acc_original,
                                    metrics.correct(proxy_logits, targets)], axis=-1)
                if not extra:
                    return binned(values), values[..., 1], {}  # and per-position JSD [B, T]
                return binned(values), values[..., 1], dictionaries.size_sums(
                    module, size_params, p, active, cache, batch, proxy_logits)

            size_axis = 0 if module.STATISTIC is None else 1  # see FittedProxy
            sums, jsd, size_sums = jax.vmap(one_size, in_axes=size_axis,
                                            axis_size=program.num_sizes)(site_params)
            return sums, jsd, {"seed": seed_sums, "size": size_sums} if extra else {}

        seed_axis = None if module.STATISTIC is None else 0
        sums, jsd, dict_sums = jax.vmap(one_seed, in_axes=(0, seed_axis))(params, proxy_params)
        pad = [(0, 0)] * (jsd.ndim - 1) + [(0, tokens_width - width)]
        return (sums, dict_sums), jnp.pad(jsd, pad)  # one shape for every branch

    tokens_width = tokens.shape[1]
    branches = [functools.partial(at_width, w) for w in program.widths]
    return jax.lax.switch(width_index, branches, tokens, evaluated, bins)


def evaluate(params, model_cfg: model_lib.ModelConfig, eval_set: EvalSet,
             fitted: Sequence[FittedProxy], *, batch_size: int, seeds: Sequence[int],
             healthy: np.ndarray | None = None, options: EvalOptions = EvalOptions()
             ) -> list[dict]:
    """Tidy rows: one per (seed, target, method, size, split, breakdown, bin).

    Columns: seed, site, method, size, split, breakdown, bin, n, jsd, same_pred, acc_original,
    acc_proxy (means over the evaluated positions in that bin), and on `all` rows jsd_p95,
    jsd_p99: exact quantiles (linear interpolation) of the per-position JSD (NaN on other rows
    and on splits of fewer than JSD_MIN_POSITIONS evaluated positions),
    and for data-dependent vector proxies the dictionary metrics fvu, l0, dead, ce_score and
    kl_score (faithfulness/dictionary_metrics.py; NaN on other rows and where undefined).
    Seeds marked unhealthy (diverged in training) are left out. `options` (`EvalOptions`) sets
    how the programs are laid out and run; none of it changes what is measured. Seeds run in
    sequential chunks (options.chunking; the plan is made per proxy family).

    Compilations: one program per proxy method (and list of sizes), whatever the families and
    split widths. Its sites are those of every family of the method in `fitted` and
    options.shared (the run's other families, when the caller evaluates one family at a time);
    a family passes the sites it does not simplify through unchanged (a traced flag).
    options.one_width: the program runs every chunk padded to the widest split (default on
    accelerators, where a compilation costs more than the padding's extra work); else it holds
    one branch per split width and runs a chunk at the narrowest that holds it (default on CPU,
    where padding the Dyck demo's five short splits to `longer` made the evaluation 1.5x
    slower). The numbers
    of the two agree within float32 rounding (sums over more, zero, terms).

    Per seed and chunk the model runs once; each size's pass then starts at the first block
    that a family of the program replaces, from that pass's residual stream. This saves less
    than it seems: under vmap over sizes, whole passes already compute what does not depend on
    the size once (vmap batches only what reads the size's parameters), so what remains is the
    duplicate of the original pass's prefix (docs/speed.md: 1.0-1.1x on the Dyck demo).
    options.share_prefix=False runs whole passes per size (the same rows within float32
    rounding; for tests and benchmarks).
    """
    rows, num_seeds = [], jax.tree.leaves(params)[0].shape[0]
    params = distributed.shard_seeds(params)  # placed once for all families (padded)
    # The split of each evaluated position, in the order of the per-position JSD.
    split_ids = np.concatenate([c[2][..., 0][c[1]] for c in _eval_batches(eval_set, batch_size)])
    one_width = options.one_width
    if one_width is None:
        one_width = jax.default_backend() != "cpu"
    widths = eval_set.widths[-1:] if one_width else eval_set.widths
    programs = _program_sites([*fitted, *options.shared])
    for proxy in fitted:
        sites = programs[_program_key(proxy.spec)]
        whole = proxy.spec.module.SITE == "model"  # replaces the whole forward pass
        program = EvalProgram(model_cfg, proxy.spec.method, len(proxy.spec.sizes),
                              eval_set.num_bins, widths,
                              model_lib.first_block(model_cfg, sites)
                              if options.share_prefix and not whole else None,
                              proxy.spec.options if whole else ())
        (totals, dict_sums), jsd = _evaluate_family(params, num_seeds, eval_set, proxy, sites,
                                                    program, batch_size, options.chunking)
        quantiles = _jsd_quantiles(jsd, split_ids, len(eval_set.split_names))
        extra = dictionaries.columns(proxy.spec, proxy.params, **dict_sums) if dict_sums \
            else None
        rows += _rows(proxy.spec, totals, quantiles, eval_set, seeds, healthy, extra)
    return rows


def _program_key(spec: ProxySpec) -> tuple:
    """Families with the same key share one compiled evaluation (the sizes fix the shapes of
    the fitted parameters of a site); a whole-model proxy's family has its own."""
    if spec.module.SITE == "model":
        return spec.method, spec.sizes, spec.sites, spec.options
    return spec.method, spec.sizes


def _program_sites(families: Sequence[FittedProxy]) -> dict[tuple, dict]:
    """{program key: {site: one family's fitted params of that site}} over `families`: the
    sites each program replaces, and the shapes of their parameters."""
    programs: dict[tuple, dict] = {}
    for proxy in families:
        programs.setdefault(_program_key(proxy.spec), {}).update(proxy.params)
    return {key: dict(sorted(sites.items())) for key, sites in programs.items()}


def _evaluate_family(params, num_seeds: int, eval_set: EvalSet, proxy: FittedProxy,
                     program_sites: dict, program: EvalProgram, batch_size: int,
                     chunking: Chunking) -> tuple[tuple[list[np.ndarray], dict], np.ndarray]:
    """One family's summed metrics per breakdown [S, R, bins, 5] with its dictionary metric
    sums (dictionaries.seed_sums/size_sums, {} for pattern proxies), and per-position JSD at the
    evaluated positions [S, R, n], for the first `num_seeds` seeds of `params` (placed, maybe
    padded), in chunks (see `evaluate`), by `program`, which replaces the sites of
    `program_sites` ({site: one family's fitted params}, _program_sites)."""
    spec = proxy.spec
    per_seed = spec.module.STATISTIC is not None  # else one proxy for all seeds
    # Sites of the program that this family does not simplify get zeros (never applied).
    site_params = {s: proxy.params[s] if s in proxy.params
                   else jax.tree.map(lambda x: np.zeros(np.shape(x), x.dtype), p)
                   for s, p in program_sites.items()}
    active = {s: np.bool_(s in proxy.params) for s in program_sites}
    widest = [jax.ShapeDtypeStruct((batch_size, *a.shape[1:]), a.dtype)
              for a in (eval_set.tokens, eval_set.evaluated, eval_set.bins)]
    chunk_size = seed_chunk(
        lambda w: memory.compiled_bytes(
            _eval_chunk, memory.seed_shapes(params, w),
            memory.seed_shapes(site_params, w) if per_seed else site_params, active, *widest,
            np.int32(0), program=program),
        num_seeds, chunking, what=f"evaluating {spec.method} on {spec.target}",
        lower=f"proxies.eval_batch_size (now {batch_size})")

    def one_chunk(params, proxy_params=site_params):
        totals, jsd = None, []
        for *chunk, width_index in _eval_batches(eval_set, batch_size, program.widths):
            out, jsd_chunk = _eval_chunk(params, proxy_params, active, *chunk, width_index,
                                         program=program)
            # Summed on the host (the same float32 sums): jnp.add compiled a program per shape.
            out = distributed.to_host(out)
            totals = out if totals is None else jax.tree.map(np.add, totals, out)
            # Per-position JSD at the evaluated positions only, one family at a time.
            jsd.append(np.asarray(distributed.to_host(jsd_chunk), np.float32)
                       [..., chunk[1]])  # [S, R, n]
        return totals, np.concatenate(jsd, axis=-1)

    trees = [params, site_params] if per_seed else [params]
    return over_seed_chunks(one_chunk, trees, num_seeds, chunk_size)


def _eval_batches(eval_set: EvalSet, batch_size: int, widths: Sequence[int] = ()):
    """[tokens, evaluated, bins, width index] in chunks of batch_size sentences, as wide as the
    widest split (one shape: one compilation), with the index into `widths` (sorted, the last
    the widest) of the narrowest that holds the chunk's tokens."""
    for chunk in padded_chunks([eval_set.tokens, eval_set.evaluated, eval_set.bins], batch_size):
        watchdog.progress()
        used = int((chunk[0] != tasks.PAD).any(0).nonzero()[0].max()) + 1
        yield [*chunk, np.int32(next((i for i, w in enumerate(widths) if w >= used), 0))]


def _jsd_quantiles(jsd: np.ndarray, split_ids: np.ndarray, num_splits: int) -> np.ndarray:
    """jsd [S, R, n] at the evaluated positions -> quantiles [S, R, num_splits, Q] per split,
    NaN where the split has fewer than JSD_MIN_POSITIONS positions."""
    out = np.full(jsd.shape[:2] + (num_splits, len(schema.JSD_QUANTILES)), np.nan)
    for k in range(num_splits):
        values = jsd[..., split_ids == k]
        for i, (name, q) in enumerate(schema.JSD_QUANTILES.items()):
            if values.shape[-1] >= JSD_MIN_POSITIONS[name]:
                out[:, :, k, i] = np.quantile(values, q, axis=-1)
    return out


def _rows(spec: ProxySpec, totals: list[np.ndarray], quantiles: np.ndarray, eval_set: EvalSet,
          seeds, healthy, extra: np.ndarray | None = None):
    """totals[breakdown]: [S, R, bins, 5] sums (count, jsd, same, acc_orig, acc_proxy); extra:
    [S, R, splits, M] the `all` rows' schema.DICTIONARY_METRICS, or None."""
    rows = []
    per_split = dict(zip(eval_set.breakdowns, eval_set.per_split, strict=True))
    for b, breakdown in enumerate(eval_set.breakdowns):
        sums = totals[b]
        for s, seed in enumerate(seeds):
            if healthy is not None and not healthy[s]:
                continue
            for r, size in enumerate(spec.sizes):
                for k in np.flatnonzero(sums[s, r, :, 0] > 0):
                    split, value = divmod(int(k), per_split[breakdown])
                    count = sums[s, r, k, 0]
                    row = {"seed": int(seed), "site": spec.target, "method": spec.method,
                           "size": int(size), "split": eval_set.split_names[split],
                           "breakdown": breakdown, "bin": value if breakdown != "all" else "",
                           "n": int(count)}
                    row.update({m: float(sums[s, r, k, 1 + i] / count)
                                for i, m in enumerate(schema.POSITION_METRICS)})
                    row.update({q: float(quantiles[s, r, split, i]) if breakdown == "all"
                                else float("nan") for i, q in enumerate(schema.JSD_QUANTILES)})
                    if extra is not None:
                        row.update({c: float(extra[s, r, split, i]) if breakdown == "all"
                                    else float("nan")
                                    for i, c in enumerate(schema.DICTIONARY_METRICS)})
                    rows.append(row)
    return rows
