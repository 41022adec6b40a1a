import math
import os

import numpy as np
import pytest

from jaxillusions.report import results
from jaxillusions.runtime import schema

pd = pytest.importorskip("pandas")

SPLITS = ("iid", "seen_structure", "unseen_depth", "longer")


def _rows():
    """In-memory rows as faithfulness.evaluate makes them (int bins, "" on `all` rows), splits in
    evaluation order (not alphabetical), with an extra metric column that is NaN on the
    breakdown rows."""
    rows = []
    for seed in (3, 4):
        for method, site, sizes in (("svd", "blocks.1.attn.k", (1, 2)),
                                    ("uniform_attention", "blocks.1.attn.pattern", (0,))):
            for size in sizes:
                for j, split in enumerate(SPLITS):
                    for breakdown, bin_ in (("all", ""), ("depth", 0), ("depth", 11)):
                        width = len(str(bin_))
                        rows.append({"seed": seed, "site": site, "method": method, "size": size,
                                     "split": split, "breakdown": breakdown, "bin": bin_,
                                     "n": 10 + j + width, "jsd": 0.1 * size + 0.01 * j,
                                     "same_pred": 0.9 + 0.01 * j,
                                     "acc_original": 0.5 + 0.1 * j + 0.01 * seed + width / 8,
                                     "acc_proxy": 0.4 + 0.01 * size,
                                     "jsd_p95": 0.3 if breakdown == "all" else math.nan})
    return rows


def _same(a, b):
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def test_csv_has_original_rows_and_round_trips(tmp_path):
    rows = _rows()
    path = str(tmp_path / "results.csv")
    results.write_csv(rows, path)
    with open(path) as f:
        header = f.readline().strip().split(",")
    assert header == list(schema.CSV) + ["jsd_p95"]
    back = results.read_csv(path)
    assert len(back) == len(rows)
    for a, b in zip(rows, back, strict=True):
        assert a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)


def test_write_csv_writes_what_dictwriter_writes_and_refuses_unknown_keys(tmp_path):
    """A lacking column and NaN (Python's or numpy's) are empty cells, floats their repr,
    the same text as csv.DictWriter's; a key that is not a column is an error naming the file."""
    import csv
    import io

    from jaxillusions.report import tables

    columns = ("seed", "split", "acc", "jsd", "note")
    rows = [{"seed": 0, "split": "iid", "acc": 0.1 + 0.2, "jsd": math.nan},
            {"seed": 1, "split": 'a "quoted", split', "acc": np.float64("nan"),
             "jsd": np.float64(1 / 3), "note": "x"}]
    path = str(tmp_path / "t.csv")
    tables.write_csv(rows, path, columns)
    want = io.StringIO()
    writer = csv.DictWriter(want, fieldnames=columns)
    writer.writeheader()
    writer.writerows({k: "" if isinstance(v, float) and math.isnan(v) else v
                      for k, v in r.items()} for r in rows)
    with open(path, newline="") as f:
        assert f.read() == want.getvalue()
    with pytest.raises(ValueError, match=r"bad\.csv: row keys \['extra'\] are not columns"):
        tables.write_csv([{**rows[0], "extra": 1}], str(tmp_path / "bad.csv"), columns)
    assert not os.path.exists(tmp_path / "bad.csv")


def test_load_results_types_and_original_rows(tmp_path):
    rows = _rows()
    results.write_csv(rows, str(tmp_path / "results.csv"))
    df = results.load_results(str(tmp_path), splits=SPLITS)
    assert df.dtypes.to_dict() == {
        "seed": np.dtype("int64"), "site": pd.StringDtype(), "method": df["method"].dtype,
        "size": np.dtype("int64"), "split": df["split"].dtype, "breakdown": df["breakdown"].dtype,
        "bin": np.dtype("int64"), "n": np.dtype("int64"), "acc": np.dtype("float64"),
        "jsd": np.dtype("float64"), "same_pred": np.dtype("float64"),
        "jsd_p95": np.dtype("float64")}
    assert isinstance(df["method"].dtype, pd.CategoricalDtype)
    assert df["split"].cat.ordered and list(df["split"].cat.categories) == list(SPLITS)
    assert list(df["method"].cat.categories) == ["original", "svd", "uniform_attention"]
    assert list(df["split"].sort_values().unique()) == list(SPLITS)  # evaluation order
    assert set(df.loc[df["breakdown"] == "all", "bin"]) == {results.ALL_BINS}
    assert set(df.loc[df["breakdown"] == "depth", "bin"]) == {0, 11}
    assert set(df.loc[df["method"] == "uniform_attention", "size"]) == {results.NO_SIZE}

    # One original row per (seed, split, breakdown, bin), with the original's accuracy.
    original = df[df["method"] == "original"]
    assert len(original) == 2 * len(SPLITS) * 3
    assert (original["site"] == "").all() and (original["size"] == results.NO_SIZE).all()
    assert original[["jsd", "same_pred"]].isna().all().all()
    row = original[(original.seed == 4) & (original.split == "unseen_depth")
                   & (original.breakdown == "depth") & (original.bin == 11)]
    assert row["acc"].item() == pytest.approx(0.5 + 0.2 + 0.04 + 2 / 8)
    assert row["n"].item() == 10 + 2 + 2
    proxies = df[df["method"] != "original"]
    assert len(proxies) == len(rows)
    assert proxies.loc[proxies.method == "svd", "acc"].round(6).isin([0.41, 0.42]).all()
    # A typical pivot works without hand conversion: proxy accuracy minus the original's.
    acc = df[df.breakdown == "all"].pivot_table(index=["seed", "split"], columns="method",
                                                values="acc", observed=True)
    assert list(acc.index.get_level_values("split")[:4]) == list(SPLITS)
    assert (acc["original"] - acc["uniform_attention"]).notna().all()


