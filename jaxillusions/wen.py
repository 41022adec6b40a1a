"""Measurements of Wen et al. ("Transformers are uninterpretable with myopic methods"), batched
over the leading seed (member) axis of the parameters.

- attention variation between seeds (section 4.1): for two attention patterns A, B of the same
  input, the mean over query rows of ||A_i - B_i||^2; its mean over all pairs of seeds per layer
  and head, with a jackknife-over-seeds interval, against random causal row-stochastic patterns
  (rows uniform on the simplex; closed form `random_baseline`, Monte Carlo `random_baseline_mc`);
- balance violation of the last layer (eqs. 15-17) of a model with a minimal first layer, for
  any number of bracket types, through the model's own token ids (`balance_violation`);
- length generalization (section 4.2) on valid prefixes much longer than training sentences
  (`length_prefixes`, `length_generalization`).
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from jaxillusions import metrics
from jaxillusions import model as model_lib
from jaxillusions.data import dyck

# ------------------------------------------------------------------------- attention variation


def attention_prefix(num_types: int, max_depth: int) -> np.ndarray:
    """BOS, then for each type t: D opens of t and D closes of t. Every bracket type appears
    open at every depth 1..D and closed at every depth 0..D-1. int32 [1 + 2kD]."""
    body = [np.r_[np.full(max_depth, dyck.open_id(t, num_types)),
                  np.full(max_depth, dyck.close_id(t, num_types))] for t in range(num_types)]
    return np.concatenate([[dyck.BOS], *body]).astype(np.int32)


def attention_patterns(params, tokens: np.ndarray, cfg: model_lib.ModelConfig
                       ) -> dict[int, np.ndarray]:
    """{layer: patterns [S, heads, T, T]} of every attention layer on one sequence tokens [T]."""
    sites = [s for s in model_lib.site_names(cfg) if s.endswith(".attn.pattern")]
    cache = _patterns(params, jnp.asarray(tokens)[None], cfg=cfg, sites=tuple(sites))
    return {int(s.split(".")[1]): np.asarray(cache[s][:, 0]) for s in sites}


@functools.partial(jax.jit, static_argnames=("cfg", "sites"))
def _patterns(params, tokens, *, cfg, sites):
    return jax.vmap(lambda p: model_lib.forward(p, tokens, cfg, cache=sites)[1])(params)


def attention_variation(a: jax.Array, b: jax.Array) -> jax.Array:
    """Mean over query rows of the squared L2 distance between rows: [..., T, T] -> [...]."""
    return jnp.mean(jnp.sum((a - b) ** 2, axis=-1), axis=-1)


def pairwise_variation(patterns: np.ndarray) -> np.ndarray:
    """patterns [S, ..., T, T] -> variation between every two seeds [S, S, ...]."""
    p = jnp.asarray(patterns)
    return np.asarray(jax.vmap(lambda a: jax.vmap(lambda b: attention_variation(a, b))(p))(p))


def mean_over_pairs(matrix: np.ndarray) -> tuple[float, float, float]:
    """Mean of a symmetric [S, S] matrix over the S(S-1)/2 pairs i < j, with a 95% interval from
    the jackknife over seeds (pairs sharing a seed are not independent, so the interval reflects
    the number of seeds, not of pairs). Returns (mean, low, high)."""
    s = matrix.shape[0]
    if s < 2:
        return float("nan"), float("nan"), float("nan")
    off = ~np.eye(s, dtype=bool)
    mean = matrix[off].mean()
    if s < 3:
        return float(mean), float("nan"), float("nan")
    # Leave seed i out: the mean over pairs among the other seeds.
    total, row = matrix[off].sum(), np.where(off, matrix, 0).sum(1)
    loo = (total - 2 * row) / ((s - 1) * (s - 2))
    se = math.sqrt((s - 1) / s * np.sum((loo - loo.mean()) ** 2))
    t = stats.t.ppf(0.975, s - 1)
    return float(mean), float(mean - t * se), float(mean + t * se)


def random_baseline(length: int, causal: bool = True) -> float:
    """Expected attention variation of two independent random patterns [T, T] whose rows are
    uniform on the simplex (Dirichlet(1, ..., 1)) over the n allowed keys: per row
    E||X - Y||^2 = 2 * sum_j Var(X_j) = 2 (n - 1) / (n (n + 1)); n = i + 1 for causal row i
    (as our models' patterns), n = T for full square matrices."""
    n = np.arange(1, length + 1) if causal else np.full(length, length)
    return float(np.mean(2 * (n - 1) / (n * (n + 1))))


def random_baseline_mc(key: jax.Array, length: int, num_samples: int = 2000,
                       causal: bool = True) -> float:
    """Monte-Carlo estimate of random_baseline: pairs of random patterns whose rows are uniform
    on the simplex (normalized exponentials), restricted to the causal keys."""
    mask = np.tril(np.ones((length, length))) if causal else np.ones((length, length))
    e = jax.random.exponential(key, (2, num_samples, length, length)) * mask
    rows = e / e.sum(-1, keepdims=True)
    return float(attention_variation(rows[0], rows[1]).mean())


# --------------------------------------------------------------------------- balance violation


def _last_layer_terms(params, cfg: model_lib.ModelConfig, keys: jax.Array, queries: jax.Array):
    """u(key; query) of the last layer for first-layer outputs keys [..., d] and queries [Q, d]:
    exp(score) * (the key's attention-output contribution, centred over d_model as the next
    LayerNorm does), concatenated over heads -> [Q, ..., heads * d]."""
    block = params["blocks"][cfg.n_layers - 1]
    a = block["attn"]

    def ln(x):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * block["ln1"]["scale"] + block["ln1"]["bias"]

    hk, hq = ln(keys), ln(queries)
    k = jnp.einsum("...d,dhe->...he", hk, a["w_k"])
    v = jnp.einsum("...d,dhe->...he", hk, a["w_v"]) + a["b_v"]
    q = jnp.einsum("qd,dhe->qhe", hq, a["w_q"]) + a["b_q"]
    out = jnp.einsum("...he,hed->...hd", v, a["w_o"])
    out = out - out.mean(-1, keepdims=True)  # the projection orthogonal to all-ones
    scores = jnp.einsum("qhe,...he->q...h", q, k) / math.sqrt(cfg.head_dim)
    u = jnp.exp(scores)[..., None] * out  # [Q, ..., h, d]
    return u.reshape(*u.shape[:-2], -1)


def _check_balance_model(cfg: model_lib.ModelConfig) -> None:
    if cfg.first_layer != "minimal" or cfg.n_layers != 2:
        raise ValueError("balance violation is defined for 2-layer models with a minimal first "
                         f"layer (model.first_layer='minimal', n_layers=2); got first_layer="
                         f"{cfg.first_layer!r}, n_layers={cfg.n_layers}")
    if cfg.uniform_attention_layers:
        raise ValueError("balance violation: uniform_attention_layers is not supported")


def minimal_features(params, cfg: model_lib.ModelConfig, tokens, depths) -> jax.Array:
    """The minimal first layer's output for (token, depth) arrays (one model)."""
    depths = jnp.clip(jnp.asarray(depths), 0, cfg.depth_bins - 1)
    return params["blocks"][0]["minimal"]["table"][jnp.asarray(tokens) * cfg.depth_bins + depths]


def balance_terms(params, cfg: model_lib.ModelConfig) -> dict[str, jax.Array]:
    """delta (eq. 15), Delta (eq. 17) and the balance violation delta / Delta of ONE model.

    delta: the largest norm, over bracket types t, depths d in 1..D and every possible last token
    (each bracket at each depth it can occur at, and BOS), of u(open t at d) + u(close t at d-1),
    where u(x) = exp(q_last . k_x / sqrt(d_head)) * centred W_O v_x (what a matched pair adds to
    the last position's unnormalized attention output).
    Delta: over prefixes of D open brackets (after BOS), the smallest distance between the
    unnormalized attention outputs at the last position of two prefixes that differ only in the
    last (depth D) bracket.
    """
    _check_balance_model(cfg)
    k, depth = len(cfg.open_ids), cfg.max_depth
    if k ** depth > 1 << 16:
        raise ValueError(f"balance violation enumerates k^D = {k}^{depth} open prefixes; more "
                         "than 65536 is not supported")
    opens, closes = jnp.asarray(cfg.open_ids), jnp.asarray(cfg.close_ids)
    d = jnp.arange(1, depth + 1)
    feats = functools.partial(minimal_features, params, cfg)
    open_f = feats(opens[:, None], d[None])  # [k, D, d_model]: open t at depth d
    close_f = feats(closes[:, None], d[None] - 1)  # its matching close, at depth d - 1
    bos_f = feats(jnp.asarray([dyck.BOS]), jnp.zeros(1, jnp.int32))  # [1, d_model]
    queries = jnp.concatenate([open_f.reshape(-1, open_f.shape[-1]),
                               close_f.reshape(-1, close_f.shape[-1]), bos_f])
    pair = (_last_layer_terms(params, cfg, open_f, queries)
            + _last_layer_terms(params, cfg, close_f, queries))  # [Q, k, D, F]
    delta = jnp.linalg.norm(pair, axis=-1).max()

    # Open prefixes: the query is the last bracket (type tau at depth D).
    last_q = open_f[:, -1]  # [k, d_model]
    u_open = _last_layer_terms(params, cfg, open_f, last_q)  # [tau, t, depth, F]
    u_bos = _last_layer_terms(params, cfg, bos_f, last_q)[:, 0]  # [tau, F]
    common = jnp.asarray(list(itertools.product(range(k), repeat=depth - 1)),
                         jnp.int32).reshape(-1, depth - 1)  # [C, D-1]: the shared first brackets
    pos = jnp.arange(depth - 1)
    shared = u_open[:, common, pos].sum(2)  # [tau, C, F]
    s = u_bos[:, None] + shared + u_open[jnp.arange(k), jnp.arange(k), depth - 1][:, None]
    dist = jnp.linalg.norm(s[:, None] - s[None], axis=-1)  # [tau, tau', C]
    dist = jnp.where(jnp.eye(k, dtype=bool)[..., None], jnp.inf, dist)
    big_delta = dist.min()
    return {"delta": delta, "Delta": big_delta, "balance_violation": delta / big_delta}


def balance_violation(params, cfg: model_lib.ModelConfig) -> dict[str, np.ndarray]:
    """balance_terms for every seed: {"delta", "Delta", "balance_violation"} -> [S]."""
    _check_balance_model(cfg)
    out = jax.jit(jax.vmap(functools.partial(balance_terms, cfg=cfg)))(params)
    return {name: np.asarray(v) for name, v in out.items()}


# ------------------------------------------------------------------------ length generalization


def length_prefixes(rng: np.random.Generator, num: int, num_types: int, max_depth: int,
                    length: int) -> np.ndarray:
    """num valid Dyck-(k, D) prefixes of `length` brackets after BOS, int32 [num, length + 1].

    The prefix process of Wen et al. (their distribution with q = 1/2): at depth 0 open, at
    depth D close, otherwise open or close with probability 1/2; open types uniform, a close
    matches the innermost open bracket. Every position is itself a valid prefix."""
    tokens = np.zeros((num, length + 1), np.int32)
    tokens[:, 0] = dyck.BOS
    stack = np.zeros((num, max_depth), np.int32)
    depth = np.zeros(num, np.int32)
    rows = np.arange(num)
    for t in range(1, length + 1):
        coin = rng.random(num) < 0.5
        opening = (depth == 0) | ((depth < max_depth) & coin)
        types = rng.integers(num_types, size=num)
        top = stack[rows, np.maximum(depth - 1, 0)]
        tokens[:, t] = np.where(opening, dyck.open_id(types, num_types),
                                dyck.close_id(top, num_types))
        stack[rows[opening], depth[opening]] = types[opening]
        depth += np.where(opening, 1, -1)
    return tokens


@functools.partial(jax.jit, static_argnames=("cfg", "members_per_call"))
def _length_scores(params, tokens, evaluate, threshold, *, cfg, members_per_call: int):
    close = jnp.asarray(cfg.close_ids)

    def one(p):
        logits, _ = model_lib.forward(p, tokens[:, :-1], cfg)
        targets = tokens[:, 1:]
        probs = jax.nn.softmax(logits.astype(jnp.float32), -1)
        on_close = probs[..., close]  # [B, T, k]
        share = (jnp.take_along_axis(probs, targets[..., None], -1)[..., 0]
                 / on_close.sum(-1))
        ok = evaluate[:, 1:]
        return {"share_correct": ((share > threshold) & ok).sum(),
                "argmax_correct": ((logits.argmax(-1) == targets) & ok).sum()}

    # Members in groups: long sequences make each member's attention scores large.
    return jax.lax.map(one, params, batch_size=members_per_call)


def length_generalization(params, cfg: model_lib.ModelConfig, tokens: np.ndarray, min_len: int,
                          *, threshold: float = 0.8, batch_size: int = 16,
                          members_per_call: int = 8) -> dict[str, np.ndarray]:
    """Accuracy [S] on the closing brackets of valid prefixes tokens [N, L+1] (BOS + L brackets)
    at prefix lengths min_len..L: "acc" (Wen et al.: the correct closing bracket gets more than
    `threshold` of the probability given to closing brackets) and "argmax_acc" (it is the argmax
    over the whole vocabulary). Only prefixes ending in a closing bracket count (the next token
    is then determined)."""
    if cfg.pos_encoding not in ("none", "linear"):
        raise ValueError(f"length generalization needs model.pos_encoding 'none' or 'linear' "
                         f"(got {cfg.pos_encoding!r}: its positions beyond the training length "
                         "are untrained or unseen)")
    if tokens.shape[1] > cfg.max_len:
        raise ValueError(f"length generalization prefixes have {tokens.shape[1]} tokens but the "
                         f"model supports {cfg.max_len}: set model.max_len >= {tokens.shape[1]} "
                         "(it fixes the linear position scale, so set it before training)")
    position = np.arange(tokens.shape[1])
    evaluate = np.isin(tokens, cfg.close_ids) & (position >= min_len)
    total = None
    from jaxillusions.data import padded_chunks  # noqa: PLC0415

    for chunk, ok in padded_chunks([tokens, evaluate], batch_size):
        out = _length_scores(params, chunk, ok, threshold, cfg=cfg,
                             members_per_call=members_per_call)
        total = out if total is None else jax.tree.map(jnp.add, total, out)
    count = evaluate.sum()
    return {"acc": np.asarray(total["share_correct"]) / count,
            "argmax_acc": np.asarray(total["argmax_correct"]) / count,
            "count": np.full(len(total["share_correct"]), count)}


def mean_ci(values: np.ndarray) -> tuple[float, float]:
    """Mean and 95% t-interval half-width over the finite values."""
    values = np.asarray(values, np.float64)
    mean, ci = metrics.mean_ci95(values[np.isfinite(values)])
    return float(mean), float(ci)
