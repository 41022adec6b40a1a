"""The Dyck-(k, m) task (Friedman et al. section 4): data in jaxillusions/data/dyck.py.

Evaluated positions: those whose next token is a closing bracket (the only deterministic
prediction). Breakdowns: depth (the stack depth after the token at t, which the closing bracket
closes), distance to the matching open bracket, and position. See jaxillusions/tasks/__init__.py.
"""

from __future__ import annotations

import numpy as np

from jaxillusions.data import dyck
from jaxillusions.tasks import View, positions

NAME = "dyck"
SPLITS = dyck.SPLITS
DEFAULT_EVAL_SPLITS = ("iid", "seen_structure", "unseen_structure", "unseen_depth", "longer",
                       "iid_with_train")
BREAKDOWNS = ("depth", "distance", "position")
TRAIN_BREAKDOWN = "depth"
EVALUATED = "closing-bracket"
WIDTH_KEYS = ("data.max_len", "data.longer_max_len")  # set the splits' widths
VOCAB_KEY = "data.num_types"  # sets the vocabulary size


def data_rules() -> dict:
    """validate.RULES rows of the data.* keys (dyck.make_splits checks the combinations)."""
    from jaxillusions import validate as v  # noqa: PLC0415 - validate imports the tasks

    return {
        "data.seed": (v.INT, v._nonneg, ">= 0"),  # noqa: SLF001
        "data.num_types": (v.INT, lambda x, c: 1 <= x <= 30000, "in [1, 30000]"),
        "data.max_depth": (v.INT, v._pos, ">= 1"),  # noqa: SLF001
        "data.min_len": (v.INT, lambda x, c: 2 <= x <= c.data.max_len, "in [2, data.max_len]"),
        "data.max_len": (v.INT, lambda x, c: x >= 2, ">= 2"),
        "data.longer_max_len": (v.INT, lambda x, c: x > c.data.max_len, "> data.max_len"),
        "data.depth_extra": (v.INT, v._pos, ">= 1"),  # noqa: SLF001
        "data.num_train": (v.INT, v._pos, ">= 1"),  # noqa: SLF001
        "data.num_eval": (v.INT, v._pos, ">= 1"),  # noqa: SLF001
        "data.cache_dir": (v.STR, v._any, "a directory, or '' for the default"),  # noqa: SLF001
    }


def check_config(config) -> list[str]:
    dyck._params(config.data)  # noqa: SLF001 - the data module's own combined checks
    return []


def load(config, verbose: bool = True) -> dict[str, dyck.Split]:
    return dyck.load_or_make(config.data, verbose=verbose)


def view(split: dyck.Split) -> View:
    width = split.tokens.shape[1]
    return View(tokens=split.tokens, evaluated=split.is_close,
                bins={"depth": split.depth, "distance": split.distance,
                      "position": positions(split.tokens)},
                num_bins={"depth": 1 + int(split.depth.max()), "distance": width,
                          "position": width})


def model_fields(config, splits=None) -> dict:
    k = config.data.num_types
    return {"vocab_size": dyck.vocab_size(k),
            "open_ids": tuple(int(dyck.open_id(t, k)) for t in range(k)),
            "close_ids": tuple(int(dyck.close_id(t, k)) for t in range(k)),
            "max_depth": int(config.data.max_depth), "depth_bins": train_num_bins(config)}


def train_width(config) -> int:
    return config.data.max_len + 2  # BOS ... EOS


def widest_width(config) -> int:
    return max(config.data.max_len, config.data.longer_max_len) + 2  # BOS ... EOS of `longer`


def train_num_bins(config) -> int:
    """Depth bins of the training-time evaluation (and of the minimal first layer)."""
    return config.data.max_depth + config.data.depth_extra + 1


def bounds(config) -> dict[str, int]:
    # The largest bin seen in training: depth, and the position predicting the last bracket.
    return {"depth": config.data.max_depth, "position": config.data.max_len - 1}


def bin_labels(breakdown: str) -> None:
    return None


def baselines(splits, names) -> dict:
    return {}


def token_label(token: int, num_types: int) -> str:
    names = {dyck.PAD: "PAD", dyck.BOS: "BOS", dyck.EOS: "EOS"}
    return names.get(int(token), ("(" if token < 3 + num_types else ")")
                     + str((int(token) - 3) % num_types))


def activation_figures(run, splits, config, shown, pattern_site: str, key_site: str,
                       num_sentences: int = 200, key_seeds: int = 3) -> dict:
    """Last-layer attention patterns on one long iid sentence (the seeds `shown`), and the 2-D
    SVD projection of the last layer's keys at training positions of the first `key_seeds` of
    them (one figure each: a reader sees whether the structure holds across seeds), coloured by
    depth, open vs close and bracket type. `run(tokens, site)` -> the site's values
    [len(shown), ...]."""
    from jaxillusions.analysis import figures  # noqa: PLC0415

    iid = splits["iid"]
    sentence = iid.tokens[int(np.argmax(iid.lengths[:100]))][None]  # a long one, for structure
    train_tokens = splits["train"].tokens[:num_sentences]
    k = config.data.num_types
    length = int((sentence[0] != 0).sum())
    patterns = run(sentence, pattern_site)[:, 0, 0, :length, :length]  # head 0
    labels = [token_label(t, k) for t in sentence[0, :length]]
    keys = run(train_tokens, key_site)[:, :, :, 0]  # head 0: [S, B, T, F]
    valid = train_tokens != 0
    depth = splits["train"].depth[:num_sentences][valid]
    out = {"attention_patterns": figures.attention_patterns(patterns, labels, shown,
                                                            pattern_site)}
    for i, seed in enumerate(shown[:key_seeds]):
        out[f"key_projection_seed{seed}"] = figures.key_projection(
            keys[i][valid], depth, train_tokens[valid], k, f"{key_site} (seed {seed}, head 0)")
    return out
