"""Circuits: the edge forward (path patching), node patching, attribution patching and the
circuit proxy, on hand-built models whose answers are known."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tolerance as tol

from jaxillusions import model
from jaxillusions.model import patching
from jaxillusions.proxies import circuit

ARCHS = {
    "two_heads": dict(n_heads=2),
    "attn_only": dict(attn_only=True),
    "rotary": dict(n_heads=2, pos_encoding="rotary"),
    # Frozen uniform attention in layer 0: a ModelConfig field, or a standing intervention
    # (model.UniformAttention) where the model has those.
    "uniform_layer0": dict(uniform_attention_layers=(0,)) if not hasattr(
        model, "UniformAttention") else dict(interventions=(model.UniformAttention((0,)),)),
}


def _model(seed=0, **arch):
    cfg = model.ModelConfig(vocab_size=11, max_len=10, n_layers=2, d_model=16, d_mlp=24,
                            **arch)
    params = model.init_params(jax.random.PRNGKey(seed), cfg)
    # Larger than init's 0.02 embeddings, so that every path carries signal (a trained model's).
    params["embed"] = params["embed"] * 50
    tokens = jax.random.randint(jax.random.PRNGKey(seed + 1), (4, 10), 1, 11)
    return cfg, params, tokens


def _tolerance(cfg, logits):
    """Two float32 forwards that sum each residual stream's terms in another order: each
    receiver's input is a sum of at most S sender outputs, then layer norms and matmuls of
    d_model terms; activation_error of d_model * S terms per row covers both, twice."""
    width = cfg.d_model * len(patching.graph(cfg).senders)
    return tol.two_ways(tol.activation_error(np.asarray(logits, np.float64), width))


def _assert_close(got, ref, bound):
    diff = np.abs(np.asarray(got, np.float64) - np.asarray(ref, np.float64))
    assert np.all(diff <= bound), float(np.max(diff - bound))


def test_graph_of_two_layers():
    cfg, _, _ = _model(n_heads=2)
    g = patching.graph(cfg)
    assert g.senders == ("embed", "blocks.0.attn.head0", "blocks.0.attn.head1", "blocks.0.mlp",
                         "blocks.1.attn.head0", "blocks.1.attn.head1", "blocks.1.mlp")
    assert len(g.receivers) == 2 * (3 * 2 + 1) + 1
    # embed feeds all 15 receivers; each layer-0 head the 9 after its layer's q/k/v; mlp0
    # the 8 of layer 1 and the logits; each layer-1 head mlp1 and the logits; mlp1 the logits.
    assert len(g.edges) == 15 + 2 * 9 + 8 + 2 * 2 + 1
    assert "blocks.0.attn.head1->blocks.1.attn.head0.v" in g.edge_names
    assert "blocks.1.attn.head0->blocks.1.attn.head1.q" not in g.edge_names
    assert patching.num_units(cfg, "node") == 6
    assert patching.num_units(cfg, "neuron") == 2 * (2 + 24)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_edge_kept_is_the_model(arch):
    cfg, params, tokens = _model(**ARCHS[arch])
    ref = model.forward(params, tokens, cfg)[0]
    ones = jnp.ones(len(patching.graph(cfg).edges))
    abl = jax.random.normal(jax.random.PRNGKey(3), (len(patching.graph(cfg).senders), 1, 1, 16))
    got = patching.edge_forward(params, tokens, cfg, ones, abl)[0]
    _assert_close(got, ref, _tolerance(cfg, ref))


@pytest.mark.parametrize("granularity", ["node", "neuron"])
def test_every_node_kept_is_the_model_bit_for_bit(granularity):
    """mask * value + (1 - mask) * ablated with mask 1 is value exactly (1 * v and v + 0 are
    exact in float32), so the logits are the model's bit for bit."""
    cfg, params, tokens = _model(n_heads=2)
    ref = model.forward(params, tokens, cfg)[0]
    ablated = patching.ablated_values(params, tokens, cfg, granularity, "resample")
    ones = jnp.ones(patching.num_units(cfg, granularity))
    got = patching.masked_logits(params, tokens, cfg, granularity, ones, ablated)
    np.testing.assert_array_equal(got, ref)


def _ln(x, p):
    return model.transformer._layer_norm(x, p)


