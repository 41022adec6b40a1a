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

import dataclasses
import functools
import itertools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import model as model_lib
from jaxillusions.config.fields import BOOL, INT, NUMBER, STR, nonnegative, positive, setting
from jaxillusions.report import figures, tables
from jaxillusions.report import stats as interval_stats
from jaxillusions.runtime import distributed
from jaxillusions.runtime.chunks import padded_chunks
from jaxillusions.studies.stage import FINAL_EVAL, TRAINED, Stage
from jaxillusions.studies.wen_figures import (
    _patterns_figure,
    attention_figure,
    balance_figure,
    length_figure,
)
from jaxillusions.tasks import dyck as dyck_task
from jaxillusions.tasks import dyck_sentences
from jaxillusions.tasks.minimal_layer import MinimalFirstLayer
from jaxillusions.training import train

# ------------------------------------------------------------------------- attention variation


def attention_prefix(num_types: int, max_depth: int) -> np.ndarray:
    """BOS, then for each type t: D opens of t and D closes of t. Every bracket type appears
    open at every depth 1..D and closed at every depth 0..D-1. int32 [1 + 2kD]."""
    body = [np.r_[np.full(max_depth, dyck_sentences.open_id(t, num_types)),
                  np.full(max_depth, dyck_sentences.close_id(t, num_types))]
            for t in range(num_types)]
    return np.concatenate([[dyck_sentences.BOS], *body]).astype(np.int32)


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
    """(scores [Q, ..., heads], values [..., heads, d]) of the last layer for first-layer outputs
    keys [..., d] and queries [Q, d]: u(key; query) = exp(score) * value, the value being the
    key's attention-output contribution, centred over d_model as the next LayerNorm does. The
    exponential is left to the caller, which scales it so that it cannot overflow."""
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
    return jnp.einsum("qhe,...he->q...h", q, k) / math.sqrt(cfg.head_dim), out


def _scaled(scores: jax.Array, out: jax.Array, shift: jax.Array) -> jax.Array:
    """exp(scores - shift) * out, concatenated over heads: [Q, ..., h] x [..., h, d] ->
    [Q, ..., h * d]; shift broadcasts against the scores' leading axes."""
    u = jnp.exp(scores - shift)[..., None] * out
    return u.reshape(*u.shape[:-2], -1)


def balance_undefined(cfg: model_lib.ModelConfig) -> str | None:
    """Why the balance violation is not defined for (or not computed on) this model, or None."""
    if not isinstance(cfg.front, MinimalFirstLayer) or cfg.n_layers != 2:
        return ("it is defined for 2-layer models with a minimal first layer "
                "(model.first_layer='minimal', n_layers=2); got first layer "
                f"{type(cfg.front).__name__ if cfg.front else 'standard'}, n_layers={cfg.n_layers}")
    if cfg.interventions:  # eq. 17 reads the last layer's own attention scores
        return "the attention of model.uniform_attention_layers is not the model's own"
    k, depth = len(cfg.front.open_ids), cfg.front.max_depth
    if k ** depth > 1 << 16:
        return f"it enumerates k^D = {k}^{depth} open prefixes; more than 65536 is not supported"
    return None


def _check_balance_model(cfg: model_lib.ModelConfig) -> None:
    why = balance_undefined(cfg)
    if why is not None:
        raise ValueError(f"balance violation: {why}")


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
    log_delta, log_big_delta = _log_balance_terms(params, cfg)
    return {"delta": jnp.exp(log_delta), "Delta": jnp.exp(log_big_delta),
            "balance_violation": jnp.exp(log_delta - log_big_delta)}


