"""The Dyck-(k, m) task (Friedman et al. section 4): data in jaxillusions/tasks/dyck_sentences.py.

Evaluated positions: those whose next token is a closing bracket (the only deterministic
prediction). Breakdowns: depth (the stack depth after the token at t, which the closing bracket
closes), distance to the matching open bracket, and position. See jaxillusions/tasks/__init__.py.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import model
from jaxillusions.config.fields import INT, STR, nonnegative, positive, setting
from jaxillusions.tasks import SpecialTokens, View, dyck_sentences, positions
from jaxillusions.tasks.minimal_layer import MinimalFirstLayer

NAME = "dyck"
SPLITS = dyck_sentences.SPLITS
# Splits drawn from the training distribution: gaps are measured against them, never reported
# as out of distribution (iid_with_train: sentences that may also be in train).
IN_DISTRIBUTION = ("iid", "iid_with_train")
DEFAULT_EVAL_SPLITS = ("iid", "seen_structure", "unseen_structure", "unseen_depth", "longer",
                       "iid_with_train")
BREAKDOWNS = ("depth", "distance", "position")
TRAIN_BREAKDOWN = "depth"
# Concepts per position (probes, erasure): the stack depth after the token, and the type of the
# innermost open bracket (the bracket to close next; undefined at depth 0).
CONCEPTS = ("depth", "bracket")
EVALUATED = "closing-bracket"
WIDTH_KEYS = ("data.max_len", "data.longer_max_len")  # set the splits' widths
VOCAB_KEY = "data.num_types"  # sets the vocabulary size


@dataclasses.dataclass(frozen=True)
class Data:
    """The data.* settings of the Dyck task (dyck_sentences.make_splits checks the combinations)."""

    seed: int = setting(0, INT, ">= 0", nonnegative)
    num_types: int = setting(8, INT, "in [1, 30000]", lambda x, s: 1 <= x <= 30000,
                             "k: bracket types")
    max_depth: int = setting(6, INT, ">= 1", positive, "m: the deepest training nesting")
    min_len: int = setting(2, INT, "in [2, data.max_len]", lambda x, s: 2 <= x <= s.data.max_len)
    max_len: int = setting(24, INT, ">= 2", lambda x, s: x >= 2,
                           "bracket tokens per training sentence")
    longer_max_len: int = setting(40, INT, "> data.max_len", lambda x, s: x > s.data.max_len,
                                  "`longer` split: lengths max_len+1 .. longer_max_len")
    depth_extra: int = setting(4, INT, ">= 1", positive,
                               "`unseen_depth` split: depths m+1 .. m+depth_extra")
    num_train: int = setting(20_000, INT, ">= 1", positive)
    num_eval: int = setting(500, INT, ">= 1", positive, "sentences per evaluation split")
    cache_dir: str = setting("", STR, "a directory, or '' for the default",
                             doc="'': $JAXILLUSIONS_CACHE or ~/.cache/jaxillusions")


def check_config(config) -> list[str]:
    dyck_sentences._params(config.data)  # noqa: SLF001 - the data module's own combined checks
    return []


def load(data: Data, verbose: bool = True) -> dict[str, dyck_sentences.Split]:
    return dyck_sentences.load_or_make(data, verbose=verbose)


def view(split: dyck_sentences.Split) -> View:
    width = split.tokens.shape[1]
    return View(tokens=split.tokens, evaluated=split.is_close,
                bins={"depth": split.depth, "distance": split.distance,
                      "position": positions(split.tokens)},
                num_bins={"depth": 1 + int(split.depth.max()), "distance": width,
                          "position": width})


def concepts(split: dyck_sentences.Split) -> dict[str, np.ndarray]:
    """{"depth": stack depth after each token, "bracket": type of the innermost open bracket
    after it (-1 at depth 0)}, int32 [N, T]; PAD positions get depth 0 (tasks.concept_labels
    marks them undefined)."""
    tokens, depth = split.tokens, split.depth
    # An open bracket raises the depth (its type is its id - open_id(0)); the split does not
    # carry k, which tells open from close ids, but the depth does.
    is_open = np.diff(depth, axis=1, prepend=0) > 0
    # The innermost open bracket after token t is the last open bracket s <= t whose depth
    # after it equals the depth after t (a later one at that depth would have replaced it).
    rows, width = np.arange(len(tokens)), tokens.shape[1]
    last = np.full((len(tokens), int(depth.max(initial=0)) + 1), -1, np.int32)  # type per depth
    bracket = np.full(tokens.shape, -1, np.int32)
    for t in range(width):  # a scan over positions, vectorized over sentences
        opened = is_open[:, t]
        last[rows[opened], depth[opened, t]] = tokens[opened, t] - dyck_sentences.open_id(0, 0)
        bracket[:, t] = np.where(depth[:, t] > 0, last[rows, depth[:, t]], -1)
    return {"depth": depth.astype(np.int32), "bracket": bracket}


def attention_targets(split: dyck_sentences.Split) -> dict[str, np.ndarray]:
    """{"stack_top": int32 [N, T]}: at a position whose next token closes a bracket, the
    position of the open bracket it closes (the top of the stack, what a hierarchical head
    attends to); -1 elsewhere."""
    t = np.arange(split.tokens.shape[1], dtype=np.int32)
    return {"stack_top": np.where(split.is_close, t + 1 - split.distance, -1).astype(np.int32)}


def model_fields(data: Data, splits=None) -> dict:
    return {"vocab_size": dyck_sentences.vocab_size(data.num_types)}


def bracket_ids(data: Data) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The open and the close bracket token ids, by type."""
    k = data.num_types
    return (tuple(int(dyck_sentences.open_id(t, k)) for t in range(k)),
            tuple(int(dyck_sentences.close_id(t, k)) for t in range(k)))


