import dataclasses
import os
from importlib.machinery import ModuleSpec

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tolerance as tol
from conftest import checked

from jaxillusions import model, tasks
from jaxillusions.report import load_run
from jaxillusions.tasks.minimal_layer import MinimalFirstLayer
from jaxillusions.training import train


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, cache_dir):
    from conftest import tiny_config

    config = tiny_config(cache_dir)
    config.seed = 5  # seeds 5, 6: seed numbers are not indices
    workdir = str(tmp_path_factory.mktemp("export") / "run")
    state, _ = train.train_sweep(checked(config), workdir, verbose=False)
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


def _within(got, ref, width, key=""):
    """Two float32 implementations (torch, ours) of the same activations agree within twice an
    activation's rounding through matmuls of `width` terms (tests/tolerance.py), per row."""
    bound = tol.two_ways(tol.activation_error(ref, width))
    assert np.all(np.abs(np.asarray(got, np.float64) - ref) <= bound), (
        key, float(np.max(np.abs(got - ref) - bound)))


def _compare(tl_model, params, cfg, tokens):
    """Logits and every mapped site of our forward vs the exported model's run_with_cache; also
    every other hook name of the cache that `site_name` reads (TL 4's own names of its hooks),
    each within float32 rounding (`_within`; the widest matmul: the MLP's or the vocabulary)."""
    import torch

    from jaxillusions.report import export

    major = export.tl_major()
    assert type(tl_model).__name__ == {3: "HookedTransformer", 4: "TransformerBridge"}[major]
    ours, cache = model.forward(params, tokens, cfg, cache=model.site_names(cfg))
    logits, tl_cache = tl_model.run_with_cache(torch.tensor(np.asarray(tokens), dtype=torch.long))
    width = max(cfg.d_mlp, cfg.d_model, cfg.vocab_size)
    _within(logits.detach().numpy(), np.asarray(ours, np.float64), width, "logits")
    diffs = {"logits": float(np.max(np.abs(logits.detach().numpy() - np.asarray(ours))))}
    sites = export.site_map(cfg)
    # 3.x: all but ln_final and logits; 4.x: all but attn.scores and a rotary model's
    # attn.rot_q/rot_k (and never resid_mid of attention-only blocks).
    unmapped = 2 if major == 3 else cfg.n_layers * (3 if cfg.pos_encoding == "rotary" else 1)
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
        _within(got, ref.astype(np.float64), width, key)
        diffs[key] = float(np.max(np.abs(got - ref)))
    worst = max(diffs, key=diffs.get)
    # Shown with `pytest -s`: the parity numbers of this TL version.
    print(f"TL {major}.x parity: {len(diffs)} tensors, logits max |diff| {diffs['logits']:.2e}, "
          f"worst {worst} {diffs[worst]:.2e}")


def test_export_matches_the_jax_forward(workdir):
    pytest.importorskip("transformer_lens")
    from jaxillusions.report import export

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
                                     dict(embedding="onehot"),
                                     dict(pos_encoding="rotary", n_heads=2, rotary_base=100),
                                     # The options of imported architectures that TL's native
                                     # model runs (model.IMPORTED_FIELDS). Was: exported as tanh
                                     # GELU, epsilon 1e-5, no key bias, the whole head rotated.
                                     dict(pos_encoding="rotary", n_heads=2, rotary_base=100,
                                          rotary_dim=4, activation="gelu", ln_eps=1e-3,
                                          key_bias=True),
                                     dict(pos_encoding="learned", key_bias=True, ln_eps=1e-3)])
def test_export_every_position_encoding(options):
    pytest.importorskip("transformer_lens")
    from jaxillusions.report import export

    cfg = dataclasses.replace(model.ModelConfig(vocab_size=11, max_len=12, d_model=16, d_mlp=32),
                              **options)
    params = model.init_params(jax.random.PRNGKey(3), cfg)
    # Random non-zero biases and LayerNorm params, so that a dropped one would show.
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(4), len(leaves))
    params = jax.tree.unflatten(treedef, [x + 0.1 * jax.random.normal(k, x.shape)
                                          for x, k in zip(leaves, keys, strict=True)])
    tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(5), (4, 12), 0, 11))
    tl_model = export.to_transformer_lens(params, cfg)
    if cfg.pos_encoding == "rotary":  # TL's rotary, our base, GPT-J's adjacent pairs
        tl_cfg = tl_model.cfg
        assert (tl_cfg.positional_embedding_type, tl_cfg.rotary_dim, tl_cfg.rotary_base,
                tl_cfg.rotary_adjacent_pairs) == ("rotary", cfg.rotary_dim or cfg.head_dim, 100,
                                                  True)
    _compare(tl_model, params, cfg, tokens)