def _log_balance_terms(params, cfg: model_lib.ModelConfig) -> tuple[jax.Array, jax.Array]:
    """(log delta, log Delta) of balance_terms. Every exp(score) is taken less the largest score
    it is compared with (per query for delta; one for all of Delta's terms, whose queries
    differ), and that shift is added back to the log: scores of 90 and more overflowed float32
    (a healthy, sharply attending member's violation read NaN)."""
    _check_balance_model(cfg)
    part = cfg.front
    k, depth = len(part.open_ids), part.max_depth
    opens, closes = jnp.asarray(part.open_ids), jnp.asarray(part.close_ids)
    d = jnp.arange(1, depth + 1)
    feats = functools.partial(part.features_of, params)
    open_f = feats(opens[:, None], d[None])  # [k, D, d_model]: open t at depth d
    close_f = feats(closes[:, None], d[None] - 1)  # its matching close, at depth d - 1
    bos_f = feats(jnp.asarray([dyck_sentences.BOS]), jnp.zeros(1, jnp.int32))  # [1, d_model]
    queries = jnp.concatenate([open_f.reshape(-1, open_f.shape[-1]),
                               close_f.reshape(-1, close_f.shape[-1]), bos_f])
    (s_open, v_open), (s_close, v_close) = (_last_layer_terms(params, cfg, f, queries)
                                            for f in (open_f, close_f))  # scores [Q, k, D, h]
    shift = jnp.maximum(s_open.max((1, 2, 3)), s_close.max((1, 2, 3)))[:, None, None, None]
    pair = _scaled(s_open, v_open, shift) + _scaled(s_close, v_close, shift)  # [Q, k, D, F]
    log_delta = (jnp.log(jnp.linalg.norm(pair, axis=-1)) + shift[..., 0]).max()

    # Open prefixes: the query is the last bracket (type tau at depth D).
    last_q = open_f[:, -1]  # [k, d_model]
    (s_o, v_o), (s_b, v_b) = (_last_layer_terms(params, cfg, f, last_q) for f in (open_f, bos_f))
    shift = jnp.maximum(s_o.max(), s_b.max())
    u_open = _scaled(s_o, v_o, shift)  # [tau, t, depth, F]
    u_bos = _scaled(s_b, v_b, shift)[:, 0]  # [tau, F]
    common = jnp.asarray(list(itertools.product(range(k), repeat=depth - 1)),
                         jnp.int32).reshape(-1, depth - 1)  # [C, D-1]: the shared first brackets
    pos = jnp.arange(depth - 1)
    shared = u_open[:, common, pos].sum(2)  # [tau, C, F]
    s = u_bos[:, None] + shared + u_open[jnp.arange(k), jnp.arange(k), depth - 1][:, None]
    dist = jnp.linalg.norm(s[:, None] - s[None], axis=-1)  # [tau, tau', C]
    dist = jnp.where(jnp.eye(k, dtype=bool)[..., None], jnp.inf, dist)
    return log_delta, jnp.log(dist.min()) + shift


def balance_violation(params, cfg: model_lib.ModelConfig) -> dict[str, np.ndarray]:
    """balance_terms for every seed: {"delta", "Delta", "balance_violation"} -> [S], float64
    from their logs (delta and Delta may exceed float32 where their ratio does not)."""
    _check_balance_model(cfg)
    log_delta, log_big_delta = (np.asarray(v, np.float64) for v in jax.jit(
        jax.vmap(functools.partial(_log_balance_terms, cfg=cfg)))(params))
    with np.errstate(over="ignore"):
        return {"delta": np.exp(log_delta), "Delta": np.exp(log_big_delta),
                "balance_violation": np.exp(log_delta - log_big_delta)}


# ------------------------------------------------------------------------ length generalization


def length_prefixes(rng: np.random.Generator, num: int, num_types: int, max_depth: int,
                    length: int) -> np.ndarray:
    """num valid Dyck-(k, D) prefixes of `length` brackets after BOS, int32 [num, length + 1].

    The prefix process of Wen et al. (their distribution with q = 1/2): at depth 0 open, at
    depth D close, otherwise open or close with probability 1/2; open types uniform, a close
    matches the innermost open bracket. Every position is itself a valid prefix."""
    tokens = np.zeros((num, length + 1), np.int32)
    tokens[:, 0] = dyck_sentences.BOS
    stack = np.zeros((num, max_depth), np.int32)
    depth = np.zeros(num, np.int32)
    rows = np.arange(num)
    for t in range(1, length + 1):
        coin = rng.random(num) < 0.5
        opening = (depth == 0) | ((depth < max_depth) & coin)
        types = rng.integers(num_types, size=num)
        top = stack[rows, np.maximum(depth - 1, 0)]
        tokens[:, t] = np.where(opening, dyck_sentences.open_id(types, num_types),
                                dyck_sentences.close_id(top, num_types))
        stack[rows[opening], depth[opening]] = types[opening]
        depth += np.where(opening, 1, -1)
    return tokens