def test_load_results_reads_the_old_layout_and_config_order(tmp_path):
    rows = _rows()
    keys = ("seed", "site", "method", "size", "split", "breakdown", "bin", "n", "jsd",
            "same_pred", "acc_original", "acc_proxy", "jsd_p95")
    pd.DataFrame(rows, columns=list(keys)).to_csv(tmp_path / "results.csv", index=False)
    with open(tmp_path / "config.json", "w") as f:
        f.write('{"proxies": {"eval_splits": ["iid", "seen_structure", "unseen_depth", '
                '"longer"]}}')
    old = results.load_results(str(tmp_path))
    results.write_csv(rows, str(tmp_path / "new.csv"))
    new = results.load_results(str(tmp_path / "new.csv"), splits=SPLITS)
    order = list(schema.KEYS)
    pd.testing.assert_frame_equal(old.sort_values(order).reset_index(drop=True),
                                  new.sort_values(order).reset_index(drop=True))
    assert list(old["split"].cat.categories) == list(SPLITS)
    # A group directory of a contrastive-weight sweep takes the parent's config.
    os.makedirs(tmp_path / "contrastive_weight_0.5")
    results.write_csv(rows[::-1], str(tmp_path / "contrastive_weight_0.5" / "results.csv"))
    group = results.load_results(str(tmp_path / "contrastive_weight_0.5"))
    assert list(group["split"].cat.categories) == list(SPLITS)
    with pytest.raises(ValueError, match=r"splits \['longer'\] are not in"):
        results.load_results(str(tmp_path), splits=("iid", "seen_structure", "unseen_depth"))
    with pytest.raises(FileNotFoundError, match="not a jaxillusions workdir|not found"):
        results.load_run(os.path.join(str(tmp_path), "missing"))


def test_compare_runs_pairs_seeds(tmp_path):
    from benchmarks import compare_runs

    rows = _rows()
    changed = [{**r, "acc_original": r["acc_original"] + 0.05 * (r["split"] == "longer"),
                "same_pred": r["same_pred"] + 0.02 * (r["split"] == "unseen_depth")}
               for r in rows]
    for name, table in (("a", rows), ("b", changed)):
        os.makedirs(tmp_path / name)
        results.write_csv(table, str(tmp_path / name / "results.csv"))
    out = compare_runs.compare(str(tmp_path / "a"), str(tmp_path / "b"))
    acc = {r["name"]: r for r in out["accuracy"]}
    assert list(acc) == list(SPLITS) and {r["n_seeds"] for r in acc.values()} == {2}
    assert acc["longer"]["diff"] == pytest.approx(0.05)
    assert acc["iid"]["diff"] == pytest.approx(0.0)
    gaps = {r["name"]: r["diff"] for r in out["gaps"]}
    assert len(gaps) == 3 * (len(SPLITS) - 1)  # svd 1, svd 2, uniform_attention; not iid
    assert gaps["svd blocks.1.attn.k 2 unseen_depth"] == pytest.approx(-0.02)  # iid minus split
    assert gaps["uniform_attention blocks.1.attn.pattern 0 longer"] == pytest.approx(0.0)
    # A table of several groups (trained and untrained members of the same seeds) would pair a
    # seed with itself: refused, naming the groups' directories.
    grouped = tmp_path / "grouped"
    for kind in ("null_0", "null_1"):
        os.makedirs(grouped / kind)
        results.write_csv(rows, str(grouped / kind / "results.csv"))
    table = pd.read_csv(tmp_path / "a" / "results.csv", dtype=str, keep_default_na=False)
    pd.concat([table.assign(null=k) for k in ("trained", "untrained")]).to_csv(
        grouped / "results.csv", index=False)
    with pytest.raises(SystemExit, match=r"holds several groups of members; compare one "
                       r"group's directory: null_0, null_1$"):
        compare_runs.compare(str(grouped), str(tmp_path / "b"))


