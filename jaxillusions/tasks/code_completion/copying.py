"""The code task's half of the induction-head study (jaxillusions/studies/induction.py), which
calls it through the task's hooks (tasks.Hooks; the package's __init__ hands them over):

- its token pool "identifier" (`pool_tokens`): the identifier characters of the vocabulary
  (lexer.IDENTIFIER_CHARS: ASCII letters, digits and underscore), the characters its copying
  heads copy. Random characters of every kind (quotes, brackets, rare symbols) are far out of a
  code model's distribution; random name characters less so, and the loss drop's floor (ln 2 at
  L = pool / 2, see the threshold in docs/code_completion.md) holds for them the same.
- the mechanism on real code, causally (`copying_analyses`, vmapped over seeds):
  - **attention on the task's own repeats** (`code_attention`): per head, at the queries whose
    next character is `identifier_repeat` and that have an earlier bigram match j, the mean
    attention on the induction targets j+1 (and on j, j-1, j+2; the share of queries whose
    strongest key is a target), beside what uniform causal attention puts on the targets;
  - **mean-ablation** (`head_ablation`): each head in turn with its z replaced by its mean over
    the non-PAD positions of training rows (`head_means`, `mean_ablation`): next-character
    accuracy per category on the evaluated splits, original vs ablated. Per seed, the best
    head's drop on identifier_repeat against the drop on every other character
    (`HeadAblation.contrast`) says whether the head the probe finds is the one the model copies
    identifiers with.
- its part of the verdict (`copying_verdict`) and of the headline (`copying_report`: the
  ablation line, and `identifier_gap`, the mechanism-facing accuracy contrast: per seed and
  split, accuracy on `identifier_repeat` minus `identifier_first` from results.csv, written to
  identifier_gap.csv); `head_predicts_gap` asks whether a seed's head strength predicts its
  identifier_repeat gap (benchmarks/code_claims.py).

The study's functions it needs (report.stats for intervals, the verdict's counts) come in as
arguments: a task sits below the studies and the report.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import model as model_lib
from jaxillusions import tasks
from jaxillusions.runtime import schema
from jaxillusions.runtime.chunks import padded_chunks
from jaxillusions.tasks.code_completion import lexer

if TYPE_CHECKING:
    import pandas as pd

GAP_COLUMNS = ("seed", "site", "size", "split", "acc_first", "acc_repeat", "n_first", "n_repeat",
               "repeat_minus_first")
# `code_attention`: measures of a head's attention at identifier_repeat queries with an earlier
# bigram match j, by the key's offset from the match (the induction target is j+1, the character
# after the earlier occurrence).
TARGET_OFFSETS = {"target_attention": 1, "match_attention": 0, "before_match_attention": -1,
                  "after_target_attention": 2}
CODE_MEASURES = (*TARGET_OFFSETS, "argmax_is_target", "prev_token_attention")
CODE_COLUMNS = ("seed", "layer", "head", "best", *CODE_MEASURES, "uniform_on_target", "queries")
ABLATION_COLUMNS = ("seed", "layer", "head", "best", "split", "category", "n", "acc_original",
                    "acc_ablated", "drop")
# induction_seeds.csv's further columns (Analyses.seed_values): the best head's mean-ablation on
# the in-distribution split (accuracy drop on identifier_repeat, on every other character, and
# their difference) and its attention on the induction target in real code (and uniform
# attention's).
CODE_SEED_COLUMNS = ("ablation_drop_repeat", "ablation_drop_other", "ablation_repeat_minus_other",
                     "code_target_attention", "code_uniform_on_target")
REPEAT = "identifier_repeat"
POOLS = {"identifier": "identifier characters"}  # the token pools of the induction test


def special_tokens(data) -> tasks.SpecialTokens:
    """PAD, BOS, EOS and UNK, never drawn by a random-token test; every row starts with BOS (the
    same ids for any data.* settings `data`)."""
    del data
    from jaxillusions.tasks.code_completion import splits  # noqa: PLC0415 - corpus code loads lazily

    return tasks.SpecialTokens(exclude=tuple(range(splits.NUM_SPECIAL)), bos=splits.BOS)


def token_pools() -> dict[str, str]:
    return dict(POOLS)


def identifier_pool(vocab) -> tuple[int, ...]:
    """The identifier characters (lexer.IDENTIFIER_CHARS) in `vocab` (a splits.Vocab)."""
    return vocab.ids_of(lexer.IDENTIFIER_CHARS)


def pool_tokens(name: str, splits) -> tuple[int, ...]:
    """The ids of token pool `name` (POOLS) in the vocabulary of the loaded `splits`."""
    if name not in POOLS:
        raise ValueError(f"token pool {name!r}: the code task's are {', '.join(POOLS)}")
    return identifier_pool(splits.vocab)


# --- Attention on the task's own repeats -------------------------------------------------------

def repeat_queries(tokens: jax.Array, category: jax.Array, repeat: int
                   ) -> tuple[jax.Array, jax.Array]:
    """The queries of `code_attention` in code rows tokens [N, T] (category [N, T]: the
    CATEGORIES index of the next character): (match bool [N, T, T], query bool [N, T]).
    match[n, t, j]: query t has an earlier bigram match j (tokens[j-1:j+1] == tokens[t-1:t+1],
    1 <= j < t-1), kept only where query[n, t]: the next character is identifier_repeat
    (`repeat`) and there is at least one match. The induction target of match j is j+1."""
    tokens, category = jnp.asarray(tokens), jnp.asarray(category)
    width = tokens.shape[1]
    same = tokens[:, :, None] == tokens[:, None, :]
    match = jnp.pad(same[:, 1:, 1:] & same[:, :-1, :-1], ((0, 0), (1, 0), (1, 0)))
    match &= jnp.tril(jnp.ones((width, width), bool), -2)
    query = (category == repeat) & match.any(-1)
    return match & query[..., None], query


def attention_sums(pattern: jax.Array, match: jax.Array, tokens: jax.Array, pad: int
                   ) -> dict[str, jax.Array]:
    """Sums over queries of one layer's attention, pattern [N, head, q, k], on code rows tokens
    [N, T] with `repeat_queries`' match: {CODE_MEASURES name: [head]}. TARGET_OFFSETS: the mass on
    the keys j+d of every match j; argmax_is_target: queries whose strongest key is a target;
    prev_token_attention: over every non-PAD query q >= 1, the mass on q-1. `code_attention`
    divides them by the counts of `query_counts`."""
    m = match.astype(jnp.float32)
    # A match j has 1 <= j <= q-2, so its keys j-1 .. j+2 lie in [0, q]: a roll never wraps them.
    out = {name: jnp.einsum("nhqk,nqk->h", pattern, jnp.roll(m, d, -1))
           for name, d in TARGET_OFFSETS.items()}
    top = pattern.argmax(-1)[..., None]  # [N, head, q, 1]; ties: the first key
    target = jnp.broadcast_to(jnp.roll(match, 1, -1)[:, None], pattern.shape)
    out["argmax_is_target"] = jnp.take_along_axis(target, top, -1)[..., 0].sum((0, 2))
    real = (tokens[:, 1:] != pad).astype(jnp.float32)  # queries 1..T-1 with a token
    prev = jnp.diagonal(pattern, -1, -2, -1)  # [N, head, T-1]: query q+1 on key q
    out["prev_token_attention"] = jnp.einsum("nhq,nq->h", prev, real)
    return out


def query_counts(match: jax.Array, query: jax.Array, tokens: jax.Array, pad: int
                 ) -> dict[str, jax.Array]:
    """The denominators of `attention_sums` (queries: identifier_repeat queries with a match;
    real: non-PAD queries q >= 1) and uniform_sum: what uniform causal attention would put on
    the targets, summed over the queries (query q: its matches / (q+1))."""
    width = tokens.shape[1]
    return {"queries": query.sum(), "real": (tokens[:, 1:] != pad).sum(),
            "uniform_sum": (match.sum(-1) / (jnp.arange(width) + 1.0)).sum()}


@functools.partial(jax.jit, static_argnames=("cfg", "pad", "repeat"))
def _code_attention_batch(params, tokens, category, *, cfg, pad, repeat):
    match, query = repeat_queries(tokens, category, repeat)
    sites = [f"blocks.{i}.attn.pattern"
             for i in range(model_lib.first_attention_layer(cfg), cfg.n_layers)]

    def one(p):
        _, cache = model_lib.forward(p, tokens, cfg, cache=sites)
        per_layer = [attention_sums(cache[s], match, tokens, pad) for s in sites]
        return {k: jnp.stack([d[k] for d in per_layer]) for k in CODE_MEASURES}

    return jax.vmap(one)(params), query_counts(match, query, tokens, pad)


@dataclasses.dataclass(frozen=True)
class CodeAttention:
    """Result of `code_attention`: every head's attention at identifier_repeat queries of real
    code with an earlier bigram match (per seed, layer, head)."""

    seeds: tuple
    values: dict[str, np.ndarray]  # CODE_MEASURES name -> [S, layer, head]; NaN: no attention
    uniform_on_target: float  # uniform causal attention's mass on the targets (no parameters)
    queries: int  # identifier_repeat queries with a match

    def of_heads(self, heads: np.ndarray) -> dict[str, np.ndarray]:
        """{measure: [S]} of one head per seed, heads int [S, 2] (layer, head); NaN where -1."""
        ok = heads[:, 0] >= 0
        index = (np.arange(len(heads)), np.maximum(heads[:, 0], 0), np.maximum(heads[:, 1], 0))
        return {k: np.where(ok, v[index], np.nan) for k, v in self.values.items()}

    def rows(self, best: np.ndarray | None = None) -> list[dict]:
        """One row per (seed, layer, head) with attention and a finite value (CODE_COLUMNS);
        `best` int [S, 2] marks each seed's best head (best = 1)."""
        score = self.values["target_attention"]
        return [{"seed": s, "layer": layer, "head": head,
                 "best": int(best is not None and tuple(best[i]) == (layer, head)),
                 **{k: float(v[i, layer, head]) for k, v in self.values.items()},
                 "uniform_on_target": self.uniform_on_target, "queries": self.queries}
                for i, s in enumerate(self.seeds)
                for layer in range(score.shape[1]) for head in range(score.shape[2])
                if not np.isnan(self.values["prev_token_attention"][i, layer, head])]


