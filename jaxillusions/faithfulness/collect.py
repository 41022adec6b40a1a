"""Collection: streamed second moments and a sample of vectors, per seed and head, from the
training split only (`collect`), and the seed chunks every proxy-stage call runs in
(`Chunking`, `seed_chunk`, `over_seed_chunks`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import jax
import numpy as np

from jaxillusions import model as model_lib
from jaxillusions import proxies, tasks
from jaxillusions.faithfulness.specs import ProxySpec, resolve_spec
from jaxillusions.runtime import distributed, watchdog
from jaxillusions.runtime.chunks import padded_chunks
from jaxillusions.training import memory


@dataclasses.dataclass(frozen=True)
class Chunking:
    """How a proxy-stage call (collect, fit, fit_one, evaluate) runs the seed axis: in
    sequential chunks of `seed_chunk_size` seeds (0: as many as fit the device, planned per call
    by memory.plan_seed_chunk), the plan's line printed with `say` (None: not printed). A seed's
    numbers depend on that seed alone, so the chunks change none of them."""

    seed_chunk_size: int = 0
    say: Callable[[str], object] | None = print


@dataclasses.dataclass(frozen=True)
class Packing:
    """Where `pack_rows` put each sentence's tokens: `rows` rows of the sentences' width, each
    token's sentence (`segments`, -1: none) and position minus column (`offsets`), [rows, T]
    each; `lay` moves any per-position array [N, T, ...] there."""

    rows: int
    length: np.ndarray  # [N]: each sentence's tokens up to its last non-PAD one
    kept: np.ndarray  # [N, T]: the positions moved (each sentence up to its last token)
    at: tuple[np.ndarray, np.ndarray]  # their row and column, in the order of kept
    segments: np.ndarray
    offsets: np.ndarray

    def lay(self, values: np.ndarray, empty) -> np.ndarray:
        """values [N, T, ...] (or [N, 1, ...], the same at every position) in the packed rows;
        `empty` where no sentence is."""
        values = np.broadcast_to(values, self.kept.shape + np.shape(values)[2:])
        out = np.full((self.rows, self.kept.shape[1], *values.shape[2:]), empty, values.dtype)
        out[self.at] = values[self.kept]
        return out


def pack_rows(tokens: np.ndarray, *, in_order: bool) -> Packing:
    """The sentences of `tokens` [N, T], each up to its last non-PAD token, side by side in rows
    of width T, so that model.forward with the segments and offsets computes for each what it
    computes for the sentence alone. in_order: each in the current row if it fits, else in a
    new one (next fit), so the rows read the tokens in their order; else at the first row with
    room, the longest first (first-fit decreasing: fewer rows)."""
    n, width = tokens.shape
    used = tokens != tasks.PAD
    length = np.where(used.any(1), width - np.argmax(used[:, ::-1], axis=1), 0)
    fill, row, start = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    current = 0
    for i in range(n) if in_order else np.argsort(-length, kind="stable"):
        if in_order:
            current += fill[current] + length[i] > width
            r = current
        else:
            r = int(np.argmax(fill + length[i] <= width))  # there is one: n rows, <= one each
        row[i], start[i] = r, fill[r]
        fill[r] += length[i]
    column = np.arange(width)
    kept = column[None, :] < length[:, None]
    at = (np.broadcast_to(row[:, None], kept.shape)[kept], (start[:, None] + column)[kept])
    rows = int(row.max(initial=-1) + 1) if kept.any() else 0
    layout = Packing(rows, length, kept, at, np.empty(0), np.empty(0))
    return dataclasses.replace(layout, segments=layout.lay(np.arange(n, dtype=np.int32)[:, None],
                                                           -1),
                               offsets=layout.lay((-start).astype(np.int32)[:, None], 0))


PAIR_INPUT = "input:"  # prefix of a "pairs" site's sampled inputs in _collect_chunk
PAIR_OUTPUT = "output:"  # prefix of a lens's sampled output site (the final residual stream)
SAMPLED = frozenset({"samples", "pairs", "labelled"})  # the statistics read from the sample


def _grouped(x: jax.Array) -> jax.Array:
    """Site value [B, T, F] or [B, T, H, F] -> [B*T, G, F] (G heads, or 1)."""
    if x.ndim == 3:
        x = x[:, :, None, :]
    return x.reshape(-1, *x.shape[2:])


@functools.partial(jax.jit, static_argnames=("model_cfg", "sites", "with_vectors", "pairs"))
def _collect_chunk(params, tokens, packed=None, *, model_cfg, sites: tuple[str, ...],
                   with_vectors: bool, pairs: tuple[tuple[str, str], ...] = ()):
    """packed: the rows' (segments, offsets) where `tokens` are packed rows (`pack_rows`), else
    None. pairs: (site, method) of the "pairs" statistic: the method's input of the site (e.g.
    a transcoder's MLP input) is sampled too, as vectors[PAIR_INPUT + site]."""
    valid = (tokens != tasks.PAD).reshape(-1)
    svd = proxies.get("svd")
    inputs = {s: proxies.get(m).input_site(s, model_cfg) for s, m in pairs
              if proxies.hook(proxies.get(m), "input_site") is not None}
    outputs = {s: proxies.get(m).output_site(s, model_cfg.n_layers) for s, m in pairs
               if proxies.hook(proxies.get(m), "output_site") is not None}

    def one_seed(p):
        rows = {} if packed is None else {"segments": packed[0], "position_offset": packed[1]}
        _, cache = model_lib.forward(p, tokens, model_cfg, cache=tuple(dict.fromkeys(
            sites + tuple(inputs.values()) + tuple(outputs.values()))), **rows)
        vectors = {s: _grouped(cache[s]) for s in sites}
        moments = {s: jax.vmap(svd.moments, in_axes=(1, None))(v, valid)
                   for s, v in vectors.items()}
        if with_vectors:
            vectors |= {PAIR_INPUT + s: _grouped(proxies.get(m).input_of(p, model_cfg, s,
                                                                         cache[inputs[s]]))
                        for s, m in pairs if s in inputs}
            vectors |= {PAIR_OUTPUT + s: _grouped(cache[o]) for s, o in outputs.items()}
        # Vectors leave the device only while k-means samples are still being gathered.
        return moments, vectors if with_vectors else {}

    return jax.vmap(one_seed)(params)


