"""Does a model have induction heads? The standard repeated-random-tokens test, for any task's
model, vmapped over the seed axis of the parameters.

A batch of random token sequences of length L, each repeated once, is run through the model
(after a BOS token when the task has one). Tokens are drawn without replacement within a sequence,
so every token of the repeat has exactly one earlier occurrence and "the token after its first
occurrence" is unambiguous. With the first copy at positions o .. o+L-1 (o = 1 with a BOS):

- **induction score** of a head (per seed, layer, head): the mean attention from each position
  o+L+i of the repeat to position o+i+1, the token after the first occurrence of its token
  (i = 0 .. L-1). A perfect induction head scores 1. A head that spreads its attention uniformly
  over the causal prefix scores `chance_score(L, o)` = mean over the repeat of 1/(q+1), about
  ln(2)/L; a previous-token or same-token head scores 0.
- **loss drop** (per seed): the mean next-token cross-entropy (nats) on tokens 2..L of the first
  copy (unpredictable: uniform over the pool gives ln(pool)) minus the same on tokens 2..L of the
  second copy (predictable by copying). Large when the model uses the repeat, ~0 when it does not.

The tokens are drawn from a pool: every id but the special ones by default; for the code task the
stage also runs the test on **identifier characters** (`identifier_pool`: ASCII letters, digits
and underscore, L = half of them), the characters its copying heads copy. Random characters of
every kind (quotes, brackets, rare symbols) are far out of a code model's distribution; random
name characters less so, and the loss drop's floor (ln 2 at L = pool / 2, see the threshold in
docs/code_completion.md) holds for them the same.

`induction(...)` returns an `Induction` with arrays and tidy rows (`rows()`, `seed_rows()`) for a
CSV, and `scalars()` for TensorBoard; `write(...)` writes both (induction.csv,
induction_seeds.csv, and the board's seed_<s> runs). `identifier_gap(df)` is the code
task's mechanism-facing accuracy contrast: per seed and split, accuracy on `identifier_repeat`
minus `identifier_first` (from results.csv, as loaded by `analysis.load_results`).

The mechanism on real code, causally (the code task; `code_analyses`, vmapped over seeds):

- **attention on the task's own repeats** (`code_attention`): per head, at the queries whose next
  character is `identifier_repeat` and that have an earlier bigram match j, the mean attention on
  the induction targets j+1 (and on j, j-1, j+2; the share of queries whose strongest key is a
  target), beside what uniform causal attention puts on the targets;
- **mean-ablation** (`head_ablation`): each head in turn with its z replaced by its mean over
  the non-PAD positions of training rows (`head_means`, `mean_ablation`): next-character
  accuracy per category on the evaluated splits, original vs ablated. Per seed, the best
  head's drop on identifier_repeat against the drop on every other character
  (`HeadAblation.contrast`) says whether the head the probe finds is the one the model copies
  identifiers with.

In the main job (pipeline/sweep.py) the config section `induction` (`enabled`, `length`,
`batch`, `code_rows`; analysis keys) runs the stage `STAGE` after training: the probe on the
trained parameters (and for the code task the analyses above), saved whole (a stamped stage
file, so that a relaunch does not probe again), and `report_lines` adds its headline lines and
identifier_gap.csv to the reports.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import model as model_lib
from jaxillusions.report import tables
from jaxillusions.runtime import stages, tensorboard
from jaxillusions.runtime.chunks import padded_chunks

if TYPE_CHECKING:
    import pandas as pd

ROW_COLUMNS = ("seed", "layer", "head", "induction_score")
GAP_COLUMNS = ("seed", "site", "size", "split", "acc_first", "acc_repeat", "n_first", "n_repeat",
               "repeat_minus_first")
# The stage's: induction.csv, induction_seeds.csv and, for the code task, induction_code.csv and
# induction_ablation.csv (one pattern for the last three, so that a Dyck run, which has only the
# seeds file, is complete too); identifier_gap.csv is the report's.
OUTPUTS = ("induction.csv", "induction_*.csv")
# "A seed has an induction head" (docs/code_completion.md): its best head puts >= 0.3 of its
# attention on the token after the earlier occurrence (20x chance at L = 48), and the model's
# loss on the repeat is >= 1 nat lower than on the first copy (more than the ln 2 that knowing
# which tokens occurred gives at L = pool / 2). For code the same 0.3 is also applied to the
# best head's attention on the induction targets of real code (`verdict`): random characters are
# out of distribution for a code model, whose copying heads score about 0.1 on them.
MIN_SCORE = 0.3
MIN_LOSS_DROP = 1.0
SEED_COLUMNS = ("seed", "max_induction_score", "best_layer", "best_head", "loss_first",
                "loss_second", "loss_drop")
# induction_seeds.csv's further columns with the test on identifier characters (the code task):
# its best-head score and loss drop (and induction.csv's identifier_score per head).
IDENTIFIER_SEED_COLUMNS = ("identifier_max_score", "identifier_loss_first",
                           "identifier_loss_second", "identifier_loss_drop")
# The code task's analyses (`code_attention`, `head_ablation`): measures of a head's attention at
# identifier_repeat queries with an earlier bigram match j, by the key's offset from the match
# (the induction target is j+1, the character after the earlier occurrence).
TARGET_OFFSETS = {"target_attention": 1, "match_attention": 0, "before_match_attention": -1,
                  "after_target_attention": 2}
CODE_MEASURES = (*TARGET_OFFSETS, "argmax_is_target", "prev_token_attention")
CODE_COLUMNS = ("seed", "layer", "head", "best", *CODE_MEASURES, "uniform_on_target", "queries")
ABLATION_COLUMNS = ("seed", "layer", "head", "best", "split", "category", "n", "acc_original",
                    "acc_ablated", "drop")
# induction_seeds.csv's further columns for the code task: the best head's mean-ablation on the
# in-distribution split (accuracy drop on identifier_repeat, on every other character, and their
# difference) and its attention on the induction target in real code (and uniform attention's).
CODE_SEED_COLUMNS = ("ablation_drop_repeat", "ablation_drop_other", "ablation_repeat_minus_other",
                     "code_target_attention", "code_uniform_on_target")
REPEAT = "identifier_repeat"


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """A task's tokens as the test needs them (`task_tokens`): `exclude`, the ids never
    drawn (PAD, BOS, EOS, UNK), `bos`, the token every training row starts with (None: the
    rows have none), and `pool`, the ids drawn from (None: every id of the vocabulary; the code
    task's `identifier_pool`), less `exclude`."""

    exclude: tuple[int, ...] = ()
    bos: int | None = None
    pool: tuple[int, ...] | None = None


def drawable(vocab_size: int, special: SpecialTokens = SpecialTokens()) -> np.ndarray:
    """The sorted ids the test draws from: special.pool (default: every id below vocab_size)
    minus special.exclude; ValueError if the pool names an id outside the vocabulary."""
    pool = special.pool
    ids = np.arange(vocab_size) if pool is None else np.asarray(pool, np.int64).ravel()
    if len(ids) and not (0 <= ids.min() and ids.max() < vocab_size):
        raise ValueError(f"induction pool: ids must be in [0, {vocab_size}), got "
                         f"{int(ids.min())}..{int(ids.max())}")
    return np.setdiff1d(ids, np.asarray(special.exclude, dtype=np.int64))


def repeated_tokens(key: jax.Array, vocab_size: int, length: int, batch: int,
                    special: SpecialTokens = SpecialTokens()) -> jax.Array:
    """int32 [batch, (bos) + 2*length]: per row, `length` distinct tokens of `drawable(vocab_size,
    special)`, repeated once, after special.bos when given. Deterministic in `key`."""
    exclude, bos = special.exclude, special.bos
    pool = drawable(vocab_size, special)
    if not 2 <= length <= len(pool):
        source = (f"the vocabulary of {vocab_size}" if special.pool is None
                  else f"a pool of {len(set(special.pool))}")
        raise ValueError(f"induction length={length}: must be in [2, {len(pool)}] (the tokens "
                         f"left of {source} after excluding {list(exclude)})")
    if batch < 1:
        raise ValueError(f"induction batch={batch}: must be >= 1")
    keys = jax.random.split(key, batch)
    first = jax.vmap(lambda k: jax.random.permutation(k, len(pool))[:length])(keys)
    first = jnp.asarray(pool, jnp.int32)[first]
    parts = [first, first]
    if bos is not None:
        parts.insert(0, jnp.full((batch, 1), bos, jnp.int32))
    return jnp.concatenate(parts, axis=1)


def chance_score(length: int, offset: int) -> float:
    """The induction score of uniform causal attention: position q has q+1 keys."""
    q = offset + length + np.arange(length)
    return float(np.mean(1.0 / (q + 1)))


@dataclasses.dataclass(frozen=True)
class Induction:
    """Result of `induction`: arrays with a leading seed axis, in the order of `seeds`."""

    seeds: tuple
    score: np.ndarray  # [S, layer, head]; layers without attention (minimal layer 0) are NaN
    loss_first: np.ndarray  # [S] nats, tokens 2..L of the first copy
    loss_second: np.ndarray  # [S] nats, tokens 2..L of the second copy
    length: int
    chance: float  # the score of uniform causal attention (chance_score)
    # The code task's: the same test on identifier characters (`identifier_pool`), and the
    # analyses on real code, `code_attention` and `head_ablation` (None elsewhere).
    identifier: Induction | None = None
    code: CodeAttention | None = None
    ablation: HeadAblation | None = None
    split: str = "iid"  # the ablation split of the per-seed summary (CODE_SEED_COLUMNS)

    @property
    def loss_drop(self) -> np.ndarray:
        return self.loss_first - self.loss_second

    @property
    def best(self) -> np.ndarray:
        """int [S, 2]: each seed's strongest head (layer, head); (-1, -1) for a diverged seed."""
        out = np.full((len(self.seeds), 2), -1)
        for i in np.flatnonzero(np.isfinite(self.max_score)):
            out[i] = np.unravel_index(np.nanargmax(self.score[i]), self.score.shape[1:])
        return out

    def code_seed_values(self) -> dict[str, np.ndarray]:
        """{CODE_SEED_COLUMNS name: [S]} of the best heads, {} without the code analyses."""
        if self.code is None or self.ablation is None:
            return {}
        repeat, other = self.ablation.contrast(self.best, self.split)
        return {"ablation_drop_repeat": repeat, "ablation_drop_other": other,
                "ablation_repeat_minus_other": repeat - other,
                "code_target_attention": self.code.of_heads(self.best)["target_attention"],
                "code_uniform_on_target": np.where(np.isfinite(self.max_score),
                                                   self.code.uniform_on_target, np.nan)}

    @property
    def max_score(self) -> np.ndarray:
        """[S] the score of each seed's strongest induction head (NaN for a diverged seed)."""
        flat = self.score.reshape(len(self.seeds), -1)
        return np.where(np.isnan(flat).all(1), np.nan, np.nanmax(np.nan_to_num(flat, nan=-1), 1))

    def identifier_seed_values(self) -> dict[str, np.ndarray]:
        """{IDENTIFIER_SEED_COLUMNS name: [S]}, {} without the test on identifier characters."""
        found = self.identifier
        if found is None:
            return {}
        return {"identifier_max_score": found.max_score, "identifier_loss_first": found.loss_first,
                "identifier_loss_second": found.loss_second,
                "identifier_loss_drop": found.loss_drop}

    @property
    def row_columns(self) -> tuple[str, ...]:
        """induction.csv's columns: ROW_COLUMNS, and identifier_score with that test."""
        return ROW_COLUMNS + (("identifier_score",) if self.identifier is not None else ())

    def rows(self) -> list[dict]:
        """One row per (seed, layer, head) with attention (`row_columns`)."""
        extra = {} if self.identifier is None else {"identifier_score": self.identifier.score}
        return [{"seed": s, "layer": layer, "head": head,
                 "induction_score": float(self.score[i, layer, head]),
                 **{k: float(v[i, layer, head]) for k, v in extra.items()}}
                for i, s in enumerate(self.seeds)
                for layer in range(self.score.shape[1]) for head in range(self.score.shape[2])
                if not np.isnan(self.score[i, layer, head])]

    @property
    def seed_columns(self) -> tuple[str, ...]:
        """induction_seeds.csv's columns: SEED_COLUMNS, then CODE_SEED_COLUMNS with the code
        analyses and IDENTIFIER_SEED_COLUMNS with the test on identifier characters."""
        return (SEED_COLUMNS + (CODE_SEED_COLUMNS if self.code_seed_values() else ())
                + (IDENTIFIER_SEED_COLUMNS if self.identifier is not None else ()))

    def seed_rows(self) -> list[dict]:
        """One row per seed (`seed_columns`): its best head (-1: a diverged seed) and the loss
        drop, with the code analyses the best head's ablation and attention on code, and with
        the test on identifier characters its best-head score and loss drop."""
        more, best = {**self.code_seed_values(), **self.identifier_seed_values()}, self.best
        return [{"seed": s, "max_induction_score": float(self.max_score[i]),
                 "best_layer": int(best[i, 0]), "best_head": int(best[i, 1]),
                 "loss_first": float(self.loss_first[i]),
                 "loss_second": float(self.loss_second[i]),
                 "loss_drop": float(self.loss_drop[i]),
                 **{k: float(v[i]) for k, v in more.items()}}
                for i, s in enumerate(self.seeds)]

    def scalars(self) -> dict[str, np.ndarray]:
        """{name: [S] values in the order of `seeds`}, TensorBoard's induction/<name>:
        score/layer<l>_head<h>, max_score, loss_drop, and with the code analyses the
        CODE_SEED_COLUMNS and IDENTIFIER_SEED_COLUMNS' score and loss drop."""
        out = {f"score/layer{layer}_head{head}": self.score[:, layer, head]
               for layer in range(self.score.shape[1]) for head in range(self.score.shape[2])
               if not np.isnan(self.score[:, layer, head]).all()}
        ident = self.identifier_seed_values()
        return {**out, "max_score": self.max_score, "loss_drop": self.loss_drop,
                **self.code_seed_values(),
                **{k: ident[k] for k in ("identifier_max_score", "identifier_loss_drop")
                   if k in ident}}


def write(result: Induction, workdir: str, writer=None, step: int = 0) -> None:
    """induction.csv (result.row_columns) and induction_seeds.csv (result.seed_columns) in
    `workdir`,
    with the code analyses induction_code.csv (CODE_COLUMNS) and induction_ablation.csv
    (ABLATION_COLUMNS), and the scalars to a board (tensorboard.board) when given, its members
    in the order of result.seeds."""
    tables.write_csv(result.rows(), os.path.join(workdir, "induction.csv"), result.row_columns)
    tables.write_csv(result.seed_rows(), os.path.join(workdir, "induction_seeds.csv"),
                     result.seed_columns)
    if result.code is not None:
        tables.write_csv(result.code.rows(result.best),
                         os.path.join(workdir, "induction_code.csv"), CODE_COLUMNS)
    if result.ablation is not None:
        tables.write_csv(result.ablation.rows(result.best),
                         os.path.join(workdir, "induction_ablation.csv"), ABLATION_COLUMNS)
    if writer is not None:
        tensorboard.write_scalars(writer, step, {"induction": result.scalars()})


def induction(params: model_lib.Params, cfg: model_lib.ModelConfig, key: jax.Array, *,
              length: int, batch: int = 32, special: SpecialTokens = SpecialTokens(),
              seeds: Sequence | None = None,
              intervention: model_lib.Intervention | None = None) -> Induction:
    """Induction scores of every head and the loss drop on the repeat, per seed.

    `params` has a leading seed axis on every leaf. `special`: the task's special tokens
    (`task_tokens(config.task)`): special.exclude are never drawn, and the sequences start with
    special.bos when there is one, and special.pool is the ids drawn from (default every
    non-special one). `intervention` is passed to `model.forward` (e.g. to probe a
    proxy-replaced model).
    """
    bos = special.bos
    width = (bos is not None) + 2 * length
    if width > cfg.max_len:
        raise ValueError(f"induction length={length}: the repeated sequence has {width} tokens, "
                         f"more than the model's max_len {cfg.max_len}")
    seeds = _seed_labels(params, seeds)
    num_seeds = len(seeds)
    tokens = repeated_tokens(key, cfg.vocab_size, length, batch, special)
    layers = range(model_lib.first_attention_layer(cfg), cfg.n_layers)
    sites = [f"blocks.{i}.attn.pattern" for i in layers]
    offset = 0 if bos is None else 1
    query = offset + length + np.arange(length)
    targets = tokens[:, 1:]  # position t predicts token t+1
    first = np.arange(offset, offset + length - 1)  # predicts tokens 2..L of the first copy
    second = first + length  # predicts tokens 2..L of the second copy

    def one(p):
        logits, cache = model_lib.forward(p, tokens, cfg, intervention=intervention,
                                          cache=sites)
        # [layer, head]: attention of repeat position q to key q - L + 1, averaged over q, batch
        score = jnp.stack([cache[s][:, :, query, query - length + 1].mean((0, 2))
                           for s in sites])
        logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), -1)
        nll = -jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
        return score, nll[:, first].mean(), nll[:, second].mean()

    score, loss_first, loss_second = jax.jit(jax.vmap(one))(params)
    full = np.full((num_seeds, cfg.n_layers, cfg.n_heads), np.nan)
    full[:, list(layers)] = np.asarray(score)
    return Induction(seeds=seeds, score=full, loss_first=np.asarray(loss_first),
                     loss_second=np.asarray(loss_second), length=length,
                     chance=chance_score(length, offset))