def code_attention(params: model_lib.Params, cfg: model_lib.ModelConfig, tokens: np.ndarray,
                   category: np.ndarray, *, batch_size: int = 64,
                   seeds: Sequence | None = None) -> CodeAttention:
    """Where every head attends inside repeated identifiers of real code, per seed (`params`
    with a leading seed axis, vmapped): on code rows tokens [N, T] with their category [N, T]
    (a CodeSplit's), the queries of `repeat_queries` and the CODE_MEASURES of `attention_sums`,
    averaged over those queries (prev_token_attention: over every non-PAD query), in row batches
    of `batch_size` (the last padded: one compilation per width)."""
    from jaxillusions.tasks.code_completion import splits as code_splits  # noqa: PLC0415

    seeds = model_lib.seed_labels(params, cfg, seeds)
    tokens, category = np.asarray(tokens, np.int32), np.asarray(category, np.int32)
    sums = None
    for batch in padded_chunks([tokens, category], batch_size):
        out = _code_attention_batch(params, *batch, cfg=cfg, pad=code_splits.PAD,
                                    repeat=lexer.IDENT_REPEAT)
        out = jax.tree.map(lambda x: np.asarray(x, np.float64), out)
        sums = out if sums is None else jax.tree.map(np.add, sums, out)
    per_head, counts = sums
    layers = list(range(model_lib.first_attention_layer(cfg), cfg.n_layers))
    values = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for k, v in per_head.items():
            full = np.full((len(seeds), cfg.n_layers, cfg.n_heads), np.nan)
            full[:, layers] = v / counts["real" if k == "prev_token_attention" else "queries"]
            values[k] = full
        uniform = float(counts["uniform_sum"] / counts["queries"])
    return CodeAttention(seeds=seeds, values=values, uniform_on_target=uniform,
                         queries=int(counts["queries"]))


