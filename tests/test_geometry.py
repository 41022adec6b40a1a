"""Why proxies fail: subspace geometry, Procrustes repair and their stage (studies/geometry.py,
studies/geometry.py)."""

import csv
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from conftest import checked

from jaxillusions.pipeline import sweep, validate
from jaxillusions.proxies import svd
from jaxillusions.studies import fit_shift, geometry

F, R = 8, 3  # feature size; rank of the planted subspaces
TRAIN_VAR = np.array([9.0, 4.0, 1.0])
OOD_VAR = np.array([5.0, 3.0, 2.0])


def _exact(n: int, var: np.ndarray, rng) -> np.ndarray:
    """[n, len(var)] with zero column means and second moments exactly n * diag(var)."""
    g = rng.normal(size=(n, len(var)))
    q, _ = np.linalg.qr(g - g.mean(0))
    return q * np.sqrt(n * var)


def _planted(thetas: np.ndarray, offset: np.ndarray, rng, n: int = 400):
    """Training activations in span(e_1..e_R) (variances TRAIN_VAR); OOD activations along
    b_i = cos(theta_i) e_i + sin(theta_i) e_{R+i} (variances OOD_VAR); both shifted by
    `offset`. Returns the two moments (svd.moments) and the OOD basis [F, R]."""
    eye = np.eye(F)
    b = eye[:, :R] * np.cos(thetas) + eye[:, R:2 * R] * np.sin(thetas)
    x_train = _exact(n, TRAIN_VAR, rng) @ eye[:, :R].T + offset
    x_ood = _exact(n, OOD_VAR, rng) @ b.T + offset
    valid = jnp.ones(n, bool)
    return (svd.moments(jnp.asarray(x_train, jnp.float32), valid),
            svd.moments(jnp.asarray(x_ood, jnp.float32), valid), b)


@pytest.mark.parametrize("center", [False, True])
def test_principal_angles_and_outside_energy_equal_their_closed_forms(center):
    rng = np.random.default_rng(0)
    offset = np.linspace(1.0, 2.0, F) if center else np.zeros(F)
    per_seed = [np.array([0.3, 0.6, 1.0]), np.array([1.2, 0.2, 0.05])]  # 2 seeds
    planted = [_planted(t, offset, rng) for t in per_seed]
    train = jax.tree.map(lambda *x: jnp.stack(x)[:, None], *[p[0] for p in planted])  # [S, 1]
    split = jax.tree.map(lambda *x: jnp.stack(x)[:, None, None], *[p[1] for p in planted])
    ranks = (1, 2, 3, F)
    got = jax.device_get(geometry.geometry(train, split, ranks=ranks, center=center))
    for s, thetas in enumerate(per_seed):
        for i, k in enumerate(ranks[:3]):
            # The top-k subspaces are spanned by the first k planted directions of each.
            want = np.sort(thetas[:k])[::-1]
            angles = got["angles"][s, 0, 0, i]
            np.testing.assert_allclose(angles[:k], want, atol=2e-4)
            assert np.isnan(angles[k:]).all()
            np.testing.assert_allclose(got["angle_max"][s, 0, 0, i], want[0], atol=2e-4)
            np.testing.assert_allclose(got["sin2_mean"][s, 0, 0, i],
                                       np.mean(np.sin(want) ** 2), atol=2e-4)
            outside = (np.sum(OOD_VAR[:k] * np.sin(thetas[:k]) ** 2) + OOD_VAR[k:].sum())
            np.testing.assert_allclose(got["energy_outside"][s, 0, 0, i],
                                       outside / OOD_VAR.sum(), atol=2e-5)
        # scipy's subspace_angles on the same rank-2 bases, and full rank: nothing outside.
        _, base = geometry._basis(planted[s][0], center)  # noqa: SLF001
        _, other = geometry._basis(planted[s][1], center)  # noqa: SLF001
        np.testing.assert_allclose(got["angles"][s, 0, 0, 1, :2], scipy.linalg.subspace_angles(
            np.asarray(base[:, :2], np.float64), np.asarray(other[:, :2], np.float64)),
            atol=1e-5)
        assert abs(got["energy_outside"][s, 0, 0, 3]) < 1e-5


