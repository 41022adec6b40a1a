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

`induction(...)` returns an `Induction` with arrays and tidy rows (`rows()`, `seed_rows()`) for a
CSV, and `scalars()` for TensorBoard; `write(...)` writes both (induction.csv,
induction_seeds.csv, and the board's seed_<s> runs). `identifier_gap(df)` is the code
task's mechanism-facing accuracy contrast: per seed and split, accuracy on `identifier_repeat`
minus `identifier_first` (from results.csv, as loaded by `analysis.load_results`).

In the main job (pipeline/sweep.py) the config section `induction` (`enabled`, `length`,
`batch`; analysis keys) runs the stage `STAGE` after training: the probe on the trained
parameters, saved whole (a stamped stage file, so that a relaunch does not probe again), and
`report_lines` adds its headline lines and identifier_gap.csv to the reports.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import model as model_lib
from jaxillusions.report import tables
from jaxillusions.runtime import stages, tensorboard

if TYPE_CHECKING:
    import pandas as pd

ROW_COLUMNS = ("seed", "layer", "head", "induction_score")
GAP_COLUMNS = ("seed", "site", "size", "split", "acc_first", "acc_repeat", "n_first", "n_repeat",
               "repeat_minus_first")
OUTPUTS = ("induction.csv", "induction_seeds.csv")  # the stage's; identifier_gap.csv: the report's
# "A seed has an induction head" (docs/code_completion.md): its best head puts >= 0.3 of its
# attention on the token after the earlier occurrence (20x chance at L = 48), and the model's
# loss on the repeat is >= 1 nat lower than on the first copy (more than the ln 2 that knowing
# which tokens occurred gives at L = pool / 2).
MIN_SCORE = 0.3
MIN_LOSS_DROP = 1.0
SEED_COLUMNS = ("seed", "max_induction_score", "best_layer", "best_head", "loss_first",
                "loss_second", "loss_drop")


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """A task's special tokens as the test needs them (`task_tokens`): `exclude`, the ids never
    drawn (PAD, BOS, EOS, UNK), and `bos`, the token every training row starts with (None: the
    rows have none)."""

    exclude: tuple[int, ...] = ()
    bos: int | None = None


def repeated_tokens(key: jax.Array, vocab_size: int, length: int, batch: int,
                    special: SpecialTokens = SpecialTokens()) -> jax.Array:
    """int32 [batch, (bos) + 2*length]: per row, `length` distinct tokens from range(vocab_size)
    minus special.exclude, repeated once, after special.bos when given. Deterministic in
    `key`."""
    exclude, bos = special.exclude, special.bos
    pool = np.setdiff1d(np.arange(vocab_size), np.asarray(exclude, dtype=np.int64))
    if not 2 <= length <= len(pool):
        raise ValueError(f"induction length={length}: must be in [2, {len(pool)}] (the tokens "
                         f"left of the vocabulary of {vocab_size} after excluding {list(exclude)})")
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

    @property
    def loss_drop(self) -> np.ndarray:
        return self.loss_first - self.loss_second

    @property
    def max_score(self) -> np.ndarray:
        """[S] the score of each seed's strongest induction head (NaN for a diverged seed)."""
        flat = self.score.reshape(len(self.seeds), -1)
        return np.where(np.isnan(flat).all(1), np.nan, np.nanmax(np.nan_to_num(flat, nan=-1), 1))

    def rows(self) -> list[dict]:
        """One row per (seed, layer, head) with attention (ROW_COLUMNS)."""
        return [{"seed": s, "layer": layer, "head": head,
                 "induction_score": float(self.score[i, layer, head])}
                for i, s in enumerate(self.seeds)
                for layer in range(self.score.shape[1]) for head in range(self.score.shape[2])
                if not np.isnan(self.score[i, layer, head])]

    def seed_rows(self) -> list[dict]:
        """One row per seed (SEED_COLUMNS): its best head and the loss drop."""
        out = []
        for i, s in enumerate(self.seeds):
            layer, head = (-1, -1) if np.isnan(self.max_score[i]) else np.unravel_index(
                np.nanargmax(self.score[i]), self.score.shape[1:])  # -1: a diverged seed
            out.append({"seed": s, "max_induction_score": float(self.max_score[i]),
                        "best_layer": int(layer), "best_head": int(head),
                        "loss_first": float(self.loss_first[i]),
                        "loss_second": float(self.loss_second[i]),
                        "loss_drop": float(self.loss_drop[i])})
        return out

    def scalars(self) -> dict[str, np.ndarray]:
        """{name: [S] values in the order of `seeds`}, TensorBoard's induction/<name>:
        score/layer<l>_head<h>, max_score, loss_drop."""
        out = {f"score/layer{layer}_head{head}": self.score[:, layer, head]
               for layer in range(self.score.shape[1]) for head in range(self.score.shape[2])
               if not np.isnan(self.score[:, layer, head]).all()}
        return {**out, "max_score": self.max_score, "loss_drop": self.loss_drop}


def write(result: Induction, workdir: str, writer=None, step: int = 0) -> None:
    """induction.csv (ROW_COLUMNS) and induction_seeds.csv (SEED_COLUMNS) in `workdir`, and
    the scalars to a board (tensorboard.board) when given, its members in the order of
    result.seeds."""
    tables.write_csv(result.rows(), os.path.join(workdir, "induction.csv"), ROW_COLUMNS)
    tables.write_csv(result.seed_rows(), os.path.join(workdir, "induction_seeds.csv"),
                     SEED_COLUMNS)
    if writer is not None:
        tensorboard.write_scalars(writer, step, {"induction": result.scalars()})


def induction(params: model_lib.Params, cfg: model_lib.ModelConfig, key: jax.Array, *,
              length: int, batch: int = 32, special: SpecialTokens = SpecialTokens(),
              seeds: Sequence | None = None,
              intervention: model_lib.Intervention | None = None) -> Induction:
    """Induction scores of every head and the loss drop on the repeat, per seed.

    `params` has a leading seed axis on every leaf. `special`: the task's special tokens
    (`task_tokens(config.task)`): special.exclude are never drawn, and the sequences start with
    special.bos when there is one. `intervention` is passed to `model.forward` (e.g. to probe a
    proxy-replaced model).
    """
    bos = special.bos
    width = (bos is not None) + 2 * length
    if width > cfg.max_len:
        raise ValueError(f"induction length={length}: the repeated sequence has {width} tokens, "
                         f"more than the model's max_len {cfg.max_len}")
    num_seeds = {x.shape[0] for x in jax.tree.leaves(params)}
    if len(num_seeds) != 1:
        raise ValueError(f"params: leaves disagree on the leading seed axis {sorted(num_seeds)}")
    num_seeds = num_seeds.pop()
    seeds = tuple(range(num_seeds)) if seeds is None else tuple(seeds)
    if len(seeds) != num_seeds:
        raise ValueError(f"seeds: {len(seeds)} labels for {num_seeds} seeds of params")
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


def default_length(cfg: model_lib.ModelConfig,
                   special: SpecialTokens = SpecialTokens()) -> int:
    """Half the tokens that can be drawn (so a model that only learned "tokens already in the
    context are likely" gains at most ln 2 nats on the repeat: see the threshold in the docs),
    capped so that the repeated sequence fits the model (after special.bos)."""
    pool = cfg.vocab_size - len(set(special.exclude) & set(range(cfg.vocab_size)))
    return max(2, min(pool // 2, (cfg.max_len - (special.bos is not None)) // 2))


def probe(workdir: str, length: int | None = None, batch: int = 64, key: int = 0) -> Induction:
    """The induction test on the newest checkpoint of a finished workdir (analysis.load_run),
    every member (a diverged one gives NaN); `length` None: default_length. Write the result
    with `write(result, workdir)`."""
    from jaxillusions.report import results  # noqa: PLC0415 - results imports pandas lazily

    run = results.load_run(workdir)
    special = task_tokens(run.config.task)
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


def enabled(config) -> bool:
    """With induction.enabled (the repeated-random-tokens probe of the trained members)."""
    return config.induction.enabled


def check_config(config, model_cfg: model_lib.ModelConfig) -> None:
    """ValueError (one line) if induction.length does not fit the task's tokens or the model."""
    if not enabled(config):
        return
    special = task_tokens(config.task)
    length = config.induction.length or default_length(model_cfg, special)
    pool = model_cfg.vocab_size - len(set(special.exclude) & set(range(model_cfg.vocab_size)))
    width = (special.bos is not None) + 2 * length
    if not 2 <= length <= pool or width > model_cfg.max_len:
        raise ValueError(f"induction.length={config.induction.length}: must be 0 (the default, "
                         f"{default_length(model_cfg, special)} here) or in [2, "
                         f"{min(pool, (model_cfg.max_len - (special.bos is not None)) // 2)}] "
                         f"({pool} drawable tokens, {model_cfg.max_len} positions)")


def run(ctx) -> object:
    """The main job's induction stage (stages.Context in and out; process 0 alone): probes the
    trained parameters (leading member axis; diverged members are NaN) and writes
    induction.csv, induction_seeds.csv and TensorBoard scalars at the trained step. The pipeline
    saves it whole (stages.Stage.stamped): a relaunch with the same settings does not probe
    again, one with other induction.* settings moves the CSVs aside first."""
    from jaxillusions.runtime import distributed  # noqa: PLC0415
    from jaxillusions.training import train  # noqa: PLC0415

    if not distributed.is_main():
        return ctx
    config, model_cfg, workdir, state = ctx.settings, ctx.model_cfg, ctx.workdir, ctx.state
    ic, special = config.induction, task_tokens(config.task)
    length = ic.length or default_length(model_cfg, special)
    labels, step = train.members(config).labels, int(np.max(state.step))
    found = induction(state.params, model_cfg, jax.random.key(config.seed), length=length,
                      batch=ic.batch, special=special, seeds=labels)
    bad = ~np.asarray(state.healthy, bool)
    found = dataclasses.replace(
        found, score=np.where(bad[:, None, None], np.nan, found.score),
        loss_first=np.where(bad, np.nan, found.loss_first),
        loss_second=np.where(bad, np.nan, found.loss_second))
    with tensorboard.board(workdir, labels) as writer:
        write(found, workdir, writer, step)
    heads = has_head(found.max_score, found.loss_drop)
    ctx.say(f"induction: {int(heads.sum())} of {int((~bad).sum())} seeds have an induction "
            f"head (score >= {MIN_SCORE}, loss drop >= {MIN_LOSS_DROP:g} nat; L={length}); "
            f"{workdir}/induction_seeds.csv")
    return ctx.produced(induction=found)


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
        heads = has_head(per_seed["max_induction_score"], per_seed["loss_drop"])
        lines.append(
            f"Induction heads: {int(heads.sum())} of {len(per_seed)} seeds (best-head score >= "
            f"{MIN_SCORE}, loss drop >= {MIN_LOSS_DROP:g} nat); best-head score "
            f"{_cell(per_seed['max_induction_score'], stats)}, loss drop "
            f"{_cell(per_seed['loss_drop'], stats)} nats (induction_seeds.csv)")
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
    (a column of induction_seeds.csv, `per_seed`) and the per-seed gap of `metric` on the
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
STAGE = stages.Stage("induction", run, enabled=enabled, scope="run",
                     keys=("induction.*",), outputs=OUTPUTS, stamped=True)