def test_a_missing_extra_is_one_line_before_the_run_loads(monkeypatch, tmp_path):
    """Without the `export` extra, the export says what to install before it reads anything
    (it had loaded the whole run, then raised ModuleNotFoundError from deep inside)."""
    from jaxillusions.report import export

    found = export.importlib.util.find_spec
    for missing, call in [
            ("torch", lambda: export.from_workdir(str(tmp_path / "no_run"), seed=0)),
            ("transformer_lens",
             lambda: export.tl_config(model.ModelConfig(vocab_size=5, max_len=8))),
            ("safetensors", lambda: export.saelens_from_workdir(
                str(tmp_path / "no_run"), str(tmp_path / "sae"), 0, "blocks.0.resid_post", 4))]:
        with monkeypatch.context() as patched:
            patched.setattr(export.importlib.util, "find_spec", lambda name, m=missing: (
                None if name == m else found(name) or ModuleSpec(name, None)))  # the others there
            with pytest.raises(ImportError, match=rf"^the export needs {missing}, which is not "
                               r"installed: pip install 'jaxillusions\[export\]', the CPU "
                               "torch wheel first"):
                call()
    assert not os.path.exists(tmp_path / "sae")


def test_site_names_both_ways_and_refusals():
    from jaxillusions.report import export

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
    # Rotary queries and keys after the turn: 3.x's hook_rot_q/k; 4.x's native model fires none.
    assert export.tl_name("blocks.1.attn.rot_k", 3) == "blocks.1.attn.hook_rot_k"
    assert export.site_name("blocks.1.attn.hook_rot_q", 3) == "blocks.1.attn.rot_q"
    with pytest.raises(ValueError, match="no TransformerLens 4.x hook"):
        export.tl_name("blocks.1.attn.rot_k", 4)
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
    uniform = dataclasses.replace(cfg, interventions=(model.UniformAttention((0,)),))
    with pytest.raises(ValueError, match="uniform_attention_layers"):
        export.tl_config(uniform)
    minimal = model.ModelConfig(vocab_size=11, max_len=12, d_model=32, pos_encoding="none",
                                front=MinimalFirstLayer((3, 4, 5, 6), (7, 8, 9, 10),
                                                        max_depth=2, depth_bins=3))
    with pytest.raises(ValueError, match=r"first_layer \(MinimalFirstLayer\)"):
        export.tl_config(minimal)
    # What TL's native model would ignore (its logits differ): Pythia's parallel blocks and
    # rotate-half layout, the Mistral GPT-2 runs' layer scaling. Was: exported as another model.
    for option, value in (("parallel_residual", True), ("attn_scale_by_layer", True),
                          ("rotary_layout", "half")):
        other = dataclasses.replace(cfg, pos_encoding="rotary", **{option: value})
        with pytest.raises(ValueError, match=rf"^{option}={value!r} \(an imported checkpoint's "
                                             r"architecture\): TransformerLens's native model"):
            export.tl_config(other)
    params = model.init_params(jax.random.PRNGKey(0), cfg)
    with pytest.raises(ValueError, match="seed axis"):
        export.state_dict(jax.tree.map(lambda x: x[None], params), cfg)


# ---------------------------------------------------------------------------------------------
# Sparse dictionaries to SAELens.


def _saelens_files(path):
    """The written SAELens directory, read with the format's own tools: weights and config."""
    import json
    import os

    from safetensors.numpy import load_file

    from jaxillusions.report import export

    assert sorted(os.listdir(path)) == sorted([export.SAELENS_WEIGHTS, export.SAELENS_CONFIG])
    with open(os.path.join(path, export.SAELENS_CONFIG)) as f:
        return load_file(os.path.join(path, export.SAELENS_WEIGHTS)), json.load(f)


def _saelens_reconstruction(weights, cfg, x):
    """SAELens 6's TopKSAE.forward in numpy (sae_lens/saes/topk_sae.py): hidden_pre =
    (x - b_dec) @ W_enc + b_enc (apply_b_dec_to_input), ReLU of its top k, the rest zero, then
    acts @ W_dec + b_dec, W_dec [d_sae, d_in]."""
    assert cfg["apply_b_dec_to_input"] and cfg["normalize_activations"] == "none"
    assert not cfg["rescale_acts_by_decoder_norm"] and cfg["reshape_activations"] == "none"
    x = np.asarray(x, np.float64)
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    top = np.argsort(-pre, axis=-1)[..., :cfg["k"]]
    acts = np.zeros_like(pre)
    np.put_along_axis(acts, top, np.maximum(np.take_along_axis(pre, top, -1), 0), -1)
    return acts @ w["W_dec"] + w["b_dec"]