@functools.partial(jax.jit, static_argnames=("cfg", "close_ids", "members_per_call"))
def _length_scores(params, tokens, evaluate, threshold, *, cfg, close_ids, members_per_call: int):
    close = jnp.asarray(close_ids)

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
                          *, close_ids: tuple[int, ...], threshold: float = 0.8,
                          batch_size: int = 16, members_per_call: int = 8
                          ) -> dict[str, np.ndarray]:
    """Accuracy [S] on the closing brackets (`close_ids`) of valid prefixes tokens [N, L+1]
    (BOS + L brackets) at prefix lengths min_len..L: "acc" (Wen et al.: the correct closing
    bracket gets more than `threshold` of the probability given to closing brackets) and
    "argmax_acc" (it is the argmax over the whole vocabulary). Only prefixes ending in a closing
    bracket count (the next token is then determined)."""
    if cfg.pos_encoding not in ("none", "linear"):
        raise ValueError(f"length generalization needs model.pos_encoding 'none' or 'linear' "
                         f"(got {cfg.pos_encoding!r}: its positions beyond the training length "
                         "are untrained or unseen)")
    if tokens.shape[1] > cfg.max_len:
        raise ValueError(f"length generalization prefixes have {tokens.shape[1]} tokens but the "
                         f"model supports {cfg.max_len}: set model.max_len >= {tokens.shape[1]} "
                         "(it fixes the linear position scale, so set it before training)")
    position = np.arange(tokens.shape[1])
    evaluate = np.isin(tokens, close_ids) & (position >= min_len)
    total = None
    for chunk, ok in padded_chunks([tokens, evaluate], batch_size):
        out = _length_scores(params, chunk, ok, threshold, cfg=cfg, close_ids=close_ids,
                             members_per_call=members_per_call)
        out = jax.device_get(out)  # summed on the host: no jit(add) per shape
        total = out if total is None else jax.tree.map(np.add, total, out)
    count = evaluate.sum()
    return {"acc": np.asarray(total["share_correct"]) / count,
            "argmax_acc": np.asarray(total["argmax_correct"]) / count,
            "count": np.full(len(total["share_correct"]), count)}


def _plus_minus(values: np.ndarray, metric: str = "") -> str:
    """stats.t_interval over the finite values as 'mean ± half-width', for the summary; with
    `metric`, '*' where the interval excludes 0 by more than its resolution (stats.verdict), as
    gap_table.txt marks; and how many values were not finite, if any."""
    values = np.asarray(values, np.float64)
    mean, low, high = interval_stats.t_interval(values)
    finite = int(np.isfinite(values).sum())
    text = (f"{mean:.3f} ± {(high - low) / 2:.3f}" if np.isfinite(low) else
            f"{mean:.3f} (no interval: {finite} finite value{'s' * (finite != 1)})")
    if metric and interval_stats.verdict({"ci_low": low, "ci_high": high}, metric):
        text += "*"
    return text + (f" ({len(values) - finite} of {len(values)} not finite, left out)"
                   if finite < len(values) else "")


# ------------------------------------------------------------------- the Wen stage of the main job


def enabled(config) -> bool:
    """With wen.enabled (Wen et al.'s measurements of the trained members)."""
    return config.wen.enabled