# --- Head mean-ablation ------------------------------------------------------------------------

def mean_ablation(means: jax.Array, mask: jax.Array) -> model_lib.Intervention:
    """The intervention (for model.forward) that mean-ablates heads of one seed: where mask
    [layer, head] is set, blocks.<l>.attn.z[..., h, :] is replaced by means[l, h] (means
    [layer, head, d_head], `head_means`' of the seed). `mask` may be traced: one compiled
    program runs every ablation (`head_ablation`)."""
    def intervene(name: str, value: jax.Array) -> jax.Array:
        parts = name.split(".")
        if len(parts) != 4 or parts[0] != "blocks" or parts[2:] != ["attn", "z"]:
            return value
        layer = int(parts[1])
        return jnp.where(mask[layer][:, None], means[layer], value)

    return intervene


@functools.partial(jax.jit, static_argnames=("cfg", "pad"))
def _z_sums_batch(params, tokens, *, cfg, pad):
    first = model_lib.first_attention_layer(cfg)
    sites = [f"blocks.{i}.attn.z" for i in range(first, cfg.n_layers)]
    real = (tokens != pad)[..., None, None].astype(jnp.float32)

    def one(p):
        _, cache = model_lib.forward(p, tokens, cfg, cache=sites)
        sums = jnp.zeros((cfg.n_layers, cfg.n_heads, cfg.head_dim))
        return sums.at[first:].set(jnp.stack([(cache[s] * real).sum((0, 1)) for s in sites]))

    return jax.vmap(one)(params), real.sum()