def collection_groups(specs: Sequence[ProxySpec]) -> list[list[int]]:
    """Indices of the data-dependent specs, grouped so that each group's statistics are
    collected by one program (`collect` of the group's specs): the methods whose
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
    "pairs": {"x": inputs, "y": the site's values, "valid"}}} (each where a spec needs it;
    a lens's pairs: {"x": the site's values, "y": its output site's}; "labelled": the sample
    with "z" [S, G, N, C], the classes of `labels` (int [sentences, T, C], the task's concepts
    of train's tokens: tasks.concept_labels) at the sampled positions).
    Moments (where a spec needs them) stream over all training sentences in fixed-size chunks
    (memory stays bounded); without them, only the chunks that hold the sample run,
    the sentences side by side in rows in their order (`pack_rows`; rows of full windows, the
    code task's, stay one a row); samples are the first `num_samples` non-PAD positions of the
    training sentences, which are i.i.d. draws, so this is a random sample of sentences (all
    positions of each).
    Seeds run in sequential chunks (`chunking`, see `Chunking` and `seed_chunk`); a seed's
    statistics depend on that seed alone. The params and specs are checked against the model
    first (`model.seed_labels`, `resolve_spec`); a site named by a negative layer (blocks.-1)
    has its statistics under both names.
    """
    for name, value, least in (("num_samples", num_samples, 0), ("batch_size", batch_size, 1)):
        if not isinstance(value, int | np.integer) or value < least:
            raise ValueError(f"collect: {name}={value!r}: must be an integer >= {least}")
    model_lib.seed_labels(params, model_cfg)  # a seed axis on params of this model
    resolved = [resolve_spec(s, model_cfg) for s in specs]
    if resolved != list(specs):
        stats = collect(params, train, model_cfg, resolved, num_samples=num_samples,
                        batch_size=batch_size, labels=labels, chunking=chunking)
        return {**stats, **{given: stats[site] for a, b in zip(specs, resolved, strict=True)
                            for given, site in zip(a.sites, b.sites, strict=True) if site in stats}}
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
    sampling = any(n & SAMPLED for n in needs.values())
    if sampling and num_samples == 0:
        raise ValueError("collect: num_samples=0, but "
                         + ", ".join(sorted({s.method for s in specs
                                             if s.module.STATISTIC in SAMPLED}))
                         + " fit from a sample of positions: give at least 1")
    static = dict(model_cfg=model_cfg, sites=sites, with_vectors=sampling)
    if pairs:  # (the collection program of configs without a transcoder is unchanged)
        static["pairs"] = tuple(sorted(pairs.items()))
    # The sentences packed side by side in their order (the samples are the same positions),
    # where that takes fewer rows (not the code task's full windows) and the model computes
    # each alone on them (model_cfg.packable).
    layout = pack_rows(train.tokens, in_order=True)
    packed = layout if model_cfg.packable and 0 < layout.rows < len(train.tokens) else None
    rows = () if packed is None else (packed.segments, packed.offsets)
    arrays = [train.tokens if packed is None else packed.lay(train.tokens, tasks.PAD), *rows]
    shapes = [jax.ShapeDtypeStruct((batch_size, *a.shape[1:]), a.dtype) for a in arrays]
    if labelled:
        arrays.append(labels if packed is None else packed.lay(labels, 0))
    chunk_size = seed_chunk(
        lambda w: memory.compiled_bytes(_collect_chunk, memory.seed_shapes(params, w),
                                        shapes[0], tuple(shapes[1:]) or None, **static),
        num_seeds, chunking, what="activation collection",
        lower=f"proxies.collect_batch_size (now {batch_size})")

    reads = [s for s, m in pairs.items()
             if proxies.hook(proxies.get(m), "input_site") is not None]
    writes = [s for s, m in pairs.items()
              if proxies.hook(proxies.get(m), "output_site") is not None]

    # Moments stream over every sentence; without them, the stream ends with the sample.
    streams = any("moments" in n for n in needs.values())

    def one_chunk(params):  # params: one chunk of seeds, placed
        totals, kept, classes = None, 0, []
        samples = {s: [] for s in (*sites, *(PAIR_INPUT + s for s in reads),
                                   *(PAIR_OUTPUT + s for s in writes))}
        for chunk in padded_chunks(arrays, batch_size):
            if not streams and kept >= num_samples:
                break
            watchdog.progress()
            tokens, *rest = chunk
            chunk_rows, chunk_labels = tuple(rest[:len(rows)]) or None, rest[len(rows):]
            moments, vectors = _collect_chunk(params, tokens, chunk_rows, **dict(
                static, with_vectors=sampling and kept < num_samples))
            moments = distributed.to_host(moments)  # summed on the host: no jit(add) per shape
            totals = moments if totals is None else jax.tree.map(np.add, totals, moments)
            if vectors:
                valid = (tokens != tasks.PAD).reshape(-1)
                take = np.flatnonzero(valid)[: num_samples - kept]
                for s in samples:
                    if s in vectors and needs.get(s, {"pairs"}) & SAMPLED:
                        samples[s].append(distributed.to_host(vectors[s])[:, take])
                if labelled:
                    classes.append(chunk_labels[0].reshape(len(valid), -1)[take])
                kept += len(take)
        def sample(s: str) -> dict:
            x = np.concatenate(samples[s], axis=1).transpose(0, 2, 1, 3)  # [S, G, N, F]
            return {"x": x, "valid": np.ones(x.shape[:3], bool)}

        stats = {s: {} for s in sites}
        for s in sites:
            if "moments" in needs[s]:
                stats[s]["moments"] = distributed.to_host(totals[s])  # [S, G, ...]
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
