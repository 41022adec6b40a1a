"""Induction-head curve of one code-task seed: train in increments, test every stop (issue 37).

    nice -n 15 python -m benchmarks.induction_curves --config=configs/code_induction.py \\
        --workdir=runs/induction_learned --stops=500,1000,2000,3000 [--analyse] \\
        [--config.model.attn_only=false --config.model.d_mlp=256 ...]

Trains the config's first seed with `train.train_sweep(settings, workdir, stop_at_step=s)` for
each stop s (resuming from the workdir's checkpoints; a stop already reached only restores) and
at each stop prints a markdown row and appends to <workdir>/curve.csv (COLUMNS):

- loss: the mean of the training losses logged (every train.log_every steps, one batch each) in
  the last --loss_window steps before the stop (NaN for stops reached by an earlier run);
- prev_token: the best layer-0 head's mean attention from each position after BOS of the
  induction test's sequences to the position before it;
- score, loss_drop: `induction.induction` (L = --length, batch --batch, key 0);
- iid accuracy, identifier_repeat and identifier_first accuracy on iid and their difference
  (the evaluation's per-category accuracy: the category of the predicted character).

--analyse, at the last stop, for every head: where it attends on the test's sequences
(`attention_mass`: the target = the token after the earlier occurrence, target +-1 and +-2, BOS,
entropy) and inside repeated identifiers of --code_rows iid functions (`code_attention`), and
with --ablate (the default) its mean-ablation (blocks.<l>.attn.z of that head replaced by its
mean over the non-PAD positions of --ablate_rows training rows): loss drop and iid identifier
accuracies with the head ablated. A stop already reached only restores, so `--stops=<step>
--analyse` analyses a finished workdir.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import re
import sys
import time

from absl import flags

from launch import common

# launch.common's flags, which this script takes as the launchers do (common.run).
SHARED_FLAGS = ("config", "workdir", "start_over", "debug")
STOPS = flags.DEFINE_list("stops", ["500", "1000", "2000", "3000"], "Steps to test at.")
LENGTH = flags.DEFINE_integer("length", 48, "Induction test: tokens per copy (L).")
BATCH = flags.DEFINE_integer("batch", 32, "Induction test: sequences.")
LOSS_WINDOW = flags.DEFINE_integer("loss_window", 400, "Training loss: mean over the logged "
                                   "losses of this many steps before the stop.")
ANALYSE = flags.DEFINE_bool("analyse", False, "Attention mass and head ablations at the end.")
ABLATE_ROWS = flags.DEFINE_integer("ablate_rows", 256, "Training rows for the ablation means.")
ABLATE = flags.DEFINE_bool("ablate", True, "With --analyse: the head mean-ablations too.")
CODE_ROWS = flags.DEFINE_integer("code_rows", 128, "With --analyse: iid rows for the heads' "
                                 "attention on real repeated identifiers.")

COLUMNS = ("step", "loss", "prev_token", "score", "best_layer", "best_head", "loss_drop",
           "iid_acc", "acc_first", "acc_repeat", "identifier_gap", "seconds")


class _Tee(io.TextIOBase):
    """Passes writes on to `out` and keeps the training losses that train_sweep prints."""

    LINE = re.compile(r"step\s+(\d+)/\d+ \| loss (\S+)")

    def __init__(self, out):
        self.out, self.losses = out, {}

    def write(self, text):
        for m in self.LINE.finditer(text):
            self.losses[int(m[1])] = float(m[2])
        return self.out.write(text)

    def flush(self):
        self.out.flush()


def category_accuracy(params, split, model_cfg, intervention=None, batch_size=64):
    """Per-category next-character accuracy [categories] and overall accuracy of one seed
    (params without a seed axis) on a code split, as the evaluation counts it."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from jaxillusions import model as model_lib  # noqa: PLC0415
    from jaxillusions import tasks  # noqa: PLC0415

    view = tasks.get("code").view(split)
    num = view.num_bins["category"]

    params = jax.tree.map(jnp.asarray, params)

    @jax.jit
    def counts(tokens, evaluated, bins):
        logits, _ = model_lib.forward(params, tokens, model_cfg, intervention=intervention)
        correct = (logits.argmax(-1) == jnp.roll(tokens, -1, axis=1)) & evaluated
        onehot = jax.nn.one_hot(bins, num) * evaluated[..., None]
        return jnp.einsum("bt,btc->c", correct.astype(jnp.float32), onehot), onehot.sum((0, 1))

    right, total = np.zeros(num), np.zeros(num)
    for i in range(0, len(view.tokens), batch_size):
        sl = slice(i, i + batch_size)
        r, t = counts(view.tokens[sl], view.evaluated[sl], view.bins["category"][sl])
        right, total = right + np.asarray(r), total + np.asarray(t)
    return right / np.maximum(total, 1), right.sum() / total.sum()