def test_outside_energy_of_a_near_constant_site_is_undefined():
    """energy_outside is a ratio over the split's energy about the (training) mean: for a site
    that is constant up to 1e-4 (variance 1e-8 against a squared mean of 4 per feature: below
    the float32 rounding of its sums of squares over 10,000 rows) it is NaN, not a number made
    of rounding; geometry_predicts_gap then leaves that seed out."""
    rng = np.random.default_rng(0)
    x = (2.0 + 1e-4 * rng.normal(size=(10_000, F))).astype(np.float32)
    moments = jax.device_get(svd.moments(jnp.asarray(x), jnp.ones(len(x), bool)))
    mean = jnp.asarray(moments["total"] / moments["count"])
    basis = jnp.eye(F)
    assert np.isnan(float(geometry.outside_energy(moments, mean, basis, 1)))
    spread = (2.0 + rng.normal(size=(10_000, F))).astype(np.float32)  # variance 1: defined
    wide = jax.device_get(svd.moments(jnp.asarray(spread), jnp.ones(len(x), bool)))
    wide_mean = jnp.asarray(wide["total"] / wide["count"])
    assert 0.0 < float(geometry.outside_energy(wide, wide_mean, basis, 1)) < 1.0
    geo = [{"seed": s, "site": "k", "head": 0, "method": "svd", "split": "longer", "rank": 1,
            "angle_max": 0.1 * s, "sin2_mean": 0.01 * s,
            "energy_outside": np.nan if s == 0 else 0.1 * s} for s in range(4)]
    rows = [{"seed": s, "site": "k", "method": "svd", "size": 1, "split": split,
             "breakdown": "all", "same_pred": 0.9 - (0.05 * s if split == "longer" else 0),
             "jsd": 0.1} for s in range(4) for split in ("iid", "longer")]
    table = {r["predictor"]: r for r in geometry.geometry_predicts_gap(geo, rows, metrics=(
        "same_pred",))}
    assert table["energy_outside"]["n_seeds"] == 3 and table["energy_outside"]["rho"] == 1.0
    assert table["angle_max"]["n_seeds"] == 4


def test_procrustes_recovers_a_rotation_as_scipy_does():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(50, F))
    rotation, _ = np.linalg.qr(rng.normal(size=(F, F)))
    got = np.asarray(geometry.procrustes(jnp.asarray(a, jnp.float32),
                                         jnp.asarray(a @ rotation, jnp.float32)))
    np.testing.assert_allclose(got, rotation, atol=1e-5)
    np.testing.assert_allclose(got, scipy.linalg.orthogonal_procrustes(a, a @ rotation)[0],
                               atol=1e-5)


@pytest.mark.parametrize("center", [False, True])
def test_repair_with_the_whole_split_closes_the_gap_of_a_planted_rotation(center):
    rng = np.random.default_rng(2)
    offset = np.full(F, 0.5) if center else np.zeros(F)
    rotation, _ = np.linalg.qr(rng.normal(size=(F, F)))
    eye = np.eye(F)
    x_train = _exact(400, TRAIN_VAR, rng) @ eye[:, :R].T + offset
    x_ood = (_exact(400, TRAIN_VAR, rng) @ eye[:, :R].T) @ rotation.T + offset  # rotated
    valid = jnp.ones(400, bool)
    train, ood = (svd.moments(jnp.asarray(x, jnp.float32), valid) for x in (x_train, x_ood))
    sizes = (R,)
    fitted = svd.fit(train, sizes, center=center)
    fixed = jax.device_get(geometry.repaired(
        jax.tree.map(lambda x: x[None, None], train),
        jax.tree.map(lambda x: x[None, None, None], ood), sizes=sizes, center=center))

    def error(params):  # relative reconstruction error of the rank-R proxy on the OOD data
        one = jax.tree.map(lambda x: jnp.asarray(x)[0], params)
        y = np.asarray(svd.apply(one, jnp.asarray(x_ood, jnp.float32)))
        return np.sum((y - x_ood) ** 2) / np.sum((x_ood - x_ood.mean(0)) ** 2)

    gap = error(fitted)
    assert gap > 0.1  # the train-fitted proxy misses the rotated subspace
    for variant in geometry.VARIANTS:
        params = jax.tree.map(lambda x, v=variant: x[0, 0, 0], fixed[variant])
        assert error(params) < 1e-6 * (1 + gap), variant  # the whole gap is closed
        # The rotated training basis spans the split's subspace.
        angles = geometry.subspace_angles(jnp.asarray(params["basis"][0]),
                                          jnp.asarray(rotation @ eye), R)
        assert np.nanmax(np.asarray(angles)) < 1e-3


def test_repair_uses_the_fit_halves_of_fit_shift():
    # One halving for the whole project (fit_shift.halves): the first M sentences of the fit half
    # a repair uses are a random sample, and never in the evaluation half.
    fit, held = fit_shift.halves(101, seed=0)
    assert len(fit) == 51 and len(held) == 50
    assert not set(fit) & set(held) and sorted([*fit, *held]) == list(range(101))
    assert (fit[:10] != np.arange(10)).any()