def test_sae_to_saelens_files_reconstruct_like_sae_apply(tmp_path):
    """Always runs (SAELens cannot be installed beside TransformerLens 4): the written weights
    and cfg.json, read directly and run with SAELens's TopK semantics, equal sae.apply."""
    pytest.importorskip("safetensors")
    from jaxillusions.proxies import sae
    from jaxillusions.report import export

    x = jax.random.normal(jax.random.PRNGKey(0), (512, 6)) * jnp.arange(1.0, 7.0) + 0.5
    stats = {"x": x, "valid": jnp.arange(512) < 500}
    # Widths 5 and 8 in one fit: width 5 is padded to 8 latents and must be cut back.
    fitted = sae.fit(stats, (5, 8), key=jax.random.PRNGKey(1), k=3, steps=200, batch_size=64)
    diffs = {}
    for index, width in enumerate((5, 8)):
        one = jax.tree.map(lambda a, i=index: np.asarray(a[i]), fitted)
        path = export.sae_to_saelens(one, str(tmp_path / f"w{width}"), "blocks.0.resid_post")
        weights, cfg = _saelens_files(path)
        assert {k: v.shape for k, v in weights.items()} == {
            "W_enc": (6, width), "b_enc": (width,), "W_dec": (width, 6), "b_dec": (6,)}
        assert all(v.dtype == np.float32 for v in weights.values())
        assert cfg["architecture"] == "topk" and (cfg["d_in"], cfg["d_sae"], cfg["k"]) == (
            6, width, 3)
        assert cfg["metadata"]["hook_name"] == export.tl_name("blocks.0.resid_post") == (
            "blocks.0.hook_resid_post")
        assert cfg["metadata"]["hook_head_index"] is None and cfg["dtype"] == "float32"
        # Marks the 6.x layout: without it SAELens reads the file as pre-6.0 and converts it.
        assert cfg["metadata"]["sae_lens_version"] == export.SAELENS_FORMAT
        ours = np.asarray(sae.apply(one, x))
        got = _saelens_reconstruction(weights, cfg, x)
        _within(got, ours, 2 * width)  # an encoder and a decoder matmul
        diffs[width] = float(np.max(np.abs(got - ours)))
        assert np.mean(np.sum((x - ours) ** 2, -1)) < 0.5 * np.mean(np.sum((x - x.mean(0)) ** 2,
                                                                             -1))  # it learned
    print(f"SAELens format (numpy) vs sae.apply, max |diff| per width: {diffs}")
    # Nothing overwritten; wrong inputs refused before anything is written.
    with pytest.raises(FileExistsError, match="already holds"):
        export.sae_to_saelens(one, path, "blocks.0.resid_post")
    with pytest.raises(ValueError, match="per head: pass head="):
        export.sae_to_saelens(one, str(tmp_path / "k"), "blocks.0.attn.k")
    with pytest.raises(ValueError, match="head=-1: must be >= 0"):
        export.sae_to_saelens(one, str(tmp_path / "k"), "blocks.0.attn.k", head=-1)
    with pytest.raises(ValueError, match="not per head"):
        export.sae_to_saelens(one, str(tmp_path / "r"), "blocks.0.resid_post", head=0)
    with pytest.raises(ValueError, match="one seed's, head's and size's"):
        export.sae_to_saelens(jax.tree.map(np.asarray, fitted), str(tmp_path / "a"),
                              "blocks.0.resid_post")
    with pytest.raises(ValueError, match="transcoder"):
        export.sae_to_saelens({**one, "b_in": one["b_dec"]}, str(tmp_path / "t"),
                              "blocks.0.resid_post")
    with pytest.raises(ValueError, match="has no"):
        export.sae_to_saelens(one, str(tmp_path / "s"), "blocks.0.attn.nothing")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w5", "w8"]


def _site_values(workdir, seed, site, head):
    """That seed's activations at `site` (one head) on the iid split, valid positions only."""
    run = load_run(workdir)
    tokens = run.splits["iid"].tokens[:32]
    _, cache = model.forward(run.seed_params(seed), tokens, run.model_config, cache=(site,))
    return np.asarray(cache[site][:, :, head])[np.asarray(tokens) != tasks.PAD], tokens


