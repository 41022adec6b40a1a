"""Evaluation: per-position metrics at the task's evaluated positions (Dyck: closing brackets),
summed into (split, breakdown) bins, as tidy rows (`evaluate`, on a `make_eval_set`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import model as model_lib
from jaxillusions import proxies, tasks
from jaxillusions.faithfulness import dictionary_metrics, metrics
from jaxillusions.faithfulness.collect import Chunking, over_seed_chunks, pack_rows, seed_chunk
from jaxillusions.faithfulness.fit import FittedProxy, make_intervention
from jaxillusions.faithfulness.specs import ProxySpec
from jaxillusions.runtime import chunks, distributed, schema, watchdog
from jaxillusions.training import memory

# A quantile q of n positions is reported only where n (1 - q) >= 1, so that at least one
# position lies beyond it: below, np.quantile interpolates between the largest values, the
# split's maximum under another name (p95: 20 positions, p99: 100). Elsewhere NaN.
JSD_MIN_POSITIONS = {name: math.ceil(round(1 / (1 - q), 6))
                     for name, q in schema.JSD_QUANTILES.items()}


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
    # Packed rows (`pack`): each token's sentence (-1: none) and its position minus its column.
    segments: np.ndarray | None = None  # [N, T]
    offsets: np.ndarray | None = None  # [N, T]


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
    pack: the families of a site (per token, or the attention pattern per query) evaluate the
        sentences side by side in rows of the widest split's width (`pack`; where
        model_cfg.packable; False: one sentence per row).
    readout: the passes compute the last block's queries and all after them, the logits
        too, at the evaluated positions only (model.Span's `readout`: the Dyck demo's closing
        brackets, at most 24 of a packed row's 42 positions), where every site a family
        replaces or reads comes before them or is read per query (`_readout_width`).
    chunking: the seed chunks and where their plan is said (`Chunking`)."""

    shared: Sequence[FittedProxy] = ()
    one_width: bool | None = None
    share_prefix: bool = True
    pack: bool = True
    readout: bool = True
    chunking: Chunking = Chunking()


@dataclasses.dataclass(frozen=True)
class EvalProgram:
    """What one compiled evaluation program is: _eval_chunk's static argument (hashable; each
    distinct value compiles once). `num_sizes` sizes of proxy `method`; `num_bins` per breakdown
    (EvalSet.num_bins); one branch per width of `widths`; the sizes' passes start at block
    `start_layer` (None: each runs the whole model); the logits at `readout` evaluated
    positions per row (model.Span's `readout`; 0: at every position)."""

    model_cfg: model_lib.ModelConfig
    method: str
    num_sizes: int
    num_bins: tuple[int, ...]
    widths: tuple[int, ...]
    start_layer: int | None
    options: tuple = ()  # a whole-model proxy's options (its spec's): logits(**options)
    readout: int = 0


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


def pack(eval_set: EvalSet) -> EvalSet:
    """`eval_set`'s sentences side by side in rows of its widest width, each up to its last
    token, at the first row with room, the longest first (first-fit decreasing), with each
    token's sentence (`segments`) and position offset (`offsets`): model.forward computes for
    each what it computes for the sentence alone. `eval_set` itself where that saves no
    positions (rows of full windows: code) or where a sentence's prediction is scored at its
    last token or after it (its target would be the next sentence's first token, or left
    out)."""
    tokens, width = eval_set.tokens, eval_set.tokens.shape[1]
    layout = pack_rows(tokens, in_order=False)
    length = layout.length
    # Positions computed one sentence a row, each at the narrowest width that holds it.
    alone = np.array(eval_set.widths)[np.searchsorted(eval_set.widths, length)].sum()
    if not 0 < layout.rows * width < alone or (
            eval_set.evaluated & (np.arange(width)[None, :] >= length[:, None] - 1)).any():
        return eval_set
    return dataclasses.replace(
        eval_set, tokens=layout.lay(tokens, tasks.PAD),
        evaluated=layout.lay(eval_set.evaluated, False), bins=layout.lay(eval_set.bins, 0),
        widths=(width,), segments=layout.segments, offsets=layout.offsets)


# The members of an evaluation pass (_eval_chunk): the original model, its sites zeroed (for the
# dictionary metrics), a size of the proxy.
_ORIGINAL, _ZERO, _PROXY = 0, 1, 2


