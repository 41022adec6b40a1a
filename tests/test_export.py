import dataclasses

import jax
import numpy as np
import pytest

from jaxillusions import model, train
from jaxillusions.analysis import load_run


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, cache_dir):
    from conftest import tiny_config

    config = tiny_config(cache_dir)
    config.seed = 5  # seeds 5, 6: seed numbers are not indices
    workdir = str(tmp_path_factory.mktemp("export") / "run")
    state, _ = train.train_sweep(config, workdir, verbose=False)
    return workdir, state


def test_load_run_gives_the_trained_state(workdir):
    path, state = workdir
    run = load_run(path)
    assert run.seeds == [5, 6] and run.step == 20 and run.healthy.tolist() == [True, True]
    assert run.model_config.d_model == 16 and set(run.splits) >= {"train", "iid", "longer"}
    same = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), run.params, state.params)
    assert all(jax.tree.leaves(same))
    one = run.seed_params(6)
    assert np.array_equal(one["embed"], state.params["embed"][1])
    with pytest.raises(ValueError, match="seed 0 is not in this run"):
        run.seed_params(0)
    # Members of a hyper-parameter sweep: a seed number is ambiguous, a label is not.
    swept = dataclasses.replace(run, seeds=[5, 5], labels=["5_cw0", "5_cw0.5"])
    assert swept.index("5_cw0.5") == 1
    with pytest.raises(ValueError, match="seed 5 has 2 members"):
        swept.index(5)


def _compare(tl_model, params, cfg, tokens, atol=1e-4):
    """Logits and every mapped site of our forward vs the exported model's run_with_cache; also
    every other hook name of the cache that `site_name` reads (TL 4's own names of its hooks)."""
    import torch

    from jaxillusions import export

    major = export.tl_major()
    assert type(tl_model).__name__ == {3: "HookedTransformer", 4: "TransformerBridge"}[major]
    ours, cache = model.forward(params, tokens, cfg, cache=model.site_names(cfg))
    logits, tl_cache = tl_model.run_with_cache(torch.tensor(np.asarray(tokens), dtype=torch.long))
    np.testing.assert_allclose(logits.detach().numpy(), np.asarray(ours), rtol=0, atol=atol)
    diffs = {"logits": float(np.max(np.abs(logits.detach().numpy() - np.asarray(ours))))}
    sites = export.site_map(cfg)
    # 3.x: all but ln_final and logits; 4.x: all but attn.scores (and never resid_mid of
    # attention-only blocks).
    unmapped = 2 if major == 3 else cfg.n_layers
    assert len(sites) == len(model.site_names(cfg)) - unmapped - cfg.attn_only * cfg.n_layers
    hooks = dict(sites.items())
    for hook in tl_cache.keys():
        try:
            site = export.site_name(hook)
        except ValueError:
            continue
        if site in model.site_names(cfg) and hook not in sites.values():
            assert site in sites, (hook, site)
            hooks[f"{site} as {hook}"] = hook
    assert major == 3 or len(hooks) > len(sites)  # 4.x: its own names were compared too
    for key, hook in hooks.items():
        site = key.split(" as ")[0]
        ref = np.asarray(cache[site])
        got = tl_cache[hook].detach().numpy()
        if site == "pos_embed":  # ours [pos, d_model], broadcast over the batch in TL
            ref = np.broadcast_to(ref, got.shape)
        finite = np.isfinite(ref)  # masked attention scores are -inf in both
        assert got.shape == ref.shape and np.array_equal(np.isfinite(got), finite), key
        got, ref = np.where(finite, got, 0), np.where(finite, ref, 0)
        np.testing.assert_allclose(got, ref, rtol=0, atol=atol, err_msg=key)
        diffs[key] = float(np.max(np.abs(got - ref)))
    worst = max(diffs, key=diffs.get)
    # Shown with `pytest -s`: the parity numbers of this TL version.
    print(f"TL {major}.x parity: {len(diffs)} tensors, logits max |diff| {diffs['logits']:.2e}, "
          f"worst {worst} {diffs[worst]:.2e}")


def test_export_matches_the_jax_forward(workdir):
    pytest.importorskip("transformer_lens")
    from jaxillusions import export

    path, _ = workdir
    run = load_run(path)
    tl_model = export.from_workdir(path, seed=6)
    longer = run.splits["longer"].tokens[:8]  # positions beyond the training lengths too
    iid = run.splits["iid"].tokens[:8]
    tokens = np.concatenate([np.pad(iid, ((0, 0), (0, longer.shape[1] - iid.shape[1]))), longer])
    _compare(tl_model, run.seed_params(6), run.model_config, tokens)


