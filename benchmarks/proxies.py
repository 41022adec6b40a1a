"""Benchmarks of the proxies (wired into `jaxillusions benchmark`).

Times are the best of `repeats` interleaved runs (the machine may be shared), compilation
excluded (every jitted function is warmed up first), results waited for with block_until_ready.
k-means against scikit-learn needs the `bench` extra.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.training import times
from jaxillusions import model, tasks
from jaxillusions.proxies import circuit, kmeans, sae, svd
from jaxillusions.training.step import init_state


def _blobs(num_seeds: int, num_points: int, dim: int, num_blobs: int = 32) -> np.ndarray:
    """Gaussian blobs [num_seeds, num_points, dim] float32, different blobs per seed."""
    rng = np.random.default_rng(0)
    centres = 3.0 * rng.normal(size=(num_seeds, num_blobs, dim))
    labels = rng.integers(0, num_blobs, size=(num_seeds, num_points))
    x = centres[np.arange(num_seeds)[:, None], labels] + rng.normal(size=labels.shape + (dim,))
    return x.astype(np.float32)


def bench_kmeans(
    num_seeds: int = 4,
    num_points: int = 20_000,
    dim: int = 16,
    sizes: tuple[int, ...] = (2, 4, 8, 16, 32, 64),
    num_iters: int = 25,
    repeats: int = 3,
) -> dict:
    """Batched JAX k-means (all seeds and sizes in one jitted call) vs a scikit-learn loop."""
    from sklearn.cluster import KMeans  # a dependency of the package (the prediction stage)

    sizes = tuple(sizes)
    x = _blobs(num_seeds, num_points, dim)
    xj, valid = jnp.asarray(x), jnp.ones(x.shape[:2], bool)
    keys = jax.random.split(jax.random.key(0), num_seeds)

    def fit_one(x: jax.Array, valid: jax.Array, key: jax.Array) -> dict:
        return kmeans.fit({"x": x, "valid": valid}, sizes, key=key, num_iters=num_iters)

    fit = jax.jit(jax.vmap(fit_one))
    params = jax.block_until_ready(fit(xj, valid, keys))  # warm-up: compile
    per_size = jax.vmap(kmeans.inertia, in_axes=(0, None, None))  # over sizes
    jax_inertia = jax.jit(jax.vmap(per_size))(params, xj, valid)  # [seeds, sizes]

    sk_inertia = np.zeros((num_seeds, len(sizes)))
    sk_iters = np.zeros((num_seeds, len(sizes)), int)
    reps = iter(range(repeats))

    def sklearn_loop() -> None:
        rep = next(reps)
        for s in range(num_seeds):
            for i, k in enumerate(sizes):
                km = KMeans(
                    n_clusters=k,
                    init="k-means++",
                    n_init=1,
                    max_iter=num_iters,
                    tol=0.0,
                    algorithm="lloyd",
                    random_state=1000 * rep + s,
                ).fit(x[s])
                sk_inertia[s, i], sk_iters[s, i] = km.inertia_, km.n_iter_

    KMeans(n_clusters=2, n_init=1, max_iter=2).fit(x[0, :1000])  # warm-up: thread pools
    seconds = times({"jax": lambda: fit(xj, valid, keys), "sklearn": sklearn_loop}, repeats)
    jax_s, sk_s = min(seconds["jax"]), min(seconds["sklearn"])
    return {
        "num_seeds": num_seeds,
        "num_points": num_points,
        "dim": dim,
        "sizes": list(sizes),
        "num_iters": num_iters,
        "repeats": repeats,
        "jax_batched_s": jax_s,
        "jax_times_s": seconds["jax"],
        "sklearn_loop_s": sk_s,
        "sklearn_times_s": seconds["sklearn"],
        "speedup": sk_s / jax_s,
        "jax_mean_inertia": np.asarray(jax_inertia).mean(0).tolist(),  # per size
        "sklearn_mean_inertia": sk_inertia.mean(0).tolist(),
        # sklearn stops early once labels stop changing, even with tol=0 (so it may do fewer
        # than num_iters iterations, which only favours it); the JAX fit always does num_iters.
        "sklearn_mean_n_iter": sk_iters.mean(0).tolist(),
        "sklearn_min_n_iter": int(sk_iters.min()),
    }


def _planted(num_seeds: int, num_points: int, dim: int, num_dirs: int, k: int) -> np.ndarray:
    """[num_seeds, num_points, dim] float32: k-sparse positive codes over num_dirs unit
    directions (different per seed) plus noise, the data an SAE is meant for."""
    rng = np.random.default_rng(0)
    dirs = rng.normal(size=(num_seeds, num_dirs, dim))
    dirs /= np.linalg.norm(dirs, axis=-1, keepdims=True)
    active = np.argsort(rng.random((num_seeds, num_points, num_dirs)), -1)[..., :k]
    codes = np.zeros((num_seeds, num_points, num_dirs))
    np.put_along_axis(codes, active, rng.uniform(0.5, 2.0, active.shape), -1)
    x = np.einsum("snd,sdf->snf", codes, dirs) + 0.05 * rng.normal(size=(num_seeds, num_points,
                                                                          dim))
    return x.astype(np.float32)


def bench_sae(num_seeds: int = 32, widths: tuple[int, ...] = (32, 64, 128, 256), dim: int = 32,
              num_points: int = 4096, k: int = 4, steps: int = 200, batch_size: int = 256,
              repeats: int = 3) -> dict:
    """SAE fitting (proxies/sae.py), all seeds x widths in one jitted program (what the sweep
    runs: sae.fit vmapped over seeds, the widths padded to the largest inside) against a JAX
    Python loop over (seed, width) of the same fit, one jitted call per pair (compiled once
    per width before timing). Both do the same number of steps on the same minibatches; the
    loop's fits equal the batched ones up to float32 rounding, which TopK's choices amplify over
    many steps (max_abs_diff of the decoders)."""
    widths = tuple(widths)
    x = jnp.asarray(_planted(num_seeds, num_points, dim, 2 * dim, k))
    valid = jnp.ones(x.shape[:2], bool)
    keys = jax.random.split(jax.random.PRNGKey(0), num_seeds)
    options = dict(k=k, steps=steps, batch_size=batch_size)
    batched = jax.jit(jax.vmap(lambda x, v, key: sae.fit({"x": x, "valid": v}, widths, key=key,
                                                         **options)))
    one = jax.jit(lambda x, v, key, w: sae.fit({"x": x, "valid": v}, (w,), key=key, **options),
                  static_argnums=3)
    per_seed = [(x[s], valid[s], keys[s]) for s in range(num_seeds)]  # sliced before timing
    together = jax.block_until_ready(batched(x, valid, keys))  # warm-up: compile
    for w in widths:
        jax.block_until_ready(one(*per_seed[0], w))
    last = {}

    def loop() -> list:
        last["fits"] = [one(*per_seed[s], w) for s in range(num_seeds) for w in widths]
        return last["fits"]

    seconds = times({"batched": lambda: batched(x, valid, keys), "loop": loop}, repeats)
    fits = iter(last["fits"])
    diff = max(float(jnp.max(jnp.abs(next(fits)["W_dec"][0, :w]
                                     - together["W_dec"][s, i, :w])))
               for s in range(num_seeds) for i, w in enumerate(widths))
    batched_s, loop_s = min(seconds["batched"]), min(seconds["loop"])
    return {"num_seeds": num_seeds, "widths": list(widths), "dim": dim, "k": k, "steps": steps,
            "batch_size": batch_size, "num_points": num_points, "repeats": repeats,
            "batched_s": batched_s, "batched_times_s": seconds["batched"], "loop_s": loop_s,
            "loop_times_s": seconds["loop"], "loop_over_batched": loop_s / batched_s,
            # The batched program pads every width to the largest (sae.py): its latent work
            # over the loop's, for the same fits.
            "padded_work": len(widths) * max(widths) / sum(widths), "max_abs_diff": diff}


def bench_fit_and_evaluate(config, num_seeds: int, repeats: int = 3,
                           fit_sentences: int = 4096) -> dict:
    """Throughput of the proxy pipeline (faithfulness.collect + fit, then evaluate) for an SVD
    proxy of the last layer's keys at the config's ranks (default 1, 2, 4, ... d_head), all
    seeds and ranks in one call each (what the sweep does), on the `iid` split; in seeds x ranks
    per second. The models are untrained (throughput does not depend on the weights); the fit
    streams the first `fit_sentences` training sentences (the sweep streams all of them)."""
    from jaxillusions import tasks  # noqa: PLC0415
    from jaxillusions.config import settings  # noqa: PLC0415
    from jaxillusions.faithfulness.collect import collect  # noqa: PLC0415
    from jaxillusions.faithfulness.evaluate import EvalOptions, evaluate, make_eval_set  # noqa: PLC0415
    from jaxillusions.faithfulness.fit import fit  # noqa: PLC0415
    from jaxillusions.faithfulness.specs import ProxySpec, resolve_site, specs_from_config  # noqa: PLC0415
    from jaxillusions.runtime import timing  # noqa: PLC0415
    from jaxillusions.training import train  # noqa: PLC0415

    config = settings.require(config, "benchmarks.proxies.bench_fit_and_evaluate")
    splits, model_cfg, tx = train.build(config)
    params = init_state(np.arange(num_seeds), model_cfg, tx).params
    site = resolve_site("blocks.-1.attn.k", model_cfg)
    (spec,) = [s for s in specs_from_config(config.proxies, model_cfg)
               if s.method == "svd" and s.sites == (site,)] or [ProxySpec(
                   "svd", (site,), svd.ranks(config.proxies, model_cfg.head_dim))]
    ranks = spec.sizes
    eval_set = make_eval_set(splits, ["iid"], tasks.get(config))
    pc = config.proxies
    train_part = types.SimpleNamespace(tokens=splits["train"].tokens[:fit_sentences])

    def fit_proxy():
        stats = collect(params, train_part, model_cfg, [spec], num_samples=0,
                        batch_size=pc.collect_batch_size)
        return fit([spec], stats, jax.random.PRNGKey(0), num_seeds)

    with timing.stage("proxy fit"):  # compile (counted by the caller's timing.Breakdown)
        (fitted,) = fit_proxy()

    def evaluate_proxy(share_prefix: bool = True):
        return evaluate(params, model_cfg, eval_set, [fitted], batch_size=pc.eval_batch_size,
                        seeds=list(range(num_seeds)),
                        options=EvalOptions(share_prefix=share_prefix))

    with timing.stage("proxy evaluate"):  # compile
        evaluate_proxy()
    evaluate_proxy(share_prefix=False)  # compile the whole-pass program too (not counted above)
    # The sweep's evaluation (each size's pass from the first replaced block) and whole passes
    # per size (before prefix sharing), interleaved in one run.
    seconds = times({"fit": lambda: fit_proxy()[0].params, "evaluate": evaluate_proxy,
                     "evaluate_whole": lambda: evaluate_proxy(share_prefix=False)}, repeats)
    fit_s, eval_s, whole_s = (min(seconds[k]) for k in ("fit", "evaluate", "evaluate_whole"))
    work = num_seeds * len(ranks)
    sentences = int(len(eval_set.tokens))
    return {"num_seeds": num_seeds, "ranks": len(ranks), "site": site,
            "fit_sentences": int(len(train_part.tokens)), "rank_list": list(ranks),
            "eval_sentences": sentences,
            "fit_s": fit_s, "evaluate_s": eval_s, "evaluate_whole_passes_s": whole_s,
            "fit_seed_ranks_per_s": work / fit_s, "evaluate_seed_ranks_per_s": work / eval_s,
            "evaluate_seed_rank_sentences_per_s": work * sentences / eval_s,
            "evaluate_whole_passes_seed_rank_sentences_per_s": work * sentences / whole_s,
            "prefix_sharing_speedup": whole_s / eval_s}


def bench_circuits(config, num_seeds: int = 32, sentences: int = 256, repeats: int = 3,
                   granularity: str = "edge") -> dict:
    """Circuit discovery (proxies/circuit.py's two statistic passes: the units' means, then
    attribution patching of the KL, one backward pass) of `num_seeds` untrained models of the
    config on its first `sentences` training sentences: every seed in one program (jit(vmap),
    what the sweep runs) against a Python loop over seeds of the same jitted per-seed function
    (compiled before timing). The scores agree up to float32 rounding (max_rel_diff: the largest
    |difference| over the largest |score| of its seed)."""
    from jaxillusions.training import train  # noqa: PLC0415

    splits, model_cfg, _ = train.build(config)
    keys = jax.random.split(jax.random.PRNGKey(0), num_seeds)
    params = jax.vmap(lambda k: model.init_params(k, model_cfg))(keys)
    tokens = jnp.asarray(splits["train"].tokens[:sentences])
    valid = tokens != tasks.PAD
    options = dict(granularity=granularity, ablation="mean", direction="complement",
                   metric="kl")

    def discover(p):
        means = circuit.statistic(0, p, tokens, valid, model_cfg, {}, **options)
        return circuit.statistic(1, p, tokens, valid, model_cfg, means, **options)["scores"]

    batched, one = jax.jit(jax.vmap(discover)), jax.jit(discover)
    per_seed = [jax.tree.map(lambda x, s=s: x[s], params) for s in range(num_seeds)]
    together = np.asarray(jax.block_until_ready(batched(params)))  # warm-up: compile
    jax.block_until_ready(one(per_seed[0]))
    last = {}

    def loop() -> list:
        last["scores"] = [one(p) for p in per_seed]
        return last["scores"]

    seconds = times({"batched": lambda: batched(params), "loop": loop}, repeats)
    alone = np.stack([np.asarray(s) for s in last["scores"]])
    rel = np.max(np.abs(alone - together) / np.abs(alone).max(-1, keepdims=True))
    batched_s, loop_s = min(seconds["batched"]), min(seconds["loop"])
    return {"num_seeds": num_seeds, "sentences": int(tokens.shape[0]),
            "width": int(tokens.shape[1]), "granularity": granularity,
            "units": int(together.shape[-1]), "repeats": repeats, "batched_s": batched_s,
            "batched_times_s": seconds["batched"], "loop_s": loop_s,
            "loop_times_s": seconds["loop"], "loop_over_batched": loop_s / batched_s,
            "max_rel_diff": float(rel)}