def previous_token(params, model_cfg, tokens):
    """[heads] layer 0's mean attention from positions 1.. to the position before (one seed)."""
    import numpy as np  # noqa: PLC0415

    from jaxillusions import model as model_lib  # noqa: PLC0415

    _, cache = model_lib.forward(params, tokens, model_cfg, cache=["blocks.0.attn.pattern"])
    pattern = np.asarray(cache["blocks.0.attn.pattern"])  # [batch, head, q, k]
    q = np.arange(1, tokens.shape[1])
    return pattern[:, :, q, q - 1].mean((0, 2))


def test(state, settings, model_cfg, splits, losses, step, seconds):
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from jaxillusions.studies import induction  # noqa: PLC0415
    from jaxillusions.tasks.code_completion import lexer  # noqa: PLC0415

    special = induction.task_tokens(settings.task)
    found = induction.induction(state.params, model_cfg, jax.random.key(0), length=LENGTH.value,
                                batch=BATCH.value, special=special)
    tokens = induction.repeated_tokens(jax.random.key(0), model_cfg.vocab_size, LENGTH.value,
                                       BATCH.value, special)
    params = jax.tree.map(lambda x: jnp.asarray(x[0]), state.params)
    by_cat, acc = category_accuracy(params, splits["iid"], model_cfg)
    first, repeat = by_cat[lexer.IDENT_FIRST], by_cat[lexer.IDENT_REPEAT]
    recent = [v for s, v in losses.items() if step - LOSS_WINDOW.value < s <= step]
    row = found.seed_rows()[0]
    return {"step": step, "loss": float(np.mean(recent)) if recent else math.nan,
            "prev_token": float(previous_token(params, model_cfg, tokens).max()),
            "score": row["max_induction_score"], "best_layer": row["best_layer"],
            "best_head": row["best_head"], "loss_drop": row["loss_drop"],
            "iid_acc": float(acc), "acc_first": float(first), "acc_repeat": float(repeat),
            "identifier_gap": float(repeat - first), "seconds": seconds}


def attention_mass(pattern, length, offset=1):
    """Where a head attends on the test's sequences: pattern [batch, q, k] of one head.
    Repeat queries q = offset+L+i (i = 2 .. L-3, so that every key below is in the first copy):
    mean mass on the target t = q-L+1 and t-2 .. t+2 (t-1: the earlier occurrence of the query's
    token), BOS, the query itself, the rest of the first copy and of the repeat; entropy (nats)
    against that of uniform causal attention. Previous-token view: all queries q >= 1, mass on
    q-1, q, q-2 and BOS."""
    import numpy as np  # noqa: PLC0415

    i = np.arange(2, length - 2)
    q = offset + length + i
    t = q - length + 1
    rows = pattern[:, q]  # [batch, query, k]
    at = lambda k: float(np.take_along_axis(rows, np.broadcast_to(k[None, :, None], (  # noqa: E731
        rows.shape[0], len(q), 1)), -1).mean())
    p = np.clip(rows, 1e-12, 1)
    out = {f"target{d:+d}" if d else "target": at(t + d) for d in (-2, -1, 0, 1, 2)}
    first_copy = rows[:, :, offset:offset + length].sum(-1).mean()
    out.update({"bos": float(rows[:, :, 0].mean()) if offset else math.nan,
                "self": at(q), "query-1": at(q - 1),
                "rest_of_first_copy": float(first_copy) - sum(
                    out[k] for k in ("target-2", "target-1", "target", "target+1", "target+2")),
                "repeat_so_far": float(rows[:, :, offset + length:].sum(-1).mean()),
                "entropy": float(-(p * np.log(p) * (rows > 0)).sum(-1).mean()),
                "uniform_entropy": float(np.log(q + 1).mean()),
                "argmax_is_target": float((rows.argmax(-1) == t[None]).mean())})
    allq = np.arange(1, pattern.shape[1])
    prev = lambda k: float(pattern[:, allq, k].mean())  # noqa: E731
    out.update({"all_q:prev": prev(allq - 1), "all_q:self": prev(allq),
                "all_q:prev2": prev(np.maximum(allq - 2, 0)),
                "all_q:bos": float(pattern[:, allq, 0].mean())})
    return out


