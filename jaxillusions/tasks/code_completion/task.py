"""The code-completion task's hooks (this package's __init__ re-exports them; its docstring
describes the task)."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxillusions.config.fields import absolute, kind_of, setting
from jaxillusions.tasks import View
from jaxillusions.tasks._text_copying import induction_targets

NAME = "code"
SPLITS = ("train", "iid", "longer", "deeper", "other_language")
IN_DISTRIBUTION = ("iid",)  # splits from the training distribution (see tasks/__init__.py)
DEFAULT_EVAL_SPLITS = ("iid", "longer", "deeper", "other_language")
BREAKDOWNS = ("category", "bracket_depth")
TRAIN_BREAKDOWN = "category"
CONCEPTS = ("category",)  # per position (probes, erasure): the next character's category
EVALUATED = "next-character"
WIDTH_KEYS = ("data.context", "data.longer_context")  # set the splits' widths
VOCAB_KEY = "data.max_vocab"  # bounds the vocabulary size


def _data():
    from jaxillusions.tasks.code_completion import splits  # noqa: PLC0415 - corpus code loads lazily

    return splits


def categories() -> tuple[str, ...]:
    return tuple(_data().CATEGORIES)


# Above these fractions of UNK characters the accuracy measures little (e.g. data.min_char_count
# above every character's count maps everything to UNK). The vocabulary comes from `train`, so
# its bound is tight; evaluation splits (other_language above all) have unseen characters.
MAX_UNK_RATE = {"train": 0.05, "other": 0.5}


class Splits(dict):
    """{split name: splits.CodeSplit}, with the character vocabulary (`vocab`) and the UNK rate
    per split (`unk_rates`)."""

    vocab = None
    unk_rates: dict[str, float] = {}  # noqa: RUF012 - replaced per instance in load()


def _source(value: str) -> str:
    """A source as the door stores it: a path or glob made absolute (fields.absolute), so that a
    relaunch from another directory reads the same files; 'stdlib', 'npm' and '' as they are."""
    return value if value in ("stdlib", "npm", "") else absolute(value)


# Paths of the data.* settings, stored absolute.
_CONVERT = {"source": _source, "other_source": _source, "cache_dir": absolute}


def _data_class() -> type:
    """The data.* settings of the code task: one field per key of splits.DATA_DEFAULTS, of that
    default's kind, documented by splits.DATA_DOCS (splits.check_data_config checks the values
    and their combinations); the paths stored absolute (`_CONVERT`)."""
    data = _data()
    return dataclasses.make_dataclass("Data", [
        (key, type(default), setting(default, kind_of(default), "see splits.check_data_config",
                                     doc=data.DATA_DOCS.get(key, ""),
                                     convert=_CONVERT.get(key)))
        for key, default in data.DATA_DEFAULTS.items()], frozen=True)


# The induction study's hooks (tasks.Hooks): the code task's half of it, copying.py's.
INDUCTION_HOOKS = ("special_tokens", "token_pools", "pool_tokens", "copying_analyses",
                   "copying_verdict", "copying_report")


def __getattr__(name: str):
    # `Data` is made on first use: the corpus code (splits.py) loads lazily; so does copying.py.
    if name == "Data":
        globals()["Data"] = _data_class()
        return globals()["Data"]
    if name in INDUCTION_HOOKS:
        from jaxillusions.tasks.code_completion import copying  # noqa: PLC0415

        return getattr(copying, name)
    raise AttributeError(name)


def check_config(config) -> list[str]:
    """The data checks of splits.check_data_config, and the Dyck-only options refused."""
    refused = {"model.first_layer": (config.model.first_layer, "standard"),
               "train.loss_on": (config.train.loss_on, "all"),
               "train.contrastive_weights": (tuple(config.train.contrastive_weights), ())}
    for key, (value, allowed) in refused.items():
        if value != allowed:
            raise ValueError(f"{key}={value!r}: the code task needs {allowed!r} (a Dyck-only "
                             "option)")
    if config.wen.enabled:
        raise ValueError("wen.enabled=True: the Wen et al. measurements need the Dyck task")
    # Its notes only say where the data comes from; loading prints that (and warns when the
    # other_language source is absent), so validation stays quiet for a good config.
    _data().check_data_config(config.data)
    return []


def load(data, verbose: bool = True) -> Splits:
    """Every split of SPLITS from the data.* settings `data` (one that the corpus cannot give,
    e.g. other_language without JavaScript files, is an empty split: it has no rows in the
    results)."""
    from jaxillusions.tasks.code_completion import stored  # noqa: PLC0415 - as _data

    code_data = _data()
    made = stored.load_or_make(data, verbose=verbose)
    out = Splits()
    for name in SPLITS:
        out[name] = made.splits[name] if name in made.splits else _empty(
            code_data.width(data, name))
    out.vocab = made.vocab
    out.unk_rates = dict(made.unk_rates)
    return out


def data_problems(splits, data) -> list[str]:
    """A split whose UNK rate is above MAX_UNK_RATE (see tasks.check_data)."""
    return [f"split {name} has an UNK rate of {rate:.3f} (characters outside the training "
            f"vocabulary of {splits.vocab.size if splits.vocab else '?'} ids), above "
            f"{_max_unk(name)}; lower data.min_char_count (now {data.min_char_count}) or "
            f"raise data.max_vocab (now {data.max_vocab})"
            for name, rate in getattr(splits, "unk_rates", {}).items() if rate > _max_unk(name)]


def _max_unk(split: str) -> float:
    return MAX_UNK_RATE["train" if split == "train" else "other"]


def _empty(width: int):
    data = _data()
    return data.CodeSplit(tokens=np.zeros((0, width), np.int32),
                          category=np.zeros((0, width), np.int8),
                          bracket_depth=np.zeros((0, width), np.int32),
                          file_id=np.zeros(0, np.int32), lengths=np.zeros(0, np.int32),
                          language="")


def view(split) -> View:
    evaluated = split.category >= 0
    close = categories().index("close_bracket")
    depth = np.where(evaluated & (split.category == close), split.bracket_depth, -1)
    return View(tokens=split.tokens, evaluated=evaluated,
                bins={"category": np.maximum(split.category, 0).astype(np.int32),
                      "bracket_depth": depth.astype(np.int32)},
                num_bins={"category": len(categories()),
                          "bracket_depth": 1 + int(depth.max(initial=0))})


def attention_targets(split) -> dict[str, np.ndarray]:
    """{"induction": the position after the previous occurrence of each character}
    (tasks._text_copying.induction_targets: where an induction head attends)."""
    return {"induction": induction_targets(split.tokens)}


def concepts(split) -> dict[str, np.ndarray]:
    """{"category": CATEGORIES index of the next character}, int32 [N, T], -1 where there is
    none (the EOS and PAD targets)."""
    return {"category": split.category.astype(np.int32)}


def vocab_size(data, splits=None) -> int:
    """The vocabulary of the data; from the data.* settings `data` alone (validation, before
    any data), the bound data.max_vocab."""
    if splits is not None:
        vocab = getattr(splits, "vocab", None)
        if vocab is not None:
            return int(vocab.size)
        return 1 + max(int(s.tokens.max(initial=0)) for s in splits.values())
    return int(data.max_vocab)


def model_fields(data, splits=None) -> dict:
    return {"vocab_size": vocab_size(data, splits)}


def train_width(data) -> int:
    return _data().width(data, "train")


def widest_width(data) -> int:
    return max(_data().width(data, s) for s in SPLITS)


def train_num_bins(data) -> int:
    return len(categories())


def bounds(data) -> dict:
    return {"bracket_depth": None}  # accuracy by bracket depth, no training bound drawn


def bin_labels(breakdown: str) -> tuple[str, ...] | None:
    return categories() if breakdown == "category" else None


def unigram(train, split) -> dict[str, float]:
    """The best data-only predictor without context, from the training split's character
    counts (add-one smoothed over the vocabulary seen): accuracy of always predicting the most
    frequent character, and the cross-entropy (nats) of the unigram distribution, at the
    evaluated positions of `split`."""
    def targets(s):
        return s.tokens[:, 1:][s.category[:, :-1] >= 0]

    size = 1 + max(int(train.tokens.max(initial=0)), int(split.tokens.max(initial=0)))
    counts = np.bincount(targets(train), minlength=size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    y = targets(split)
    if not len(y):
        return {}
    return {"unigram_acc": float((y == counts.argmax()).mean()),
            "unigram_xent": float(-logp[y].mean())}


def baselines(splits, names) -> dict[str, dict[str, float]]:
    out = {name: unigram(splits["train"], splits[name]) for name in names if name in splits}
    return {k: v for k, v in out.items() if v}


def activation_plots(run, splits, data, shown, pattern_site: str, key_site: str,
                     max_chars: int = 48) -> dict:
    """Last-layer attention patterns (seeds `shown`) on the first `max_chars` characters of
    the first iid function, characters as labels (see tasks/__init__.py)."""
    vocab = getattr(splits, "vocab", None)
    iid = splits["iid"]
    if vocab is None or not len(iid.tokens):
        return {}
    row = iid.tokens[:1, : max_chars + 1]
    length = int((row[0] != 0).sum())
    patterns = run(row, pattern_site)[:, 0, 0, :length, :length]  # head 0
    from jaxillusions.tasks.code_completion import splits as code_data  # noqa: PLC0415

    special = {code_data.PAD: "PAD", code_data.BOS: "BOS", code_data.EOS: "EOS",
               code_data.UNK: "UNK"}

    def label(t: int) -> str:
        if t in special:
            return special[t]
        c = vocab.decode([t])
        return {" ": "␣", "\n": "\\n", "\t": "\\t"}.get(c, c)

    labels = [label(int(t)) for t in row[0, :length]]
    return {"attention_patterns": ("attention_patterns", (
        patterns, labels, shown, pattern_site,
        f"the first {length} tokens of an iid function (BOS included)"))}