def check(config, model_cfg: model_lib.ModelConfig) -> list[str]:
    """One-line errors for the wen.* settings that cannot work with the model (at the door,
    before training; each key's own range is checked with the section)."""
    wc = config.wen
    if not enabled(config):
        return []
    # Rows, groups and pairs are keyed by (contrastive weight, seed): another member axis would
    # put several members under one key (rows overwritten, groups pooled as seeds).
    other = [name for name in train.members(config).hparams if name != "contrastive_weight"]
    if other:
        field = "null" if other[0] == train.NULL else f"{other[0]}s"
        key = f"train.{field}"
        raise ValueError(f"{key}={getattr(config.train, field)!r}: wen.enabled measures one "
                         "member per train.contrastive_weights value and seed, and this axis "
                         f"would mix several under each; run one value of {key} per sweep, or "
                         "set wen.enabled=false")
    if wc.length_max_len > 0:
        if not config.data.max_len < wc.length_min_len <= wc.length_max_len:
            raise ValueError(f"wen.length_min_len={wc.length_min_len}: must be in "
                             f"[data.max_len + 1 = {config.data.max_len + 1}, "
                             f"wen.length_max_len={wc.length_max_len}]: length generalization "
                             "scores prefixes longer than any training sentence")
        if model_cfg.pos_encoding not in ("none", "linear"):
            raise ValueError(f"wen.length_max_len > 0 needs model.pos_encoding 'none' or "
                             f"'linear', got {model_cfg.pos_encoding!r} (its positions cannot "
                             "extrapolate); or set wen.length_max_len=0")
        if wc.length_max_len + 1 > model_cfg.max_len:
            raise ValueError(f"wen.length_max_len={wc.length_max_len} needs model.max_len >= "
                             f"{wc.length_max_len + 1}, got {model_cfg.max_len}")
    return []


def _member_rows(state, results, config) -> list[dict]:
    members = train.members(config)
    healthy = np.asarray(state.healthy)
    # The config's own weights (0.3, not its float32 0.30000001192092896), by their float32.
    own = {float(np.float32(w)): w for w in train.contrastive_weights(config.train)}
    rows = []
    for i, (seed, weight) in enumerate(zip(members.seeds, members.hparams["contrastive_weight"],
                                           strict=True)):
        row = {"label": config.wen.label, "seed": int(seed),
               "contrastive_weight": own[float(weight)], "healthy": bool(healthy[i])}
        for split, res in (results or {}).items():
            row[f"acc_{split}"] = float(res["acc"][i])
        rows.append(row)
    return rows


def run(ctx) -> object:
    """The main job's stage (a Context in and out; process 0 alone): `measure` on the trained
    state; makes its `rows` and `attention`."""
    if not distributed.is_main():
        return ctx
    rows, attention = measure(ctx.state, ctx.final_eval, ctx.model_cfg, ctx.settings,
                              ctx.workdir, say=ctx.say)
    return ctx.produced("wen", rows=rows, attention=attention)