def test_load_results_reads_a_grids_table_with_its_keys_and_member_kinds(tmp_path):
    """A grid's results.csv adds a column per grid key and per varying hyper-parameter, the
    null kind by name. Was: ValueError, 'trained' is no number."""
    rows = _rows()
    results.write_csv(rows, str(tmp_path / "point.csv"))
    point = pd.read_csv(tmp_path / "point.csv", dtype=str, keep_default_na=False)
    joined = pd.concat([point.assign(**{"model.n_layers": layers, "null": kind})
                        for layers in ("1", "2") for kind in ("trained", "untrained")])
    joined.to_csv(tmp_path / "results.csv", index=False)
    df = results.load_results(str(tmp_path), splits=SPLITS)
    assert df["model.n_layers"].dtype == np.dtype("float64")
    assert list(df["null"].cat.categories) == ["trained", "untrained"]
    assert df.groupby(["model.n_layers", "null"], observed=True).size().tolist() == [
        len(df) // 4] * 4
    assert df["jsd_p95"].dtype == np.dtype("float64")


def test_per_seed_statistics_refuse_the_rows_of_several_groups(tmp_path):
    """load_results reads every group of a run (train.null: a trained and an untrained member
    of each seed); a statistic over seeds would pair or pool a seed with its untrained copy."""
    from jaxillusions.studies import dictionaries

    results.write_csv(_rows(), str(tmp_path / "results.csv"))
    one = results.load_results(str(tmp_path), splits=SPLITS)
    assert schema.one_group(one, "x") is one
    both = pd.concat([one.assign(null="trained"), one.assign(null="untrained")])
    with pytest.raises(ValueError, match=r"^dictionaries: the rows hold several groups of "
                       r"members .*; select one group's rows first, e.g. df\[df.null == "):
        dictionaries.equal_id(both)
    dictionaries.equal_id(both[both.null == "trained"])  # one group: as before


def test_load_results_names_a_path_that_holds_no_results(tmp_path):
    """A path that is not there, a run stopped before its results, a directory that is no run,
    a CSV that is not results.csv and a file that is no CSV: one line each, naming the path."""
    stopped, empty = tmp_path / "stopped", tmp_path / "empty"
    os.makedirs(stopped)
    os.makedirs(empty)
    (stopped / "config.json").write_text('{"proxies": {"eval_splits": ["iid"]}}')
    (tmp_path / "gaps.csv").write_text("site,method,size,split,gap\nblocks.1.attn.k,svd,1,iid,0\n")
    (tmp_path / "sweep.log").write_text("training\nstep 100, loss 1.9\nstep 200, loss 1.7, min 1\n")
    for path, error, match in [
            (tmp_path / "missing", FileNotFoundError, "missing not found: give a jaxillusions "
                                                      "workdir or the path of its results.csv"),
            (stopped, FileNotFoundError, r"stopped has no results yet \(no results.csv: its "
                                         "sweep has not finished evaluating the proxies\\); run"),
            (empty, FileNotFoundError, "empty/results.csv not found: is .*empty a jaxillusions "
                                       "workdir"),
            (tmp_path / "gaps.csv", ValueError, r"gaps.csv is not a results.csv \(no columns "
                                                r"\['seed', 'breakdown', 'bin', 'n'\]\)"),
            (tmp_path / "sweep.log", ValueError, r"sweep.log is not a results.csv \(not a CSV "
                                                 "table: Error tokenizing data")]:
        with pytest.raises(error, match=match) as raised:
            results.load_results(str(path))
        assert "\n" not in str(raised.value)


def test_a_member_not_in_the_run_is_named_as_given():
    run = results.Run(params={"w": np.zeros((3, 2))}, config=None, model_config=None,
                      splits={}, seeds=[0, 1, 2], labels=[0, 1, 2],
                      healthy=np.ones(3, bool), step=0)
    np.testing.assert_array_equal(run.seed_params(1)["w"], np.zeros(2))
    with pytest.raises(ValueError, match=r"^seed '0' is not in this run; it has seeds \[0, 1, "
                       r"2\] \(labels \[0, 1, 2\]\)$"):
        run.seed_params("0")
