"""The task contract (re-exported by jaxillusions/tasks/__init__.py): `Task`, what every task
module defines; `Hooks`, its optional hooks, with their DEFAULTS (tasks.hook and tasks.require
resolve them); and the types a task hands the shared code (View, SpecialTokens, Report).

A new task is one module (or package) of jaxillusions/tasks/ with `Task`'s members; no study and
no training code names it. Of `Hooks` it defines what its settings or studies use; a setting
that needs a missing one is refused with a one-line error: bracket_ids for train.loss_on="closing",
contrastive_loss (and contrastive_args, contrastive_width) for train.contrastive_weights,
first_layer for model.first_layer="minimal", special_tokens for induction.enabled (token_pools,
pool_tokens and copying_* add to that study)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class View:
    """One split as the shared code sees it. Position t predicts tokens[:, t+1]."""

    tokens: np.ndarray  # int32 [N, T], PAD 0, every row starts with BOS
    evaluated: np.ndarray  # bool [N, T]: the prediction at t is scored
    # breakdown -> int32 [N, T] bin of each evaluated position; < 0: not in this breakdown (code:
    # bracket depth exists at closing brackets only). TRAIN_BREAKDOWN must cover every one.
    bins: dict[str, np.ndarray]
    num_bins: dict[str, int]  # breakdown -> bins to allot per split (> every bin used)


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """A task's tokens as a random-token test needs them (hook `special_tokens`): `exclude`,
    the ids never drawn (PAD, BOS, EOS, UNK; a tokenizer's special tokens), `bos`, the token
    every training row starts with (None: the rows have none), and `pool`, the ids drawn from
    (None: every id of the model's vocabulary; the text task: its tokenizer's ids; a token
    pool's ids, hook `pool_tokens`), less `exclude`."""

    exclude: tuple[int, ...] = ()
    bos: int | None = None
    pool: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Report:
    """A task's part of a study's headline (hook `copying_report`): `cells` follow the study's
    own score in its line, `lines` follow that line, and `tables` ({file name: (rows,
    columns)}) are written beside the study's files."""

    cells: str = ""
    lines: tuple[str, ...] = ()
    tables: Mapping[str, tuple[list[dict], tuple[str, ...]]] = dataclasses.field(
        default_factory=dict)


class Task(Protocol):
    """What every task module defines (a module satisfies a Protocol as an instance would)."""

    NAME: str  # its config.task name
    SPLITS: tuple[str, ...]  # every split it can make ("train" first)
    # Its splits drawn from the training distribution (gap baselines, never reported as out of
    # distribution).
    IN_DISTRIBUTION: tuple[str, ...]
    DEFAULT_EVAL_SPLITS: tuple[str, ...]  # its generalization suite (its configs' eval_splits)
    BREAKDOWNS: tuple[str, ...]  # the per-position breakdowns besides "all", in row order
    # The breakdown logged while training (eval_by_<name>/<split>/...); it must cover every
    # evaluated position.
    TRAIN_BREAKDOWN: str
    # Its per-position concepts (what linear probes decode and the erasure proxy erases;
    # proxies.concepts picks among them).
    CONCEPTS: tuple[str, ...]
    EVALUATED: str  # what an evaluated position predicts, for messages and axis labels
    # The data.* keys that set the splits' widths and the vocabulary size (named by
    # memory.check_config when a size cannot fit).
    WIDTH_KEYS: tuple[str, ...]
    VOCAB_KEY: str
    Data: type  # the frozen dataclass of its data.* settings (fields.setting)

    def check_config(self, settings) -> list[str]:
        """The task's combined checks (one-line ValueError) -> notes."""

    def load(self, data, verbose: bool = True) -> Mapping[str, Any]:
        """{split name: split}, built or read from the cache."""

    def view(self, split) -> View:
        """The generic per-position arrays of one split."""

    def concepts(self, split) -> dict[str, np.ndarray]:
        """{name: int32 [N, T]}: each position's class of every concept (< 0 where undefined,
        e.g. PAD), classes < MAX_CONCEPT_CLASSES."""

    def model_fields(self, data, splits=None) -> dict:
        """Keyword arguments of model.ModelConfig the data decides (vocab_size); splits None:
        from the settings alone."""

    def train_width(self, data) -> int:
        """Tokens per training row, BOS and EOS included (from the settings alone)."""

    def widest_width(self, data) -> int:
        """Tokens per row of the widest split, BOS and EOS included."""

    def train_num_bins(self, data) -> int:
        """The bins of TRAIN_BREAKDOWN evaluated while training (Dyck: depths up to the deepest
        split)."""

    def bounds(self, data) -> dict:
        """{breakdown: largest bin value seen in training, or None}: these breakdowns get
        accuracy-by-bin figures (the bound marked)."""

    def bin_labels(self, breakdown: str) -> tuple[str, ...] | None:
        """Names of a breakdown's bins, or None for numbers."""

    def activation_plots(self, run, splits, data, shown, pattern_site: str,
                         key_site: str) -> dict:
        """{name: (function of report/figures.py, its arguments)}: figures of activations (may
        be empty); run(tokens, site) gives the site's values for the seeds `shown`."""

    def baselines(self, splits, names) -> dict:
        """{split: {metric: value}} of data-only predictors, or {}."""


class Hooks(Protocol):
    """The optional hooks of a task module (`hook`, `require`; defaults in DEFAULTS)."""

    def split_names(self, data) -> tuple[str, ...]:
        """The splits the data.* settings `data` make, "train" first, when the data names them
        (text: the keys of data.files); within SPLITS' names or beside them. Default: none (the
        splits are SPLITS)."""

    def data_problems(self, splits, data) -> list[str]:
        """One-line problems of the loaded data that make results meaningless (code: an UNK
        rate above MAX_UNK_RATE). Default: none."""

    def bracket_ids(self, data) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(open ids, close ids) by bracket type: the targets of train.loss_on="closing".
        Default: none (((), ()))."""

    def first_layer(self, data, features: str):
        """The model.Part of model.first_layer="minimal" (Wen et al.'s minimal first layer,
        tasks/minimal_layer.py)."""

    def contrastive_loss(self, params, x, logits_x, key, model_cfg, *args):
        """The regularizer of train.contrastive_weights (a scalar), `args` its
        contrastive_args."""

    def contrastive_args(self, data) -> tuple:
        """The static arguments of its contrastive_loss after model_cfg (hashable; Dyck: the
        bracket ids and the depth bound of its prefixes). Default: ()."""

    def contrastive_width(self, data) -> int:
        """The tokens the regularizer's inputs add at most to a training row (Dyck: a balanced
        prefix, 2 * max_depth + 2): the model has positions for them. Default: 0."""

    def special_tokens(self, data) -> SpecialTokens:
        """The ids a random-token test never draws, the BOS that starts every row and the ids
        drawn from (the induction study's test), for the data.* settings `data` (Dyck and code:
        fixed ids; text: its tokenizer's special tokens and BOS, drawing from the tokenizer's
        ids only, not the rows a checkpoint's embedding has beyond them)."""

    def token_pools(self) -> dict[str, str]:
        """{name: what its tokens are}: further pools of the induction test, each its columns
        <name>_* (code: {"identifier": "identifier characters"}). Default: none."""

    def pool_tokens(self, name: str, splits) -> tuple[int, ...]:
        """The ids of token pool `name` in the loaded data `splits` (its vocabulary)."""

    def copying_analyses(self, chunks, model_cfg, splits, diverged, *, rows: int,
                         split_names: Sequence[str], batch_size: int):
        """How the members copy on the task's own data (the induction study; code: attention on
        repeated identifiers and head mean-ablation), or None when the data has nothing to
        analyse. `chunks`: [(params with a leading seed axis, seed labels)], `diverged` bool
        [S] (their rows NaN), `rows` of its data to read, `split_names` the non-empty
        evaluated splits. The result has seed_values(best) -> {induction_seeds.csv column:
        [S]} and tables(best) -> {"induction_<name>.csv": (rows, columns)} (best: int [S, 2],
        each seed's best head of the random-token test; -1 for a diverged seed)."""

    def copying_verdict(self, columns: Mapping[str, Any], tally) -> str:
        """Its part of the induction verdict, appended to the study's: columns of
        induction_seeds.csv ([S] each, loss_drop included), counted with the study's `tally`
        (studies/induction.py, Tally)."""

    def attention_targets(self, split) -> dict[str, np.ndarray]:
        """{property: int32 [N, T]}: per query position of a split, the key position that a head
        with the property attends to, -1 where the property says nothing (Dyck: "stack_top",
        the open bracket that the next token closes; text and code: "induction", the token
        after the previous occurrence of the current one). The prediction study measures each
        head's attention on it (its head features). Default: none."""

    def copying_report(self, per_seed, results, cell: Callable[..., str]) -> Report:
        """Its part of the induction headline: per_seed (induction_seeds.csv's healthy seeds,
        or None without it), results (results.csv, or None), cell(values, fmt) a cell of mean
        and interval over seeds."""


def _no_problems(splits, data) -> list[str]:
    return []


def _no_brackets(data) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (), ()


# The default of each optional hook (every name of `Hooks`): None where a task without the hook
# has none (`hook` gives None, `require` a one-line error).
DEFAULTS: dict[str, Callable | None] = {
    "split_names": None,
    "data_problems": _no_problems,
    "bracket_ids": _no_brackets,
    "first_layer": None,
    "contrastive_loss": None,
    "contrastive_args": lambda data: (),
    "contrastive_width": lambda data: 0,
    "special_tokens": None,
    "token_pools": lambda: {},
    "pool_tokens": None,
    "copying_analyses": None,
    "copying_verdict": None,
    "copying_report": None,
    "attention_targets": lambda split: {},
}