def measure(state, results, model_cfg: model_lib.ModelConfig, config, workdir: str, *,
            say=print) -> tuple[list[dict], list[dict]]:
    """The Wen et al. measurements of a trained sweep (config.wen), written to the workdir:
    wen_results.csv (one row per member: seed, contrastive_weight, accuracies, length
    generalization, balance violation), wen_attention.csv (attention variation per weight
    group, layer and head, with the random baseline), wen_summary.txt, figures/wen_*.png and
    TensorBoard. Returns (member rows, attention rows)."""
    from jaxillusions.runtime import tensorboard  # noqa: PLC0415
    wc, k, depth = config.wen, config.data.num_types, config.data.max_depth
    params, healthy = state.params, np.asarray(state.healthy)
    rows = _member_rows(state, results, config)
    if wc.length_max_len > 0:
        tokens = length_prefixes(np.random.default_rng(wc.length_seed), wc.length_num_prefixes,
                                 k, depth, wc.length_max_len)
        lg = length_generalization(params, model_cfg, tokens, wc.length_min_len,
                                   close_ids=dyck_task.bracket_ids(config.data)[1],
                                   threshold=wc.length_threshold,
                                   batch_size=wc.length_batch_size,
                                   members_per_call=wc.members_per_call)
        for row, acc, arg in zip(rows, lg["acc"], lg["argmax_acc"], strict=True):
            row.update(length_gen_acc=float(acc), length_gen_argmax_acc=float(arg))
        say(f"  length generalization: {int(lg['count'][0])} closing brackets at prefix lengths "
            f"{wc.length_min_len}..{wc.length_max_len}")
    undefined = balance_undefined(model_cfg)
    if undefined is None:
        bv = balance_violation(params, model_cfg)
        for i, row in enumerate(rows):
            row.update({name: float(v[i]) for name, v in bv.items()})
    elif isinstance(model_cfg.front, MinimalFirstLayer):  # a model the measure is meant for
        say(f"  balance violation: left out ({undefined})")

    prefix = attention_prefix(k, depth)
    patterns = attention_patterns(params, prefix, model_cfg)
    weights = np.array([r["contrastive_weight"] for r in rows])
    attention = []
    for weight in dict.fromkeys(weights.tolist()):
        idx = np.flatnonzero((weights == weight) & healthy)
        for layer, pat in patterns.items():
            for head in range(pat.shape[1]):
                mean, low, high = interval_stats.pairs_jackknife(  # low clipped at 0
                    pairwise_variation(pat[idx, head]), bounds=(0.0, math.inf))
                attention.append({
                    "label": wc.label, "contrastive_weight": weight, "layer": layer,
                    "head": head, "variation": mean, "low": low, "high": high,
                    "num_seeds": len(idx), "num_pairs": len(idx) * (len(idx) - 1) // 2,
                    "prefix_len": len(prefix), "random_baseline": random_baseline(len(prefix)),
                    "random_baseline_square": random_baseline(len(prefix), causal=False)})

    os.makedirs(os.path.join(workdir, "figures"), exist_ok=True)
    for name, table in (("wen_results.csv", rows), ("wen_attention.csv", attention)):
        tables.write_csv(table, os.path.join(workdir, name), list(table[0]))
    text = summary(rows, attention, config)
    with open(os.path.join(workdir, "wen_summary.txt"), "w") as f:
        f.write(text + "\n")
    say(text)

    members = train.members(config)
    figs = {"wen_attention_variation": attention_figure(attention),
            "wen_attention_patterns": _patterns_figure(patterns, prefix, k, members.labels,
                                                       healthy)}
    if "length_gen_acc" in rows[0]:
        figs["wen_length_generalization"] = length_figure(rows)
    if "balance_violation" in rows[0] and "length_gen_acc" in rows[0]:
        figs["wen_balance_vs_length"] = balance_figure(rows)
    with tensorboard.board(workdir, members.labels) as writer:
        for name, fig in figs.items():
            tensorboard.write_figure(writer, f"wen/{name}", fig)
            figures.save(fig, os.path.join(workdir, "figures", name + ".png"))
        per_member = {key: np.array([r[key] for r in rows]) for key in
                      ("length_gen_acc", "length_gen_argmax_acc", "balance_violation")
                      if key in rows[0]}
        tensorboard.write_scalars(writer, config.train.num_steps, {"wen": per_member}, healthy)
    return rows, attention