@functools.partial(jax.jit, static_argnames=("program",))
def _eval_chunk(params, proxy_params, active, data: tuple, width_index, *,
                program: EvalProgram):
    """K chunks [K, B, T] of every seed and size, `data` their tokens, evaluated, bins,
    segments and offsets (`_arrays`; the last two None unless packed) and their rows' evaluated
    positions [K, B, program.readout] (`chunks.readout`, -1 past a row's last; None: no
    readout). The chunks run one after another in the program (chunks.in_turn: a large
    vocabulary's logits, chunks.logit_rows). The program holds one branch per width of
    program.widths; `width_index` [K] picks the one that runs each chunk, on its first `width`
    columns (the rest are padding: a causal model's values before them do not depend on them).
    program.start_layer: the sizes' passes start at this block from the original pass's
    residual stream (nothing before it is replaced: model.first_block); None: each runs the
    whole model.
    Returns ((binned sums, dictionary metric sums: {} for pattern proxies; over the K chunks,
    added in order), per-position JSD [..., K, B, T], or [..., K, B, program.readout] at the
    readout positions)."""
    model_cfg, num_bins, start_layer = program.model_cfg, program.num_bins, program.start_layer
    module = proxies.get(program.method)
    extra = dictionary_metrics.enabled(module)  # dictionary metrics (fvu, l0, dead, ce/kl_score)
    resume = () if start_layer is None else (model_lib.residual_site(model_cfg, start_layer),)

    size_axis = 0 if module.STATISTIC is None else 1  # see FittedProxy

    def at_width(width: int, data: tuple):
        *data, readout = data
        tokens, evaluated, bins, segments, offsets = (
            None if a is None else a[:, :width] for a in data)
        rows = {} if segments is None else {"segments": segments, "position_offset": offsets}
        # At the positions the logits are computed at: the next tokens, the scored ones, bins.
        targets, scored, scored_bins = jnp.roll(tokens, -1, axis=1), evaluated, bins
        if readout is not None:  # each row's evaluated positions, then -1 (scoring nothing)
            targets, scored_bins = (model_lib.at_positions(a, readout) for a in (targets, bins))
            scored = readout >= 0
        weight = scored.astype(jnp.float32)

        def binned(values: jax.Array) -> list[jax.Array]:
            """values [B, P, M] -> per breakdown, sums [num_bins, M] over scored positions."""
            return [jnp.einsum("btm,btk->km", values * weight[..., None],
                               jax.nn.one_hot(scored_bins[..., i], nb, dtype=jnp.float32))
                    for i, nb in enumerate(num_bins)]

        def passes(p, site_params):
            """(The original model's logits [B, P, V], each size's [R, B, P, V], with the
            dictionary metrics the zero ablation's [B, P, V] (else None), and the original
            values of the sites those metrics read), from the residual stream at start_layer
            when there is one. Batched passes: with the dictionary metrics one over the original
            and the zero ablation, and one over the sizes; else one over the original and the
            sizes (the proxy runs, unused, on the original's member too). Unbatched passes of
            one seed's model beside each other made XLA:CPU write each bias and constant they
            share out to memory at the full activation shape (docs/speed.md)."""
            sites = dictionary_metrics.cache_sites(module, active, model_cfg) if extra else ()
            span = model_lib.Span(readout=readout)
            if start_layer is not None:  # only the prefix is used: XLA drops the rest
                _, prefix = model_lib.forward(p, tokens, model_cfg, cache=resume, **rows)
                span = model_lib.Span(start_layer, prefix[resume[0]], readout)

            def member(size_params, kind):
                """A pass by `kind`: without size_params the original or the active sites
                zeroed; with them the original or one size's proxy (kind None: the proxy)."""
                proxied = None if size_params is None else \
                    make_intervention(module, size_params, active, p, model_cfg)

                def intervention(name: str, value: jax.Array) -> jax.Array:
                    if proxied is None:
                        return jnp.where((kind == _ZERO) & active[name], 0.0, value) \
                            if name in active else value
                    new = proxied(name, value)
                    return new if kind is None or new is value else \
                        jnp.where(kind == _PROXY, new, value)

                return model_lib.forward(p, tokens, model_cfg, span=span,
                                         intervention=intervention, cache=sites, **rows)

            if extra:
                logits, cache = jax.vmap(functools.partial(member, None))(
                    jnp.array([_ORIGINAL, _ZERO]))
                proxy_logits, _ = jax.vmap(member, in_axes=(size_axis, None))(site_params, None)
                return logits[0], proxy_logits, logits[1], jax.tree.map(lambda x: x[0], cache)
            index = np.arange(-1, program.num_sizes).clip(0)  # the original's, then the sizes
            members = jax.tree.map(lambda x: jnp.take(x, index, axis=size_axis), site_params)
            kinds = jnp.array([_ORIGINAL] + [_PROXY] * program.num_sizes)
            logits, cache = jax.vmap(member, in_axes=(size_axis, 0))(members, kinds)
            return logits[0], logits[1:], None, cache

        def one_seed(p, site_params):
            if module.SITE == "model":  # one family per program: its one site
                logits, _ = model_lib.forward(p, tokens, model_cfg)
                proxy_logits = jax.vmap(
                    lambda whole: module.logits(jax.tree.map(lambda x: x[0], whole), p, tokens,
                                                model_cfg, **dict(program.options)),
                    in_axes=size_axis)(*site_params.values())
                zero_logits, cache = None, {}
            else:
                logits, proxy_logits, zero_logits, cache = passes(p, site_params)
            if extra:
                batch = dictionary_metrics.Batch(
                    tokens=tokens, split_ids=bins[..., 0], num_splits=num_bins[0],
                    logits=logits, targets=targets, scored=scored,
                    scored_splits=scored_bins[..., 0])
                seed_sums = dictionary_metrics.seed_sums(active, cache, batch, zero_logits)
            acc_original = metrics.correct(logits, targets)

            def one_size(size_params, proxy_logits):
                values = jnp.stack([jnp.ones_like(weight), metrics.jsd(logits, proxy_logits),
                                    metrics.same_pred(logits, proxy_logits), acc_original,
                                    metrics.correct(proxy_logits, targets)], axis=-1)
                if not extra:
                    return binned(values), values[..., 1], {}  # and per-position JSD [B, P]
                return binned(values), values[..., 1], dictionary_metrics.size_sums(
                    module, size_params, p, model_cfg, active, cache, batch, proxy_logits)

            sums, jsd, size_sums = jax.vmap(one_size, in_axes=(size_axis, 0))(site_params,
                                                                              proxy_logits)
            return sums, jsd, {"seed": seed_sums, "size": size_sums} if extra else {}

        seed_axis = None if module.STATISTIC is None else 0
        sums, jsd, dict_sums = jax.vmap(one_seed, in_axes=(0, seed_axis))(params, proxy_params)
        pad = [(0, 0)] * (jsd.ndim - 1) + [(0, jsd_width - jsd.shape[-1])]
        return (sums, dict_sums), jnp.pad(jsd, pad)  # one shape for every branch

    jsd_width = data[0].shape[2] if data[-1] is None else data[-1].shape[2]
    branches = [functools.partial(at_width, w) for w in program.widths]

    def one_chunk(chunk: tuple):
        data, index = chunk
        return jax.lax.switch(index, branches, data)

    total, jsd = chunks.in_turn(one_chunk, (data, width_index))
    return total, jnp.moveaxis(jsd, 0, -3)


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
    `seeds`: a label per member of `params` (ValueError where the counts of params, seeds and
    the fitted proxies' seeds disagree); `fitted`'s sites as the model names them or by a
    negative layer (blocks.-1). Seeds marked unhealthy (diverged in training) are left out.
    `options` (`EvalOptions`) sets how the programs are laid out and run; none of it changes
    what is measured. Seeds run in sequential chunks (options.chunking; the plan is made per
    proxy family).

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
    options.pack: the families of a site run the sentences side by side in rows of the widest
    split's width (`pack`), one branch, where that computes fewer positions (the Dyck demo:
    869 rows of 42 positions against 1,800 sentences of 26 or 42; docs/speed.md): vector
    proxies act per token, and the pattern proxies per query on the keys its sentence may
    attend to (one-hot attention's argmax is among them, the masked keys' weights being 0;
    uniform attention reads the mask from the scores). Whole-model families keep one sentence
    a row, and so does every family of a model that reads a row as one sentence (a built
    front, standing uniform attention: `model_cfg.packable`). The rows agree within float32
    rounding (sums in another order; a near-tie may flip).

    Per seed and chunk the model's prefix (the blocks before the first that a family of the
    program replaces) runs once, and from its residual stream the original model and every
    size run as one batched pass (with the dictionary metrics, two: the original and the zero
    ablation, then the sizes). Sharing the prefix saves less than it seems: under vmap over
    sizes, whole passes already compute what does not depend on the size once (vmap batches
    only what reads the size's parameters), so what it saves is the duplicate of the prefix
    (docs/speed.md: 1.0-1.1x on the Dyck demo). Batching the original with the sizes saved
    more: the Dyck demo's compiled evaluation calls ran 1.15x faster (docs/speed.md).
    options.share_prefix=False runs whole passes per size (the same rows within float32
    rounding; for tests and benchmarks).

    options.readout: the passes compute the last block's keys and values at every position, and
    its queries, the rest of the model, the logits and the metrics at the evaluated positions
    only (the Dyck demo: the closing brackets, at most 24 in a packed row of 42), where the
    program's sites and the sites its proxies read or write all come before the last block's
    queries are read out (`model.before_readout`), or are a pattern proxy's, which acts per
    query (`_readout_width`). The rows agree with those at every position within float32
    rounding (matrix products over fewer rows).
    """
    if not isinstance(batch_size, int | np.integer) or batch_size < 1:
        raise ValueError(f"evaluate: batch_size={batch_size!r}, sentences per chunk: must be an "
                         "integer >= 1")
    seeds = model_lib.seed_labels(params, model_cfg, seeds)  # one label per member of params
    fitted = [proxy.resolved(model_cfg) for proxy in fitted]  # sites as the model names them
    for proxy in fitted:
        if proxy.num_seeds not in (None, len(seeds)):
            raise ValueError(f"fitted: {proxy.spec.method} on {proxy.spec.target} was fitted "
                             f"for {proxy.num_seeds} seeds, params have {len(seeds)}")
    rows, num_seeds = [], len(seeds)
    # A large vocabulary's logits, the original's and each size's: in chunks of the rows that
    # fit (chunks.logit_rows; a small vocabulary's batches are as given), a call's batch_size
    # rows in chunks run one after another inside it.
    chunk_rows = chunks.logit_rows(batch_size, eval_set.tokens.shape[1], model_cfg.vocab_size,
                                   1 + max((len(p.spec.sizes) for p in fitted), default=1))
    params = distributed.shard_seeds(params)  # placed once for all families (padded)
    one_width = options.one_width
    if one_width is None:
        one_width = jax.default_backend() != "cpu"
    packed = pack(eval_set) if options.pack and model_cfg.packable and any(
        p.spec.module.SITE != "model" for p in fitted) else eval_set
    programs = _program_sites([*fitted, *options.shared])
    for proxy in fitted:
        sites = programs[_program_key(proxy.spec)]
        whole = proxy.spec.module.SITE == "model"  # replaces the whole forward pass
        layout = eval_set if whole else packed  # a site's proxy: per token or query
        program = EvalProgram(model_cfg, proxy.spec.method, len(proxy.spec.sizes),
                              eval_set.num_bins,
                              layout.widths[-1:] if one_width else layout.widths,
                              model_lib.first_block(model_cfg, sites)
                              if options.share_prefix and not whole else None,
                              proxy.spec.options if whole else (),
                              _readout_width(proxy.spec.module, sites, model_cfg, layout)
                              if options.readout and not whole else 0)
        steps = chunks.steps(len(layout.tokens), chunk_rows, batch_size)
        (totals, dict_sums), jsd = _evaluate_family(params, num_seeds, layout, proxy, sites,
                                                    program, (steps, chunk_rows),
                                                    options.chunking)
        # The split of each evaluated position, in the order of the per-position JSD (the
        # chunks' row-major order; their padding rows score nothing).
        split_ids = layout.bins[..., 0][layout.evaluated]
        quantiles = _jsd_quantiles(jsd, split_ids, len(eval_set.split_names))
        extra = dictionary_metrics.columns(proxy.spec, proxy.params, **dict_sums) if dict_sums \
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
                     program_sites: dict, program: EvalProgram, batch: tuple[int, int],
                     chunking: Chunking) -> tuple[tuple[list[np.ndarray], dict], np.ndarray]:
    """One family's summed metrics per breakdown [S, R, bins, 5] with its dictionary metric
    sums (dictionary_metrics.seed_sums/size_sums, {} for pattern proxies), and per-position JSD
    at the evaluated positions [S, R, n], for the first `num_seeds` seeds of `params` (placed,
    maybe padded), in calls of `batch` = (steps, rows) chunks of rows (see `evaluate`), by
    `program`, which replaces the sites of `program_sites` ({site: one family's fitted params},
    _program_sites)."""
    spec = proxy.spec
    per_seed = spec.module.STATISTIC is not None  # else one proxy for all seeds
    # Sites of the program that this family does not simplify get zeros (never applied).
    site_params = {s: proxy.params[s] if s in proxy.params
                   else jax.tree.map(lambda x: np.zeros(np.shape(x), x.dtype), p)
                   for s, p in program_sites.items()}
    active = {s: np.bool_(s in proxy.params) for s in program_sites}
    widest = tuple(None if a is None else jax.ShapeDtypeStruct((*batch, *a.shape[1:]),
                                                               a.dtype)
                   for a in _arrays(eval_set)) + (
        jax.ShapeDtypeStruct((*batch, program.readout), np.int32) if program.readout
        else None,)
    chunk_size = seed_chunk(
        lambda w: memory.compiled_bytes(
            _eval_chunk, memory.seed_shapes(params, w),
            memory.seed_shapes(site_params, w) if per_seed else site_params, active, widest,
            np.zeros(batch[0], np.int32), program=program),
        num_seeds, chunking, what=f"evaluating {spec.method} on {spec.target}",
        lower=f"proxies.eval_batch_size (now {batch[0] * batch[1]} rows a call)")

    def one_chunk(params, proxy_params=site_params):
        totals, jsd = None, []
        for chunk, width_index in _eval_batches(eval_set, batch, program.widths,
                                                program.readout):
            out, jsd_chunk = _eval_chunk(params, proxy_params, active, chunk, width_index,
                                         program=program)
            # Summed on the host (the same float32 sums): jnp.add compiled a program per shape.
            out = distributed.to_host(out)
            totals = out if totals is None else jax.tree.map(np.add, totals, out)
            # Per-position JSD at the evaluated positions only, one family at a time (in
            # row-major order: the readout positions of a row ascend).
            scored = chunk[1] if chunk[-1] is None else chunk[-1] >= 0  # [K, B, T]
            jsd.append(np.asarray(distributed.to_host(jsd_chunk), np.float32)
                       [..., scored])  # [S, R, n]
        return totals, np.concatenate(jsd, axis=-1)

    trees = [params, site_params] if per_seed else [params]
    return over_seed_chunks(one_chunk, trees, num_seeds, chunk_size)


def _arrays(eval_set: EvalSet) -> list[np.ndarray | None]:
    """_eval_chunk's `data`: tokens, evaluated, bins, segments, offsets (None: not packed)."""
    return [eval_set.tokens, eval_set.evaluated, eval_set.bins, eval_set.segments,
            eval_set.offsets]


def _eval_batches(eval_set: EvalSet, batch: tuple[int, int], widths: Sequence[int] = (),
                  readout: int = 0):
    """(_eval_chunk's `data` (`_arrays`, then each row's first `readout` evaluated positions
    or None), the indices into `widths`) per call of batch = (K, B): K chunks of B rows, each
    [K, B, ...], as wide as the widest split (one shape: one compilation); a chunk's index
    (`widths` sorted, the last the widest) is of the narrowest that holds its tokens."""
    steps, rows = batch
    arrays = _arrays(eval_set)
    present = [a for a in arrays if a is not None]
    for call in chunks.calls(present, steps, rows):
        watchdog.progress()
        used = [int(c.nonzero()[0].max(initial=0)) + 1 for c in (call[0] != tasks.PAD).any(1)]
        parts = iter(call)
        data = tuple(None if a is None else next(parts) for a in arrays)
        yield ((*data, chunks.readout(data[1], readout) if readout else None),
               np.array([next((i for i, w in enumerate(widths) if w >= u), 0) for u in used],
                        np.int32))


def _readout_width(module, sites: dict, model_cfg: model_lib.ModelConfig,
                   eval_set: EvalSet) -> int:
    """The readout positions per row of a program of `module` replacing `sites`: the most
    evaluated positions of any row of `eval_set`, or 0 (every position) where it would compute
    no fewer, or where a site it replaces, reads (`input_site`) or writes (a lens's
    `output_site`) is computed at the read-out positions only (model.before_readout) and the
    proxy needs its every position: all but a pattern proxy, which replaces the attention
    pattern query by query (from the scores, uniform attention)."""
    read, written = proxies.hook(module, "input_site"), proxies.hook(module, "output_site")
    touched = () if module.SITE == "pattern" else [
        *sites, *(read(s, model_cfg) for s in sites if read is not None),
        *(written(s, model_cfg.n_layers) for s in sites if written is not None)]
    return chunks.readout_width(eval_set.evaluated) if model_lib.before_readout(
        model_cfg, touched) else 0


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