def head_means(params: model_lib.Params, cfg: model_lib.ModelConfig, tokens: np.ndarray, *,
               pad: int, batch_size: int = 64) -> np.ndarray:
    """float32 [S, layer, head, d_head]: every head's z (blocks.<l>.attn.z) averaged over the
    non-`pad` positions of `tokens` [N, T], per seed (vmapped); zeros for layers without
    attention. The values of `mean_ablation`."""
    tokens = np.asarray(tokens, np.int32)
    sums = count = 0.0
    for (batch,) in padded_chunks([tokens], batch_size):
        s, n = _z_sums_batch(params, batch, cfg=cfg, pad=pad)
        sums, count = sums + np.asarray(s, np.float64), count + float(n)
    return (sums / max(count, 1.0)).astype(np.float32)


@functools.partial(jax.jit, static_argnames=("cfg", "num_bins"))
def _ablated_correct_batch(params, means, masks, tokens, evaluated, bins, *, cfg, num_bins):
    targets = jnp.roll(tokens, -1, axis=1)
    onehot = jax.nn.one_hot(bins, num_bins, dtype=jnp.float32) * evaluated[..., None]

    def one(p, mu):
        def ablated(mask):
            logits, _ = model_lib.forward(p, tokens, cfg, intervention=mean_ablation(mu, mask))
            right = (logits.argmax(-1) == targets).astype(jnp.float32)
            return jnp.einsum("bt,btc->c", right, onehot)
        return jax.lax.map(ablated, masks)  # one ablation's activations live at a time

    return jax.vmap(one)(params, means)


