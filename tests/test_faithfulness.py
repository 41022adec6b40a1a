import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
import tolerance as tol
from conftest import checked
from tensorboard.backend.event_processing import event_accumulator as ea

from jaxillusions import proxies, tasks
from jaxillusions.faithfulness import collect as collect_module
from jaxillusions.faithfulness import dictionary_metrics, metrics
from jaxillusions.faithfulness.collect import Chunking, collect, pack_rows
from jaxillusions.faithfulness.evaluate import (
    EvalOptions,
    _eval_chunk,
    _readout_width,
    evaluate,
    make_eval_set,
    pack,
)
from jaxillusions.faithfulness.fit import fit
from jaxillusions.faithfulness.specs import ProxySpec, specs_from_config
from jaxillusions.model import UniformAttention, forward, init_params
from jaxillusions.pipeline import sweep, validate
from jaxillusions.report import board, results, tables
from jaxillusions.runtime import tensorboard as log_lib
from jaxillusions.runtime import timing
from jaxillusions.runtime.chunks import padded_chunks


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from conftest import tiny_config, trained_tiny

    return trained_tiny(tiny_config(str(tmp_path_factory.mktemp("cache"))))


@pytest.mark.slow
def test_collect_streams_exact_moments_and_samples(trained, monkeypatch):
    config, splits, model_cfg, params = trained
    sites = ("blocks.1.attn.k", "blocks.1.resid_mid")
    specs = [ProxySpec("svd", sites, (2,)), ProxySpec("kmeans", sites, (2,))]
    chunks = []  # the chunks each collect runs

    def counted(arrays, batch_size):
        for chunk in padded_chunks(arrays, batch_size):
            chunks[-1] += 1
            yield chunk

    monkeypatch.setattr(collect_module, "padded_chunks", counted)
    # An odd chunk size exercises the padded last chunk.
    chunks.append(0)
    stats = collect(params, splits["train"], model_cfg, specs, num_samples=300, batch_size=333)
    # Without a spec that needs moments, the same samples, from the chunks that hold them.
    chunks.append(0)
    sampled = collect(params, splits["train"], model_cfg, specs[1:], num_samples=300,
                      batch_size=333)
    assert chunks[1] < chunks[0] and set(sampled[sites[0]]) == {"samples"}
    for site in sites:
        np.testing.assert_array_equal(sampled[site]["samples"]["x"], stats[site]["samples"]["x"])
    tokens = splits["train"].tokens
    valid = (tokens != 0).reshape(-1)
    width = model_cfg.d_mlp  # the widest matmul on the way to these sites
    for s in range(2):
        seed_params = jax.tree.map(lambda x, s=s: x[s], params)
        _, cache = forward(seed_params, jnp.asarray(tokens), model_cfg,
                           cache=("blocks.1.attn.k", "blocks.1.resid_mid"))
        keys = np.asarray(cache["blocks.1.attn.k"], np.float64).reshape(-1, 16)[valid]
        gram = np.asarray(stats["blocks.1.attn.k"]["moments"]["gram"][s, 0])
        # A sum over N positions of products of activations, each within its rounding: the
        # sum's rounding plus twice an activation's, relative to sqrt(gram_ii gram_jj) >=
        # sum |x_i x_j| (Cauchy-Schwarz).
        diag = np.diagonal(keys.T @ keys)
        ulps = tol.activation_error(np.ones(1), width)[0] / tol.EPS32
        bound = tol.two_ways(tol.EPS32 * (np.sqrt(len(keys)) + 2 * ulps)
                             * np.sqrt(np.outer(diag, diag)))
        assert np.all(np.abs(gram - keys.T @ keys) <= bound)
        assert stats["blocks.1.attn.k"]["moments"]["count"][s, 0] == valid.sum()
        resid = np.asarray(cache["blocks.1.resid_mid"]).reshape(-1, 16)[valid][:300]
        assert np.all(np.abs(stats["blocks.1.resid_mid"]["samples"]["x"][s, 0] - resid)
                      <= tol.two_ways(tol.activation_error(resid, width)))


def test_specs_from_config_resolve_last_layer_and_sizes(trained):
    config, _, model_cfg, _ = trained
    specs = specs_from_config(config.proxies, model_cfg)
    svd = [s for s in specs if s.method == "svd"]
    assert [s.target for s in svd] == ["blocks.1.attn.q", "blocks.1.attn.k",
                                      "blocks.1.attn.q+blocks.1.attn.k"]
    assert svd[0].sizes == (1, 2, 4, 8, 16)  # d_head = 16
    config.proxies.targets = ("blocks.5.attn.k",)
    with pytest.raises(ValueError, match="unknown activation site"):
        specs_from_config(config.proxies, model_cfg)
    config.proxies.methods = ("nope",)
    with pytest.raises(ValueError, match="nope"):
        specs_from_config(config.proxies, model_cfg)


