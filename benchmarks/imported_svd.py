"""One SVD family on an imported population: jaxillusions' batched proxy stage against a Python
loop over the models with TransformerLens hooks, the same data and rank, timed in one run.

    python -m benchmarks.imported_svd checkpoints/hf_population            # seed*/ under it
    python -m benchmarks.imported_svd DIR --layer=1 --rank=4 --fit_windows=256 --eval_windows=256
    python -m benchmarks.imported_svd DIR --out=runs/imported_svd.json

The population is a directory that benchmarks/train_hf_population.py wrote (its `seed*/`
models, `text/train.txt` and `text/heldout_python.txt`, `tokenizer.json`), or --paths=a,b,...
(Hugging Face GPT-2 / GPT-NeoX directories) with --fit_text and --eval_text files and a
--tokenizer. Both paths read the same windows: the first --fit_windows windows of --context
tokens of the fit text (default: the models' context) and the first --eval_windows of the
evaluation text.

What is timed, each the best of --repeats interleaved runs (jaxillusions' after a first run
that compiles):
- jaxillusions: `pretrained.load_pretrained` stacks every member on the member axis; then the
  proxy stage as the main job runs it, every member in one program: `faithfulness.collect` (the
  keys' second moments per member and head, streamed over the fit windows), `faithfulness.fit`
  (the "svd" proxy: uncentered, the top-`rank` eigenvectors of each head's moment matrix) and
  `faithfulness.evaluate` (each member's forward with the keys replaced by their projection,
  against its original forward: agreement of the predictions, and the JSD, accuracies and
  dictionary metrics it always computes). The first run's time, XLA compilation included, is
  reported too.
- TransformerLens: what a user writes today, a Python loop over the models: each booted from
  its directory (`TransformerBridge.boot_transformers`, then `enable_compatibility_mode()`, TL
  4.x's HookedTransformer-equivalent; TL 3.x: `HookedTransformer.from_pretrained` needs a model
  name, so 3.x is not supported here), `run_with_cache` on the fit windows for the layer's keys
  (`blocks.<layer>.attn.hook_k`, before the rotary turn, as our `attn.k`), `torch.linalg.svd` of
  each head's keys, then per evaluation batch the original forward and `run_with_hooks` with a
  hook that replaces the keys by their projection on the top-`rank` right singular vectors;
  agreement of the argmax predictions. Booting is timed apart from fit + evaluate.

Both paths score every position but the last of each window (its target is outside the window).
The table prints each path's time, the ratio (TransformerLens loop over jaxillusions) and, to show
both computed the same thing, the projection's rank in each path, the largest difference of the
two projection matrices, and each member's agreement in both paths (they differ only where
float32 rounding flips an argmax). Needs the `pretrained` and `export` extras (transformers,
tokenizers, torch, transformer-lens 4.x).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import time
import types

import numpy as np


def population_paths(root: str) -> list[str]:
    """root/seed<n> directories, in seed order."""
    found = [p for p in glob.glob(os.path.join(root, "seed*")) if os.path.isdir(p)
             and re.fullmatch(r"seed\d+", os.path.basename(p))]
    return sorted(found, key=lambda p: int(os.path.basename(p)[4:]))


def text_windows(tokenizer_file: str, text_file: str, context: int, count: int) -> np.ndarray:
    """The first `count` windows [count, context] int32 of the text file's token stream."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)
    with open(text_file, encoding="utf-8") as f:
        # Enough text for `count` windows at any plausible tokenization (>= 1 char per token).
        ids = np.asarray(tok.encode(f.read(count * context * 16)).ids, np.int32)
    n = min(count, len(ids) // context)
    if n < 1:
        raise ValueError(f"{text_file}: fewer than {context} tokens")
    windows = ids[: n * context].reshape(n, context)
    if (windows == 0).any():  # token 0 is padding to the proxy stage (tasks.PAD)
        raise ValueError(f"{text_file}: token id 0 occurs in the text; the proxy stage reads it "
                         "as padding (benchmarks/train_hf_population.py's tokenizer keeps id 0 "
                         "for <|pad|>)")
    return windows


def _eval_set(windows: np.ndarray):
    """faithfulness.evaluate.EvalSet of one split, every position but the last evaluated."""
    from jaxillusions import tasks
    from jaxillusions.faithfulness.evaluate import make_eval_set

    evaluated = np.ones(windows.shape, bool)
    evaluated[:, -1] = False
    task = types.SimpleNamespace(BREAKDOWNS=(), view=lambda s: tasks.View(
        tokens=s, evaluated=evaluated, bins={}, num_bins={}))
    return make_eval_set({"heldout": windows}, ["heldout"], task)


# ---------------------------------------------------------------------------------------------
# jaxillusions: every member in one program.


def ours(params, cfg, site: str, rank: int, fit_tokens, eval_set, batch_size: int,
         num_members: int) -> dict:
    """collect + fit + evaluate of one SVD family; {"agreement": [members], "projections":
    [members, heads, d, d], "ranks": [members, heads]}."""
    import jax

    from jaxillusions.faithfulness.collect import Chunking, collect
    from jaxillusions.faithfulness.evaluate import EvalOptions, evaluate
    from jaxillusions.faithfulness.fit import fit
    from jaxillusions.faithfulness.specs import ProxySpec

    spec = ProxySpec("svd", (site,), (rank,), (("center", False),))
    chunking = Chunking(seed_chunk_size=num_members, say=None)
    stats = collect(params, types.SimpleNamespace(tokens=fit_tokens), cfg, [spec],
                    num_samples=0, batch_size=batch_size, chunking=chunking)
    (fitted,) = fit([spec], stats, jax.random.PRNGKey(0), num_members,
                    chunking=chunking)
    rows = evaluate(params, cfg, eval_set, [fitted], batch_size=batch_size,
                    seeds=list(range(num_members)),
                    options=EvalOptions(chunking=chunking))
    agreement, jsd = np.zeros(num_members), np.zeros(num_members)
    for row in rows:
        if row["breakdown"] == "all":
            agreement[row["seed"]], jsd[row["seed"]] = row["same_pred"], row["jsd"]
    p = jax.tree.map(np.asarray, fitted.params[site])  # [S, G, R, ...]
    kept = p["basis"][:, :, 0] * p["mask"][:, :, 0, None, :]  # [S, G, F, F]
    projections = np.einsum("sgfr,sger->sgfe", kept, p["basis"][:, :, 0])
    return {"agreement": agreement, "jsd": jsd, "projections": projections,
            "ranks": p["mask"][:, :, 0].sum(-1).astype(int)}


# ---------------------------------------------------------------------------------------------
# TransformerLens: a Python loop over the models, with hooks.


def boot_transformer_lens(path: str):
    """A TransformerLens 4.x model of a Hugging Face directory, HookedTransformer numerics."""
    from transformer_lens.model_bridge import TransformerBridge

    model = TransformerBridge.boot_transformers(path, device="cpu")
    model.enable_compatibility_mode()
    return model.eval()


def transformer_lens_loop(models: list, layer: int, rank: int, fit_tokens, eval_tokens,
                          batch_size: int, same_metrics: bool = False) -> dict:
    """For each model: its keys on the fit windows (run_with_cache), each head's SVD, then each
    evaluation batch's forward without and with the keys projected (run_with_hooks); the same
    dict as `ours`. same_metrics: also what `faithfulness.evaluate` computes beside the
    agreement (the JSD, the accuracies, and a pass with the keys zeroed for the CE and KL
    scores), so that both paths do the same work; adds "jsd" [members]."""
    import torch

    hook = f"blocks.{layer}.attn.hook_k"
    fit = torch.from_numpy(np.asarray(fit_tokens, np.int64))
    evaluation = torch.from_numpy(np.asarray(eval_tokens, np.int64))
    agreement, projections, jsd = [], [], []
    with torch.no_grad():
        for model in models:
            keys = []
            for start in range(0, len(fit), batch_size):
                _, cache = model.run_with_cache(fit[start:start + batch_size],
                                                names_filter=lambda name: name == hook)
                keys.append(cache[hook])  # [B, T, heads, d_head]
            keys = torch.cat(keys).flatten(0, 1).transpose(0, 1)  # [heads, N, d_head]
            _, _, vh = torch.linalg.svd(keys, full_matrices=False)  # per head
            top = vh[:, :rank]  # [heads, rank, d_head]
            projection = top.transpose(1, 2) @ top  # [heads, d_head, d_head]

            def project(k, hook=None, projection=projection):
                return torch.einsum("bthd,hde->bthe", k, projection)

            same = count = 0
            sums = torch.zeros(7, dtype=torch.float64)
            for start in range(0, len(evaluation), batch_size):
                batch = evaluation[start:start + batch_size]
                original = model(batch)[:, :-1]
                replaced = model.run_with_hooks(batch, fwd_hooks=[(hook, project)])[:, :-1]
                agree = original.argmax(-1) == replaced.argmax(-1)
                same += int(agree.sum())
                count += agree.numel()
                if same_metrics:
                    zeroed = model.run_with_hooks(batch, fwd_hooks=[
                        (hook, lambda k, hook=None: torch.zeros_like(k))])[:, :-1]
                    sums += _metric_sums(original, replaced, zeroed, batch[:, 1:])
            agreement.append(same / count)
            jsd.append(float(sums[0] / count))
            projections.append(projection.numpy())
    projections = np.stack(projections)
    out = {"agreement": np.asarray(agreement), "projections": projections,
           "ranks": np.linalg.matrix_rank(projections.astype(np.float64), tol=1e-3)}
    return out | ({"jsd": np.asarray(jsd)} if same_metrics else {})


def _metric_sums(original, replaced, zeroed, targets):
    """Sums over positions of the JSD (bits) of original and replaced, both accuracies, the CE
    of each pass and KL(original || replaced), KL(original || zeroed): faithfulness.evaluate's
    per-position metrics and dictionary scores."""
    import torch

    logp, logq, logz = (torch.log_softmax(x, -1) for x in (original, replaced, zeroed))
    mid = torch.logsumexp(torch.stack([logp, logq]), 0) - np.log(2)
    p, q = logp.exp(), logq.exp()
    jsd = 0.5 * ((p * (logp - mid)).sum(-1) + (q * (logq - mid)).sum(-1)) / np.log(2)

    def ce(logx):
        return -logx.gather(-1, targets[..., None])[..., 0]

    return torch.stack([
        jsd.sum(), (original.argmax(-1) == targets).sum(), (replaced.argmax(-1) == targets).sum(),
        ce(logp).sum() + ce(logq).sum() + ce(logz).sum(),
        (p * (logp - logq)).sum(), (p * (logp - logz)).sum(), jsd.max()]).double()


# ---------------------------------------------------------------------------------------------


def run(paths: list[str], *, tokenizer: str, fit_text: str, eval_text: str, layer: int,
        rank: int, fit_windows: int, eval_windows: int, context: int = 0, batch_size: int = 32,
        repeats: int = 3, same_metrics: bool = False, say=print) -> dict:
    """Both paths on the same windows; times, their ratio and the agreement of both."""
    from importlib import metadata

    import jax
    import torch
    import transformer_lens.model_bridge  # noqa: F401 - imported before the boot is timed
    import transformers
    from transformers.utils import logging as hf_logging

    from benchmarks.training import times
    from jaxillusions.faithfulness.specs import resolve_site
    from jaxillusions.model import pretrained
    from jaxillusions.runtime.machine import cpu_model

    hf_logging.disable_progress_bar()

    checkpoint = pretrained.inspect_checkpoint(paths[0])
    cfg = checkpoint.config
    context = context or cfg.max_len
    site = resolve_site(f"blocks.{layer}.attn.k", cfg)
    layer = int(site.split(".")[1])
    if not 1 <= rank <= cfg.head_dim:
        raise ValueError(f"--rank={rank}: the keys have {cfg.head_dim} dimensions per head")
    fit_tokens = text_windows(tokenizer, fit_text, context, fit_windows)
    eval_tokens = text_windows(tokenizer, eval_text, context, eval_windows)
    eval_set = _eval_set(eval_tokens)
    n = len(paths)
    report = {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
              "jax": jax.__version__, "backend": jax.default_backend(), "torch": torch.__version__,
              "torch_threads": torch.get_num_threads(),
              "transformer_lens": metadata.version("transformer-lens"),
              "transformers": transformers.__version__, "members": n, "paths": paths,
              "site": site, "rank": rank, "heads": cfg.n_heads, "d_head": cfg.head_dim,
              "model": {k: getattr(cfg, k) for k in ("n_layers", "d_model", "n_heads", "d_mlp",
                                                      "vocab_size", "max_len")},
              "fit_windows": int(len(fit_tokens)), "eval_windows": int(len(eval_tokens)),
              "context": context, "batch_size": batch_size, "repeats": repeats,
              "transformer_lens_metrics": "same as jaxillusions" if same_metrics
              else "agreement only"}
    say(f"CPU: {report['cpu_model']}, {report['cpu_count']} logical cores; jax "
        f"{jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), TransformerLens {report['transformer_lens']}")
    say(f"{n} members ({cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads of "
        f"{cfg.head_dim}); SVD of {site} at rank {rank}: fit on {len(fit_tokens)} windows, "
        f"evaluated on {len(eval_tokens)} windows of {context} tokens; batches of {batch_size}; "
        f"best of {repeats}; the TransformerLens loop computes "
        + ("the same metrics as jaxillusions' evaluation" if same_metrics else
           "the agreement only (jaxillusions' evaluation also computes the JSD, accuracies and "
           "a zero-ablation pass for its CE and KL scores; --tl_same_metrics adds them)"))

    start = time.perf_counter()
    params, cfg = pretrained.load_pretrained(paths)
    params = jax.device_put(params)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    models = [boot_transformer_lens(p) for p in paths]
    boot_s = time.perf_counter() - start

    def jax_path():
        return ours(params, cfg, site, rank, fit_tokens, eval_set, batch_size, n)

    def tl_path():
        return transformer_lens_loop(models, layer, rank, fit_tokens, eval_tokens, batch_size,
                                     same_metrics)

    start = time.perf_counter()
    first = jax_path()  # compiles
    first_s = time.perf_counter() - start
    last = {}
    seconds = times({"jaxillusions": lambda: last.__setitem__("ours", jax_path()),
                     "transformer_lens": lambda: last.__setitem__("tl", tl_path())}, repeats)
    ours_s, tl_s = min(seconds["jaxillusions"]), min(seconds["transformer_lens"])
    got, theirs = last["ours"], last["tl"]
    assert np.array_equal(first["agreement"], got["agreement"])
    report |= {
        "load_s": load_s, "transformer_lens_boot_s": boot_s,
        "jaxillusions_s": ours_s, "jaxillusions_times_s": seconds["jaxillusions"],
        "jaxillusions_first_s": first_s, "transformer_lens_s": tl_s,
        "transformer_lens_times_s": seconds["transformer_lens"],
        "transformer_lens_over_jaxillusions": tl_s / ours_s,
        "transformer_lens_over_jaxillusions_first": tl_s / first_s,
        "end_to_end_ratio": (boot_s + tl_s) / (load_s + first_s),
        "agreement_jaxillusions": got["agreement"].tolist(),
        "agreement_transformer_lens": theirs["agreement"].tolist(),
        "max_agreement_difference": float(np.max(np.abs(got["agreement"]
                                                        - theirs["agreement"]))),
        "rank_jaxillusions": np.unique(got["ranks"]).tolist(),
        "rank_transformer_lens": np.unique(theirs["ranks"]).tolist(),
        "max_projection_difference": float(np.max(np.abs(got["projections"]
                                                          - theirs["projections"]))),
        "jsd_jaxillusions": got["jsd"].tolist(),
    }
    if same_metrics:
        report |= {"jsd_transformer_lens": theirs["jsd"].tolist(),
                   "max_jsd_difference": float(np.max(np.abs(got["jsd"] - theirs["jsd"])))}
    say("\n" + " | ".join(f"{t:>{w}}" for t, w in _COLUMNS))
    say(" | ".join(f"{v:>{w}}" for v, (_, w) in zip((
        f"{n}", f"{ours_s:.2f} s", f"{first_s:.2f} s", f"{tl_s:.2f} s",
        f"{tl_s / ours_s:.2f}x", f"{tl_s / first_s:.2f}x", f"{load_s:.2f} s",
        f"{boot_s:.2f} s"), _COLUMNS, strict=True)))
    say(f"\nprojection rank: jaxillusions {report['rank_jaxillusions']}, TransformerLens "
        f"{report['rank_transformer_lens']}; largest difference of the projections "
        f"{report['max_projection_difference']:.1e}")
    say("agreement (same argmax as the original), per member: jaxillusions "
        + ", ".join(f"{a:.4f}" for a in got["agreement"]) + "; TransformerLens "
        + ", ".join(f"{a:.4f}" for a in theirs["agreement"])
        + f" (largest difference {report['max_agreement_difference']:.1e})")
    if same_metrics:
        say("mean JSD (bits), per member: jaxillusions " + ", ".join(
            f"{x:.2e}" for x in got["jsd"]) + "; TransformerLens " + ", ".join(
            f"{x:.2e}" for x in theirs["jsd"]))
    return report


# (title, width): members, jaxillusions fit+evaluate warm and with its compilation, the TL
# loop, the loop's time over ours (warm, then over the first run), loading and booting.
_COLUMNS = (("members", 7), ("jaxillusions", 12), ("+compile", 9), ("TL loop", 9),
            ("TL/jaxillusions", 15), ("TL/+compile", 11), ("load (ours)", 11),
            ("boot (TL)", 9))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("population", nargs="?", default=None,
                   help="a directory of train_hf_population.py (its seed*/, text/, tokenizer)")
    p.add_argument("--paths", default="", help="model directories, comma-separated, instead")
    p.add_argument("--tokenizer", default="", help="tokenizer.json (default: the population's)")
    p.add_argument("--fit_text", default="", help="default: the population's text/train.txt")
    p.add_argument("--eval_text", default="",
                   help="default: the population's text/heldout_python.txt")
    p.add_argument("--layer", type=int, default=-1, help="the layer whose keys (default: last)")
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--fit_windows", type=int, default=256)
    p.add_argument("--eval_windows", type=int, default=256)
    p.add_argument("--context", type=int, default=0, help="window length (default: max_len)")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tl_same_metrics", action="store_true",
                   help="the TransformerLens loop also computes what jaxillusions' evaluation "
                        "does (JSD, accuracies, a zero-ablation pass): the same work")
    p.add_argument("--out", default="", help="also write the report as JSON here")
    args = p.parse_args(argv)
    root = args.population
    paths = [x for x in args.paths.split(",") if x] or (population_paths(root) if root else [])
    if not paths:
        sys.exit("error: no models: give a population directory (with seed*/) or --paths")

    def default(flag: str, *parts: str) -> str:
        if getattr(args, flag):
            return getattr(args, flag)
        if not root:
            sys.exit(f"error: --paths needs --{flag} too (or give a population directory)")
        return os.path.join(root, *parts)

    report = run(paths, tokenizer=default("tokenizer", "tokenizer.json"),
                 fit_text=default("fit_text", "text", "train.txt"),
                 eval_text=default("eval_text", "text", "heldout_python.txt"),
                 layer=args.layer, rank=args.rank, fit_windows=args.fit_windows,
                 eval_windows=args.eval_windows, context=args.context,
                 batch_size=args.batch_size, repeats=args.repeats,
                 same_metrics=args.tl_same_metrics)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