def test_one_edge_ablated_is_the_hand_path_patched_forward():
    """Cut layer 0's head -> layer 1's value input alone (ablated to a vector a): layer 1's
    queries and keys read the whole residual stream, its values the stream without the head's
    output but with a; written out by hand for a one-head attention-only model."""
    cfg, params, tokens = _model(attn_only=True)
    g = patching.graph(cfg)
    edge = g.edge_names.index("blocks.0.attn.head0->blocks.1.attn.head0.v")
    mask = jnp.ones(len(g.edges)).at[edge].set(0.0)
    a = jax.random.normal(jax.random.PRNGKey(4), (16,))
    ablated = jnp.zeros((len(g.senders), 1, 1, 16)).at[1].set(a)
    got = patching.edge_forward(params, tokens, cfg, mask, ablated)[0]

    b0, b1 = params["blocks"]
    x0 = params["embed"][tokens] + params["pos_embed"][: tokens.shape[1]]
    _, cache = model.forward(params, tokens, cfg, cache=("blocks.0.attn.z",))
    head0 = cache["blocks.0.attn.z"][:, :, 0] @ b0["attn"]["w_o"][0]
    full = x0 + head0 + b0["attn"]["b_o"]  # what q and k read
    cut = x0 + a + b0["attn"]["b_o"]  # what v reads
    at = b1["attn"]
    q = _ln(full, b1["ln1"]) @ at["w_q"][:, 0] + at["b_q"][0]
    k = _ln(full, b1["ln1"]) @ at["w_k"][:, 0]
    v = _ln(cut, b1["ln1"]) @ at["w_v"][:, 0] + at["b_v"][0]
    t = tokens.shape[1]
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), q @ k.transpose(0, 2, 1)
                       / math.sqrt(cfg.head_dim), -jnp.inf)
    out = full + jax.nn.softmax(scores) @ v @ at["w_o"][0] + at["b_o"]
    ref = _ln(out, params["ln_final"]) @ params["unembed"]["w"] + params["unembed"]["b"]
    _assert_close(got, ref, _tolerance(cfg, ref))
    model_logits = model.forward(params, tokens, cfg)[0]
    assert np.max(np.abs(ref - model_logits)) > 100 * np.max(_tolerance(cfg, ref))  # it cuts


@pytest.mark.parametrize("ablation", patching.ABLATIONS)
def test_a_node_ablated_is_its_edges_ablated(ablation):
    """Ablating a node through forward's intervention = cutting every edge out of that sender
    (to the same ablated output) in the edge forward."""
    cfg, params, tokens = _model(n_heads=2)
    valid = jnp.ones(tokens.shape, bool)
    node_means = jax.tree.map(lambda s: s / valid.sum(),
                              patching.unit_sums(params, tokens, cfg, "node", valid))
    edge_means = patching.unit_sums(params, tokens, cfg, "edge", valid) / valid.sum()
    g = patching.graph(cfg)
    for unit, name in enumerate(patching.node_names(cfg, "node")):
        sender = g.senders.index(name)
        node_mask = jnp.ones(6).at[unit].set(0.0)
        edge_mask = jnp.asarray([float(s != sender) for s, _ in g.edges])
        nodes = patching.masked_logits(params, tokens, cfg, "node", node_mask,
                                       patching.ablated_values(params, tokens, cfg, "node",
                                                               ablation, node_means))
        edges = patching.masked_logits(params, tokens, cfg, "edge", edge_mask,
                                       patching.ablated_values(params, tokens, cfg, "edge",
                                                               ablation, edge_means))
        _assert_close(edges, nodes, _tolerance(cfg, nodes))


def _planted(seed=0):
    """Two layers, two heads, MLPs: layer 0's head 1 and MLP 0 write nothing (W_O[1] = 0,
    W_out = b_out = 0), so every edge out of them or into them has no effect; the circuit is
    every other edge."""
    cfg, params, tokens = _model(seed, n_heads=2)
    b0 = params["blocks"][0]
    b0["attn"]["w_o"] = b0["attn"]["w_o"].at[1].set(0.0)
    b0["mlp"]["w_out"] = jnp.zeros_like(b0["mlp"]["w_out"])
    b0["mlp"]["b_out"] = jnp.zeros_like(b0["mlp"]["b_out"])
    dead = {"blocks.0.attn.head1", "blocks.0.mlp"}
    g = patching.graph(cfg)
    live = np.array([g.senders[s] not in dead and g.receivers[r].rsplit(".", 1)[0] not in dead
                     and g.receivers[r] not in dead for s, r in g.edges])
    return cfg, params, tokens, live


