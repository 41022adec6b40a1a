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

The study calls only the task's hooks (tasks.Hooks), so it runs on any task that has them:

- `special_tokens(data)` (needed: induction.enabled is a one-line error naming it for a task
  without it): the ids never drawn, the BOS and the ids drawn from, for the run's data.*
  settings (`task_tokens(config)`). The tokens are drawn from every other id of the model's
  vocabulary by default; the text task (imported checkpoints, docs/pretrained.md) draws from its
  tokenizer's ids, less its special tokens, PAD and the BOS (not from the rows an embedding has
  beyond the tokenizer's ids, as Pythia's).
- `token_pools` and `pool_tokens` (optional): further pools, each tested the same way at L = half
  of it (`Induction.pools`; columns <name>_*). The code task's "identifier" pool holds its
  identifier characters, the characters its copying heads copy: random characters of every kind
  are far out of a code model's distribution, random name characters less so.
- `copying_analyses`, `copying_verdict`, `copying_report` (optional): how the models copy on the
  task's own data (`Induction.analyses`: its columns of induction_seeds.csv and its tables
  induction_<name>.csv), its part of the verdict and of the headline. The code task's
  (jaxillusions/tasks/code_completion/copying.py): every head's attention on the induction
  targets of repeated identifiers in real code and its mean-ablation, and identifier_gap.csv.
  The text task's (tasks/text.py): every head's attention on the induction targets at the
  copyable tokens of iid text (induction_text.csv).

`induction(...)` returns an `Induction` with arrays and tidy rows (`rows()`, `seed_rows()`) for a
CSV, and `scalars()` for TensorBoard; `write(...)` writes both (induction.csv,
induction_seeds.csv, the analyses' tables, and the board's seed_<s> runs).