def _seed_labels(params: model_lib.Params, seeds: Sequence | None) -> tuple:
    """The labels of params' leading seed axis (0.. by default); ValueError if the leaves
    disagree on it or `seeds` has another length."""
    num_seeds = {x.shape[0] for x in jax.tree.leaves(params)}
    if len(num_seeds) != 1:
        raise ValueError(f"params: leaves disagree on the leading seed axis {sorted(num_seeds)}")
    num_seeds = num_seeds.pop()
    seeds = tuple(range(num_seeds)) if seeds is None else tuple(seeds)
    if len(seeds) != num_seeds:
        raise ValueError(f"seeds: {len(seeds)} labels for {num_seeds} seeds of params")
    return seeds


def default_length(cfg: model_lib.ModelConfig, special: SpecialTokens = SpecialTokens()) -> int:
    """Half the tokens that can be drawn (`drawable`; so a model that only learned "tokens
    already in the context are likely" gains at most ln 2 nats on the repeat: see the threshold
    in the docs), capped so that the repeated sequence fits the model (after special.bos)."""
    size = len(drawable(cfg.vocab_size, special))
    return max(2, min(size // 2, (cfg.max_len - (special.bos is not None)) // 2))


def identifier_pool(vocab) -> tuple[int, ...]:
    """The code task's identifier characters (lexer.IDENTIFIER_CHARS) in `vocab` (a
    splits.Vocab): the pool of the test on identifier characters."""
    from jaxillusions.tasks.code_completion import lexer  # noqa: PLC0415

    return vocab.ids_of(lexer.IDENTIFIER_CHARS)


def identifier_tokens(vocab) -> SpecialTokens:
    """The `special` argument of the code task's test on identifier characters: the code
    task's special tokens (`task_tokens`) with `identifier_pool(vocab)` as the pool."""
    return dataclasses.replace(task_tokens("code"), pool=identifier_pool(vocab))


# Fewer identifier characters than this in the vocabulary (a tiny max_vocab): no such test.
MIN_IDENTIFIER_POOL = 4


def probe(workdir: str, length: int | None = None, batch: int = 64, key: int = 0,
          identifier: bool = False) -> Induction:
    """The induction test on the newest checkpoint of a finished workdir (analysis.load_run),
    every member (a diverged one gives NaN); `length` None: default_length. `identifier`: a
    code run's test on identifier characters instead (`identifier_pool`). Write the result with
    `write(result, workdir)`."""
    from jaxillusions.report import results  # noqa: PLC0415 - results imports pandas lazily

    run = results.load_run(workdir)
    special = task_tokens(run.config.task)
    if identifier:
        if run.config.task != "code":
            raise ValueError(f"identifier=True: the test on identifier characters is the code "
                             f"task's, and {workdir} is a {run.config.task} run")
        special = identifier_tokens(run.splits.vocab)
    if length is None:
        length = default_length(run.model_config, special)
    return induction(run.params, run.model_config, jax.random.key(key), length=length,
                     batch=batch, special=special, seeds=run.labels)


def task_tokens(name: str) -> SpecialTokens:
    """The `special` argument of `induction` for a task (its special tokens)."""
    if name == "code":
        from jaxillusions.tasks.code_completion import splits  # noqa: PLC0415

        return SpecialTokens(exclude=tuple(range(splits.NUM_SPECIAL)), bos=splits.BOS)
    if name == "dyck":
        from jaxillusions.tasks import dyck_sentences as dyck  # noqa: PLC0415

        return SpecialTokens(exclude=(dyck.PAD, dyck.BOS, dyck.EOS), bos=dyck.BOS)
    raise ValueError(f"task={name!r}: no special tokens known for the induction test")


# --- The code task: the mechanism on real code, causally ---------------------------------------

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
    from jaxillusions.tasks.code_completion import lexer  # noqa: PLC0415
    from jaxillusions.tasks.code_completion import splits as code_splits  # noqa: PLC0415

    seeds = _seed_labels(params, seeds)
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
    seeds = _seed_labels(params, seeds)
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


def code_analyses(params: model_lib.Params, cfg: model_lib.ModelConfig, splits: dict, *,
                  rows: int, split_names: Sequence[str], batch_size: int = 64,
                  seeds: Sequence | None = None) -> tuple[CodeAttention, HeadAblation]:
    """The code task's analyses of trained members (`params`, leading seed axis) on its splits
    ({name: CodeSplit}): `code_attention` on the first `rows` iid rows, and `head_ablation` on
    the splits `split_names` (every row), with each head's mean over the non-PAD positions of the
    first `rows` training rows."""
    from jaxillusions import tasks  # noqa: PLC0415
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


def identifier_gap(df: pd.DataFrame, method: str = "original") -> pd.DataFrame:
    """Per (seed, split): accuracy on identifier_repeat minus identifier_first of `method`'s
    rows (the original model by default; a proxy's rows also need `site` and `size` to be
    unique, so they are kept as keys). `df`: results.csv as loaded by analysis.load_results,
    from a code-task run. Columns: keys, acc_repeat, acc_first, n_repeat, n_first,
    repeat_minus_first. Seeds or splits missing either category are left out."""
    from jaxillusions.tasks.code_completion import lexer  # noqa: PLC0415

    bins = {lexer.CATEGORIES.index("identifier_repeat"): "repeat",
            lexer.CATEGORIES.index("identifier_first"): "first"}
    sel = df[(df["breakdown"] == "category") & (df["method"] == method)
             & df["bin"].isin(list(bins))]
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


def has_head(max_score: np.ndarray, loss_drop: np.ndarray) -> np.ndarray:
    """[S] bool: the seed has an induction head by the threshold MIN_SCORE and MIN_LOSS_DROP
    (False for a diverged seed, whose values are NaN)."""
    return (np.asarray(max_score) >= MIN_SCORE) & (np.asarray(loss_drop) >= MIN_LOSS_DROP)


def verdict(max_score, loss_drop, code_attention=None, identifier=None) -> str:
    """'k of n seeds ...': the seeds with an induction head (`has_head`) by the random-token
    test, with the seeds that pass each part; with `identifier` ([S] best-head score, [S] loss
    drop of the test on identifier characters) the same for that test; with the code analyses
    the code task's test (docs/code_completion.md): the best head's attention on the induction
    targets of repeated identifiers in real code in place of its score, with the loss drop on
    identifier characters (on random tokens when `identifier` is None). n counts the healthy
    seeds (finite max_score)."""
    n = int(np.isfinite(np.asarray(max_score, np.float64)).sum())

    def passing(values, bar) -> int:
        return int((np.asarray(values) >= bar).sum())  # NaN (a diverged seed) never passes

    def counts(score, drop, test: str, score_name: str = "best-head score") -> str:
        return (f"{int(has_head(score, drop).sum())} of {n} seeds by {test} ({score_name} >= "
                f"{MIN_SCORE}: {passing(score, MIN_SCORE)}, loss drop >= {MIN_LOSS_DROP:g} nat: "
                f"{passing(drop, MIN_LOSS_DROP)})")

    text = counts(max_score, loss_drop, "the random-token test")
    if identifier is not None:
        text += ", " + counts(*identifier, "the test on identifier characters")
    if code_attention is not None:
        if identifier is None:  # a run from before the test on identifier characters
            return text + (f", {int(has_head(code_attention, loss_drop).sum())} of {n} with its "
                           f"attention measured on code (on repeated identifiers' induction "
                           f"targets >= {MIN_SCORE}: {passing(code_attention, MIN_SCORE)})")
        text += "; code task: " + counts(
            code_attention, identifier[1], "attention on code and loss drop on identifier "
            "characters", "attention on repeated identifiers' induction targets")
    return text


def enabled(config) -> bool:
    """With induction.enabled (the repeated-random-tokens probe of the trained members)."""
    return config.induction.enabled


def check_config(config, model_cfg: model_lib.ModelConfig) -> None:
    """ValueError (one line) if induction.length does not fit the task's tokens or the model."""
    if not enabled(config):
        return
    special = task_tokens(config.task)
    length = config.induction.length or default_length(model_cfg, special)
    pool = len(drawable(model_cfg.vocab_size, special))
    width = (special.bos is not None) + 2 * length
    if not 2 <= length <= pool or width > model_cfg.max_len:
        raise ValueError(f"induction.length={config.induction.length}: must be 0 (the default, "
                         f"{default_length(model_cfg, special)} here) or in [2, "
                         f"{min(pool, (model_cfg.max_len - (special.bos is not None)) // 2)}] "
                         f"({pool} drawable tokens, {model_cfg.max_len} positions)")


def run(ctx) -> object:
    """The main job's induction stage (stages.Context in and out; process 0 alone): probes the
    trained parameters (leading member axis; diverged members are NaN) and writes
    induction.csv, induction_seeds.csv and TensorBoard scalars at the trained step; for the code
    task also `code_analyses` (induction.code_rows iid and training rows; the ablation on iid
    and proxies.eval_splits, batches of train.eval_batch_size): induction_code.csv,
    induction_ablation.csv and the best heads' summary in induction_seeds.csv. The pipeline
    saves it whole (stages.Stage.stamped): a relaunch with the same settings does not probe
    again, one with other induction.* settings (or proxies.eval_splits) moves the CSVs aside
    first."""
    from jaxillusions import tasks  # noqa: PLC0415
    from jaxillusions.runtime import distributed  # noqa: PLC0415
    from jaxillusions.training import train  # noqa: PLC0415

    if not distributed.is_main():
        return ctx
    config, model_cfg, workdir, state = ctx.settings, ctx.model_cfg, ctx.workdir, ctx.state
    ic, special = config.induction, task_tokens(config.task)
    length = ic.length or default_length(model_cfg, special)
    labels, step = train.members(config).labels, int(np.max(state.step))
    # The seeds in the chunks that train and evaluate them (train.seed_chunk_size), so that the
    # stage fits where the evaluation does (configs/code.py: 8 chunks of 8 on one GPU).
    chunks = [(jax.tree.map(lambda x, i=index: x[i], state.params), [labels[i] for i in index])
              for index in distributed.seed_chunks(len(labels), config.train.seed_chunk_size)]
    found = _joined([induction(params, model_cfg, jax.random.key(config.seed), length=length,
                               batch=ic.batch, special=special, seeds=seeds)
                     for params, seeds in chunks], ("score", "loss_first", "loss_second"),
                    len(labels))
    bad = ~np.asarray(state.healthy, bool)

    def diverged_nan(x: np.ndarray) -> np.ndarray:  # NaN in the diverged seeds' rows (axis 0)
        return np.where(bad.reshape(-1, *[1] * (np.ndim(x) - 1)), np.nan, x)

    def diverged_nan_test(test: Induction) -> Induction:
        return dataclasses.replace(test, score=diverged_nan(test.score),
                                   loss_first=diverged_nan(test.loss_first),
                                   loss_second=diverged_nan(test.loss_second))

    found = diverged_nan_test(found)
    names = identifier_tokens(ctx.splits.vocab) if tasks.name(config) == "code" else None
    pool = () if names is None else names.pool
    if len(pool) >= MIN_IDENTIFIER_POOL:  # the code task's test on identifier characters
        ident = _joined([induction(params, model_cfg, jax.random.key(config.seed),
                                   length=default_length(model_cfg, names), batch=ic.batch,
                                   special=names, seeds=seeds)
                         for params, seeds in chunks], ("score", "loss_first", "loss_second"),
                        len(labels))
        found = dataclasses.replace(found, identifier=diverged_nan_test(ident))
    elif tasks.name(config) == "code":
        ctx.say(f"note: the vocabulary has {len(pool)} identifier characters (fewer than "
                f"{MIN_IDENTIFIER_POOL}): no induction test on identifier characters")
    names = [s for s in dict.fromkeys([*tasks.get(config).IN_DISTRIBUTION,
                                        *config.proxies.eval_splits])
             if tasks.name(config) == "code" and s in ctx.splits and len(ctx.splits[s].tokens)]
    if "iid" in names and len(ctx.splits["train"].tokens):  # the code task's analyses
        parts = [code_analyses(params, model_cfg, ctx.splits, rows=ic.code_rows,
                               split_names=names, seeds=seeds,
                               batch_size=config.train.eval_batch_size)
                 for params, seeds in chunks]
        code = _joined([c for c, _ in parts], ("values",), len(labels))
        ablation = _joined([a for _, a in parts], ("correct",), len(labels))
        code = dataclasses.replace(code, values={k: diverged_nan(v)
                                                 for k, v in code.values.items()})
        ablation = dataclasses.replace(ablation, correct=diverged_nan(ablation.correct))
        found = dataclasses.replace(found, code=code, ablation=ablation, split="iid")
    with tensorboard.board(workdir, labels) as writer:
        write(found, workdir, writer, step)
    in_code = found.code_seed_values().get("code_target_attention")
    ident = (None if found.identifier is None
             else (found.identifier.max_score, found.identifier.loss_drop))
    ctx.say(f"induction heads (L={length}"
            + ("" if ident is None else f", {found.identifier.length} on identifier characters")
            + f"): {verdict(found.max_score, found.loss_drop, in_code, ident)}; "
            f"{workdir}/induction_seeds.csv"
            + (", induction_code.csv, induction_ablation.csv" if found.code else ""))
    return ctx.produced(induction=found)


def _joined(parts: Sequence, seeded: Sequence[str], num: int):
    """One result (Induction, CodeAttention or HeadAblation) from those of consecutive seed
    chunks (distributed.seed_chunks: the last chunk padded with copies of the last seed): its
    `seeded` fields (arrays, or dicts of arrays, with a leading seed axis) and seeds joined and
    cut to the first `num` seeds; the other fields are the first chunk's (the same in all)."""
    from jaxillusions.runtime import distributed  # noqa: PLC0415

    joined = distributed.concat_host([{name: getattr(p, name) for name in seeded}
                                      for p in parts], num)
    return dataclasses.replace(parts[0], seeds=tuple(s for p in parts for s in p.seeds)[:num],
                               **joined)


def report_lines(config, workdir: str) -> list[str]:
    """The headline's lines about the mechanism, read from `workdir`'s induction_seeds.csv
    (its stage, `run`) and, for the code task, the original model's identifier_repeat minus
    identifier_first accuracy per split from its results.csv (written to identifier_gap.csv,
    GAP_COLUMNS). [] if the section is disabled."""
    import pandas as pd  # noqa: PLC0415

    from jaxillusions import tasks  # noqa: PLC0415
    from jaxillusions.report import stats  # noqa: PLC0415

    if not enabled(config):
        return []
    lines = []
    seeds_path = os.path.join(workdir, "induction_seeds.csv")
    if os.path.exists(seeds_path):
        per_seed = pd.read_csv(seeds_path).dropna(subset=["max_induction_score"])
        score, drop = per_seed["max_induction_score"], per_seed["loss_drop"]
        in_code = per_seed.get("code_target_attention")
        ident = None
        if "identifier_loss_drop" in per_seed:
            ident = (per_seed["identifier_max_score"], per_seed["identifier_loss_drop"])
        lines.append(
            f"Induction heads: {verdict(score, drop, in_code, ident)}; "
            f"best-head score {_cell(score, stats)}"
            + ("" if in_code is None else f", on code {_cell(in_code, stats)}")
            + f", loss drop {_cell(drop, stats)} nats"
            + ("" if ident is None else f"; on identifier characters best-head score "
               f"{_cell(ident[0], stats)}, loss drop {_cell(ident[1], stats)} nats")
            + " (induction_seeds.csv)")
        if "ablation_drop_repeat" in per_seed:
            lines.append(ablation_line(per_seed, stats))
    results_path = os.path.join(workdir, "results.csv")
    if tasks.name(config) == "code" and os.path.exists(results_path):
        from jaxillusions.report import results  # noqa: PLC0415

        gap = identifier_gap(results.load_results(results_path))
        tables.write_csv(gap.to_dict("records"), os.path.join(workdir, "identifier_gap.csv"),
                         GAP_COLUMNS)
        splits = list(dict.fromkeys(gap["split"]))
        lines.append("identifier_repeat - identifier_first accuracy (original model): " + ", ".join(
            f"{s} {_cell(gap.loc[gap['split'] == s, 'repeat_minus_first'], stats, '+.3f')}"
            for s in splits) + " (identifier_gap.csv)")
    return lines


def ablation_line(per_seed: pd.DataFrame, stats) -> str:
    """The headline's line on the best heads' mean-ablation (induction_seeds.csv's
    CODE_SEED_COLUMNS of the healthy seeds): the accuracy drop on identifier_repeat and on the
    other characters, and their paired difference over seeds (Student t)."""
    ok = per_seed.dropna(subset=["ablation_drop_repeat", "ablation_drop_other"])
    repeat, other = ok["ablation_drop_repeat"], ok["ablation_drop_other"]
    return (f"Best head mean-ablated (iid, {len(ok)} seeds): accuracy drop on {REPEAT} "
            f"{_cell(repeat, stats, '+.3f')}, on the other characters "
            f"{_cell(other, stats, '+.3f')}, paired difference "
            f"{_cell(repeat - other, stats, '+.3f')} (induction_ablation.csv)")


def _cell(values, stats, fmt: str = ".3f") -> str:
    """'mean [low, high]' over seeds (stats.t_interval; the mean alone for one seed)."""
    v = np.asarray(values, np.float64)
    if len(v) < 2:
        return format(float(v.mean()), fmt) if len(v) else "n/a"
    mean, low, high = stats.t_interval(v)
    return f"{mean:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


HEAD_GAP_COLUMNS = ("site", "method", "size", "split", "metric", "category", "n_seeds", "rho",
                    "rho_low", "rho_high", "p_value")


def head_predicts_gap(df: pd.DataFrame, per_seed: pd.DataFrame, baseline: str = "iid",
                      category: str = "identifier_repeat", metric: str = "same_pred",
                      strength: str = "max_induction_score") -> pd.DataFrame:
    """Across seeds: does a seed's induction-head strength predict its generalization gap on
    `category`? Per proxy (site, method, size) and OOD split: Spearman rho between `strength`
    (a column of induction_seeds.csv, `per_seed`: the probe's max_induction_score, or for the
    causal strength the best head's ablation_drop_repeat or ablation_repeat_minus_other) and
    the per-seed gap of `metric` on the
    category's characters (stats.signed_gap: positive = less faithful than on `baseline`), with
    stats.spearman_interval's bootstrap interval over seeds and permutation p-value.
    `df`: results.csv as loaded by analysis.load_results. Columns HEAD_GAP_COLUMNS."""
    import pandas as pd  # noqa: PLC0415

    from jaxillusions.report import stats  # noqa: PLC0415
    from jaxillusions.tasks.code_completion import lexer  # noqa: PLC0415

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




# The main job's stage (sweep.PIPELINE): after training, once per run, saved whole.
# (proxies.eval_splits: the splits the code task's heads are ablated on.)
STAGE = stages.Stage("induction", run, enabled=enabled, scope="run",
                     keys=("induction.*", "proxies.eval_splits"), outputs=OUTPUTS, stamped=True)
