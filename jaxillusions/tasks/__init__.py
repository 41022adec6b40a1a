"""Tasks: the testbeds (one module or package each; adding one = adding one module).

`config.task` picks one (DEFAULT when the key is absent). A task is a module of this package that
defines NAME (`available()` finds them; the others are their helpers) and `get(name)` gives it.
Training, proxies, evaluation, reporting and the studies call only what a task module defines
(_task_contract.py): the members of `Task`, which every task defines, and the optional `Hooks`,
resolved here alone: `hook(task, name)`, the task's own or its default, `require(task, name,
what)`, the task's own or a one-line error naming the missing hook. A hook is handed what it
reads: `data` is the task's data.* settings (its `Data`); only check_config gets the settings.
`check_data` refuses degenerate data before any training (train.build calls it): a split with rows
but no evaluated position, a split whose evaluated targets are all one token (any model scores
1.0 by predicting it), and the task's own data_problems.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import types
from collections.abc import Callable

import numpy as np

from jaxillusions.tasks._task_contract import DEFAULTS as DEFAULTS
from jaxillusions.tasks._task_contract import Hooks as Hooks
from jaxillusions.tasks._task_contract import Report as Report
from jaxillusions.tasks._task_contract import SpecialTokens as SpecialTokens
from jaxillusions.tasks._task_contract import Task as Task
from jaxillusions.tasks._task_contract import View as View

DEFAULT = "dyck"  # config.task when the key is absent (first in `available()`)
PAD = 0  # every task pads with token 0
# Classes per concept (static one-hot width of the probes and of erasure): a concept with more
# classes is refused by `concept_labels` with a one-line error.
MAX_CONCEPT_CLASSES = 64


def hook(task: types.ModuleType, name: str) -> Callable | None:
    """The optional hook `name` of a task module (a name of `Hooks`): its own, else the
    default (DEFAULTS; None: the task has none). KeyError for a name that is no hook."""
    if name not in DEFAULTS:
        raise KeyError(f"{name!r} is not an optional task hook (tasks.Hooks): "
                       f"{', '.join(DEFAULTS)}")
    return getattr(task, name, DEFAULTS[name])


def require(task: types.ModuleType, name: str, what: str) -> Callable:
    """`hook(task, name)`; ValueError (one line) where the task has none: `what` needs it (a
    setting, e.g. "induction.enabled=True", or a study)."""
    found = hook(task, name)
    if found is None:
        raise ValueError(f"{what}: the {task.NAME} task does not define the hook {name} "
                         "(tasks.Hooks)")
    return found


@functools.cache
def _task_modules() -> dict[str, str]:
    """{task name: module name}: the modules of this package that define NAME."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            module = importlib.import_module(f"{__name__}.{info.name}")
            if isinstance(getattr(module, "NAME", None), str):
                found[module.NAME] = module.__name__
    return found


def available() -> tuple[str, ...]:
    """The tasks' names: DEFAULT first, then the others sorted."""
    return tuple(sorted(_task_modules(), key=lambda n: (n != DEFAULT, n)))


def __getattr__(name: str):
    if name == "TASKS":  # the tasks' names (`available`), found on first use
        return available()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def name(config) -> str:
    """The task of settings (settings.Settings)."""
    return config.task


def get(config_or_name) -> types.ModuleType:
    """The task module of a config (or a name); ValueError listing the tasks if unknown."""
    task = config_or_name if isinstance(config_or_name, str) else name(config_or_name)
    modules = _task_modules()
    if task not in modules:
        raise ValueError(f"task={task!r}: unknown task; available: {', '.join(available())}")
    return importlib.import_module(modules[task])


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
    for problem in hook(task, "data_problems")(splits, config.data):
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