@pytest.mark.parametrize("metric", patching.METRICS)
@pytest.mark.parametrize("ablation", patching.ABLATIONS)
def test_attribution_finds_the_planted_circuit_and_it_is_faithful(ablation, metric):
    cfg, params, tokens, live = _planted()
    assert live.sum() == 24  # 3 + 2 * 6 + 4 + 5 (see _planted)
    valid = jnp.ones(tokens.shape, bool)
    options = dict(granularity="edge", ablation=ablation, direction="complement",
                   metric=metric)
    stats = circuit.statistic(0, params, tokens, valid, cfg, {}, **options)
    stats |= circuit.statistic(1, params, tokens, valid, cfg, stats, **options)
    scores = np.abs(np.asarray(stats["scores"]))
    # Dead edges have exactly zero effect: their sender's output is 0 (clean = ablated) or no
    # gradient reaches their receiver (its output is multiplied by a zero matrix).
    assert np.all(scores[~live] == 0)
    assert np.all(scores[live] > 0)
    sizes = (int(live.sum()) - 1, int(live.sum()))
    fitted = circuit.fit(stats, sizes, **options)
    np.testing.assert_array_equal(fitted["mask"][1], live.astype(np.float32))
    ref = model.forward(params, tokens, cfg)[0]
    smaller, same = (circuit.logits(jax.tree.map(lambda x, i=i: x[i], fitted), params, tokens,
                                    cfg, **options) for i in range(2))
    _assert_close(same, ref, _tolerance(cfg, ref))
    assert np.max(np.abs(smaller - ref)) > 100 * np.max(_tolerance(cfg, ref))


def test_ablating_the_circuit_keeps_the_rest():
    cfg, params, tokens, live = _planted()
    valid = jnp.ones(tokens.shape, bool)
    options = dict(granularity="edge", ablation="zero", direction="circuit", metric="kl")
    stats = circuit.statistic(1, params, tokens, valid, cfg,
                              circuit.statistic(0, params, tokens, valid, cfg, {}, **options),
                              **options)
    fitted = circuit.fit(stats, (24,), **options)
    np.testing.assert_array_equal(fitted["mask"][0], 1 - live.astype(np.float32))


def test_attribution_is_the_gradient_of_the_masked_metric():
    """The first-order score of an edge equals the finite difference of the metric in its mask
    around the point of linearisation (a central difference of step h; its error is O(h^2)
    against float32 rounding of the metric / h)."""
    cfg, params, tokens = _model(n_heads=1)
    weight = jnp.ones(tokens.shape)
    ablated = patching.ablated_values(params, tokens, cfg, "edge", "zero")
    scores = patching.attribution(params, tokens, cfg, "edge", ablated, weight, "logit")
    clean = model.forward(params, tokens, cfg)[0]
    h, e = 1e-2, 3
    n = len(patching.graph(cfg).edges)

    def metric(m):
        logits = patching.masked_logits(params, tokens, cfg, "edge", m, ablated)
        return float(patching.metric(clean, logits, weight, "logit"))

    plus = metric(jnp.ones(n).at[e].add(h))
    minus = metric(jnp.ones(n).at[e].add(-h))
    total = float(jnp.sum(jnp.abs(clean)))
    assert abs((plus - minus) / (2 * h) - float(scores[e])) <= 1e-3 * (abs(float(scores[e]))
                                                                       + tol.EPS32 * total / h)


def test_batched_over_seeds_is_the_loop():
    """jit(vmap) of the statistics and logits over 3 seeds = each seed alone: the same
    computation batched (XLA may sum in another order: within the edge-forward tolerance)."""
    seeds = [_model(s, n_heads=2) for s in range(3)]
    cfg, tokens = seeds[0][0], seeds[0][2]
    params = jax.tree.map(lambda *x: jnp.stack(x), *[p for _, p, _ in seeds])
    valid = jnp.ones(tokens.shape, bool)
    options = dict(granularity="edge", ablation="mean", direction="complement", metric="kl")

    def fit_and_run(p):
        stats = circuit.statistic(0, p, tokens, valid, cfg, {}, **options)
        stats |= circuit.statistic(1, p, tokens, valid, cfg, stats, **options)
        fitted = circuit.fit(stats, (5,), **options)
        return fitted, circuit.logits(jax.tree.map(lambda x: x[0], fitted), p, tokens, cfg,
                                      **options)

    batched = jax.jit(jax.vmap(fit_and_run))(params)
    for s in range(3):
        one = fit_and_run(jax.tree.map(lambda x, s=s: x[s], params))
        np.testing.assert_array_equal(batched[0]["mask"][s], one[0]["mask"])
        _assert_close(batched[1][s], one[1], _tolerance(cfg, one[1]))
        scores = np.asarray(one[0]["scores"][0])
        # A sum over 40 positions of gradients, each a product chain through the model:
        # activation_error's bound for rows of that magnitude.
        bound = tol.two_ways(tol.activation_error(scores[None], 16 * 7 * 40))[0]
        _assert_close(batched[0]["scores"][s, 0], scores, bound)