@dataclasses.dataclass(frozen=True)
class HeadAblation:
    """Result of `head_ablation`: correct predictions per bin of a breakdown, with nothing and
    with each head mean-ablated, per seed and split."""

    seeds: tuple
    heads: tuple[tuple[int, int], ...]  # the ablated heads (layer, head), in order
    splits: tuple[str, ...]
    labels: tuple[str, ...]  # the bins' names (the code task: CATEGORIES)
    correct: np.ndarray  # [S, 1 + heads, split, bin]; index 0: nothing ablated
    count: np.ndarray  # [split, bin] evaluated positions

    def accuracy(self) -> np.ndarray:
        """[S, 1 + heads, split, bin] (NaN for an empty bin)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > 0, self.correct / self.count, np.nan)

    def rows(self, best: np.ndarray | None = None) -> list[dict]:
        """One row per (seed, ablated head, split, bin with positions) (ABLATION_COLUMNS):
        acc_original, acc_ablated and drop = original - ablated; `best` int [S, 2] marks each
        seed's best head. A diverged seed (NaN counts) has no rows."""
        acc = self.accuracy()
        return [{"seed": s, "layer": layer, "head": head,
                 "best": int(best is not None and tuple(best[i]) == (layer, head)),
                 "split": split, "category": label, "n": int(self.count[j, c]),
                 "acc_original": float(acc[i, 0, j, c]), "acc_ablated": float(acc[i, a, j, c]),
                 "drop": float(acc[i, 0, j, c] - acc[i, a, j, c])}
                for i, s in enumerate(self.seeds) if np.isfinite(self.correct[i]).all()
                for a, (layer, head) in enumerate(self.heads, start=1)
                for j, split in enumerate(self.splits)
                for c, label in enumerate(self.labels) if self.count[j, c] > 0]

    def contrast(self, heads: np.ndarray, split: str, label: str = REPEAT
                 ) -> tuple[np.ndarray, np.ndarray]:
        """([S], [S]): on `split`, the accuracy drop on bin `label` when each seed's head
        heads[s] (int [S, 2], (layer, head); -1: none, NaN) is ablated, and the drop on every
        other evaluated position (the other bins' drops weighted by their positions)."""
        j, c = self.splits.index(split), self.labels.index(label)
        index = {h: a for a, h in enumerate(self.heads, start=1)}
        rows = [index.get(tuple(h), -1) for h in heads]
        lost = self.correct[:, 0, j] - self.correct[np.arange(len(heads)), rows, j]  # [S, bin]
        other = np.arange(len(self.labels)) != c
        with np.errstate(invalid="ignore", divide="ignore"):
            repeat = lost[:, c] / self.count[j, c]
            rest = lost[:, other].sum(-1) / self.count[j, other].sum()
        missing = np.array([r < 0 for r in rows])
        return np.where(missing, np.nan, repeat), np.where(missing, np.nan, rest)


def head_ablation(params: model_lib.Params, cfg: model_lib.ModelConfig, means: np.ndarray,
                  views: dict, *, breakdown: str = "category",
                  labels: Sequence[str] | None = None, batch_size: int = 64,
                  seeds: Sequence | None = None) -> HeadAblation:
    """Mean-ablation of every head, one at a time (`mean_ablation` with `means`, [S, layer,
    head, d_head] from `head_means`): correct predictions at the evaluated positions of each
    task View in `views` ({split: View}) per bin of `breakdown`, with nothing and with each head
    ablated, vmapped over seeds (the ablations one after the other in one compiled loop), in row
    batches of `batch_size`. `labels`: the bins' names (default their numbers)."""
    seeds = model_lib.seed_labels(params, cfg, seeds)
    heads = tuple((layer, head)
                  for layer in range(model_lib.first_attention_layer(cfg), cfg.n_layers)
                  for head in range(cfg.n_heads))
    masks = np.zeros((1 + len(heads), cfg.n_layers, cfg.n_heads), bool)
    for a, (layer, head) in enumerate(heads, start=1):
        masks[a, layer, head] = True
    num_bins = max(v.num_bins[breakdown] for v in views.values())
    correct = np.zeros((len(seeds), len(masks), len(views), num_bins))
    count = np.zeros((len(views), num_bins))
    for j, view in enumerate(views.values()):
        bins = np.asarray(view.bins[breakdown], np.int32)
        for batch in padded_chunks([view.tokens, view.evaluated, bins], batch_size):
            correct[:, :, j] += np.asarray(_ablated_correct_batch(
                params, means, masks, *batch, cfg=cfg, num_bins=num_bins), np.float64)
        scored = view.evaluated & (bins >= 0)
        count[j] = np.bincount(bins[scored], minlength=num_bins)[:num_bins]
    labels = tuple(labels) if labels is not None else tuple(str(b) for b in range(num_bins))
    return HeadAblation(seeds=seeds, heads=heads, splits=tuple(views), labels=labels,
                        correct=correct, count=count)


# --- The analyses of the induction stage (hook copying_analyses) -------------------------------

