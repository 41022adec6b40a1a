"""The text task's half of the induction study (jaxillusions/studies/induction.py) on the text
itself, which the study calls through the task's hooks (tasks.Hooks; tasks/text.py imports them
under their names; its hook special_tokens, the random-token test's tokens, stays there, beside
the tokenizer it reads):

- on the iid split's rows (`copying_analyses`): every head's mean attention on the induction
  target at the copyable positions (the next token continues a bigram seen earlier in the row),
  beside uniform causal attention's, as induction_text.csv and columns of induction_seeds.csv
  (TEXT_SEED_COLUMNS); its part of the verdict (`copying_verdict`) and of the headline
  (`copying_report`);
- the induction targets of a row of tokens (`induction_targets`: where an induction head
  attends), also the text and code tasks' attention target (hook attention_targets).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import model as model_lib
from jaxillusions.runtime.chunks import padded_chunks
from jaxillusions.tasks import PAD, Report


def induction_targets(tokens: np.ndarray) -> np.ndarray:
    """int32 [N, T]: at position t, the position after the latest earlier occurrence of
    tokens[t] in its row (s + 1 for the largest s < t with tokens[s] == tokens[t]: where an
    induction head attends), -1 where tokens[t] has none or is PAD."""
    n, width = tokens.shape
    out = np.full((n, width), -1, np.int32)
    last: dict[tuple[int, int], int] = {}
    for t in range(width):  # a scan over positions; rows and tokens by dictionary
        for r in np.flatnonzero(tokens[:, t] != PAD):
            key = (int(r), int(tokens[r, t]))
            if key in last:
                out[r, t] = last[key] + 1
            last[key] = t
    return out


# ---------------------------------------------------------------------------------------------
# On the text itself (hooks copying_analyses, copying_verdict, copying_report).

ANALYSED = "iid"  # the split whose rows the heads' attention is measured on
# induction_seeds.csv's further columns: the attention on the induction targets at copyable
# positions of the random-token test's best head, of the seed's strongest head on the text, and
# of uniform causal attention.
TEXT_SEED_COLUMNS = ("text_target_attention", "text_max_target_attention",
                     "text_uniform_on_target")
TEXT_COLUMNS = ("seed", "layer", "head", "best", "target_attention", "uniform_on_target",
                "queries")


def copy_targets(split) -> np.ndarray:
    """int32 [N, T] of a text split (tasks/text.py's TextSplit): `induction_targets` at the
    copyable positions (copyable == 1: the next token continues a bigram seen earlier in the
    row), -1 elsewhere."""
    return np.where(split.copyable == 1, induction_targets(split.tokens), -1).astype(np.int32)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _target_attention_batch(params, tokens, shifted, *, cfg):
    """[S, attention layers, head]: attention on the targets (shifted - 1; < 0: none), summed
    over the queries."""
    targets = shifted - 1
    defined = (targets >= 0).astype(jnp.float32)
    index = jnp.maximum(targets, 0)[:, None, :, None]  # [N, 1, q, 1]
    sites = [f"blocks.{i}.attn.pattern"
             for i in range(model_lib.first_attention_layer(cfg), cfg.n_layers)]

    def one(p):
        _, found = model_lib.forward(p, tokens, cfg, cache=sites)
        return jnp.stack([jnp.einsum("nhq,nq->h", jnp.take_along_axis(
            found[s].astype(jnp.float32), index, -1)[..., 0], defined) for s in sites])

    return jax.vmap(one)(params)


@dataclasses.dataclass(frozen=True)
class TextCopying:
    """Result of `copying_analyses`: every head's mean attention on the induction target at the
    copyable positions of real text (per seed, layer, head; NaN: a diverged seed or a layer
    without attention)."""

    seeds: tuple
    attention: np.ndarray  # [S, layer, head]
    uniform_on_target: float  # uniform causal attention's: the mean of 1 / (q + 1)
    queries: int

    def seed_values(self, best: np.ndarray) -> dict[str, np.ndarray]:
        """{TEXT_SEED_COLUMNS name: [S]}; best int [S, 2]: the random-token test's best heads."""
        ok = best[:, 0] >= 0
        index = (np.arange(len(best)), np.maximum(best[:, 0], 0), np.maximum(best[:, 1], 0))
        flat = self.attention.reshape(len(self.seeds), -1)
        top = np.where(np.isnan(flat).all(1), np.nan,
                       np.nanmax(np.nan_to_num(flat, nan=-1.0), 1))
        return {"text_target_attention": np.where(ok, self.attention[index], np.nan),
                "text_max_target_attention": top,
                "text_uniform_on_target": np.where(np.isnan(top), np.nan,
                                                   self.uniform_on_target)}

    def tables(self, best: np.ndarray) -> dict[str, tuple[list[dict], tuple[str, ...]]]:
        """{"induction_text.csv": one row per (seed, layer, head) with a value (TEXT_COLUMNS),
        the random-token test's best head marked}."""
        rows = [{"seed": s, "layer": layer, "head": head,
                 "best": int(tuple(best[i]) == (layer, head)),
                 "target_attention": float(self.attention[i, layer, head]),
                 "uniform_on_target": self.uniform_on_target, "queries": self.queries}
                for i, s in enumerate(self.seeds)
                for layer in range(self.attention.shape[1])
                for head in range(self.attention.shape[2])
                if not np.isnan(self.attention[i, layer, head])]
        return {"induction_text.csv": (rows, TEXT_COLUMNS)}


def copying_analyses(chunks, model_cfg, splits, diverged, *, rows: int, split_names,
                     batch_size: int = 64) -> TextCopying | None:
    """The hook copying_analyses: every head's attention on `copy_targets` in the first `rows`
    rows of the iid split (chunks: [(params with a seed axis, seed labels)], joined; NaN for
    the `diverged` seeds); None without iid rows or a copyable position in them."""
    if ANALYSED not in split_names:
        return None
    split = splits[ANALYSED]
    tokens, targets = split.tokens[:rows], copy_targets(split)[:rows]
    defined = targets >= 0
    if not defined.any():
        return None
    shifted = targets + 1  # the zero rows padded_chunks adds are no target
    batches = list(padded_chunks([tokens, shifted], batch_size))
    layers = list(range(model_lib.first_attention_layer(model_cfg), model_cfg.n_layers))
    sums, labels = [], []
    for params, seeds in chunks:
        total = sum(np.asarray(_target_attention_batch(params, tok, tgt, cfg=model_cfg),
                               np.float64) for tok, tgt in batches)
        sums.append(total)
        labels += list(seeds)
    num = len(diverged)
    found = np.full((num, model_cfg.n_layers, model_cfg.n_heads), np.nan)
    found[:, layers] = np.concatenate(sums)[:num] / defined.sum()
    found[np.asarray(diverged, bool)] = np.nan
    query = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)[defined]
    return TextCopying(seeds=tuple(labels[:num]), attention=found,
                       uniform_on_target=float(np.mean(1.0 / (query + 1))),
                       queries=int(defined.sum()))


def copying_verdict(columns: Mapping, tally) -> str:
    """The hook copying_verdict: the seeds with a head that puts >= the study's bar on the
    induction targets at copyable positions of real text (text_max_target_attention)."""
    on_text = columns.get("text_max_target_attention")
    if on_text is None:
        return ""
    passing = tally.passing(on_text, tally.min_score)
    return (f"; on real text ({ANALYSED}, copyable tokens): {passing} of {tally.n} seeds have a "
            f"head with >= {tally.min_score} of its attention on the induction target")


def copying_report(per_seed, results, cell) -> Report:
    """The hook copying_report: the strongest head's attention on real text's induction targets
    (and uniform attention's) after the best-head score."""
    del results
    if per_seed is None or "text_max_target_attention" not in per_seed:
        return Report()
    return Report(cells=f", strongest head on {ANALYSED} text's induction targets "
                  f"{cell(per_seed['text_max_target_attention'], bounds=(0, 1))} (uniform "
                  f"{cell(per_seed['text_uniform_on_target'], bounds=(0, 1))})")