@pytest.mark.parametrize("options", [dict(pos_encoding="none"),
                                     dict(pos_encoding="sinusoidal", n_heads=2),
                                     dict(pos_encoding="linear", attn_only=True, n_layers=1),
                                     dict(embedding="onehot")])
def test_export_every_position_encoding(options):
    pytest.importorskip("transformer_lens")
    from jaxillusions import export

    cfg = dataclasses.replace(model.ModelConfig(vocab_size=11, max_len=12, d_model=16, d_mlp=32),
                              **options)
    params = model.init_params(jax.random.PRNGKey(3), cfg)
    # Random non-zero biases and LayerNorm params, so that a dropped one would show.
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(4), len(leaves))
    params = jax.tree.unflatten(treedef, [x + 0.1 * jax.random.normal(k, x.shape)
                                          for x, k in zip(leaves, keys, strict=True)])
    tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(5), (4, 12), 0, 11))
    _compare(export.to_transformer_lens(params, cfg), params, cfg, tokens)


def test_site_names_both_ways_and_refusals():
    from jaxillusions import export

    for major in (3, 4):  # HookedTransformer's names: 4.x keeps them as aliases
        assert export.tl_name("blocks.1.attn.out", major) == "blocks.1.hook_attn_out"
        assert export.tl_name("blocks.0.mlp.hidden", major) == "blocks.0.mlp.hook_post"
        assert export.site_name("blocks.1.hook_attn_out", major) == "blocks.1.attn.out"
        with pytest.raises(ValueError, match="no jaxillusions site"):
            export.site_name("blocks.0.ln1.hook_scale", major)
    assert export.tl_name("blocks.3.attn.scores", 3) == "blocks.3.attn.hook_attn_scores"
    # 4.x's hook_attn_scores is the pattern; its ln_final.hook_out and unembed are ours.
    with pytest.raises(ValueError, match="no TransformerLens 4.x hook"):
        export.tl_name("blocks.3.attn.scores", 4)
    with pytest.raises(ValueError, match="no jaxillusions site"):
        export.site_name("blocks.3.attn.hook_attn_scores", 4)
    assert export.tl_name("ln_final", 4) == "ln_final.hook_out"
    assert export.site_name("unembed.hook_out", 4) == "logits"
    # 4.x's own names of the same hooks read back; 3.x has no such names.
    assert export.site_name("blocks.2.attn.k.hook_out", 4) == "blocks.2.attn.k"
    assert export.site_name("blocks.0.hook_in", 4) == "blocks.0.resid_pre"
    with pytest.raises(ValueError, match="no jaxillusions site"):
        export.site_name("blocks.2.attn.k.hook_out", 3)
    with pytest.raises(ValueError, match="no TransformerLens 3.x hook"):
        export.tl_name("logits", 3)
    with pytest.raises(ValueError, match="major=5"):
        export.tl_name("embed", 5)
    cfg = model.ModelConfig(vocab_size=11, max_len=12, n_layers=3)
    for major in (3, 4):
        sites = export.site_map(cfg, major)
        assert ("blocks.2.attn.scores" in sites) == (major == 3)
        assert ("ln_final" in sites) == ("logits" in sites) == (major == 4)
        for site, hook in sites.items():
            assert export.site_name(hook, major) == site
    pytest.importorskip("transformer_lens")
    uniform = dataclasses.replace(cfg, uniform_attention_layers=(0,))
    with pytest.raises(ValueError, match="uniform_attention_layers"):
        export.tl_config(uniform)
    minimal = model.ModelConfig(vocab_size=11, max_len=12, d_model=32, first_layer="minimal",
                                pos_encoding="none", open_ids=(3, 4, 5, 6),
                                close_ids=(7, 8, 9, 10), max_depth=2, depth_bins=3)
    with pytest.raises(ValueError, match="first_layer='minimal'"):
        export.tl_config(minimal)
    params = model.init_params(jax.random.PRNGKey(0), cfg)
    with pytest.raises(ValueError, match="seed axis"):
        export.state_dict(jax.tree.map(lambda x: x[None], params), cfg)
