"""The report a reader sees: the headline summary, practical significance, statistics at small
n, bounded intervals, figure panel order and split colours, TensorBoard against gaps.csv."""

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats
from test_logging import _rows

from jaxillusions.pipeline import validate
from jaxillusions.report import figures, proxy_sizes, stats, tables
from jaxillusions.tasks import dyck

SPLITS = ["iid", "unseen_depth", "longer", "iid_with_train"]


def row(seed, split, *, site="blocks.1.attn.k", method="svd", size=2, **values):
    base = {"seed": seed, "site": site, "method": method, "size": size, "split": split,
            "breakdown": "all", "bin": "", "n": 100, "jsd": 0.01, "same_pred": 0.99,
            "acc_original": 0.9, "acc_proxy": 0.9, "jsd_p95": 0.05, "jsd_p99": 0.1}
    return {**base, **values}


def hand_built():
    """4 seeds. svd on k: iid same_pred 0.95 at rank 1, 0.995 at rank 2, 1.0 at rank 4 (so rank
    2 is the smallest faithful size); at rank 2 unseen_depth is 0.10 + 0.01 * seed lower, longer
    only 0.0001 lower (below the resolution). svd on q (model order before k) comes first."""
    rows = []
    for seed in range(4):
        for site in ("blocks.1.attn.k", "blocks.1.attn.q"):
            for size, iid in ((1, 0.95), (2, 0.995), (4, 1.0)):
                drop = {"iid": 0.0, "iid_with_train": 0.0, "longer": 0.0001,
                        "unseen_depth": 0.10 + 0.01 * seed}
                for split in SPLITS:
                    rows.append(row(seed, split, site=site, size=size,
                                    same_pred=iid - drop[split] * (size < 4),
                                    acc_original=0.9 - 0.2 * (split == "unseen_depth")))
    return rows


def test_headline_on_a_hand_built_table():
    text, _ = tables.statistics_report(hand_built(), SPLITS,
                                       in_distribution=dyck.IN_DISTRIBUTION)
    head = tables.summary_of(text).splitlines()
    assert len(head) <= tables.HEADLINE_LINES and text.startswith("\n".join(head))
    assert head[0].startswith("SUMMARY, 4 seeds.")
    assert "iid 0.900 [0.900,0.900]" in head[2] and "unseen_depth 0.700 [0.700,0.700]" in head[2]
    # Rank 2 on blocks.1.attn.q (first in model order): unseen_depth gap 0.115 = mean of
    # 0.10..0.13, t interval 0.115 ± t3 * s / 2, flagged; longer 0.0001: below the resolution.
    gaps = np.array([0.10, 0.11, 0.12, 0.13])
    half = scipy.stats.t.ppf(0.975, 3) * gaps.std(ddof=1) / 2
    svd = next(line for line in head if line.startswith("svd q 2 (0.995)"))
    assert f"+0.115 [{0.115 - half:+.3f},{0.115 + half:+.3f}]*" in svd
    assert svd.endswith("+0.000 (in every seed)")  # longer: the same in all, no star
    assert ("svd on blocks.1.attn.q at size 2 is less faithful than on iid on unseen_depth "
            "(4/4 seeds); no gap beyond ±0.001 shown on longer.") in head
    # The full tables: methods as configured, sites in model order (q before k), sizes up.
    table = text[text.index("Generalization gap in same_pred"):]
    lines = [x for x in table.splitlines()[3:9]]
    assert [x.split()[1:3] for x in lines] == [["blocks.1.attn.q", s] for s in "124"] + [
        ["blocks.1.attn.k", s] for s in "124"]