@pytest.mark.slow
def test_batched_evaluation_equals_item_by_item(trained):
    config, splits, model_cfg, params = trained
    specs = [ProxySpec("svd", ("blocks.1.attn.k",), (1, 4, 16), (("center", False),)),
             ProxySpec("kmeans", ("blocks.1.attn.q", "blocks.1.attn.k"), (2, 8),
                       (("num_iters", 5),)),
             ProxySpec("onehot_attention", ("blocks.1.attn.pattern",))]
    stats = collect(params, splits["train"], model_cfg, specs, num_samples=500,
                    batch_size=256)
    fitted = fit(specs, stats, jax.random.PRNGKey(0), num_seeds=2)
    eval_set = make_eval_set(splits, ["iid", "longer"])
    rows = evaluate(params, model_cfg, eval_set, fitted, batch_size=50, seeds=[0, 1])

    def lookup(**where):
        (row,) = [r for r in rows if all(r[k] == v for k, v in where.items())]
        return row

    bits = 3 * np.log2(model_cfg.vocab_size)  # a JSD term's inputs: three entropies
    one_position = tol.two_ways(tol.TERM_ULPS * tol.EPS32 * bits)

    for proxy in fitted:
        for s in range(2):
            p = jax.tree.map(lambda x, s=s: x[s], params)
            for r, size in enumerate(proxy.spec.sizes):
                intervention = proxy.intervention(s, r)
                for split in ("iid", "longer"):
                    sp = splits[split]
                    tokens = jnp.asarray(sp.tokens)
                    logits, _ = forward(p, tokens, model_cfg)
                    proxy_logits, _ = forward(p, tokens, model_cfg, intervention=intervention)
                    mask = sp.is_close
                    targets = np.roll(sp.tokens, -1, axis=1)
                    row = lookup(seed=s, site=proxy.spec.target, method=proxy.spec.method,
                                 size=size, split=split, breakdown="all")
                    assert row["n"] == mask.sum()
                    expect = {
                        "jsd": np.asarray(metrics.jsd(logits, proxy_logits))[mask].mean(),
                        "same_pred": np.asarray(metrics.same_pred(logits, proxy_logits))[
                            mask].mean(),
                        "acc_original": np.asarray(metrics.correct(logits, targets))[
                            mask].mean(),
                        "acc_proxy": np.asarray(metrics.correct(proxy_logits, targets))[
                            mask].mean(),
                    }
                    # Counts of the same 0/1 outcomes: equal up to the float32 division of
                    # the direct mean; JSD a mean of per-position values each rounded by a few
                    # ulps of the entropies it is computed from (up to log2 V bits each).
                    for m, v in expect.items():
                        bound = tol.EPS32 if m != "jsd" else tol.two_ways(
                            tol.mean_error(row["n"], v, bits))
                        assert row[m] == pytest.approx(v, rel=0, abs=bound), (
                            proxy.spec, s, size, m)
                    # Worst case: quantiles of the per-position JSD at the evaluated positions,
                    # each one position's value (or between two): that position's rounding.
                    jsd = np.asarray(metrics.jsd(logits, proxy_logits))[mask]
                    for q, col in ((0.95, "jsd_p95"), (0.99, "jsd_p99")):
                        assert row[col] == pytest.approx(np.quantile(jsd, q), abs=one_position)
                    # Breakdowns: counts add up to the split's total, and metrics average back.
                    for breakdown in ("depth", "distance", "position"):
                        parts = [x for x in rows if x["breakdown"] == breakdown and
                                 x["split"] == split and x["seed"] == s and
                                 x["size"] == size and x["site"] == proxy.spec.target and
                                 x["method"] == proxy.spec.method]
                        assert sum(x["n"] for x in parts) == row["n"] == mask.sum()
                        assert sum(x["n"] * x["same_pred"] for x in parts) / row["n"] == (
                            pytest.approx(row["same_pred"], abs=1e-5))
                        assert all(np.isnan(x["jsd_p95"]) for x in parts)
                    depth_rows = [x for x in rows if x["breakdown"] == "depth" and
                                  x["split"] == split and x["seed"] == s and
                                  x["size"] == size and x["site"] == proxy.spec.target and
                                  x["method"] == proxy.spec.method]
                    # Position t predicts the closing bracket at t + 1.
                    t = int(np.argmax(mask.sum(0)))
                    (row_t,) = [x for x in rows if x["breakdown"] == "position" and x["bin"] == t
                                and x["split"] == split and x["seed"] == s and
                                x["size"] == size and x["site"] == proxy.spec.target and
                                x["method"] == proxy.spec.method]
                    assert row_t["n"] == mask[:, t].sum()
                    d = 3
                    depth_mask = mask & (sp.depth == d)
                    (row_d,) = [x for x in depth_rows if x["bin"] == d]
                    same = np.asarray(metrics.same_pred(logits, proxy_logits))
                    assert row_d["same_pred"] == pytest.approx(same[depth_mask].mean(),
                                                               abs=tol.EPS32)