@pytest.mark.slow
def test_saelens_from_workdir(sae_sweep, tmp_path):
    pytest.importorskip("safetensors")
    from jaxillusions.proxies import sae
    from jaxillusions.report import export

    site, seed, head = "blocks.1.attn.k", 1, 1  # the tiny config's seeds are 0 and 1
    params = export.sae_params(sae_sweep, seed, site, 8, head=head)
    assert params["W_enc"].shape == (8, 8) and int(params["kmask"].sum()) == 4  # default k
    other = export.sae_params(sae_sweep, 0, site, 8, head=head)
    assert not np.array_equal(params["W_enc"], other["W_enc"])  # the seed's own SAE
    path = export.saelens_from_workdir(sae_sweep, str(tmp_path / "sae"), seed, site, 8,
                                       head=head)
    weights, cfg = _saelens_files(path)
    assert cfg["metadata"]["hook_name"] == "blocks.1.attn.hook_k"
    assert cfg["metadata"]["hook_head_index"] == head and cfg["d_in"] == 8
    x, _ = _site_values(sae_sweep, seed, site, head)
    ours = np.asarray(sae.apply(params, x))
    got = _saelens_reconstruction(weights, cfg, x)
    _within(got, ours, 16)  # width 8: an encoder and a decoder matmul
    print(f"from workdir, SAELens format (numpy) vs sae.apply: max |diff| "
          f"{np.max(np.abs(got - ours)):.2e} over {len(x)} positions")
    with pytest.raises(ValueError, match="pass head="):
        export.sae_params(sae_sweep, seed, site, 8)
    with pytest.raises(ValueError, match=r"fitted \(width, k\) are \[\(4, 4\), \(8, 4\)\]"):
        export.sae_params(sae_sweep, seed, site, 16, head=0)
    with pytest.raises(ValueError, match="0 SAE families"):
        export.sae_params(sae_sweep, seed, "blocks.0.attn.k", 8, head=0)
    with pytest.raises(ValueError, match="seed 7 is not in this run"):
        export.sae_params(sae_sweep, 7, site, 8, head=0)


@pytest.mark.slow
def test_saelens_loads_and_reconstructs(sae_sweep, tmp_path):
    """SAELens itself (skipped without it): SAE.load_from_disk of the export reconstructs the
    seed's activations as sae.apply does, read from our forward and from the TL export's hook."""
    sae_lens = pytest.importorskip("sae_lens")
    import torch

    from jaxillusions.proxies import sae
    from jaxillusions.report import export

    site, seed, head = "blocks.1.attn.k", 1, 1
    params = export.sae_params(sae_sweep, seed, site, 8, head=head)
    path = export.saelens_from_workdir(sae_sweep, str(tmp_path / "sae"), seed, site, 8,
                                       head=head)
    loaded = sae_lens.SAE.load_from_disk(path, device="cpu")
    assert type(loaded).__name__ == "TopKSAE" and loaded.cfg.k == 4 and loaded.cfg.d_sae == 8
    x, tokens = _site_values(sae_sweep, seed, site, head)
    ours = np.asarray(sae.apply(params, x))
    with torch.no_grad():
        got = loaded(torch.tensor(x)).numpy()
        l0 = (loaded.encode(torch.tensor(x)) != 0).sum(-1)
    _within(got, ours, 16)  # width 8: an encoder and a decoder matmul
    assert int(l0.max()) <= 4
    # Through TransformerLens: the hook SAELens names, at its head index.
    tl_model = export.from_workdir(sae_sweep, seed=seed)
    _, tl_cache = tl_model.run_with_cache(torch.tensor(np.asarray(tokens), dtype=torch.long))
    hook = tl_cache[loaded.cfg.metadata.hook_name][:, :, loaded.cfg.metadata.hook_head_index]
    with torch.no_grad():
        via_tl = loaded(hook[torch.tensor(np.asarray(tokens) != tasks.PAD)]).numpy()
    # TL's hook holds its own forward's keys (within their rounding through the model's
    # matmuls), then the SAE's two matmuls: both widths.
    _within(via_tl, ours, 16 + 32)  # tiny_config's d_mlp
    print(f"sae_lens {sae_lens.__version__}: load_from_disk vs sae.apply max |diff| "
          f"{np.max(np.abs(got - ours)):.2e}; on TL's hook {np.max(np.abs(via_tl - ours)):.2e}")