def code_attention(pattern, tokens, category):
    """Where a head attends inside repeated identifiers of real code. pattern [N, q, k] of one
    head on iid rows `tokens` [N, T]. Queries: positions t whose next character is
    identifier_repeat and that have an earlier bigram match j (tokens[j-1:j+1] ==
    tokens[t-1:t+1], j < t-1). Mean mass on the matches' next positions j+1 (the induction
    target), on the matches j, on j-1 and j+2, and what uniform causal attention would put on
    the targets; the share of queries whose strongest key is a target; and over all non-PAD
    positions, the attention to the position before (all_q:prev)."""
    import numpy as np  # noqa: PLC0415

    from jaxillusions.tasks.code_completion import lexer  # noqa: PLC0415
    from jaxillusions.tasks.code_completion import splits as code_splits  # noqa: PLC0415

    prev = []  # every non-PAD query's attention to the position before
    sums, n = dict.fromkeys(("target", "match", "match-1", "target+1", "uniform_on_target",
                             "argmax_is_target"), 0.0), 0
    width = tokens.shape[1]
    tri = np.tril(np.ones((width, width), bool), -2)  # j < t-1
    for p, tok, cat in zip(pattern, tokens, category, strict=True):
        same = (tok[:, None] == tok[None, :])
        match = np.zeros_like(same)
        match[1:, 1:] = same[1:, 1:] & same[:-1, :-1]
        match &= tri
        queries = np.flatnonzero((cat == lexer.IDENT_REPEAT) & match.any(1))
        for t in queries:
            j = np.flatnonzero(match[t])
            sums["target"] += p[t, j + 1].sum()
            sums["match"] += p[t, j].sum()
            sums["match-1"] += p[t, j - 1].sum()
            sums["target+1"] += p[t, np.minimum(j + 2, t)].sum()
            sums["uniform_on_target"] += len(j) / (t + 1)
            sums["argmax_is_target"] += float(np.isin(p[t, : t + 1].argmax(), j + 1))
        n += len(queries)
        real = np.flatnonzero(tok[1:] != code_splits.PAD) + 1
        prev.append(p[real, real - 1])
    return {**{k: v / max(n, 1) for k, v in sums.items()},
            "all_q:prev": float(np.concatenate(prev).mean()), "queries": n}


