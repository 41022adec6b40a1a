"""Induction-head curve of one code-task seed: train in increments, test every stop.

    nice -n 15 python -m benchmarks.induction_curves --config=code_induction \\
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
  (the evaluation's per-category accuracy: the category of the predicted character);
- the code task's test as the main job's induction stage runs it (its defaults: key 0, batch
  64, --code_rows iid rows): code_attention, the attention of the best head of the random-token
  test (at its default length) on repeated identifiers' induction targets in iid code;
  identifier_score and identifier_loss_drop, the test on random identifier characters; passes,
  1 where the two pass `induction.has_head`'s thresholds.

--analyse, at the last stop, for every head: where it attends on the test's sequences
(`attention_mass`: the target = the token after the earlier occurrence, target +-1 and +-2, BOS,
entropy) and inside repeated identifiers of --code_rows iid functions, and with --ablate (the
default) its mean-ablation (blocks.<l>.attn.z of that head replaced by its mean over the
non-PAD positions of --ablate_rows training rows): loss drop and iid identifier accuracies with
the head ablated. The code measures and the ablation are the main job's
(`jaxillusions.tasks.code_completion.copying.code_analyses`, `mean_ablation`). A stop already
reached only restores, so `--stops=<step> --analyse` analyses a finished workdir.
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

from jaxillusions.launch import common

# jaxillusions.launch.common's flags, which this script takes as the launchers do (common.run).
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
           "iid_acc", "acc_first", "acc_repeat", "identifier_gap", "code_attention",
           "identifier_score", "identifier_loss_drop", "passes", "seconds")


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

    from jaxillusions import tasks  # noqa: PLC0415
    from jaxillusions.studies import induction  # noqa: PLC0415
    from jaxillusions.tasks.code_completion import lexer  # noqa: PLC0415
    from jaxillusions.training import evaluation  # noqa: PLC0415

    special = induction.task_tokens(settings.task)
    found = induction.induction(state.params, model_cfg, jax.random.key(0), length=LENGTH.value,
                                batch=BATCH.value, special=special)
    tokens = induction.repeated_tokens(jax.random.key(0), model_cfg.vocab_size, LENGTH.value,
                                       BATCH.value, special)
    params = jax.tree.map(lambda x: jnp.asarray(x[0]), state.params)
    task = tasks.get(settings)
    ev = evaluation.evaluate([state.params], splits["iid"], model_cfg, num_seeds=1,
                             batch_size=64, num_bins=task.train_num_bins(settings.data),
                             task=task)  # the evaluation's own per-category accuracy
    by_cat, acc = ev["acc_by_category"][0], float(ev["acc"][0])
    first, repeat = by_cat[lexer.IDENT_FIRST], by_cat[lexer.IDENT_REPEAT]
    recent = [v for s, v in losses.items() if step - LOSS_WINDOW.value < s <= step]
    row = found.seed_rows()[0]
    code = code_task_test(state, model_cfg, splits)
    return {"step": step, "loss": float(np.mean(recent)) if recent else math.nan,
            "prev_token": float(previous_token(params, model_cfg, tokens).max()),
            "score": row["max_induction_score"], "best_layer": row["best_layer"],
            "best_head": row["best_head"], "loss_drop": row["loss_drop"],
            "iid_acc": float(acc), "acc_first": float(first), "acc_repeat": float(repeat),
            "identifier_gap": float(repeat - first), **code, "seconds": seconds}


def code_task_test(state, model_cfg, splits):
    """The code task's test of the main job's induction stage (studies/induction.py, run) on the
    first seed: {code_attention, identifier_score, identifier_loss_drop, passes}."""
    import jax  # noqa: PLC0415

    from jaxillusions import tasks  # noqa: PLC0415
    from jaxillusions.studies import induction  # noqa: PLC0415
    from jaxillusions.tasks.code_completion import copying  # noqa: PLC0415

    defaults = induction.task_tokens("code")
    names = induction.pool_special(tasks.get("code"), "identifier", splits, defaults)
    tests = [induction.induction(state.params, model_cfg, jax.random.key(0),
                                 length=induction.default_length(model_cfg, special), batch=64,
                                 special=special) for special in (defaults, names)]
    iid = splits["iid"]
    code = copying.code_attention(state.params, model_cfg, iid.tokens[:CODE_ROWS.value],
                                  iid.category[:CODE_ROWS.value])
    attention = float(code.of_heads(tests[0].best)["target_attention"][0])
    drop = float(tests[1].loss_drop[0])
    return {"code_attention": attention, "identifier_score": float(tests[1].max_score[0]),
            "identifier_loss_drop": drop,
            "passes": int(induction.has_head(attention, drop))}


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


def _table(columns, measures):
    """A markdown table: a row per measure, a column per head ({label: {measure: value}})."""
    print("| measure | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for k in measures:
        print(f"| {k} | " + " | ".join(f"{columns[c][k]:.3f}" for c in columns) + " |")


def analyse(state, settings, model_cfg, splits, curve_row):
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from jaxillusions import model as model_lib  # noqa: PLC0415
    from jaxillusions import tasks  # noqa: PLC0415
    from jaxillusions.studies import induction  # noqa: PLC0415
    from jaxillusions.tasks.code_completion import copying, lexer  # noqa: PLC0415
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
    masses = {f"L{layer}H{h}": attention_mass(np.asarray(cache[sites[layer]])[:, h], L)
              for layer, h in heads}
    _table(masses, list(next(iter(masses.values()))))

    # The study's measures on real code (the code task's copying.py, as the main job's
    # code_analyses):
    # attention inside repeated identifiers of --code_rows iid rows, and each head mean-ablated
    # (its mean over the non-PAD positions of --ablate_rows training rows) on iid.
    iid = splits["iid"]
    code = copying.code_attention(state.params, model_cfg, iid.tokens[:CODE_ROWS.value],
                                  iid.category[:CODE_ROWS.value])
    on_code = {f"L{layer}H{h}": {k: float(v[0, layer, h]) for k, v in code.values.items()}
               for layer, h in heads}
    print(f"\nOn iid code, queries inside repeated identifiers with an earlier bigram match "
          f"({code.queries} queries; uniform attention on the targets "
          f"{code.uniform_on_target:.3f}):\n")
    _table(on_code, copying.CODE_MEASURES)
    if not ABLATE.value:
        return masses, on_code

    means = copying.head_means(state.params, model_cfg,
                               splits["train"].tokens[:ABLATE_ROWS.value], pad=code_splits.PAD)
    ablation = copying.head_ablation(state.params, model_cfg, means,
                                     {"iid": tasks.get("code").view(iid)},
                                     labels=lexer.CATEGORIES)
    acc = ablation.accuracy()[0, :, 0]  # [1 + heads, category] on iid
    count = ablation.count[0]
    print("\n| ablated | loss drop | iid acc | identifier_first | identifier_repeat | gap |")
    print("|---|---|---|---|---|---|")
    out = []
    for a, head in enumerate([None, *ablation.heads]):
        mask = np.zeros((model_cfg.n_layers, model_cfg.n_heads), bool)
        if head is not None:
            mask[head] = True
        res = induction.induction(state.params, model_cfg, jax.random.key(0), length=L,
                                  batch=BATCH.value, special=special,
                                  intervention=copying.mean_ablation(means[0], mask))
        total = float(ablation.correct[0, a, 0].sum() / count.sum())
        first, rep = acc[a, lexer.IDENT_FIRST], acc[a, lexer.IDENT_REPEAT]
        label = "none" if head is None else f"L{head[0]}H{head[1]}"
        out.append((label, float(res.loss_drop[0]), total, first, rep))
        print(f"| {label} | {res.loss_drop[0]:.2f} | {total:.3f} | {first:.3f} | {rep:.3f} | "
              f"{rep - first:+.3f} |", flush=True)
    return masses, out


def check_curve_file(path: str) -> None:
    """Refuses, before any work, a curve.csv whose header is not COLUMNS (one written by an
    older version of this script), which the rows of this one would corrupt."""
    if not os.path.exists(path):
        return
    with open(path, newline="") as f:
        header = next(csv.reader(f), [])
    if tuple(header) != COLUMNS:
        raise SystemExit(f"{path} has other columns than this script writes (an older "
                         f"version's); move it aside or use another --workdir")


def main(settings, workdir, start_over=False):
    import numpy as np  # noqa: PLC0415

    from jaxillusions.training import train  # noqa: PLC0415

    stops = sorted(int(s) for s in STOPS.value)
    path = os.path.join(workdir, "curve.csv")
    check_curve_file(path)
    splits, model_cfg, _ = train.build(settings)
    print("| step | loss | previous-token | best-head score | loss drop (nats) | iid acc | "
          "identifier_repeat - first | attention on code | identifier loss drop | passes | "
          "s |\n|---|---|---|---|---|---|---|---|---|---|---|")
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
              f"{row['code_attention']:.3f} | {row['identifier_loss_drop']:.2f} | "
              f"{row['passes']} | {row['seconds']:.0f} |", flush=True)
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