def test_rounding_level_gaps_are_not_flagged_and_exact_zero_is_exact():
    rows = []
    for seed in range(4):
        rows += [row(seed, "iid", same_pred=0.5, jsd=0.01),
                 row(seed, "longer", same_pred=0.5, jsd=0.01 + 1e-9 * (seed + 1))]
    text, tabs = tables.statistics_report(rows, ["iid", "longer"])
    jsd = next(g for g in tabs["gaps"] if g["metric"] == "jsd")
    assert jsd["ci_low"] > 0  # excludes 0 ...
    assert stats.verdict(jsd) == 0  # ... by less than the resolution: not flagged
    assert "[+0.0000,+0.0000]*" not in text and "+0.0000 [+0.0000,+0.0000] " in text
    assert "0 (exact)" in text  # same_pred: every seed's gap is exactly 0
    assert "resolution" in text


def test_exact_spearman_p_at_four_seeds():
    x = np.array([0.1, 0.2, 0.3, 0.4])
    rho, low, high, p = stats.spearman_interval(x, 2 * x)
    assert rho == 1 and p == pytest.approx(2 / 24)  # 2 of 24 pairings have |rho| = 1
    assert math.isnan(low) and math.isnan(high)  # no bootstrap at 4 seeds
    assert stats.spearman_p(x, -x) == pytest.approx(2 / 24)


def test_proportion_intervals_stay_in_unit_interval():
    rows = []
    for seed in range(4):
        for split, v in (("iid", 1.0), ("longer", 0.0), ("shuffled", float(seed % 2)),
                         ("x", [1.0, 1.0, 1.0, 0.2][seed])):
            rows.append(row(seed, split, same_pred=v, acc_original=v, acc_proxy=v, jsd=v))
    agg = tables.aggregate(rows)
    for (*_, split, _), values in agg.items():
        for metric in ("same_pred", "acc_original", "acc_proxy", "jsd"):
            mean, low, high, n = values[metric]
            assert 0 <= low <= mean <= high <= 1 and n == 4, (split, metric, values[metric])
    assert agg[("blocks.1.attn.k", "svd", 2, "iid", "")]["same_pred"][:3] == (1, 1, 1)
    assert agg[("blocks.1.attn.k", "svd", 2, "longer", "")]["same_pred"][:3] == (0, 0, 0)
    for mean, low, high in tables.original_accuracy(rows).values():
        assert 0 <= low <= mean <= high <= 1


def _sites_rows():
    """_rows with three sites, given in an order other than the model's."""
    rows = []
    for site in ("blocks.1.attn.q+blocks.1.attn.k", "blocks.1.attn.k", "blocks.1.attn.q"):
        rows += [{**r, "site": site} for r in _rows(splits=("iid", "iid_with_train",
                                                            "unseen_depth", "longer"))
                 if r["method"] != "onehot_attention"]
    return rows


def test_panel_order_and_split_colours_are_the_same_in_every_figure():
    from matplotlib.colors import to_hex

    from jaxillusions.report import figures

    splits = ("iid", "iid_with_train", "unseen_depth", "longer")
    rows = _sites_rows()
    gaps = [g for g in stats.gaps(rows, metrics=("same_pred", "jsd"))
            if g["split"] not in dyck.IN_DISTRIBUTION]
    model_order = ["blocks.1.attn.q", "blocks.1.attn.k", "blocks.1.attn.q+blocks.1.attn.k"]
    colours: dict[str, set] = {}
    for fig in (figures.faithfulness_curves(rows, "svd", splits),
                figures.gap_vs_size(gaps, "svd", splits),
                figures.gap_vs_size(gaps, "kmeans", splits)):
        titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
        assert titles == model_order
        for container in fig.axes[0].containers:
            colours.setdefault(container.get_label(), set()).add(
                to_hex(container.lines[0].get_color()))
        assert "\n" not in fig._suptitle.get_text()  # titles on one line
    assert set(colours) == set(splits)
    assert all(len(c) == 1 for c in colours.values()), colours
    assert len({next(iter(c)) for c in colours.values()}) == len(splits)  # distinguishable
    # Where each panel is one split, the lines are the original and the sizes: never in a
    # split's colour (iid's black excepted, which is the original's).
    by_depth = figures.accuracy_by_depth(rows, "blocks.1.attn.k", "svd", splits, max_depth=1)
    drawn = {to_hex(c.lines[0].get_color()) for c in by_depth.axes[0].containers}
    assert len(drawn) > 2 and not drawn & {to_hex(c) for c in figures.OKABE_ITO[1:]}, drawn