def test_packed_in_order_the_rows_read_the_tokens_in_their_order(trained):
    # Collection's layout: the training sentences side by side in their order (next fit), in
    # fewer rows, so the first N non-PAD positions (the k-means samples) are the same tokens.
    _, splits, _, _ = trained
    tokens = splits["train"].tokens
    layout = pack_rows(tokens, in_order=True)
    packed = layout.lay(tokens, tasks.PAD)
    assert 0 < layout.rows < len(tokens) and packed.shape == (layout.rows, tokens.shape[1])
    assert np.array_equal(packed[packed != tasks.PAD], tokens[tokens != tasks.PAD])
    segments = layout.segments[layout.segments >= 0]
    assert np.array_equal(segments, np.sort(segments))  # row-major order: sentence order
    for i in (0, 1, len(tokens) // 2, len(tokens) - 1):
        rows, cols = np.nonzero(layout.segments == i)
        assert len(set(rows)) == 1
        assert np.array_equal(layout.offsets[rows, cols] + cols, np.arange(len(cols)))


def test_pack_lays_each_sentence_once_at_its_own_positions(trained):
    # Every sentence of the evaluation splits, up to its last token, in one packed row with its
    # own tokens, scored positions and bins, one segment id, and offsets that put its first
    # token at position 0; fewer positions than one sentence a row; refused (the set itself)
    # where a sentence is scored at its last token, and where packing saves nothing.
    _, splits, _, _ = trained
    eval_set = make_eval_set(splits, ["iid", "longer"])
    packed = pack(eval_set)
    n, width = eval_set.tokens.shape
    assert packed.widths == (width,) and packed.tokens.shape[1] == width
    alone = 0  # positions one sentence a row, each at the narrowest width that holds it
    for i in range(n):
        length = int(np.flatnonzero(eval_set.tokens[i] != tasks.PAD).max()) + 1
        alone += min(w for w in eval_set.widths if w >= length)
        rows, cols = np.nonzero(packed.segments == i)
        assert len(set(rows)) == 1 and list(cols) == list(range(cols[0], cols[0] + length))
        r, c = rows[0], cols
        assert np.array_equal(packed.tokens[r, c], eval_set.tokens[i, :length])
        assert np.array_equal(packed.evaluated[r, c], eval_set.evaluated[i, :length])
        assert np.array_equal(packed.bins[r, c], eval_set.bins[i, :length])
        assert np.array_equal(packed.offsets[r, c] + c, np.arange(length))
        assert not eval_set.evaluated[i, length - 1:].any()
    empty = packed.segments == -1
    assert (packed.tokens[empty] == tasks.PAD).all() and not packed.evaluated[empty].any()
    assert packed.evaluated.sum() == eval_set.evaluated.sum()
    assert packed.tokens.shape[0] * width < alone
    last = eval_set.evaluated.copy()
    last[0, np.flatnonzero(eval_set.tokens[0] != tasks.PAD).max()] = True
    scored_last = dataclasses.replace(eval_set, evaluated=last)
    assert pack(scored_last) is scored_last
    full = dataclasses.replace(eval_set, tokens=np.where(eval_set.tokens == tasks.PAD, 1,
                                                         eval_set.tokens))
    assert pack(full) is full  # rows of full windows: nothing to save


def test_a_model_that_reads_a_row_as_one_sentence_is_never_packed(trained):
    """A standing uniform-attention layer spans its row's whole causal prefix, so packed rows
    would mix sentences (it did: the original model's iid accuracy read 0.21 against 0.30).
    Its forward pass refuses segments; collection and evaluation keep one sentence a row, so
    packing on gives the rows of packing off, bit for bit."""
    _, splits, model_cfg, params = trained
    assert model_cfg.packable
    cfg = dataclasses.replace(model_cfg, interventions=(UniformAttention((0,)),))
    assert not cfg.packable
    one = jax.tree.map(lambda x: x[0], params)
    tokens = jnp.asarray(splits["iid"].tokens[:2])
    with pytest.raises(ValueError, match="packed rows"):
        forward(one, tokens, cfg, segments=jnp.zeros(tokens.shape, jnp.int32))
    spec = ProxySpec("svd", ("blocks.1.attn.q",), (1, 4))
    stats = collect(params, splits["train"], cfg, [spec], num_samples=0, batch_size=256)
    fitted = fit([spec], stats, jax.random.PRNGKey(0), num_seeds=2)
    eval_set = make_eval_set(splits, ["iid", "longer"])
    rows = [evaluate(params, cfg, eval_set, fitted, batch_size=64, seeds=[0, 1],
                     options=EvalOptions(pack=packed)) for packed in (True, False)]
    assert repr(rows[0]) == repr(rows[1])  # every value, NaN where undefined (l0, dead)


@pytest.mark.slow
def test_demo_families_compile_once_per_method_at_any_width(trained):
    """The demo's 8 families (svd and k-means on q, k and q+k; one-hot and uniform attention)
    on splits of two widths: one compilation of the evaluation per proxy method (it was one
    per family and width: 16). Padded to the widest split or run at each split's width, the
    rows agree within float32 rounding: counts exactly, JSD within a mean's rounding of
    per-position values computed from entropies of up to log2 V bits (tests/tolerance.py), its
    quantiles within one position's. The sentences packed side by side (every family here;
    the default; one-hot attention picks among its sentence's keys, uniform attention reads
    them from the scores) give the same rows within float32 rounding too, their sums taken in
    another order: counts up to a near-tie flipped, the dictionary metrics' ratios within the
    0.1% by which rounding may move each side of them (dictionary_metrics.DENOMINATOR_MARGIN),
    twice for two runs."""
    _, splits, model_cfg, params = trained
    targets = [("blocks.1.attn.q",), ("blocks.1.attn.k",), ("blocks.1.attn.q", "blocks.1.attn.k")]
    specs = [ProxySpec(method, sites, sizes, options) for method, sizes, options in
             (("svd", (1, 4, 16), (("center", False),)), ("kmeans", (2, 8), (("num_iters", 5),)))
             for sites in targets]
    specs += [ProxySpec(m, ("blocks.1.attn.pattern",))
              for m in ("onehot_attention", "uniform_attention")]
    stats = collect(params, splits["train"], model_cfg, specs, num_samples=500,
                    batch_size=256)
    fitted = fit(specs, stats, jax.random.PRNGKey(0), num_seeds=2)
    eval_set = make_eval_set(splits, ["iid", "longer"])
    assert len(eval_set.widths) == 2
    rows = {}
    for one_width, packed in ((False, False), (True, False), (False, True)):
        _eval_chunk.clear_cache()  # count its compilations, whatever ran before
        with timing.Breakdown() as clock:  # one family at a time, as the sweep does
            rows[one_width, packed] = [row for proxy in fitted for row in evaluate(
                params, model_cfg, eval_set, [proxy], batch_size=64, seeds=[0, 1],
                options=EvalOptions(shared=fitted, one_width=one_width, pack=packed))]
        assert clock.programs["jit(_eval_chunk)"] == 4, (one_width, packed, clock.programs)
        assert "jit(add)" not in clock.programs  # chunk sums on the host: was one per shape
    keys = ("seed", "site", "method", "size", "split", "breakdown", "bin", "n")
    narrow = rows[False, False]
    bits = 3 * np.log2(model_cfg.vocab_size)
    flips = 0
    for other in ((True, False), (False, True)):
        assert [[r[k] for k in keys] for r in rows[other]] == [[r[k] for k in keys]
                                                               for r in narrow]
        for a, b in zip(rows[other], narrow, strict=True):
            for column in ("same_pred", "acc_original", "acc_proxy"):  # sums of 0/1
                if other == (True, False):  # the same sums: exact
                    assert a[column] == b[column]
                else:  # packed: a near-tie of two logits within their rounding may flip one
                    flips += a[column] != b[column]
                    assert abs(a[column] - b[column]) * b["n"] <= 1 + 1e-6, (column, b)
            assert a["jsd"] == pytest.approx(b["jsd"], rel=0, abs=tol.two_ways(
                tol.mean_error(b["n"], b["jsd"], bits)))
            for column in ("jsd_p95", "jsd_p99"):
                assert a[column] == pytest.approx(b[column], rel=0, nan_ok=True, abs=(
                    tol.two_ways(tol.TERM_ULPS * tol.EPS32 * bits)))
            for column in ("fvu", "l0", "dead", "kl_score", "ce_score"):
                if column in b:
                    assert np.isnan(a[column]) == np.isnan(b[column]), (column, b)
                    assert a[column] == pytest.approx(b[column], nan_ok=True, abs=tol.EPS32,
                                                      rel=2 * 2 / dictionary_metrics.
                                                      DENOMINATOR_MARGIN), (column, b)
    assert flips <= len(narrow) // 100, flips


def test_full_rank_svd_is_faithful_and_rank_one_is_not(trained):
    config, splits, model_cfg, params = trained
    spec = ProxySpec("svd", ("blocks.1.attn.q", "blocks.1.attn.k"), (1, 16))
    stats = collect(params, splits["train"], model_cfg, [spec], num_samples=0, batch_size=512)
    fitted = fit([spec], stats, jax.random.PRNGKey(0), num_seeds=2)
    rows = evaluate(params, model_cfg, make_eval_set(splits, ["iid", "unseen_depth"]),
                    fitted, batch_size=64, seeds=[0, 1])
    full = [r for r in rows if r["size"] == 16 and r["breakdown"] == "all"]
    assert all(r["same_pred"] == 1.0 and r["jsd"] < 1e-6 for r in full)
    assert all(r["acc_proxy"] == r["acc_original"] for r in full)
    rank1 = [r for r in rows if r["size"] == 1 and r["breakdown"] == "all"]
    assert max(r["jsd"] for r in rank1) > 1e-4


def test_the_library_calls_resolve_sites_and_refuse_what_disagrees(trained):
    """collect, fit, evaluate and FittedProxy.intervention take sites as the configs name them
    (blocks.-1: the last layer) and refuse in one line an unknown site, a proxy on a site of
    another kind, a size its proxy's rule or the site's width refuses, counts of seeds that
    disagree and indices out of range."""
    _, splits, model_cfg, params = trained

    def collected(*specs):
        return collect(params, splits["train"], model_cfg, list(specs), num_samples=0,
                       batch_size=512)

    for spec, match in [
            (("svd", ("blocks.1.attn.kk",), (1,)), "^unknown activation site 'blocks.1.attn.kk'"),
            (("svd", ("blocks.1.attn.pattern",), (2,)), r"^ProxySpec\('svd', .*\): "
             "'blocks.1.attn.pattern' is not a site of a vector proxy"),
            (("onehot_attention", ("blocks.1.attn.k",), (0,)), "not a site of a pattern proxy"),
            (("svd", ("blocks.1.attn.k",), (64,)), r"sizes=\(64,\)\): .*ranks \[64\] exceed "
             r"the dimension 16 of blocks.1.attn.k \(width 16\)"),
            (("kmeans", ("blocks.1.attn.k",), (0, 2)), r"sizes=\(0, 2\)\): "
             r"proxies.kmeans_sizes=\(0, 2\): k below 1")]:
        with pytest.raises(ValueError, match=match):
            collected(ProxySpec(*spec))
    last = ProxySpec("svd", ("blocks.-1.attn.k",), (1, 16))
    stats = collected(last)
    fitted = fit([last], stats, jax.random.PRNGKey(0), num_seeds=2)
    eval_set = make_eval_set(splits, ["iid"])
    rows = evaluate(params, model_cfg, eval_set, fitted, batch_size=64, seeds=[0, 1])
    assert {r["site"] for r in rows} == {"blocks.1.attn.k"}
    full = [r for r in rows if r["size"] == 16 and r["breakdown"] == "all"]
    assert len(full) == 2 and all(r["same_pred"] == 1.0 for r in full)
    with pytest.raises(ValueError, match="^fit: num_seeds=3, but the stats of blocks.-1.attn.k "
                       "are of 2 seeds$"):
        fit([last], stats, jax.random.PRNGKey(0), num_seeds=3)
    for seeds in ([0], [0, 1, 2]):
        with pytest.raises(ValueError, match=f"^seeds: {len(seeds)} labels for 2 seeds of "):
            evaluate(params, model_cfg, eval_set, fitted, batch_size=64, seeds=seeds)
    # Sizes that cannot be, named (were: ZeroDivisionError, "reshape new_sizes must all be
    # positive", "need at least one array to concatenate").
    kmeans = ProxySpec("kmeans", ("blocks.-1.attn.k",), (2,))
    for call, message in [
            (lambda: evaluate(params, model_cfg, eval_set, fitted, batch_size=0, seeds=[0, 1]),
             "evaluate: batch_size=0, sentences per chunk: must be an integer >= 1"),
            (lambda: collect(params, splits["train"], model_cfg, [last], num_samples=0,
                             batch_size=-1), "collect: batch_size=-1: must be an integer >= 1"),
            (lambda: collect(params, splits["train"], model_cfg, [last], num_samples=-5,
                             batch_size=8), "collect: num_samples=-5: must be an integer >= 0"),
            (lambda: collect(params, splits["train"], model_cfg, [kmeans], num_samples=0,
                             batch_size=8), "collect: num_samples=0, but kmeans fit from a "
                                            "sample of positions: give at least 1")]:
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == message
    with pytest.raises(ValueError, match=r"^fitted: svd on blocks.1.attn.k was fitted for 2 "
                       "seeds, params have 1$"):
        evaluate(jax.tree.map(lambda x: x[:1], params), model_cfg, eval_set, fitted,
                 batch_size=64, seeds=[0])
    for index, match in [((2, 0), r"^seed_index=2: svd on blocks.-1.attn.k has 2 seeds "
                                  r"\(indices 0..1\)$"),
                         ((0, 2), r"^size_index=2: .* has 2 sizes \(indices 0..1\)$"),
                         ((0, 0), "a negative layer needs the model: pass model_cfg")]:
        with pytest.raises(ValueError, match=match):
            fitted[0].intervention(*index)
    p0, tokens = jax.tree.map(lambda x: x[0], params), jnp.asarray(splits["iid"].tokens[:8])
    # Params of another architecture, or of one model, are refused before any work, naming the
    # first parameter that differs (they had run through with numbers of another model).
    wide = jax.vmap(lambda k: init_params(k, dataclasses.replace(
        model_cfg, d_mlp=2 * model_cfg.d_mlp)))(jax.random.split(jax.random.PRNGKey(0), 2))
    for call in (lambda p: collect(p, splits["train"], model_cfg, [last], num_samples=0,
                                   batch_size=512),
                 lambda p: evaluate(p, model_cfg, eval_set, fitted, batch_size=64, seeds=[0, 1])):
        with pytest.raises(ValueError, match=rf"^params: blocks/0/mlp/b_in: shape \(2, "
                           rf"{2 * model_cfg.d_mlp}\) in params, shape \(2, {model_cfg.d_mlp}"
                           r"\) in the model config \(n_layers 2, .*, after the seed axis\)$"):
            call(wide)
        with pytest.raises(ValueError, match=r"^params: one model's, with no leading seed axis: "
                           r"add one with jax.tree.map\(lambda x: x\[None\], params\)"):
            call(p0)
    logits, _ = forward(p0, tokens, model_cfg)
    rank1, _ = forward(p0, tokens, model_cfg,
                       intervention=fitted[0].intervention(0, 0, model_cfg=model_cfg))
    assert np.abs(np.asarray(rank1) - np.asarray(logits)).max() > 1e-3  # the keys replaced


def test_a_readout_scores_the_evaluated_positions_and_no_others(trained):
    """The readout's slots past a row's last evaluated position (-1, read at position 0) score
    nothing, also where position 0 is itself evaluated (the code task's first character; never
    a Dyck BOS): the counts per split and bin are those at every position, with rows of fewer
    evaluated positions than the readout's width."""
    _, splits, model_cfg, params = trained
    spec = ProxySpec("svd", ("blocks.1.attn.k",), (1, 4))
    stats = collect(params, splits["train"], model_cfg, [spec], num_samples=0, batch_size=512)
    fitted = fit([spec], stats, jax.random.PRNGKey(0), num_seeds=2)
    eval_set = make_eval_set(splits, ["iid", "longer"])
    first = np.zeros_like(eval_set.evaluated)
    first[::2, 0] = True  # every other sentence scored at its first position too
    eval_set = dataclasses.replace(eval_set, evaluated=eval_set.evaluated | first)
    assert len({int(n) for n in eval_set.evaluated.sum(1)}) > 1  # rows with padding slots
    rows = {readout: evaluate(params, model_cfg, eval_set, fitted, batch_size=64, seeds=[0, 1],
                              options=EvalOptions(readout=readout)) for readout in (True, False)}
    keys = ("seed", "site", "size", "split", "breakdown", "bin", "n")
    assert [[r[k] for k in keys] for r in rows[True]] == [[r[k] for k in keys]
                                                          for r in rows[False]]
    total = sum(r["n"] for r in rows[True] if r["breakdown"] == "all")
    assert total == 2 * 2 * eval_set.evaluated.sum()  # seeds x sizes x positions


def test_unhealthy_seed_rows_are_left_out(trained):
    _, splits, model_cfg, params = trained
    fitted = fit([ProxySpec("uniform_attention", ("blocks.1.attn.pattern",))], {},
                 jax.random.PRNGKey(0), num_seeds=2)
    rows = evaluate(params, model_cfg, make_eval_set(splits, ["iid"]), fitted,
                    batch_size=64, seeds=[10, 11], healthy=np.array([True, False]))
    assert {r["seed"] for r in rows} == {10}
    with pytest.raises(ValueError, match="do not exist"):
        make_eval_set(splits, ["iid", "nonsense"])


@pytest.mark.slow
def test_sweep_end_to_end_writes_table_figures_and_tensorboard(trained, tmp_path):
    config = trained[0]
    config.proxies.methods = ("svd", "kmeans", "uniform_attention")
    config.proxies.targets = ("blocks.-1.attn.q", "blocks.-1.attn.k")
    config.proxies.eval_splits = ("iid", "unseen_depth")
    config.figures = "all"  # every figure (the default draws the summary: test_figures.py)
    workdir = str(tmp_path / "run")
    _eval_chunk.clear_cache()  # count its compilations; other programs stay compiled
    with timing.Breakdown() as clock:
        rows = sweep.run(checked(config), workdir, verbose=False)
    # The families of a method share one compiled evaluation (5 families, 3 methods).
    assert clock.programs["jit(_eval_chunk)"] == 3, clock.programs
    assert {"training", "collection", "fitting", "evaluation", "reports",
            "figures"} <= set(clock.seconds)
    back = results.read_csv(os.path.join(workdir, "results.csv"))
    assert len(back) == len(rows) > 0
    assert set(rows[0]) == set(back[0])
    # The original model's accuracy is the same in every proxy's evaluation (results.csv keeps
    # one copy of it, in the `original` rows).
    by_position = {}
    for r in rows:
        key = (r["seed"], r["split"], r["breakdown"], r["bin"])
        assert by_position.setdefault(key, r["acc_original"]) == r["acc_original"]
    assert {r["method"] for r in back} == {"svd", "kmeans", "uniform_attention"}
    assert {r["split"] for r in back} == {"iid", "unseen_depth"}
    assert {r["breakdown"] for r in back} == {"all", "depth", "distance", "position"}
    gap = open(os.path.join(workdir, "gap_table.txt")).read()
    assert "gap unseen_depth" in gap and "kmeans" in gap
    # gaps.csv agrees with a recomputation from results.csv: per seed iid - split, t interval.
    gaps = tables.read_csv(os.path.join(workdir, "gaps.csv"))
    # Four faithfulness metrics per proxy, and the dictionary metrics' three (fvu, ce_score,
    # kl_score) per vector proxy (svd, kmeans), not for uniform attention.
    proxies = {(r["site"], r["method"], r["size"]) for r in back}
    assert len(gaps) == 4 * len(proxies) + 3 * len([p for p in proxies
                                                     if p[1] != "uniform_attention"])
    for g in gaps:
        def per_seed(split, g=g):
            return {r["seed"]: r[g["metric"]] for r in back if r["breakdown"] == "all" and
                    (r["site"], r["method"], r["size"], r["split"]) ==
                    (g["site"], g["method"], g["size"], split)}
        iid, ood = per_seed("iid"), per_seed(g["split"])
        sign = -1.0 if g["metric"].startswith("jsd") or g["metric"] == "fvu" else 1.0
        diffs = np.array([sign * (iid[s] - ood[s]) for s in sorted(iid)])
        assert g["baseline"] == "iid" and g["n_seeds"] == len(diffs) == 2
        assert g["gap"] == pytest.approx(diffs.mean(), abs=1e-9)
        assert g["seeds_positive"] == (diffs > 0).sum()
        if diffs.std() > 0:
            low, high = scipy.stats.t.interval(0.95, 1, loc=diffs.mean(),
                                               scale=scipy.stats.sem(diffs))
            assert (g["ci_low"], g["ci_high"]) == pytest.approx((low, high), abs=1e-9)
    for name in ("proxy_vs_original", "id_predicts_gap", "min_size"):
        assert os.path.exists(os.path.join(workdir, f"{name}.csv"))
    families = ["svd_blocks.1.attn.q", "svd_blocks.1.attn.k", "kmeans_blocks.1.attn.q",
                "kmeans_blocks.1.attn.k", "uniform_attention_blocks.1.attn.pattern"]
    assert sorted(os.listdir(os.path.join(workdir, "figures"))) == sorted(
        [f"{name}.png" for name in ("faithfulness_svd", "faithfulness_kmeans", "gap_vs_size_svd",
                                    "gap_vs_size_kmeans", "gaps_attention_proxies",
                                    "attention_patterns", "key_projection_seed0",
                                    "key_projection_seed1")]
        + [f"accuracy_by_{b}_{f}.png" for b in ("depth", "position") for f in families])
    for name in os.listdir(os.path.join(workdir, "figures")):
        assert os.path.getsize(os.path.join(workdir, "figures", name)) > 1000
    # TensorBoard: the Headline cards are gaps.csv's gaps of gap_table.txt's headline proxies,
    # one point each at the last training step; every other tag starts with a lowercase
    # letter, so that Headline is the first group (TensorBoard sorts uppercase first); the
    # TEXT tab has the headline.
    logdir = os.path.join(workdir, "tensorboard")
    scalars = log_lib.read_scalars(logdir)
    headline = {t: points for tags in scalars.values() for t, points in tags.items()
                if t.startswith(log_lib.HEADLINE + "/")}
    by_key = {(g["method"], g["site"], g["size"], g["split"]): g["gap"] for g in gaps
              if g["metric"] == "same_pred" and g["baseline"] == "iid"}
    expected = {log_lib.headline_tag(i, m, site, size, "unseen_depth"):
                [(config.train.num_steps, pytest.approx(by_key[(m, site, size, "unseen_depth")],
                                                        rel=1e-6))]  # float32 storage
                for i, (m, site, size, _) in enumerate(board.headline_proxies(gaps, rows), 1)}
    assert headline == expected and len(expected) == 3
    tags, summary = set(), None
    for root, _, files in os.walk(logdir):
        if any("tfevents" in f for f in files):
            acc = ea.EventAccumulator(root, size_guidance={ea.IMAGES: 1, ea.TENSORS: 1})
            acc.Reload()
            tags |= set(acc.Tags()["images"]) | set(acc.Tags()["scalars"])
            if log_lib.SUMMARY_TAG in acc.Tags()["tensors"]:
                summary = acc.Tensors(log_lib.SUMMARY_TAG)[0].tensor_proto.string_val[0].decode()
    assert {t for t in tags if not t[0].islower()} == set(headline)
    assert summary.replace("\n    ", "\n").strip() == tables.summary_of(gap)


def test_available_proxies_include_the_four_methods():
    assert {"svd", "pca", "kmeans", "onehot_attention", "uniform_attention"} <= set(
        proxies.available())


@pytest.mark.slow
def test_prefix_sharing_and_readout_give_the_rows_of_whole_passes_for_every_proxy_method(
        trained):
    """Each size's pass starts at the first block a family replaces, from the original pass's
    residual stream, and computes the last block after its attention and the logits at the
    evaluated positions only (faithfulness.evaluate: EvalOptions share_prefix, readout): the
    rows of every proxy method equal those of whole passes per size, and of passes at every
    position, within float32 rounding. The blocks from the start on compute the same values
    from the same residual stream, and the readout the same per-position values on fewer rows,
    so the proxy logits agree to a few ulps of the logits (XLA may fuse the shorter program
    differently): JSD within a mean's rounding of per-position values from entropies of up to
    log2 V bits, a prediction flips only at a near-tie (counted below), and the dictionary
    metrics within a few ulps of their sums. The readout runs where every site a family
    replaces, reads or writes comes before the last block's attention output: not for the
    circuit (whole passes), the transcoder (the MLP's output) or the lenses (the final
    residual stream)."""
    from jaxillusions import model as model_lib
    from jaxillusions import tasks

    config, splits, model_cfg, params = trained
    config = validate.parse(config)
    proxy_cfg = dataclasses.replace(
        config.proxies, methods=proxies.available(), targets=("blocks.-1.attn.k",),
        svd_ranks=(1, 4), kmeans_sizes=(4,), sae_targets=("blocks.-1.attn.k",), sae_sizes=(8,),
        sae_k=(2,), sae_steps=20, transcoder_targets=("blocks.-1.mlp.out",),
        transcoder_sizes=(8,), logit_lens_targets=("blocks.1.resid_mid", "blocks.0.resid_post"),
        tuned_lens_targets=("blocks.1.resid_pre",), tuned_lens_ranks=(0, 4),
        concepts=("depth",), erasure_targets=("blocks.1.resid_pre",))
    specs = specs_from_config(proxy_cfg, model_cfg)
    assert {s.method for s in specs} == set(proxies.available())
    starts = {model_lib.first_block(model_cfg, s.sites) for s in specs
              if s.module.SITE != "model"}  # the circuit replaces whole passes: never shared
    assert starts == {0, 1}  # a family in block 0 (nothing shared) and families in block 1
    labels = tasks.concept_labels(tasks.get("dyck"), splits["train"], proxy_cfg.concepts)
    stats = collect(params, splits["train"], model_cfg, specs, num_samples=500,
                    batch_size=256, labels=labels)
    fitted = fit(specs, stats, jax.random.PRNGKey(0), num_seeds=2,
                 chunking=Chunking(say=None))
    eval_set = make_eval_set(splits, ["longer"])  # one width: one branch per program
    read_out = {s.method for s in specs if s.module.SITE != "model" and _readout_width(
        s.module, s.sites, model_cfg, pack(eval_set))}
    assert read_out == set(proxies.available()) - {"circuit", "transcoder", "logit_lens",
                                                   "tuned_lens"}
    variants = ((True, True), (False, True), (True, False))  # (share_prefix, readout)
    rows = {v: [row for proxy in fitted for row in evaluate(
        params, model_cfg, eval_set, [proxy], batch_size=64, seeds=[0, 1],
        options=EvalOptions(shared=fitted, share_prefix=v[0], readout=v[1]))]
        for v in variants}
    keys = ("seed", "site", "method", "size", "split", "breakdown", "bin", "n")
    for v in variants[1:]:
        assert [[r[k] for k in keys] for r in rows[variants[0]]] == [[r[k] for k in keys]
                                                                     for r in rows[v]]
    bits = 3 * np.log2(model_cfg.vocab_size)
    flips = 0
    for variant, shared, whole in ((v, a, b) for v in variants[1:]
                                   for a, b in zip(rows[variants[0]], rows[v], strict=True)):
        if variant[1]:  # the same original pass (its readout)
            assert shared["acc_original"] == whole["acc_original"]
        for column in ("acc_original", "same_pred", "acc_proxy"):  # a near-tie may flip one
            flips += shared[column] != whole[column]
            assert abs(shared[column] - whole[column]) * whole["n"] <= 1 + 1e-6, (column, whole)
        assert shared["jsd"] == pytest.approx(whole["jsd"], rel=0, abs=tol.two_ways(
            tol.mean_error(whole["n"], whole["jsd"], bits))), whole
        for column in ("jsd_p95", "jsd_p99", "fvu", "l0", "dead", "kl_score", "ce_score"):
            if column in whole:
                a, b = shared[column], whole[column]
                assert np.isnan(a) == np.isnan(b), (column, whole)
                if not np.isnan(b):
                    assert a == pytest.approx(b, rel=tol.two_ways(tol.TERM_ULPS * tol.EPS32
                                                                  * bits), abs=tol.EPS32)
    # A near-tie of two logits within their rounding is rare: at most a few in the whole table.
    assert flips <= len(rows[variants[0]]) // 100, flips