@dataclasses.dataclass(frozen=True)
class Analyses:
    """The code task's analyses of trained members: `code_attention` and `head_ablation`, the
    per-seed summary on `split` (CODE_SEED_COLUMNS)."""

    code: CodeAttention
    ablation: HeadAblation
    split: str = "iid"

    def seed_values(self, best: np.ndarray) -> dict[str, np.ndarray]:
        """{CODE_SEED_COLUMNS name: [S]} of each seed's best head, best int [S, 2] (-1: a
        diverged seed, NaN)."""
        repeat, other = self.ablation.contrast(best, self.split)
        return {"ablation_drop_repeat": repeat, "ablation_drop_other": other,
                "ablation_repeat_minus_other": repeat - other,
                "code_target_attention": self.code.of_heads(best)["target_attention"],
                "code_uniform_on_target": np.where(best[:, 0] >= 0,
                                                   self.code.uniform_on_target, np.nan)}

    def tables(self, best: np.ndarray) -> dict[str, tuple[list[dict], tuple[str, ...]]]:
        """induction_code.csv (CODE_COLUMNS) and induction_ablation.csv (ABLATION_COLUMNS), each
        seed's best head marked."""
        return {"induction_code.csv": (self.code.rows(best), CODE_COLUMNS),
                "induction_ablation.csv": (self.ablation.rows(best), ABLATION_COLUMNS)}


def code_analyses(params: model_lib.Params, cfg: model_lib.ModelConfig, splits: dict, *,
                  rows: int, split_names: Sequence[str], batch_size: int = 64,
                  seeds: Sequence | None = None) -> tuple[CodeAttention, HeadAblation]:
    """The analyses of trained members (`params`, leading seed axis) on the task's splits
    ({name: CodeSplit}): `code_attention` on the first `rows` iid rows, and `head_ablation` on
    the splits `split_names` (every row), with each head's mean over the non-PAD positions of the
    first `rows` training rows."""
    from jaxillusions.tasks.code_completion import splits as code_splits  # noqa: PLC0415

    task = tasks.get("code")
    iid = splits["iid"]
    code = code_attention(params, cfg, iid.tokens[:rows], iid.category[:rows],
                          batch_size=batch_size, seeds=seeds)
    means = head_means(params, cfg, splits["train"].tokens[:rows],
                       pad=code_splits.PAD, batch_size=batch_size)
    views = {name: task.view(splits[name]) for name in split_names}
    ablation = head_ablation(params, cfg, means, views, labels=task.categories(),
                             batch_size=batch_size, seeds=seeds)
    return code, ablation


def _joined(parts: Sequence, seeded: Sequence[str], num: int):
    """One result (CodeAttention or HeadAblation) from those of consecutive seed chunks
    (distributed.seed_chunks: the last chunk padded with copies of the last seed): its `seeded`
    fields (arrays, or dicts of arrays, with a leading seed axis) and seeds joined and cut to
    the first `num` seeds; the other fields are the first chunk's (the same in all)."""
    from jaxillusions.runtime import distributed  # noqa: PLC0415

    joined = distributed.concat_host([{name: getattr(p, name) for name in seeded}
                                      for p in parts], num)
    return dataclasses.replace(parts[0], seeds=tuple(s for p in parts for s in p.seeds)[:num],
                               **joined)


def copying_analyses(chunks: Sequence[tuple[Any, Sequence]], cfg: model_lib.ModelConfig,
                     splits: dict, diverged: np.ndarray, *, rows: int,
                     split_names: Sequence[str], batch_size: int = 64) -> Analyses | None:
    """The hook copying_analyses: `code_analyses` of every chunk of seeds ([(params, seed
    labels)]), joined, with NaN for the `diverged` seeds; None without iid rows among
    `split_names` or without training rows."""
    if "iid" not in split_names or not len(splits["train"].tokens):
        return None
    parts = [code_analyses(params, cfg, splits, rows=rows, split_names=split_names, seeds=seeds,
                           batch_size=batch_size)
             for params, seeds in chunks]
    num, bad = len(diverged), np.asarray(diverged, bool)

    def nan_rows(x: np.ndarray) -> np.ndarray:  # NaN in the diverged seeds' rows (axis 0)
        return np.where(bad.reshape(-1, *[1] * (np.ndim(x) - 1)), np.nan, x)

    code = _joined([c for c, _ in parts], ("values",), num)
    ablation = _joined([a for _, a in parts], ("correct",), num)
    code = dataclasses.replace(code, values={k: nan_rows(v) for k, v in code.values.items()})
    ablation = dataclasses.replace(ablation, correct=nan_rows(ablation.correct))
    return Analyses(code=code, ablation=ablation, split="iid")


