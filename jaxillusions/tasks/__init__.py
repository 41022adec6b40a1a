"""Tasks: the testbeds (one module or package each; adding one = adding one module).

`config.task` picks one ("dyck" when the key is absent). Training, proxies, evaluation, statistics
and reporting are shared and call only what a task module defines. A hook is handed what it
reads: `data` is the task's data.* settings (settings.data, an instance of its `Data`), and only
check_config, which also refuses other sections' options, gets the whole settings.

  NAME, SPLITS                 its name and every split it can make ("train" first)
  IN_DISTRIBUTION              its splits drawn from the training distribution (gap baselines,
                               never reported as out of distribution)
  DEFAULT_EVAL_SPLITS          its generalization suite (what its configs' proxies.eval_splits
                               list)
  BREAKDOWNS                   names of the per-position breakdowns besides "all", in row order
  TRAIN_BREAKDOWN              the breakdown logged while training (eval_by_<name>/<split>/...);
                               it must cover every evaluated position
  CONCEPTS                     names of its per-position concepts (what linear probes decode and
                               the erasure proxy erases; proxies.concepts picks among them)
  concepts(split)              -> {name: int32 [N, T]}: each position's class of every concept
                               (< 0 where undefined, e.g. PAD), classes < MAX_CONCEPT_CLASSES
  train_num_bins(data)         its number of bins (Dyck: depths up to the deepest split)
  EVALUATED                    what an evaluated position predicts, for messages and axis labels
  WIDTH_KEYS, VOCAB_KEY        the data.* keys that set the splits' widths and the vocabulary
                               size (named by memory.check_config when a size cannot fit)
  Data                         the frozen dataclass of its data.* settings (fields.setting)
  check_config(settings)       the task's combined checks (one-line ValueError) -> notes
  contrastive_loss(...)        (optional) the regularizer of train.contrastive_weights
  load(data, verbose)          -> {split name: split}, built or read from the cache
  view(split)                  -> View: the generic per-position arrays of one split
  model_fields(data, splits)   -> keyword arguments of model.ModelConfig the data decides
                                  (vocab_size); splits None: from the settings alone
  bracket_ids(data)            (optional) -> (open ids, close ids) by bracket type: the targets
                               of train.loss_on="closing" and the contrastive prefixes
  first_layer(data, features)  (optional) -> the model.Part of model.first_layer="minimal"
                               (Wen et al.'s minimal first layer, tasks/minimal_layer.py)
  train_width(data), widest_width(data)  tokens per training row and per row of the widest
                                  split, BOS and EOS included (from the settings alone)
  bounds(data)                 {breakdown: largest bin value seen in training, or None}: these
                               breakdowns get accuracy-by-bin figures (the bound marked)
  bin_labels(breakdown)        names of a breakdown's bins, or None for numbers
  activation_plots(run, splits, data, shown, pattern_site, key_site)
                               -> {name: (function of report/figures.py, its arguments)}:
                                  figures of activations (may be empty); run(tokens, site)
                                  gives the site's values for the seeds `shown`
  baselines(splits, names)     -> {split: {metric: value}} of data-only predictors, or {}
  data_problems(splits, data)  (optional) -> one-line problems of the loaded data that make
                               results meaningless (code: an UNK rate above MAX_UNK_RATE)

`check_data` refuses degenerate data before any training (train.build calls it): a split with rows
but no evaluated position, a split whose evaluated targets are all one token (any model scores
1.0 by predicting it), and the task's own data_problems.
"""

from __future__ import annotations

import dataclasses
import importlib
import types

import numpy as np

TASKS = ("dyck", "code")
# A task's module, where its name is not one (the standard library has a module `code`).
MODULES = {"code": "code_completion"}
PAD = 0  # every task pads with token 0
# Classes per concept (static one-hot width of the probes and of erasure): a concept with more
# classes is refused by `concept_labels` with a one-line error.
MAX_CONCEPT_CLASSES = 64


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
    """The task of settings (settings.Settings)."""
    return config.task


def get(config_or_name) -> types.ModuleType:
    """The task module of a config (or a name); ValueError listing the tasks if unknown."""
    task = config_or_name if isinstance(config_or_name, str) else name(config_or_name)
    if task not in TASKS:
        raise ValueError(f"task={task!r}: unknown task; available: {', '.join(TASKS)}")
    return importlib.import_module(f"{__name__}.{MODULES.get(task, task)}")


def subset(split, index: np.ndarray):
    """The sentences `index` of a task's split (every array field with a sentence axis)."""
    n = len(split.tokens)
    return dataclasses.replace(split, **{
        f.name: getattr(split, f.name)[index] for f in dataclasses.fields(split)
        if isinstance(getattr(split, f.name), np.ndarray) and len(getattr(split, f.name)) == n})


def positions(tokens: np.ndarray) -> np.ndarray:
    """The position breakdown: bin t at position t."""
    return np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)


def check_data(config, splits: dict) -> None:
    """ValueError (one line) if the loaded data cannot give meaningful results (see above). An
    empty split other than train is left to the task (code: other_language without its
    source, which it warns about)."""
    task = get(config)
    for problem in getattr(task, "data_problems", lambda s, d: [])(splits, config.data):
        raise ValueError(f"data: {problem}; nothing was trained")
    for split_name, split in splits.items():
        if not len(split.tokens):
            if split_name == "train":
                raise ValueError("data: the train split is empty; check the data.* settings")
            continue
        view = task.view(split)
        targets = view.tokens[:, 1:][view.evaluated[:, :-1]]  # position t predicts t + 1
        if not targets.size:
            raise ValueError(f"data: split {split_name} has {len(split.tokens)} rows but no "
                             f"evaluated position ({task.EVALUATED} target); check the data.* "
                             "settings; nothing was trained")
        first = targets[0]
        if (targets == first).all():
            raise ValueError(f"data: every one of the {targets.size} evaluated targets of split "
                             f"{split_name} is token {int(first)}, so any model scores accuracy "
                             "1.0 by always predicting it; check the data.* settings; nothing "
                             "was trained")


def concept_labels(task: types.ModuleType, split, names) -> np.ndarray:
    """int32 [N, T, len(names)]: the task's concepts `names` (task.CONCEPTS) of each position
    of `split`, < 0 where undefined (PAD included); ValueError for an unknown concept or one
    with classes >= MAX_CONCEPT_CLASSES."""
    unknown = [n for n in names if n not in task.CONCEPTS]
    if unknown:
        raise ValueError(f"proxies.concepts: unknown concept {unknown[0]!r} of task "
                         f"{task.NAME}; available: {', '.join(task.CONCEPTS)}")
    labels = task.concepts(split)
    out = np.stack([labels[n] for n in names], axis=-1).astype(np.int32)
    out = np.where((split.tokens != PAD)[..., None], out, -1)
    if out.size and out.max() >= MAX_CONCEPT_CLASSES:
        bad = names[int(np.argmax(out.reshape(-1, len(names)).max(0)))]
        raise ValueError(f"concept {bad!r} has class {int(out.max())}; probes and erasure "
                         f"support classes 0..{MAX_CONCEPT_CLASSES - 1}")
    return out