def test_tensorboard_headline_reproduces_gaps_from_results_csv(tmp_path):
    """Through results.csv: the Headline cards are the paired gaps (stats.gaps) of the
    headline's proxies, one point each, with the interval and seed count in the card's
    description, and TEXT holds the report's headline."""
    from tensorboard.backend.event_processing import event_accumulator

    from jaxillusions.configs import dyck_small
    from jaxillusions.report import board, results
    from jaxillusions.runtime import tensorboard as log_lib
    from jaxillusions.runtime.tensorboard import SweepWriter, read_scalars

    splits = ("iid", "unseen_depth", "longer")
    config = dyck_small.get_config()
    config.proxies.eval_splits = splits
    config = validate.parse(config)
    # Gaps that differ by seed (each seed's own offset cancels in _rows' paired gaps).
    rows = [{**r, "same_pred": r["same_pred"] - 0.002 * r["seed"] * (r["split"] != "iid")}
            for r in _rows()]
    results.write_csv(rows, str(tmp_path / "results.csv"))
    back = results.read_csv(str(tmp_path / "results.csv"))
    text, stat_tables = tables.statistics_report(back, list(splits),
                                                 in_distribution=dyck.IN_DISTRIBUTION)
    gaps = [g for g in stat_tables["gaps"] if g["baseline"] == "iid"]
    with SweepWriter(str(tmp_path / "tb"), seeds=[0, 1, 2]) as w:
        board.write_all(w, back, config, None, board.Sessions([0, 1, 2], [True] * 3),
                        str(tmp_path), gaps=gaps, report=text)
    runs = read_scalars(str(tmp_path / "tb"))
    by_key = {(g["method"], g["site"], g["size"], g["split"]): g for g in gaps
              if g["metric"] == "same_pred"}
    proxies = board.headline_proxies(gaps, back)
    assert [p[:3] for p in proxies] == [("svd", "blocks.1.attn.k", 16),
                                        ("kmeans", "blocks.1.attn.k", 8),
                                        ("onehot_attention", "blocks.1.attn.pattern", 0)]
    for i, (method, site, size, _) in enumerate(proxies, 1):
        for split in ("unseen_depth", "longer"):
            g = by_key[(method, site, size, split)]
            tag = log_lib.headline_tag(i, method, site, size, split)
            assert runs[f"split/{split}"][tag] == [
                (config.train.num_steps, pytest.approx(g["gap"], abs=1e-7))]  # float32
            acc = event_accumulator.EventAccumulator(str(tmp_path / "tb" / "split" / split))
            acc.Reload()
            note = acc.SummaryMetadata(tag).summary_description
            assert (f"95% t interval [{g['ci_low']:+.4f}, {g['ci_high']:+.4f}] over "
                    f"{g['n_seeds']} seeds" in note), note
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb" / "report"))
    acc.Reload()
    summary = acc.Tensors(log_lib.SUMMARY_TAG)[0].tensor_proto.string_val[0].decode()
    assert summary.replace("\n    ", "\n").strip() == tables.summary_of(text)