# --- Its part of the verdict and of the headline ------------------------------------------------

def copying_verdict(columns: Mapping[str, Any], tally) -> str:
    """The hook copying_verdict: with the analyses (code_target_attention in `columns`), the
    code task's test (docs/code_completion.md): the best head's attention on the induction
    targets of repeated identifiers in real code in place of its score, with the loss drop on
    identifier characters (on random tokens without that test, e.g. a vocabulary too small for
    it). `tally`: the study's counts (studies/induction.py, Tally)."""
    on_code = columns.get("code_target_attention")
    if on_code is None:
        return ""
    if "identifier_loss_drop" not in columns:
        return (f", {tally.heads(on_code, columns['loss_drop'])} of {tally.n} with its attention "
                f"measured on code (on repeated identifiers' induction targets >= "
                f"{tally.min_score}: {tally.passing(on_code, tally.min_score)})")
    return "; code task: " + tally.counts(
        on_code, columns["identifier_loss_drop"], "attention on code and loss drop on "
        "identifier characters", "attention on repeated identifiers' induction targets")


def ablation_line(per_seed: pd.DataFrame, cell: Callable[..., str]) -> str:
    """The headline's line on the best heads' mean-ablation (induction_seeds.csv's
    CODE_SEED_COLUMNS of the healthy seeds): the accuracy drop on identifier_repeat and on the
    other characters, and their paired difference over seeds (Student t). `cell(values, fmt)`:
    the study's cell of mean and interval (studies/induction.py, cell; a third argument
    bounds it to the values' range)."""
    ok = per_seed.dropna(subset=["ablation_drop_repeat", "ablation_drop_other"])
    repeat, other = ok["ablation_drop_repeat"], ok["ablation_drop_other"]

    def diff(values) -> str:  # of two accuracies: in [-1, 1]
        return cell(values, "+.3f", (-1, 1))

    return (f"Best head mean-ablated (iid, {len(ok)} seeds): accuracy drop on {REPEAT} "
            f"{diff(repeat)}, on the other characters {diff(other)}, paired difference "
            f"{diff(repeat - other)} (induction_ablation.csv)")


def identifier_gap(df: pd.DataFrame, method: str = "original") -> pd.DataFrame:
    """Per (seed, split): accuracy on identifier_repeat minus identifier_first of `method`'s
    rows (the original model by default; a proxy's rows also need `site` and `size` to be
    unique, so they are kept as keys). `df`: results.csv as loaded by analysis.load_results,
    from a code-task run. Columns: keys, acc_repeat, acc_first, n_repeat, n_first,
    repeat_minus_first. Seeds or splits missing either category are left out."""
    bins = {lexer.CATEGORIES.index("identifier_repeat"): "repeat",
            lexer.CATEGORIES.index("identifier_first"): "first"}
    sel = schema.one_group(df[(df["breakdown"] == "category") & (df["method"] == method)
                              & df["bin"].isin(list(bins))], "identifier_gap")
    if sel.empty:
        raise ValueError(f"no category rows of method {method!r}: is this a code-task run "
                         "with the category breakdown?")
    keys = ["seed", "site", "size", "split"]
    wide = sel.assign(which=sel["bin"].map(bins)).pivot_table(
        index=keys, columns="which", values=["acc", "n"], observed=True, aggfunc="first")
    wide = wide.dropna()
    out = wide["acc"].rename(columns=lambda c: f"acc_{c}").join(
        wide["n"].astype("int64").rename(columns=lambda c: f"n_{c}")).reset_index()
    out["repeat_minus_first"] = out["acc_repeat"] - out["acc_first"]
    return out