In the main job (pipeline/sweep.py) the config section `induction` (`enabled`, `length`,
`batch`, `code_rows`; analysis keys) runs the stage `STAGE` after training: the probe on the
trained parameters (and the task's pools and analyses), saved whole (a stamped stage file, so
that a relaunch does not probe again), and `report_lines` adds its headline lines (and the
task's report tables) to the reports.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import model as model_lib
from jaxillusions import tasks
from jaxillusions.config.fields import BOOL, INT, nonnegative, positive, setting
from jaxillusions.report import tables
from jaxillusions.runtime import tensorboard
from jaxillusions.studies.stage import TRAINED, Stage
from jaxillusions.tasks import SpecialTokens

ROW_COLUMNS = ("seed", "layer", "head", "induction_score")
# The stage's: induction.csv, induction_seeds.csv and the tables of the task's analyses,
# induction_<name>.csv (the code task's induction_code.csv and induction_ablation.csv; one
# pattern, so that a Dyck run, which has only the seeds file, is complete too); the task's
# report tables (the code task's identifier_gap.csv) are the report's.
OUTPUTS = ("induction.csv", "induction_*.csv")
# "A seed has an induction head" (docs/code_completion.md): its best head puts >= 0.3 of its
# attention on the token after the earlier occurrence (20x chance at L = 48), and the model's
# loss on the repeat is >= 1 nat lower than on the first copy (more than the ln 2 that knowing
# which tokens occurred gives at L = pool / 2). A task's verdict (copying_verdict) applies the
# same bars (the code task: 0.3 also to the best head's attention on the induction targets of
# real code; random characters are out of distribution for a code model, whose copying heads
# score about 0.1 on them).
MIN_SCORE = 0.3
MIN_LOSS_DROP = 1.0
SEED_COLUMNS = ("seed", "max_induction_score", "best_layer", "best_head", "loss_first",
                "loss_second", "loss_drop")
# induction_seeds.csv's further columns per token pool <name> of the task: <name>_<column> (its
# best-head score and loss drop; induction.csv gets <name>_score per head).
POOL_SEED_COLUMNS = ("max_score", "loss_first", "loss_second", "loss_drop")
# A pool with fewer ids in the vocabulary (a tiny max_vocab) gets no test.
MIN_POOL = 4
EVERY_TOKEN = SpecialTokens()  # no special tokens: every id drawn, no BOS


def drawable(vocab_size: int, special: SpecialTokens = EVERY_TOKEN) -> np.ndarray:
    """The sorted ids the test draws from: special.pool (default: every id below vocab_size)
    minus special.exclude; ValueError if the pool names an id outside the vocabulary."""
    pool = special.pool
    ids = np.arange(vocab_size) if pool is None else np.asarray(pool, np.int64).ravel()
    if len(ids) and not (0 <= ids.min() and ids.max() < vocab_size):
        raise ValueError(f"induction pool: ids must be in [0, {vocab_size}), got "
                         f"{int(ids.min())}..{int(ids.max())}")
    return np.setdiff1d(ids, np.asarray(special.exclude, dtype=np.int64))


def repeated_tokens(key: jax.Array, vocab_size: int, length: int, batch: int,
                    special: SpecialTokens = EVERY_TOKEN) -> jax.Array:
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
    # The same test on each token pool of the task (hook token_pools; the code task's
    # "identifier"), and the task's analyses on its own data (hook copying_analyses: an object
    # with seed_values(best) and tables(best)), or none.
    pools: Mapping[str, Induction] = dataclasses.field(default_factory=dict)
    analyses: Any = None

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

    @property
    def max_score(self) -> np.ndarray:
        """[S] the score of each seed's strongest induction head (NaN for a diverged seed)."""
        flat = self.score.reshape(len(self.seeds), -1)
        return np.where(np.isnan(flat).all(1), np.nan, np.nanmax(np.nan_to_num(flat, nan=-1), 1))

    def analyses_seed_values(self) -> dict[str, np.ndarray]:
        """{column: [S]} of the task's analyses for the best heads, {} without them."""
        return {} if self.analyses is None else dict(self.analyses.seed_values(self.best))

    def pool_seed_values(self) -> dict[str, np.ndarray]:
        """{<pool>_<POOL_SEED_COLUMNS name>: [S]} of the tests on the token pools."""
        return {f"{name}_{column}": values for name, test in self.pools.items()
                for column, values in zip(POOL_SEED_COLUMNS, (
                    test.max_score, test.loss_first, test.loss_second, test.loss_drop),
                    strict=True)}

    @property
    def row_columns(self) -> tuple[str, ...]:
        """induction.csv's columns: ROW_COLUMNS, and <pool>_score per token pool."""
        return ROW_COLUMNS + tuple(f"{name}_score" for name in self.pools)

    def rows(self) -> list[dict]:
        """One row per (seed, layer, head) with attention (`row_columns`)."""
        extra = {f"{name}_score": test.score for name, test in self.pools.items()}
        return [{"seed": s, "layer": layer, "head": head,
                 "induction_score": float(self.score[i, layer, head]),
                 **{k: float(v[i, layer, head]) for k, v in extra.items()}}
                for i, s in enumerate(self.seeds)
                for layer in range(self.score.shape[1]) for head in range(self.score.shape[2])
                if not np.isnan(self.score[i, layer, head])]

    @property
    def seed_columns(self) -> tuple[str, ...]:
        """induction_seeds.csv's columns: SEED_COLUMNS, then the analyses' and the pools'."""
        return (SEED_COLUMNS + tuple(self.analyses_seed_values())
                + tuple(self.pool_seed_values()))

    def seed_rows(self) -> list[dict]:
        """One row per seed (`seed_columns`): its best head (-1: a diverged seed) and the loss
        drop, the task's analyses of the best head, and each token pool's best-head score and
        loss drop."""
        more, best = {**self.analyses_seed_values(), **self.pool_seed_values()}, self.best
        return [{"seed": s, "max_induction_score": float(self.max_score[i]),
                 "best_layer": int(best[i, 0]), "best_head": int(best[i, 1]),
                 "loss_first": float(self.loss_first[i]),
                 "loss_second": float(self.loss_second[i]),
                 "loss_drop": float(self.loss_drop[i]),
                 **{k: float(v[i]) for k, v in more.items()}}
                for i, s in enumerate(self.seeds)]

    def scalars(self) -> dict[str, np.ndarray]:
        """{name: [S] values in the order of `seeds`}, TensorBoard's induction/<name>:
        score/layer<l>_head<h>, max_score, loss_drop, the task's analyses' seed columns and each
        token pool's <pool>_max_score and <pool>_loss_drop."""
        out = {f"score/layer{layer}_head{head}": self.score[:, layer, head]
               for layer in range(self.score.shape[1]) for head in range(self.score.shape[2])
               if not np.isnan(self.score[:, layer, head]).all()}
        pools = self.pool_seed_values()
        return {**out, "max_score": self.max_score, "loss_drop": self.loss_drop,
                **self.analyses_seed_values(),
                **{k: pools[k] for name in self.pools
                   for k in (f"{name}_max_score", f"{name}_loss_drop")}}


def write(result: Induction, workdir: str, writer=None, step: int = 0) -> None:
    """induction.csv (result.row_columns) and induction_seeds.csv (result.seed_columns) in
    `workdir`, with the task's analyses their tables (induction_<name>.csv), and the scalars to a
    board (tensorboard.board) when given, its members in the order of result.seeds."""
    tables.write_csv(result.rows(), os.path.join(workdir, "induction.csv"), result.row_columns)
    tables.write_csv(result.seed_rows(), os.path.join(workdir, "induction_seeds.csv"),
                     result.seed_columns)
    if result.analyses is not None:
        for name, (rows, columns) in result.analyses.tables(result.best).items():
            tables.write_csv(rows, os.path.join(workdir, name), columns)
    if writer is not None:
        tensorboard.write_scalars(writer, step, {"induction": result.scalars()})


def induction(params: model_lib.Params, cfg: model_lib.ModelConfig, key: jax.Array, *,
              length: int, batch: int = 32, special: SpecialTokens = EVERY_TOKEN,
              seeds: Sequence | None = None,
              intervention: model_lib.Intervention | None = None) -> Induction:
    """Induction scores of every head and the loss drop on the repeat, per seed.

    `params` has a leading seed axis on every leaf. `special`: the task's special tokens
    (`task_tokens(config)`): special.exclude are never drawn, and the sequences start with
    special.bos when there is one, and special.pool is the ids drawn from (default every
    non-special one). `intervention` is passed to `model.forward` (e.g. to probe a
    proxy-replaced model).
    """
    bos = special.bos
    width = (bos is not None) + 2 * length
    if width > cfg.max_len:
        raise ValueError(f"induction length={length}: the repeated sequence has {width} tokens, "
                         f"more than the model's max_len {cfg.max_len}")
    seeds = model_lib.seed_labels(params, cfg, seeds)
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


def default_length(cfg: model_lib.ModelConfig, special: SpecialTokens = EVERY_TOKEN) -> int:
    """Half the tokens that can be drawn (`drawable`; so a model that only learned "tokens
    already in the context are likely" gains at most ln 2 nats on the repeat: see the threshold
    in the docs), capped so that the repeated sequence fits the model (after special.bos)."""
    size = len(drawable(cfg.vocab_size, special))
    return max(2, min(size // 2, (cfg.max_len - (special.bos is not None)) // 2))


def task_tokens(config, what: str = "the induction test") -> SpecialTokens:
    """The `special` argument of `induction` for a run's settings `config` (its task and its
    data.* settings) or for a task's name (its data.* settings at their defaults: enough for the
    Dyck and code tasks, whose ids are fixed; the text task's are its tokenizer's): the task's
    hook special_tokens (a one-line ValueError naming the hook, and `what` needs it, for a task
    without it)."""
    task = tasks.get(config)
    data = task.Data() if isinstance(config, str) else config.data
    return tasks.require(task, "special_tokens", what)(data)


def token_pools(task) -> dict[str, str]:
    """{name: what its tokens are} of a task module's token pools (hook token_pools)."""
    return dict(tasks.hook(task, "token_pools")())


def pool_special(task, name: str, splits, special: SpecialTokens) -> SpecialTokens:
    """`special` drawing from the task's token pool `name` in the loaded data `splits` (its hook
    pool_tokens)."""
    ids = tasks.require(task, "pool_tokens", f"the induction test on token pool {name!r}")
    return dataclasses.replace(special, pool=tuple(ids(name, splits)))


def probe(workdir: str, length: int | None = None, batch: int = 64, key: int = 0,
          pool: str | None = None) -> Induction:
    """The induction test on the newest checkpoint of a finished workdir (analysis.load_run),
    every member (a diverged one gives NaN); `length` None: default_length. `pool`: the test on
    that token pool of the run's task instead (`token_pools`; a code run's "identifier"). Write
    the result with `write(result, workdir)`."""
    from jaxillusions.report import results  # noqa: PLC0415 - results imports pandas lazily

    run = results.load_run(workdir)
    special = task_tokens(run.config)
    if pool is not None:
        task = tasks.get(run.config.task)
        if pool not in token_pools(task):
            raise ValueError(f"pool={pool!r}: not a token pool of the {task.NAME} task of "
                             f"{workdir} (its pools: {', '.join(token_pools(task)) or 'none'})")
        special = pool_special(task, pool, run.splits, special)
    if length is None:
        length = default_length(run.model_config, special)
    return induction(run.params, run.model_config, jax.random.key(key), length=length,
                     batch=batch, special=special, seeds=run.labels)


def has_head(max_score: np.ndarray, loss_drop: np.ndarray) -> np.ndarray:
    """[S] bool: the seed has an induction head by the threshold MIN_SCORE and MIN_LOSS_DROP
    (False for a diverged seed, whose values are NaN)."""
    return (np.asarray(max_score) >= MIN_SCORE) & (np.asarray(loss_drop) >= MIN_LOSS_DROP)


@dataclasses.dataclass(frozen=True)
class Tally:
    """The verdict's counts over `n` healthy seeds (a task's copying_verdict counts with it)."""

    n: int
    min_score: float = MIN_SCORE
    min_loss_drop: float = MIN_LOSS_DROP

    @staticmethod
    def passing(values, bar: float) -> int:
        return int((np.asarray(values) >= bar).sum())  # NaN (a diverged seed) never passes

    @staticmethod
    def heads(score, drop) -> int:
        """The seeds with an induction head (`has_head`) by these scores and loss drops."""
        return int(has_head(score, drop).sum())

    def counts(self, score, drop, test: str, score_name: str = "best-head score") -> str:
        return (f"{self.heads(score, drop)} of {self.n} seeds by {test} ({score_name} >= "
                f"{self.min_score}: {self.passing(score, self.min_score)}, loss drop >= "
                f"{self.min_loss_drop:g} nat: {self.passing(drop, self.min_loss_drop)})")


def verdict(max_score, loss_drop, columns: Mapping | None = None, task=None) -> str:
    """'k of n seeds ...': the seeds with an induction head (`has_head`) by the random-token
    test, with the seeds that pass each part. With `task` (a task module) and `columns` (the
    further per-seed columns of induction_seeds.csv: a dict of [S] arrays or its DataFrame):
    the same for the test on each of its token pools, and its own part (hook copying_verdict).
    n counts the healthy seeds (finite max_score)."""
    columns = {} if columns is None else columns
    tally = Tally(int(np.isfinite(np.asarray(max_score, np.float64)).sum()))
    text = tally.counts(max_score, loss_drop, "the random-token test")
    if task is None:
        return text
    for name, about in token_pools(task).items():
        if f"{name}_loss_drop" in columns:
            text += ", " + tally.counts(columns[f"{name}_max_score"],
                                        columns[f"{name}_loss_drop"], f"the test on {about}")
    own = tasks.hook(task, "copying_verdict")
    return text if own is None else text + own({**columns, "loss_drop": loss_drop}, tally)


def enabled(config) -> bool:
    """With induction.enabled (the repeated-random-tokens probe of the trained members)."""
    return config.induction.enabled


def check(config, model_cfg: model_lib.ModelConfig) -> list[str]:
    """ValueError (one line) if induction.length does not fit the task's tokens or the model."""
    if not enabled(config):
        return []
    special = task_tokens(config, "induction.enabled=True")
    length = config.induction.length or default_length(model_cfg, special)
    pool = len(drawable(model_cfg.vocab_size, special))
    width = (special.bos is not None) + 2 * length
    if not 2 <= length <= pool or width > model_cfg.max_len:
        raise ValueError(f"induction.length={config.induction.length}: must be 0 (the default, "
                         f"{default_length(model_cfg, special)} here) or in [2, "
                         f"{min(pool, (model_cfg.max_len - (special.bos is not None)) // 2)}] "
                         f"({pool} drawable tokens, {model_cfg.max_len} positions)")
    return []


def run(ctx) -> object:
    """The main job's induction stage (stages.Context in and out; process 0 alone): probes the
    trained parameters (leading member axis; diverged members are NaN) and writes
    induction.csv, induction_seeds.csv and TensorBoard scalars at the trained step; with the
    task's token pools the test on each, and with its analyses (hook copying_analyses:
    induction.code_rows rows, the in-distribution splits and proxies.eval_splits, batches of
    train.eval_batch_size) their tables and columns. The pipeline saves it whole
    (stages.Stage.stamped): a relaunch with the same settings does not probe again, one with
    other induction.* settings (or proxies.eval_splits) moves the CSVs aside first."""
    from jaxillusions.runtime import distributed  # noqa: PLC0415
    from jaxillusions.training import train  # noqa: PLC0415

    if not distributed.is_main():
        return ctx
    config, model_cfg, workdir, state = ctx.settings, ctx.model_cfg, ctx.workdir, ctx.state
    task = tasks.get(config)
    ic, special = config.induction, task_tokens(config, "induction.enabled=True")
    length = ic.length or default_length(model_cfg, special)
    labels, step = train.members(config).labels, int(np.max(state.step))
    # The seeds in the chunks that train and evaluate them (train.seed_chunk_size), so that the
    # stage fits where the evaluation does (jaxillusions/configs/code.py: 8 chunks of 8 on one GPU).
    chunks = [(jax.tree.map(lambda x, i=index: x[i], state.params), [labels[i] for i in index])
              for index in distributed.seed_chunks(len(labels), config.train.seed_chunk_size)]
    diverged = ~np.asarray(state.healthy, bool)

    def nan_rows(x: np.ndarray) -> np.ndarray:  # NaN in the diverged seeds' rows (axis 0)
        return np.where(diverged.reshape(-1, *[1] * (np.ndim(x) - 1)), np.nan, x)

    def test(special: SpecialTokens, length: int) -> Induction:  # every chunk, joined
        found = _joined([induction(params, model_cfg, jax.random.key(config.seed), length=length,
                                   batch=ic.batch, special=special, seeds=seeds)
                         for params, seeds in chunks], ("score", "loss_first", "loss_second"),
                        len(labels))
        return dataclasses.replace(found, score=nan_rows(found.score),
                                   loss_first=nan_rows(found.loss_first),
                                   loss_second=nan_rows(found.loss_second))

    found, pools, about = test(special, length), {}, token_pools(task)
    for name, what in about.items():
        drawn = pool_special(task, name, ctx.splits, special)
        if len(drawn.pool) >= MIN_POOL:
            pools[name] = test(drawn, default_length(model_cfg, drawn))
        else:
            ctx.say(f"note: the vocabulary has {len(drawn.pool)} {what} (fewer than "
                    f"{MIN_POOL}): no induction test on {what}")
    analyses = tasks.hook(task, "copying_analyses")
    if analyses is not None:
        names = [s for s in dict.fromkeys([*task.IN_DISTRIBUTION, *config.proxies.eval_splits])
                 if s in ctx.splits and len(ctx.splits[s].tokens)]
        analyses = analyses(chunks, model_cfg, ctx.splits, diverged, rows=ic.code_rows,
                            split_names=names, batch_size=config.train.eval_batch_size)
    found = dataclasses.replace(found, pools=pools, analyses=analyses)
    with tensorboard.board(workdir, labels) as writer:
        write(found, workdir, writer, step)
    files = [] if analyses is None else list(analyses.tables(found.best))
    columns = {**found.analyses_seed_values(), **found.pool_seed_values()}
    ctx.say(f"induction heads (L={length}"
            + "".join(f", {test.length} on {about[name]}" for name, test in pools.items())
            + f"): {verdict(found.max_score, found.loss_drop, columns, task)}; "
            f"{workdir}/induction_seeds.csv" + "".join(f", {name}" for name in files))
    return ctx.produced("induction", found=found)


def _joined(parts: Sequence[Induction], seeded: Sequence[str], num: int) -> Induction:
    """One result from those of consecutive seed chunks (distributed.seed_chunks: the last
    chunk padded with copies of the last seed): its `seeded` fields (arrays with a leading seed
    axis) and seeds joined and cut to the first `num` seeds; the other fields are the first
    chunk's (the same in all)."""
    from jaxillusions.runtime import distributed  # noqa: PLC0415

    joined = distributed.concat_host([{name: getattr(p, name) for name in seeded}
                                      for p in parts], num)
    return dataclasses.replace(parts[0], seeds=tuple(s for p in parts for s in p.seeds)[:num],
                               **joined)


def report_lines(ctx) -> list[str]:
    """The headline's lines about the mechanism, read from the group directory's
    induction_seeds.csv (its stage, `run`): the verdict with its cells, and the task's part
    (hook copying_report, which also reads results.csv and writes its tables beside it: the code
    task's identifier_gap.csv). [] if the section is disabled."""
    import pandas as pd  # noqa: PLC0415

    from jaxillusions.report import results  # noqa: PLC0415

    config, workdir = ctx.settings, ctx.directory
    if not enabled(config):
        return []
    task, lines, per_seed, own = tasks.get(config), [], None, None
    seeds_path = os.path.join(workdir, "induction_seeds.csv")
    if os.path.exists(seeds_path):
        per_seed = pd.read_csv(seeds_path).dropna(subset=["max_induction_score"])
    report = tasks.hook(task, "copying_report")
    if report is not None:
        results_path = os.path.join(workdir, "results.csv")
        own = report(per_seed, (results.load_results(results_path)
                                if os.path.exists(results_path) else None), cell)
    if per_seed is not None:
        score, drop = per_seed["max_induction_score"], per_seed["loss_drop"]
        share = functools.partial(cell, bounds=(0, 1))  # an attention share
        pools = "".join(f"; on {what} best-head score {share(per_seed[f'{name}_max_score'])}, "
                        f"loss drop {cell(per_seed[f'{name}_loss_drop'])} nats"
                        for name, what in token_pools(task).items()
                        if f"{name}_loss_drop" in per_seed)
        lines.append(f"Induction heads: {verdict(score, drop, per_seed, task)}; "
                     f"best-head score {share(score)}" + ("" if own is None else own.cells)
                     + f", loss drop {cell(drop)} nats{pools} (induction_seeds.csv)")
    if own is not None:
        lines += own.lines
        for name, (rows, columns) in own.tables.items():
            tables.write_csv(rows, os.path.join(workdir, name), columns)
    return lines


def cell(values, fmt: str = ".3f", bounds: tuple[float, float] = (-math.inf, math.inf)) -> str:
    """'mean [low, high]' over seeds (stats.t_interval, clipped to `bounds`, the range of the
    values: (0, 1) for a share, (-1, 1) for a difference of two; the mean alone for one
    seed)."""
    from jaxillusions.report import stats  # noqa: PLC0415

    v = np.asarray(values, np.float64)
    if len(v) < 2:
        return format(float(v.mean()), fmt) if len(v) else "n/a"
    mean, low, high = stats.t_interval(v, bounds=bounds)
    return f"{mean:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


@dataclasses.dataclass(frozen=True)
class InductionSettings:
    """The induction-head test after training (jaxillusions/studies/induction.py)."""

    enabled: bool = setting(False, BOOL, "true or false")
    length: int = setting(0, INT, ">= 0 (0: half the drawable tokens, capped to fit)",
                          nonnegative, "tokens of the random sequence, repeated once")
    batch: int = setting(64, INT, ">= 1", positive, "sequences")
    code_rows: int = setting(128, INT, ">= 1", positive,
                             "code task: iid rows for the heads' attention on repeated "
                             "identifiers, training rows for the ablation means")


# The main job's stage (job.PIPELINE): after training, once per run, saved whole.
# (proxies.eval_splits: the splits the code task's heads are ablated on.)
STAGE = Stage("induction", run, enabled=enabled, scope="run",
              keys=("induction.*", "proxies.eval_splits"), outputs=OUTPUTS, stamped=True,
              section=InductionSettings, check=check, report=report_lines, headline=True,
              needs=(TRAINED,), makes=("induction",))