@pytest.mark.parametrize("ablation", patching.ABLATIONS)
def test_node_patching_matches_transformer_lens_hooks(ablation):
    """Activation patching of layer 0's head 1 and layer 1's MLP on one seed = the same patch by
    TransformerLens hooks (hook_z, hook_mlp_out) on the exported model."""
    pytest.importorskip("transformer_lens")
    import torch

    from jaxillusions.report import export

    cfg, params, tokens = _model(n_heads=2)
    valid = jnp.ones(tokens.shape, bool)
    means = jax.tree.map(lambda s: s / valid.sum(),
                         patching.unit_sums(params, tokens, cfg, "node", valid))
    ablated = patching.ablated_values(params, tokens, cfg, "node", ablation, means)
    mask = jnp.ones(6).at[1].set(0.0).at[5].set(0.0)  # blocks.0.attn.head1, blocks.1.mlp
    ours = patching.masked_logits(params, tokens, cfg, "node", mask, ablated)

    z = np.broadcast_to(np.asarray(ablated["blocks.0.attn.z"]), (*tokens.shape, 2, 8))
    out = np.broadcast_to(np.asarray(ablated["blocks.1.mlp.out"]), (*tokens.shape, 16))

    def patch_head(value, hook):
        value = value.clone()
        value[:, :, 1] = torch.tensor(np.array(z[:, :, 1]))
        return value

    def patch_mlp(value, hook):
        return torch.tensor(np.array(out), dtype=value.dtype)

    tl = export.to_transformer_lens(params, cfg)
    logits = tl.run_with_hooks(
        torch.tensor(np.asarray(tokens), dtype=torch.long),
        fwd_hooks=[(export.tl_name("blocks.0.attn.z"), patch_head),
                   (export.tl_name("blocks.1.mlp.out"), patch_mlp)]).detach().numpy()
    width = max(cfg.d_mlp, cfg.d_model, cfg.vocab_size)  # as tests/test_export.py
    bound = tol.two_ways(tol.activation_error(np.asarray(ours, np.float64), width))
    _assert_close(logits, ours, bound)
    assert np.max(np.abs(ours - model.forward(params, tokens, cfg)[0])) > 100 * np.max(bound)