def test_key_projections_for_several_healthy_seeds():
    from types import SimpleNamespace

    from jaxillusions.configs import dyck_small

    rng = np.random.default_rng(0)
    config = dyck_small.get_config()
    k = config.data.num_types
    tokens = rng.integers(3, 3 + 2 * k, (20, 12))
    split = SimpleNamespace(tokens=tokens, lengths=np.full(20, 12), depth=rng.integers(0, 5,
                                                                                       (20, 12)))
    shown = [1, 3, 5, 7]

    def run(batch, site):  # [S, B, T, T] patterns or [S, B, T, heads, F] keys
        if site.endswith("pattern"):
            return rng.random((len(shown), batch.shape[0], 1, 12, 12))
        return rng.normal(size=(len(shown), batch.shape[0], 12, 1, 8))

    plots = dyck.activation_plots(run, {"iid": split, "train": split}, config.data, shown,
                                  "blocks.1.attn.pattern", "blocks.1.attn.k")
    figs = {name: getattr(figures, kind)(*args) for name, (kind, args) in plots.items()}
    assert set(figs) == {"attention_patterns", "key_projection_seed1", "key_projection_seed3",
                         "key_projection_seed5"}
    assert "seed 3" in figs["key_projection_seed3"]._suptitle.get_text()


def test_headline_never_offers_the_original_model_itself():
    """A full-rank proxy (the original model: same predictions, JSD 0) is faithful by
    construction; the headline takes the largest other size, marked 'never 0.99'."""
    rows = []
    for seed in range(3):
        for split in ("iid", "longer"):
            rows.append(row(seed, split, site="blocks.1.attn.q", size=2,
                            same_pred=0.95 - (0.05 + 0.01 * seed) * (split == "longer")
                            - 0.01 * seed))
            rows.append(row(seed, split, site="blocks.1.attn.q", size=4, same_pred=1.0, jsd=0.0))
    assert tables.identical_sizes(rows) == {("svd", "blocks.1.attn.q"): {4}}
    head = tables.summary_of(tables.statistics_report(rows, ["iid", "longer"])[0]).splitlines()
    assert any(line.startswith("svd q 2 (0.940, never 0.99)") and "+0.060 [+0.035,+0.085]*"
               in line for line in head), head


def test_a_family_that_is_the_original_at_every_size_is_named_in_the_headline():
    """Was: left out of the summary without a word, and with it the method's other sites:
    svd on k, faithful at size 2, went unshown because svd's first site, q, had no size to
    offer."""
    rows = []
    for seed in range(3):
        for split in ("iid", "longer"):
            rows.append(row(seed, split, site="blocks.1.attn.k", size=2,
                            same_pred=0.995 - 0.03 * (split == "longer") - 0.001 * seed))
            for size in (4, 8):
                rows.append(row(seed, split, site="blocks.1.attn.q", size=size, same_pred=1.0,
                                jsd=0.0))
    head = tables.summary_of(tables.statistics_report(rows, ["iid", "longer"])[0]).splitlines()
    assert ("The original model itself at every size, so no gap to show (the same predictions, "
            "accuracy and JSD): svd on blocks.1.attn.q at size 4, 8.") in head, head
    assert any(line.startswith("svd k 2 (0.994)") for line in head), head
    alone = [r for r in rows if r["site"] == "blocks.1.attn.q"]
    head = tables.summary_of(tables.statistics_report(alone, ["iid", "longer"])[0]).splitlines()
    assert head[-2].endswith("svd on blocks.1.attn.q at size 4, 8."), head


def test_a_split_more_faithful_than_the_baseline_is_not_called_no_gap():
    """Was: "no gap beyond ±0.001 shown on any OOD split" for a row whose longer gap was
    significantly negative (-0.010 [-0.014,-0.006]*): every split not flagged positive went
    into the no-gap list."""
    rows = [row(seed, split, site="blocks.1.attn.q", size=2,
                same_pred=0.95 + (0.01 + 0.001 * seed) * (split == "longer") - 0.001 * seed
                - (0.05 + 0.001 * seed) * (split == "unseen_depth"))
            for seed in range(3) for split in ("iid", "unseen_depth", "longer")]
    head = tables.summary_of(tables.statistics_report(
        rows, ["iid", "unseen_depth", "longer"])[0]).splitlines()
    assert ("svd on blocks.1.attn.q at size 2 is less faithful than on iid on unseen_depth "
            "(3/3 seeds); more faithful than on iid on longer (3/3 seeds not positive).") in head
    alone = [r for r in rows if r["split"] != "unseen_depth"]
    head = tables.summary_of(tables.statistics_report(alone, ["iid", "longer"])[0]).splitlines()
    assert ("svd on blocks.1.attn.q at size 2 is more faithful than on iid on longer (3/3 seeds "
            "not positive).") in head, head