def copying_report(per_seed: pd.DataFrame | None, results: pd.DataFrame | None,
                   cell: Callable[..., str]) -> tasks.Report:
    """The hook copying_report: the attention on code after the best-head score, the ablation
    line (`ablation_line`), and from results.csv the original model's identifier_repeat minus
    identifier_first accuracy per split (`identifier_gap`, written to identifier_gap.csv,
    GAP_COLUMNS)."""
    cells, lines, tables = "", [], {}
    if per_seed is not None:
        if "code_target_attention" in per_seed:
            cells = f", on code {cell(per_seed['code_target_attention'], bounds=(0, 1))}"
        if "ablation_drop_repeat" in per_seed:
            lines.append(ablation_line(per_seed, cell))
    if results is not None:
        gap = identifier_gap(results)
        tables["identifier_gap.csv"] = (gap.to_dict("records"), GAP_COLUMNS)
        splits = list(dict.fromkeys(gap["split"]))
        lines.append("identifier_repeat - identifier_first accuracy (original model): " + ", ".join(
            f"{s} {cell(gap.loc[gap['split'] == s, 'repeat_minus_first'], '+.3f', (-1, 1))}"
            for s in splits) + " (identifier_gap.csv)")
    return tasks.Report(cells=cells, lines=tuple(lines), tables=tables)


HEAD_GAP_COLUMNS = ("site", "method", "size", "split", "metric", "category", "n_seeds", "rho",
                    "rho_low", "rho_high", "p_value")


def head_predicts_gap(df: pd.DataFrame, per_seed: pd.DataFrame, stats, baseline: str = "iid",
                      category: str = "identifier_repeat", metric: str = "same_pred",
                      strength: str = "max_induction_score") -> pd.DataFrame:
    """Across seeds: does a seed's induction-head strength predict its generalization gap on
    `category`? Per proxy (site, method, size) and OOD split: Spearman rho between `strength`
    (a column of induction_seeds.csv, `per_seed`: the probe's max_induction_score, or for the
    causal strength the best head's ablation_drop_repeat or ablation_repeat_minus_other) and
    the per-seed gap of `metric` on the category's characters (stats.signed_gap: positive =
    less faithful than on `baseline`), with stats.spearman_interval's bootstrap interval over
    seeds and permutation p-value. `df`: results.csv as loaded by analysis.load_results;
    `stats`: jaxillusions.report.stats. Columns HEAD_GAP_COLUMNS."""
    import pandas as pd  # noqa: PLC0415

    if strength not in per_seed:
        raise ValueError(f"strength={strength!r}: not a column of induction_seeds.csv "
                         f"({', '.join(per_seed.columns)})")
    sel = df[(df["breakdown"] == "category") & (df["bin"] == lexer.CATEGORIES.index(category))
             & (df["method"] != "original")]
    wide = sel.pivot_table(index=["site", "method", "size", "seed"], columns="split",
                           values=metric, observed=True, aggfunc="first")
    if baseline not in wide:
        raise ValueError(f"baseline={baseline!r}: no {category} rows of that split")
    x_by_seed = per_seed.set_index("seed")[strength]
    out = []
    for (site, method, size), group in wide.groupby(level=[0, 1, 2], observed=True):
        group = group.droplevel([0, 1, 2])
        for split in [s for s in group.columns if s != baseline]:
            gap = pd.Series(stats.signed_gap(group[baseline].to_numpy(),
                                             group[split].to_numpy(), metric),
                            index=group.index)
            both = pd.concat([x_by_seed, gap], axis=1, join="inner").dropna()
            rho, low, high, p = stats.spearman_interval(both.iloc[:, 0].to_numpy(),
                                                        both.iloc[:, 1].to_numpy())
            out.append({"site": site, "method": method, "size": int(size), "split": split,
                        "metric": metric, "category": category, "n_seeds": len(both),
                        "rho": rho, "rho_low": low, "rho_high": high, "p_value": p})
    return pd.DataFrame(out, columns=list(HEAD_GAP_COLUMNS))