@pytest.mark.slow  # a whole sweep
def test_circuits_in_a_tiny_sweep(tiny_sweep, tmp_path, cache_dir):
    """The circuit proxy added to a finished tiny sweep: per (granularity, ablation) family the
    usual rows for every size, the whole model at full size, the areas,
    overlaps across seeds and fit splits, and circuits against SVD at equal iid faithfulness."""
    import csv
    import os
    import shutil

    from conftest import checked, tiny_sweep_config

    from jaxillusions.pipeline import sweep

    workdir = str(tmp_path / "run")
    shutil.copytree(tiny_sweep, workdir)
    config = tiny_sweep_config(cache_dir)
    config.proxies.methods = ("svd", "onehot_attention", "circuit")
    config.proxies.circuit_granularity = ("edge", "node")
    config.proxies.circuit_ablation = ("mean", "resample")
    config.proxies.circuit_sentences = 256  # one batch of the 2,000: each pass one call
    config.fit_shift.splits = ("train", "unseen_depth")
    rows = sweep.run(checked(config), workdir, verbose=False)
    circ = [r for r in rows if r["method"] == "circuit" and r["breakdown"] == "all"]
    assert {r["site"] for r in circ} == {f"circuit.{g}.{a}" for g in ("edge", "node")
                                         for a in ("mean", "resample")}
    # 2 layers x 1 head: senders embed, h0, m0, h1, m1 -> 23 edges; 4 nodes
    assert {r["size"] for r in circ if r["site"] == "circuit.edge.mean"} == {
        0, 1, 2, 4, 8, 16, 23}
    assert {r["size"] for r in circ if r["site"] == "circuit.node.mean"} == {0, 1, 2, 4}
    assert {r["split"] for r in circ} == {"iid", "unseen_depth", "longer"}
    full = [r for r in circ if r["size"] == {"edge": 23, "node": 4}[r["site"].split(".")[1]]]
    assert all(r["same_pred"] == 1.0 for r in full)
    # Not bit for bit under jit: the patched pass is another program than the model's, which
    # XLA may fuse and sum in another order. A JSD of logits within float32 rounding r is about
    # r^2 / 8 nats; r ~ 1e-5 here (tolerance.activation_error of logits ~ 10): far below 1e-6.
    assert all(r["jsd"] < 1e-6 for r in full), max(r["jsd"] for r in full)
    assert any(r["same_pred"] < 0.9 for r in circ if r["size"] == 0)

    def read(name):
        with open(os.path.join(workdir, name)) as f:
            return list(csv.DictReader(f))

    areas = read("circuits.csv")
    assert {(r["site"], r["measure"]) for r in areas} >= {("circuit.edge.mean", "cpr"),
                                                          ("circuit.node.resample", "cmd")}
    for r in areas:
        assert 0 <= float(r["mean"]) <= 1
        assert (r["gap"] == "") == (r["split"] == "iid")
    overlap = read("circuits_overlap.csv")
    assert {r["between"] for r in overlap} == {"seeds", "fit:unseen_depth"}
    assert all(0 <= float(r["mean"]) <= 1 for r in overlap)
    assert {int(r["size"]) for r in overlap if r["site"] == "circuit.edge.mean"} == {
        1, 2, 4, 8, 16}
    assert {r["reference"] for r in read("circuits_equal_iid.csv")} == {"svd"}


def test_areas_of_a_known_curve():
    """f = x on [0, 1]: area 1/2 under it and 1/2 between it and 1; f = 1: the model."""
    from jaxillusions.studies import circuits as study

    xs = np.linspace(0, 1, 5)
    assert study.areas(xs, xs) == {"cpr": 0.5, "cmd": 0.5}
    assert study.areas(xs, np.ones(5)) == {"cpr": 1.0, "cmd": 0.0}
    a = np.array([[1, 1, 0, 0], [0, 0, 0, 0]], bool)
    b = np.array([[0, 1, 1, 0], [0, 0, 0, 0]], bool)
    np.testing.assert_array_equal(study.jaccard(a, b), [1 / 3, np.nan])


def test_overlap_of_known_circuits():
    """Two seeds whose top-2 units share one of three: Jaccard 1/3 at size 2; a fit on another
    split equal to train's: 1 at every size."""
    import types

    from jaxillusions.studies import circuits as study

    cfg, _, _ = _model(n_heads=2)  # 6 nodes
    scores = np.array([[5, -4, 0, 0, 1, 0], [5, 0, 0, 4.5, 0, 0]], np.float32)
    fitted = {"circuit.node.mean": {"scores": scores[:, None, None, :]}}
    spec = types.SimpleNamespace(target="circuit.node.mean", sizes=(0, 1, 2, 6))
    rows = study.overlap_rows(spec, fitted, {"unseen_depth": fitted}, cfg)
    seeds = {r["size"]: r["mean"] for r in rows if r["between"] == "seeds"}
    assert seeds == {1: 1.0, 2: pytest.approx(1 / 3)}  # sizes 0 and 6 (every unit) left out
    assert all(r["mean"] == 1.0 for r in rows if r["between"] == "fit:unseen_depth")
    # Overlaps lie in [0, 1], and so do their intervals (a plain t interval over 3 seeds read
    # [-3.569, 4.902] around a mean of 0.667).
    third = np.array([[0, 0, 5, 4, 0, 0]], np.float32)
    fitted = {"circuit.node.mean": {"scores": np.concatenate([scores, third])[:, None, None]}}
    rows = study.overlap_rows(spec, fitted, {}, cfg)
    assert all(0 <= r["ci_low"] < r["mean"] < r["ci_high"] <= 1 for r in rows), rows