def summary(rows: list[dict], attention: list[dict], config) -> str:
    """Text tables: attention variation, per-weight means with 95% intervals over seeds, paired
    differences against the first weight, Spearman correlations across seeds per weight."""
    out = [f"Wen et al. measurements ({config.wen.label}); intervals are 95% over seeds: "
           "[low, high] for a share or accuracy (Student-t on the logit scale, within [0, 1]), "
           "± for a balance violation and a difference (Student-t), jackknife over seeds for "
           "attention variation", ""]
    out.append("Attention variation between seeds (mean over seed pairs) on a prefix of "
               f"{attention[0]['prefix_len']} tokens; random causal baseline "
               f"{attention[0]['random_baseline']:.3f} (square rows: "
               f"{attention[0]['random_baseline_square']:.3f})")
    out.append(f"  {'weight':>6} {'layer':>5} {'head':>4} {'seeds':>5}  variation [95% interval]")
    for a in attention:
        interval = (f"[{a['low']:.3f}, {a['high']:.3f}]" if np.isfinite(a["low"]) else
                    "(no interval: the jackknife over seeds takes 3 or more)")
        out.append(f"  {a['contrastive_weight']:>6g} {a['layer']:>5} {a['head']:>4} "
                   f"{a['num_seeds']:>5}  {a['variation']:.3f} {interval}")
    keys = [key for key in ("acc_iid", "length_gen_acc", "length_gen_argmax_acc",
                            "balance_violation") if key in rows[0]]
    weights = list(dict.fromkeys(r["contrastive_weight"] for r in rows))
    by = {(r["contrastive_weight"], r["seed"]): r for r in rows if r["healthy"]}
    seeds = sorted({r["seed"] for r in rows})
    out += ["", "Per contrastive weight (mean and 95% interval over healthy seeds"
            + ("; balance violation also as median):" if "balance_violation" in keys else "):")]
    for w in weights:
        group = [by[(w, s)] for s in seeds if (w, s) in by]
        cells = []
        for key in keys:
            vals = np.array([r[key] for r in group], np.float64)
            if key == "balance_violation":  # a ratio, not bounded above
                finite = vals[np.isfinite(vals)]
                median = f" (median {np.median(finite):.3f})" if len(finite) else ""
                cell = f"{key} {_plus_minus(vals)}{median}"
            else:  # a share of sequences or tokens
                mean, low, high = interval_stats.bounded_interval(vals)
                cell = f"{key} {mean:.3f} [{low:.3f}, {high:.3f}]"
            cells.append(cell)
        out.append(f"  weight {w:g} ({len(group)} seeds): " + ", ".join(cells))
    if len(weights) > 1:
        base = weights[0]
        out += ["", f"Paired differences vs weight {base:g} (same seeds; mean ± 95% CI; * where "
                "the interval excludes 0, unmarked: within noise):"]
        for w in weights[1:]:
            pairs = [s for s in seeds if (w, s) in by and (base, s) in by]
            cells = [f"{key} " + _plus_minus(np.array([by[w, s][key] - by[base, s][key]
                                                       for s in pairs], np.float64),
                                             "acc" if key.startswith(("acc", "length")) else key)
                     for key in keys]
            out.append(f"  weight {w:g} - {base:g} ({len(pairs)} seeds): " + ", ".join(cells))
    if "balance_violation" in keys and "length_gen_acc" in keys:
        out += ["", "Spearman correlation, balance violation vs length generalization, across "
                "seeds: rho [95% bootstrap interval], permutation p (not pooled over weights: "
                "the same seeds under every weight are not independent models):"]
        for w in weights:
            group = [by[(w, s)] for s in seeds if (w, s) in by]
            x, y = (np.array([r[key] for r in group], np.float64)
                    for key in ("balance_violation", "length_gen_acc"))
            ok = np.isfinite(x) & np.isfinite(y)
            rho, low, high, p = interval_stats.spearman_interval(x[ok], y[ok])
            interval = (f"[{low:+.3f}, {high:+.3f}]" if np.isfinite(low) else "(no interval: "
                        f"the bootstrap takes {interval_stats.MIN_BOOTSTRAP_SEEDS} seeds or more)")
            text = (f"rho = {rho:+.3f} {interval}, p = {p:.2g}"
                    + (", within noise" if p >= 0.05 else "") if np.isfinite(rho) else
                    "undefined (it takes 3 seeds or more, neither value constant)")
            left = (f", {len(ok) - ok.sum()} with a value not finite left out"
                    if not ok.all() else "")
            out.append(f"  weight {w:g} ({ok.sum()} seeds{left}): {text}")
    return "\n".join(out)


@dataclasses.dataclass(frozen=True)
class Wen:
    """Wen et al.'s measurements of a trained Dyck sweep (jaxillusions/studies/wen.py)."""

    enabled: bool = setting(False, BOOL, "true or false")
    label: str = setting("wen", STR, "a name for the measurements")
    length_min_len: int = setting(25, INT, ">= 1", positive)
    length_max_len: int = setting(0, INT, ">= 0 (0: no length generalization)", nonnegative)
    length_num_prefixes: int = setting(16, INT, ">= 1", positive)
    length_threshold: float = setting(0.8, NUMBER, "in (0, 1)", lambda v, s: 0 < v < 1,
                                      "correct close's share of the closing probability")
    length_seed: int = setting(0, INT, ">= 0", nonnegative)
    length_batch_size: int = setting(8, INT, ">= 1", positive)
    members_per_call: int = setting(8, INT, ">= 1", positive)


# The main job's stage (job.PIPELINE): after training, once per run, saved whole.
STAGE = Stage("wen", run, enabled=enabled, scope="run", keys=("wen.*",),
              outputs=("wen_results.csv", "wen_attention.csv", "wen_summary.txt",
                       "figures/wen_*.png"),
              stamped=True, section=Wen, check=check, needs=(TRAINED, FINAL_EVAL), makes=("wen",))