def test_sae_size_codes_read_as_width_and_k_in_the_tables():
    """Was: "sae resid_mid 800128" in the summary and the gap table, where the docs write
    w128k8: the code k * 100000 + width of several sae_k (proxies/sae.py), decoded by
    sae.width_and_k."""
    from jaxillusions.proxies import sae

    code = sae.size_code(128, 8)
    rows = [row(seed, split, site="blocks.0.resid_mid", method=method, size=size,
                same_pred=0.95 - (0.03 + 0.001 * seed) * (split == "longer") - 0.001 * seed)
            for seed in range(3) for split in ("iid", "longer")
            for method, size in (("sae", code), ("transcoder", code), ("svd", 8))]
    text, _ = tables.statistics_report(rows, ["iid", "longer"])
    head = tables.summary_of(text).splitlines()
    assert any(line.startswith("sae resid_mid w128k8 (0.949, never 0.99)") for line in head)
    assert any(line.startswith("svd resid_mid 8 (0.949") for line in head)  # a plain size
    assert "sae on blocks.0.resid_mid at size w128k8 is less faithful" in text
    table = tables.gap_table(stats.gaps(rows), ["longer"])
    assert re.search(r"transcoder +blocks.0.resid_mid +w128k8 ", table), table
    assert str(code) not in text + table
    # The smallest faithful size per seed (was "lower median 400064  200064:1 400064:1").
    wide = sae.size_code(64, 4)
    rows = [row(seed, split, site="blocks.0.resid_mid", method="sae", size=size,
                same_pred=0.995 if size == (code if seed else wide) else 0.9)
            for seed in range(2) for split in ("iid", "longer") for size in (code, wide)]
    lines = [line for line in tables.statistics_report(rows, ["iid", "longer"])[0].splitlines()
             if line.startswith("  sae ")]
    assert len(lines) == 2 and all(re.search(r"lower median +w64k4  w64k4:1 w128k8:1$", line)
                                   for line in lines), lines
    # Several k: the sparsest dictionary that reaches 0.99, then the narrowest (the docs).
    both = [row(0, "iid", method="sae", size=size, same_pred=0.995)
            for size in (sae.size_code(32, 8), wide)]
    assert [r["min_size"] for r in stats.min_sizes(both)] == [wide]
    # The console's line per family, as the tables write them (was "sizes [800128]").
    assert proxy_sizes.listed("sae", (sae.size_code(64, 4), code)) == "[w64k4, w128k8]"
    assert proxy_sizes.listed("svd", (1, 8)) == "[1, 8]"
    assert proxy_sizes.listed("uniform_attention", (0,)) == "[0]"


def test_a_one_seed_headline_says_why_it_has_no_interval():
    """Was: "SUMMARY, 1 seeds." over cells of "+0.050 [+nan,+nan]", with no word on why."""
    rows = [row(0, split, site="blocks.1.attn.q", size=2,
                same_pred=0.995 - 0.05 * (split == "longer")) for split in ("iid", "longer")]
    head = tables.summary_of(tables.statistics_report(rows, ["iid", "longer"])[0]).splitlines()
    assert head[0].startswith("SUMMARY, 1 seed, so no interval over seeds (nan: it takes 2 or "
                              "more). Gap = "), head[0]
    assert ("svd on blocks.1.attn.q at size 2: no gap beyond ±0.001 shown on any OOD split (1 "
            "seed).") in head, head