def first_layer(data: Data, features: str) -> MinimalFirstLayer:
    """Wen et al.'s minimal first layer for this data (model.first_layer="minimal"): features
    for every depth of the training-time evaluation, the deepest split's included."""
    opens, closes = bracket_ids(data)
    return MinimalFirstLayer(opens, closes, max_depth=int(data.max_depth),
                             depth_bins=train_num_bins(data), features=features)


def special_tokens(data: Data) -> SpecialTokens:
    """PAD, BOS and EOS, never drawn by a random-token test; every row starts with BOS (the
    same ids for any `data`)."""
    del data
    return SpecialTokens(exclude=(dyck_sentences.PAD, dyck_sentences.BOS, dyck_sentences.EOS),
                         bos=dyck_sentences.BOS)


def train_width(data: Data) -> int:
    return data.max_len + 2  # BOS ... EOS


def widest_width(data: Data) -> int:
    return max(data.max_len, data.longer_max_len) + 2  # BOS ... EOS of `longer`


def train_num_bins(data: Data) -> int:
    """Depth bins of the training-time evaluation (and of the minimal first layer)."""
    return data.max_depth + data.depth_extra + 1


def bounds(data: Data) -> dict[str, int]:
    # The largest bin seen in training: depth, and the position predicting the last bracket.
    return {"depth": data.max_depth, "position": data.max_len - 1}


def bin_labels(breakdown: str) -> None:
    return None


def baselines(splits, names) -> dict:
    return {}


def token_label(token: int, num_types: int) -> str:
    names = {dyck_sentences.PAD: "PAD", dyck_sentences.BOS: "BOS", dyck_sentences.EOS: "EOS"}
    return names.get(int(token), ("(" if token < 3 + num_types else ")")
                     + str((int(token) - 3) % num_types))


def activation_plots(run, splits, data: Data, shown, pattern_site: str, key_site: str,
                     num_sentences: int = 200, key_seeds: int = 3) -> dict:
    """Last-layer attention patterns on one long iid sentence (the seeds `shown`), and the 2-D
    SVD projection of the last layer's keys at training positions of the first `key_seeds` of
    them (one figure each: a reader sees whether the structure holds across seeds), coloured by
    depth, open vs close and bracket type. `run(tokens, site)` -> the site's values
    [len(shown), ...]. Returns {name: (analysis.figures function, its arguments)}."""
    iid = splits["iid"]
    sentence = iid.tokens[int(np.argmax(iid.lengths[:100]))][None]  # a long one, for structure
    train_tokens = splits["train"].tokens[:num_sentences]
    k = data.num_types
    length = int((sentence[0] != 0).sum())
    patterns = run(sentence, pattern_site)[:, 0, 0, :length, :length]  # head 0
    labels = [token_label(t, k) for t in sentence[0, :length]]
    keys = run(train_tokens, key_site)[:, :, :, 0]  # head 0: [S, B, T, F]
    valid = train_tokens != 0
    depth = splits["train"].depth[:num_sentences][valid]
    out = {"attention_patterns": ("attention_patterns", (patterns, labels, shown, pattern_site))}
    for i, seed in enumerate(shown[:key_seeds]):
        out[f"key_projection_seed{seed}"] = ("key_projection", (
            keys[i][valid], depth, train_tokens[valid], k, f"{key_site} (seed {seed}, head 0)"))
    return out


