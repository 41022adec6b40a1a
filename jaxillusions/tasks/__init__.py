"""Tasks: the testbeds (one module or package each; adding one = adding one module).

`config.task` picks one ("dyck" when the key is absent). Training, proxies, evaluation, statistics
and reporting are shared and call only what a task module defines:

  NAME, SPLITS                 its name and every split it can make ("train" first)
  DEFAULT_EVAL_SPLITS          its generalization suite (what its configs' proxies.eval_splits
                               list)
  BREAKDOWNS                   names of the per-position breakdowns besides "all", in row order
  TRAIN_BREAKDOWN              the breakdown logged while training (eval_by_<name>/<split>/...);
                               it must cover every evaluated position
  train_num_bins(config)       its number of bins (Dyck: depths up to the deepest split)
  EVALUATED                    what an evaluated position predicts, for messages and axis labels
  WIDTH_KEYS, VOCAB_KEY        the data.* keys that set the splits' widths and the vocabulary
                               size (named by memory.check_config when a size cannot fit)
  data_rules()                 validate.RULES rows for its config.data keys
  check_config(config)         the task's combined checks (one-line ValueError) -> notes
  load(config, verbose)        -> {split name: split}, built or read from the cache
  view(split)                  -> View: the generic per-position arrays of one split
  model_fields(config, splits) -> keyword arguments of model.ModelConfig the data decides
                                  (vocab_size, ...); splits None: from the config alone
  train_width(config), widest_width(config)  tokens per training row and per row of the widest
                                  split, BOS and EOS included (from the config alone)
  bounds(config)               {breakdown: largest bin value seen in training, or None}: these
                               breakdowns get accuracy-by-bin figures (the bound marked)
  bin_labels(breakdown)        names of a breakdown's bins, or None for numbers
  activation_figures(run, splits, config, shown, pattern_site, key_site)
                               -> {name: figure} of activations (may be empty); run(tokens,
                                  site) gives the site's values for the seeds `shown`
  baselines(splits, names)     -> {split: {metric: value}} of data-only predictors, or {}
"""

from __future__ import annotations

import dataclasses
import importlib
import types

import numpy as np

TASKS = ("dyck", "code")
PAD = 0  # every task pads with token 0


@dataclasses.dataclass(frozen=True, eq=False)
class View:
    """One split as the shared code sees it. Position t predicts tokens[:, t+1]."""

    tokens: np.ndarray  # int32 [N, T], PAD 0, every row starts with BOS
    evaluated: np.ndarray  # bool [N, T]: the prediction at t is scored
    # breakdown -> int32 [N, T] bin of each evaluated position; < 0: not in this breakdown (code:
    # bracket depth exists at closing brackets only). TRAIN_BREAKDOWN must cover every one.
    bins: dict[str, np.ndarray]
    num_bins: dict[str, int]  # breakdown -> bins to allot per split (> every bin used)


def name(config) -> str:
    return config.get("task", "dyck")


def get(config_or_name) -> types.ModuleType:
    """The task module of a config (or a name); ValueError listing the tasks if unknown."""
    task = config_or_name if isinstance(config_or_name, str) else name(config_or_name)
    if task not in TASKS:
        raise ValueError(f"task={task!r}: unknown task; available: {', '.join(TASKS)}")
    return importlib.import_module(f"{__name__}.{task}")


def positions(tokens: np.ndarray) -> np.ndarray:
    """The position breakdown: bin t at position t."""
    return np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