def test_headline_labels_longer_than_the_column_do_not_run_into_the_gap():
    """Was: "transcoder out 16 (0.260, never 0.99)-0.012": a label longer than the column."""
    rows = [row(seed, split, site="blocks.1.mlp.out", method="transcoder", size=16,
                same_pred=0.26 - 0.01 * (split == "longer") - 0.01 * seed)
            for seed in range(3) for split in ("iid", "longer")]
    head = tables.summary_of(tables.statistics_report(rows, ["iid", "longer"])[0]).splitlines()
    (line,) = [line for line in head if line.startswith("transcoder out 16")]
    assert line.startswith("transcoder out 16 (0.250, never 0.99) +0.010"), line  # seed mean


def test_a_size_just_under_faithful_does_not_read_as_faithful():
    """Was: "kmeans q 64 (0.990, never 0.99)", a seed mean of 0.98956 rounded up to the
    threshold it did not reach."""
    rows = [row(seed, split, site="blocks.1.attn.q", method="kmeans", size=64,
                same_pred=0.9897 + 0.0002 * seed - 0.02 * (split == "longer"))
            for seed in range(3) for split in ("iid", "longer")]
    head = tables.summary_of(tables.statistics_report(rows, ["iid", "longer"])[0]).splitlines()
    (line,) = [line for line in head if line.startswith("kmeans q 64")]
    assert line.startswith("kmeans q 64 (0.9899, never 0.99)"), line


def test_headline_wraps_the_accuracy_line_between_splits():
    splits = ["iid", "seen_structure", "unseen_structure", "unseen_depth", "longer",
              "iid_with_train"]
    accuracy = {s: (0.9, 0.85, 0.95) for s in splits}
    empty = dict.fromkeys(("gaps", "proxy_vs_original", "id_predicts_gap"), [])
    lines = [line for line in tables.headline(empty, accuracy, splits, [])
             if line.startswith("  ")]  # the accuracy line(s)
    assert len(lines) > 1  # wider than one line
    assert all(line.rstrip(",").endswith("]") for line in lines), lines
    assert ", ".join(line.strip().rstrip(",") for line in lines).count("[") == len(splits)


def test_gap_table_is_the_same_under_every_string_hash_seed(tmp_path):
    """Was: circuit families of one ablation (circuit.edge.mean, circuit.node.mean) tie on
    site_key, and gap_table.txt listed them in the order of a set of strings, which follows the
    process's string hashing: a resumed run and a rewrite of the reports gave other row orders."""
    rows = [row(seed, split, site=f"circuit.{g}.mean", method="circuit", size=size,
                same_pred=0.9 - 0.01 * seed - 0.05 * (split == "longer") - 0.001 * i)
            for seed in range(3) for split in ("iid", "longer")
            for i, g in enumerate(("edge", "node", "neuron")) for size in (1, 4)]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    code = ("import json, sys; from jaxillusions.report import tables; "
            f"sys.stdout.write(tables.statistics_report(json.load(open({str(path)!r})), "
            "['iid', 'longer'])[0])")
    texts = {seed: subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                                  env={**os.environ, "PYTHONHASHSEED": seed}).stdout
             for seed in ("0", "1", "2", "3")}
    assert b"circuit.neuron.mean" in texts["0"]
    assert len(set(texts.values())) == 1


@pytest.mark.parametrize("splits", [["iid", "longer"],
                                    ["iid", "seen_structure", "unseen_structure",
                                     "unseen_depth", "longer", "iid_with_train", "deeper"]])
