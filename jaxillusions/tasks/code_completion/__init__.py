"""The code-completion task (Friedman et al. section 5): a character-level language model on
source code, with faithfulness broken down by what the next character is.

Data (corpus.py, lexer.py, splits.py): functions from CodeSearchNet jsonl files or from the
source files every machine has; splits train / iid (held-out files) / longer / deeper /
other_language; a category for every next character. Here: what the shared code needs (see
jaxillusions/tasks/__init__.py); copying.py holds the induction study's hooks (INDUCTION_HOOKS).
Every character target is evaluated (not PAD, not the EOS target); breakdowns `category` (bin =
index into CATEGORIES) and `bracket_depth` (the nesting depth of a closing bracket, at
closing-bracket targets only). The model is the standard
transformer with learned embeddings; Dyck-only options (minimal first layer, contrastive
regularizer, closing-bracket loss, Wen et al. measurements) are refused.

The task's hooks are task.py's (re-exported here: tasks.get("code") is this package).
"""

from jaxillusions.tasks.code_completion import task
from jaxillusions.tasks.code_completion.task import (  # noqa: F401 - the task's hooks
    BREAKDOWNS,
    CONCEPTS,
    DEFAULT_EVAL_SPLITS,
    EVALUATED,
    IN_DISTRIBUTION,
    INDUCTION_HOOKS,
    MAX_UNK_RATE,
    NAME,
    SPLITS,
    TRAIN_BREAKDOWN,
    VOCAB_KEY,
    WIDTH_KEYS,
    Splits,
    activation_plots,
    baselines,
    bin_labels,
    bounds,
    categories,
    check_config,
    concepts,
    data_problems,
    load,
    model_fields,
    train_num_bins,
    train_width,
    unigram,
    view,
    vocab_size,
    widest_width,
)


def __getattr__(name: str):
    """What task.py makes on first use (its Data, the induction hooks of copying.py)."""
    return getattr(task, name)