def analyse(state, settings, model_cfg, splits, curve_row):
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from jaxillusions import model as model_lib  # noqa: PLC0415
    from jaxillusions.studies import induction  # noqa: PLC0415
    from jaxillusions.tasks.code_completion import lexer  # noqa: PLC0415
    from jaxillusions.tasks.code_completion import splits as code_splits  # noqa: PLC0415

    special = induction.task_tokens(settings.task)
    L = LENGTH.value
    tokens = induction.repeated_tokens(jax.random.key(0), model_cfg.vocab_size, L, BATCH.value,
                                       special)
    params = jax.tree.map(lambda x: jnp.asarray(x[0]), state.params)
    sites = [f"blocks.{i}.attn.pattern" for i in range(model_cfg.n_layers)]
    _, cache = model_lib.forward(params, tokens, model_cfg, cache=sites)
    found = induction.induction(state.params, model_cfg, jax.random.key(0), length=L,
                                batch=BATCH.value, special=special)
    prev = previous_token(params, model_cfg, tokens)
    print(f"\n## Analysis at step {curve_row['step']}\n\nscores [layer, head]: "
          f"{np.round(found.score[0], 3).tolist()}; layer-0 previous-token: "
          f"{np.round(prev, 3).tolist()}\n")
    heads = [(layer, h) for layer in range(model_cfg.n_layers) for h in range(model_cfg.n_heads)]
    masses = {(layer, h): attention_mass(np.asarray(cache[sites[layer]])[:, h], L)
              for layer, h in heads}
    keys = list(next(iter(masses.values())))
    print("| measure | " + " | ".join(f"L{layer}H{h}" for layer, h in heads) + " |")
    print("|---|" + "---|" * len(heads))
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{masses[lh][k]:.3f}" for lh in heads) + " |")

    rows = splits["iid"].tokens[:CODE_ROWS.value]
    _, cc = model_lib.forward(params, jnp.asarray(rows), model_cfg, cache=sites)
    code = {(layer, h): code_attention(np.asarray(cc[sites[layer]])[:, h], rows,
                                       splits["iid"].category[:CODE_ROWS.value])
            for layer, h in heads}
    print("\nOn iid code, queries inside repeated identifiers with an earlier bigram match "
          f"({code[heads[0]]['queries']} queries):\n")
    print("| measure | " + " | ".join(f"L{layer}H{h}" for layer, h in heads) + " |")
    print("|---|" + "---|" * len(heads))
    for k in [k for k in code[heads[0]] if k != "queries"]:
        print(f"| {k} | " + " | ".join(f"{code[lh][k]:.3f}" for lh in heads) + " |")
    if not ABLATE.value:
        return masses, code

    # Mean ablation: each head's z replaced by its mean over the non-PAD positions of training
    # rows.
    rows = jnp.asarray(splits["train"].tokens[:ABLATE_ROWS.value])
    zsites = [f"blocks.{i}.attn.z" for i in range(model_cfg.n_layers)]
    _, zc = model_lib.forward(params, rows, model_cfg, cache=zsites)
    real = (rows != code_splits.PAD)[..., None, None]
    means = {s: (zc[s] * real).sum((0, 1)) / real.sum((0, 1)) for s in zsites}  # [head, e]

    def ablate(layer, h):
        site = zsites[layer]

        def intervene(name, value):
            return value.at[:, :, h].set(means[site][h]) if name == site else value
        return intervene

    print("\n| ablated | loss drop | iid acc | identifier_first | identifier_repeat | gap |")
    print("|---|---|---|---|---|---|")
    out = []
    for label, iv in [("none", None)] + [(f"L{layer}H{h}", ablate(layer, h))
                                          for layer, h in heads]:
        res = induction.induction(state.params, model_cfg, jax.random.key(0), length=L,
                                  batch=BATCH.value, special=special, intervention=iv)
        by_cat, acc = category_accuracy(params, splits["iid"], model_cfg, intervention=iv)
        first, rep = by_cat[lexer.IDENT_FIRST], by_cat[lexer.IDENT_REPEAT]
        out.append((label, float(res.loss_drop[0]), acc, first, rep))
        print(f"| {label} | {res.loss_drop[0]:.2f} | {acc:.3f} | {first:.3f} | {rep:.3f} | "
              f"{rep - first:+.3f} |", flush=True)
    return masses, out


def main(settings, workdir, start_over=False):
    import numpy as np  # noqa: PLC0415

    from jaxillusions.training import train  # noqa: PLC0415

    stops = sorted(int(s) for s in STOPS.value)
    splits, model_cfg, _ = train.build(settings)
    path = os.path.join(workdir, "curve.csv")
    print("| step | loss | previous-token | best-head score | loss drop (nats) | iid acc | "
          "identifier_repeat - first | s |\n|---|---|---|---|---|---|---|---|")
    tee, start, state, row = _Tee(sys.stdout), time.perf_counter(), None, None
    for stop in stops:
        with contextlib.redirect_stdout(tee):
            state, _ = train.train_sweep(settings, workdir, splits=splits, stop_at_step=stop,
                                         start_over=start_over)
        step = int(np.max(state.step))
        row = test(state, settings, model_cfg, splits, tee.losses, step,
                   round(time.perf_counter() - start, 1))
        print(f"| {step} | {row['loss']:.2f} | {row['prev_token']:.2f} | {row['score']:.3f} | "
              f"{row['loss_drop']:.2f} | {row['iid_acc']:.3f} | {row['identifier_gap']:+.3f} | "
              f"{row['seconds']:.0f} |", flush=True)
        new = not os.path.exists(path)
        if not new:
            with open(path) as f:
                if any(int(r["step"]) == step for r in csv.DictReader(f)):
                    continue  # (a stop reached by an earlier run: its row is there)
        with open(path, "a", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS)
            if new:
                writer.writeheader()
            writer.writerow(row)
    if ANALYSE.value and state is not None:
        analyse(state, settings, model_cfg, splits, row)


if __name__ == "__main__":
    common.run(main)