def test_a_headline_of_many_methods_names_those_left_out_and_keeps_its_last_lines(splits):
    """Was: the first 5 methods and nothing on the others, and the headline cut at 15 lines,
    which dropped its last (the proxy against the original model's accuracy) at 5 methods."""
    methods = ("svd", "kmeans", "pca", "sae", "transcoder", "logit_lens", "erasure")
    rows = [row(seed, split, method=method, size=2, acc_proxy=0.9 - 0.01 * i,
                same_pred=0.995 - 0.01 * seed - (split != "iid") * (0.02 + 0.005 * ((seed * 7
                                                                               + i) % 4)))
            for seed in range(4) for split in splits for i, method in enumerate(methods)]
    head = tables.summary_of(tables.statistics_report(rows, splits)[0]).splitlines()
    assert len(head) <= tables.HEADLINE_LINES
    shown = [m for m in methods
             if any(line.startswith(f"{m} on blocks.1.attn.k") for line in head)]
    assert shown == list(methods[:len(shown)]) and 1 <= len(shown) <= 5
    assert head[-3] == (f"(and {len(methods) - len(shown)} more methods in the full tables: "
                        f"{', '.join(methods[len(shown):])})")
    # One left out: "method", no "s".
    six = [r for r in rows if r["method"] in methods[:6]]
    head = tables.summary_of(tables.statistics_report(six, splits)[0]).splitlines()
    assert len(head) <= tables.HEADLINE_LINES
    assert any(re.fullmatch(r"\(and \d+ more methods? in the full tables: .*\)", line)
               for line in head), head
    assert head[-2].startswith("ID faithfulness predicting the gap")
    assert head[-1].startswith("The proxy beats the original model's accuracy")


def test_the_headline_sets_the_models_own_accuracy_beside_id_faithfulness():
    """The headline's line on ID faithfulness predicting the gap names, beside its count, the
    count for the skeptic's baseline (the original model's accuracy on the predictor split, no
    proxy) and for faithfulness beyond it (partial), the counts those of id_predicts_gap.csv;
    the full table gives each line's model and partial rho and p. Without seed-to-seed
    variation in that accuracy, the baseline is left out."""
    splits = ["iid", "unseen_depth", "longer", "iid_with_train"]

    def rows(acc):
        return [row(seed, split, size=size, acc_original=acc(seed),
                    same_pred=0.99 - (split in ("unseen_depth", "longer")) * 0.002 * seed
                    * size - (split == "iid_with_train") * 0.001 * seed)
                for seed in range(8) for split in splits for size in (1, 2)]

    text, t = tables.statistics_report(rows(lambda seed: 0.9 + 0.01 * seed), splits,
                                       in_distribution=dyck.IN_DISTRIBUTION)
    line = next(line for line in tables.summary_of(text).splitlines()
                if line.startswith("ID faithfulness predicting the gap"))
    same = [c for c in t["id_predicts_gap"] if c["metric"] == "same_pred"]
    model = sum(c["p_model"] < 0.05 for c in same)
    assert model == len(same) == 4  # the gap grows with the seed, as the accuracy does
    assert all(c["rho_model"] == pytest.approx(1.0) for c in same)
    assert line.endswith(f"; the original model's own accuracy on iid_with_train, no proxy: "
                         f"{model} of {len(same)}.")
    assert all(c["rho"] == pytest.approx(-1.0) and c["p_value"] < 0.05 for c in same)
    assert text.count("model rho +1.00 p 0.000") == len(same)  # each listed line
    # An accuracy that follows the seeds only in part: the partial correlation is defined,
    # and its count closes the line.
    text, t = tables.statistics_report(rows(lambda seed: 0.9 + 0.01 * ((3 * seed) % 8)),
                                       splits, in_distribution=dyck.IN_DISTRIBUTION)
    line = next(line for line in tables.summary_of(text).splitlines()
                if line.startswith("ID faithfulness predicting the gap"))
    same = [c for c in t["id_predicts_gap"] if c["metric"] == "same_pred"]
    assert all(np.isfinite(c["rho_partial"]) for c in same)
    assert line.endswith(f"; faithfulness beyond that accuracy (partial): "
                         f"{sum(c['p_partial'] < 0.05 for c in same)} of {len(same)}.")
    assert text.count("  partial rho ") == sum(c["p_value"] < 0.05 for c in same)
    text, t = tables.statistics_report(rows(lambda seed: 0.9), splits,
                                       in_distribution=dyck.IN_DISTRIBUTION)
    assert "no proxy" not in text and "model rho" not in text
    assert all(math.isnan(c["rho_model"]) for c in t["id_predicts_gap"])