def test_repair_table_shares_and_signs():
    """Per seed: base 0.9 on iid, 0.7 on the split's evaluation half, repaired 0.85: a quarter
    of a 0.2 gap is left, so 0.75 of it is closed on each seed."""
    rows, repair = [], []
    for seed, shift in enumerate((0.0, 0.01, 0.02)):
        common = {"seed": seed, "site": "k", "method": "svd", "size": 2, "breakdown": "all",
                  "jsd": 0.0}
        rows.append({**common, "split": "iid", "same_pred": 0.9 + shift / 2})
        repair.append({**common, "split": "longer", "variant": "train", "sentences": 0,
                       "same_pred": 0.7 + shift / 2 - shift})
        repair.append({**common, "split": "longer", "variant": "refit", "sentences": 16,
                       "same_pred": 0.7 + shift / 2 - shift + 0.75 * (0.2 + shift)})
    (row,) = geometry.repair_table(repair, rows, metrics=("same_pred",))
    assert (row["variant"], row["sentences"], row["n_seeds"]) == ("refit", 16, 3)
    np.testing.assert_allclose(row["share"], 0.75, atol=1e-9)
    np.testing.assert_allclose(row["gap_eval_half"], 0.21, atol=1e-9)
    assert row["n_seeds_share"] == 3 and row["seeds_positive"] == 3


@pytest.mark.parametrize(("key", "value", "message"), [
    ("enabled", 1, "geometry.enabled=1: must be true or false"),
    ("repair_sentences", (0, 4), "geometry.repair_sentences=(0, 4): must be distinct sentence"),
    ("repair_sentences", (4, 4), "geometry.repair_sentences=(4, 4): 4 is given twice"),
    ("repair_sentences", (4, 33), "geometry.repair_sentences=(4, 33): must be at most 32, the "
                                  "fit half of a split of data.num_eval=64"),
])
def test_bad_geometry_keys_are_one_line_errors(config, key, value, message):
    with config.unlocked():  # replaced, not assigned: ConfigDict refuses another type
        del config.geometry[key]
        config.geometry[key] = value
    with pytest.raises(ValueError) as err:
        validate.validate(config)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_geometry_without_an_svd_proxy_is_a_one_line_error(config):
    config.proxies.methods = ("kmeans",)
    config.geometry.enabled = True
    with pytest.raises(ValueError) as err:
        validate.validate(config)
    assert str(err.value) == ("geometry.enabled=True: needs svd or pca in proxies.methods "
                              "(now ('kmeans',))")


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_tiny_sweep_writes_geometry_and_repair(tiny_sweep, tmp_path, cache_dir):
    """Geometry and repair switched on for a finished tiny sweep: training and the proxy stages
    are reused; the new CSVs and the figure are written; a second M list recomputes only the
    moments and the repair."""
    import shutil

    from conftest import tiny_sweep_config

    workdir = str(tmp_path / "run")
    shutil.copytree(tiny_sweep, workdir)
    config = tiny_sweep_config(cache_dir)
    config.geometry.enabled = True
    config.geometry.repair_sentences = (4, 16)
    stage = os.path.join(workdir, "proxies", "00_svd_blocks.1.attn.k_rows.json")
    before = os.path.getmtime(stage)
    sweep.run(checked(config), workdir, verbose=False)
    assert os.path.getmtime(stage) == before  # the proxy evaluation was not redone

    geo = _read(os.path.join(workdir, "geometry.csv"))
    assert {r["split"] for r in geo} == {"iid", "unseen_depth", "longer"}
    assert {int(r["rank"]) for r in geo} == {1, 2, 4} and {r["seed"] for r in geo} == {"0", "1"}
    for seed in ("0", "1"):  # nested subspaces: less energy outside at a higher rank
        for split in ("iid", "unseen_depth", "longer"):
            energy = [float(r["energy_outside"]) for r in geo
                      if (r["seed"], r["split"]) == (seed, split)]
            assert 1 > energy[0] > energy[1] > energy[2] > 0, energy
    predicts = _read(os.path.join(workdir, "geometry_predicts_gap.csv"))
    assert {r["split"] for r in predicts} == {"unseen_depth", "longer"}
    assert {r["predictor"] for r in predicts} == set(geometry.QUANTITIES)
    assert {r["id_predictor"] for r in predicts} == {"iid"}
    repair = _read(os.path.join(workdir, "repair.csv"))
    assert {(r["variant"], r["sentences"]) for r in repair} == {("refit", "4"), ("refit", "16")}
    assert {r["split"] for r in repair} == {"unseen_depth", "longer"}
    assert os.path.getsize(os.path.join(workdir, "figures", "repair_svd.png")) > 10_000

    config.geometry.repair_sentences = (8,)
    sweep.run(checked(config), workdir, verbose=False)
    assert {r["sentences"] for r in _read(os.path.join(workdir, "repair.csv"))} == {"8"}
    assert os.path.getmtime(stage) == before
    # The earlier tables were kept, under superseded/.
    assert any(f == "repair.csv" for _, _, files in os.walk(os.path.join(workdir, "superseded"))
               for f in files)