def test_the_overlap_between_seeds_has_a_jackknife_interval_over_seeds():
    """Was: a logit-t interval over each seed's mean overlap with the others, though every pair
    enters two of those means: too narrow, and of zero width at 2 seeds (one pair). Now none
    below 3 seeds, and the jackknife over seeds (each left out with all its pairs) above."""
    import types

    import scipy.stats

    from jaxillusions.studies import circuits as study

    cfg, _, _ = _model(n_heads=2)  # 6 nodes
    scores = np.array([[5, -4, 0, 0, 1, 0], [5, 0, 0, 4.5, 0, 0], [0, 0, 5, 4, 0, 0],
                       [5, 0, 4, 0, 0, 0], [0, 3, 0, 2, 1, 0]], np.float32)
    spec = types.SimpleNamespace(target="circuit.node.mean", sizes=(2,))

    def seeds_row(s):
        fitted = {"circuit.node.mean": {"scores": scores[:s, None, None, :]}}
        (only,) = study.overlap_rows(spec, fitted, {}, cfg)
        return only

    two = seeds_row(2)
    assert np.isnan(two["ci_low"]) and np.isnan(two["ci_high"])  # was [1/3, 1/3]
    assert two["mean"] == pytest.approx(1 / 3) and (two["n_seeds"], two["n_pairs"]) == (2, 1)
    sets = [set(np.argsort(-np.abs(v), kind="stable")[:2]) for v in scores]
    overlap = {(a, b): len(sets[a] & sets[b]) / len(sets[a] | sets[b])
               for a, b in itertools.combinations(range(5), 2)}
    left_out = [np.mean([v for pair, v in overlap.items() if i not in pair]) for i in range(5)]
    half = scipy.stats.t.ppf(0.975, 4) * np.sqrt(4 / 5 * np.sum(
        (np.array(left_out) - np.mean(left_out)) ** 2))
    mean = np.mean(list(overlap.values()))
    five = seeds_row(5)
    assert (five["n_seeds"], five["n_pairs"]) == (5, 10)
    assert five["mean"] == pytest.approx(mean)
    assert five["ci_low"] == pytest.approx(max(mean - half, 0.0))
    assert five["ci_high"] == pytest.approx(min(mean + half, 1.0))
    assert 0 <= five["ci_low"] < five["mean"] < five["ci_high"] <= 1


def test_equal_iid_matches_the_circuits_below_every_unit_to_each_reference_site():
    """circuits_equal_iid.csv: per seed, the circuit size closest to SVD rank 2 on iid
    same_pred, among the sizes below every unit (size 6 of 6 nodes, the model, would match
    exactly), from the `all` rows only (a depth bin's row, 0.0, left out); one row per
    reference site and metric."""
    from jaxillusions.studies import circuits as study

    cfg, _, _ = _model(n_heads=2)  # 6 nodes
    family = "circuit.node.mean"

    def row(seed, method, site, size, split, same_pred, breakdown="all"):
        return {"seed": seed, "site": site, "method": method, "size": size, "split": split,
                "breakdown": breakdown, "bin": -1 if breakdown == "all" else 1, "n": 100,
                "same_pred": same_pred, "jsd": 0.1}

    rows = []
    for s in range(4):
        for site in ("blocks.1.attn.q", "blocks.1.attn.k"):
            rows += [row(s, "svd", site, 2, "iid", 0.9),
                     row(s, "svd", site, 2, "ood", 0.8 - 0.01 * s)]
        rows += [row(s, "circuit", family, 2, "iid", 0.7),
                 row(s, "circuit", family, 2, "ood", 0.6),
                 row(s, "circuit", family, 4, "iid", 0.88),
                 row(s, "circuit", family, 4, "ood", 0.5 + 0.01 * s),
                 row(s, "circuit", family, 4, "ood", 0.0, breakdown="depth"),
                 row(s, "circuit", family, 6, "iid", 0.9), row(s, "circuit", family, 6, "ood", 0.9)]
    out = study.equal_iid(rows, "iid", cfg)
    assert sorted((r["site"], r["metric"]) for r in out) == [
        (site, metric) for site in ("blocks.1.attn.k", "blocks.1.attn.q")
        for metric in ("jsd", "same_pred")]
    for r in out:
        assert (r["reference"], r["dictionary"], r["rank"], r["split"]) == ("svd", family, 2, "ood")
        assert r["dictionary_sizes"] == "4:4" and r["n_seeds"] == 4
        # gap of size 4: 0.88 - (0.5 + 0.01 s); of rank 2: 0.9 - (0.8 - 0.01 s)
        expected = 0.25 if r["metric"] == "same_pred" else 0.0
        assert r["diff"] == pytest.approx(expected)