# ---------------------------------------------------------------------------------------------
# The task's contrastive regularizer (train.contrastive_weights; objective.py calls it).

def contrastive_args(data: Data) -> tuple:
    """contrastive_loss's arguments after model_cfg: the bracket ids and the depth bound of its
    balanced prefixes."""
    return bracket_ids(data), int(data.max_depth)


def contrastive_width(data: Data) -> int:
    """A contrastive prefix adds at most 2 * max_depth + 2 tokens to a training row."""
    return 2 * int(data.max_depth) + 2


def contrastive_prefixes(key: jax.Array, batch: int, brackets: tuple[tuple[int, ...], ...],
                         max_depth: int) -> tuple[jax.Array, jax.Array]:
    """Balanced prefixes for the contrastive regularizer: n ~ U{0..D} nested pairs of random
    types, with one extra matched pair of random type inserted at depth j ~ U{0..min(n, D-1)}
    (so no prefix is deeper than D). `brackets`: (open ids, close ids), `bracket_ids`. Returns
    PAD-padded tokens [batch, 2D+2] and lengths 2n+2."""
    depth, (open_ids, close_ids) = max_depth, brackets
    kn, kj, kt, ke = jax.random.split(key, 4)
    n = jax.random.randint(kn, (batch, 1), 0, depth + 1)
    j = jax.random.randint(kj, (batch, 1), 0, jnp.minimum(n, depth - 1) + 1)
    types = jax.random.randint(kt, (batch, depth), 0, len(open_ids))
    extra = jax.random.randint(ke, (batch, 1), 0, len(open_ids))
    p = jnp.arange(2 * depth + 2)[None]
    # Layout: open types[0..j-1] | open extra | close extra | open types[j..n-1] | closes of
    # types[n-1..0].
    before, after = p < j, (p >= j + 2) & (p <= n + 1)
    closing = (p >= n + 2) & (p <= 2 * n + 1)
    index = jnp.clip(jnp.where(before, p, jnp.where(after, p - 2, 2 * n + 1 - p)), 0, depth - 1)
    t = jnp.where((p == j) | (p == j + 1), extra, jnp.take_along_axis(types, index, 1))
    is_open = before | after | (p == j)
    is_close = closing | (p == j + 1)
    tokens = jnp.where(is_open, jnp.asarray(open_ids)[t],
                       jnp.where(is_close, jnp.asarray(close_ids)[t], dyck_sentences.PAD))
    return tokens, 2 * n[:, 0] + 2


def contrastive_loss(params: dict, x: jax.Array, logits_x: jax.Array, key: jax.Array,
                     model_cfg: model.ModelConfig, brackets: tuple[tuple[int, ...], ...],
                     max_depth: int) -> jax.Array:
    """Wen et al. eq. 22: mean squared error between the logits of x ([B, T], starting with BOS)
    and those of BOS + prefix + x[1:] at the positions of x's tokens (non-PAD, after BOS), per
    logit entry; every row draws its own prefix (contrastive_prefixes)."""
    batch, length = x.shape
    prefix, plen = contrastive_prefixes(key, batch, brackets, max_depth)
    pos = jnp.arange(length + prefix.shape[1])[None]
    plen = plen[:, None]
    from_prefix = jnp.take_along_axis(prefix, jnp.clip(pos - 1, 0, prefix.shape[1] - 1), 1)
    from_x = jnp.take_along_axis(x, jnp.clip(pos - plen, 0, length - 1), 1)
    joined = jnp.where(pos == 0, x[:, :1], jnp.where(
        pos <= plen, from_prefix, jnp.where(pos - plen < length, from_x, dyck_sentences.PAD)))
    logits_joined, _ = model.forward(params, joined, model_cfg)
    aligned = jnp.take_along_axis(logits_joined, (jnp.arange(length)[None] + plen)[..., None], 1)
    mask = ((x != dyck_sentences.PAD) & (jnp.arange(length) > 0)).astype(logits_x.dtype)[..., None]
    sq = ((aligned - logits_x) ** 2 * mask).sum()
    return sq / jnp.maximum(mask.sum() * logits_x.shape[-1], 1.0)
