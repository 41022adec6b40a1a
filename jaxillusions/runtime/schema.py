"""The results row: one schema for what faithfulness.evaluate produces, results.csv holds and the
reports read.

It sits at the bottom (with runtime) so that every layer may name the columns without importing
the layer that computes them: faithfulness makes the rows, studies and report read them, and a
reader of results.csv never imports JAX. Every other list of the row's columns is derived from
these (tests/test_architecture.py fails on a second definition).

A row is one (seed, site, method, size, split, breakdown, bin): KEYS, then its metrics. In memory
(faithfulness.evaluate) every proxy row carries both accuracies, ROW's order; in results.csv the
original model has rows of its own and each row has the one accuracy `acc` of its model, CSV's
order (see report/results.py for both directions).
"""

KEYS = ("seed", "site", "method", "size", "split", "breakdown", "bin", "n")
"""What names a row: the seed, the proxy (site, method, size), the split, the breakdown and its
bin, and n, the evaluated positions in the bin (per seed)."""

FAITHFULNESS = ("jsd", "same_pred")  # of the proxy to the original, per position
ACCURACIES = ("acc_original", "acc_proxy")  # of the original and of the proxy
POSITION_METRICS = FAITHFULNESS + ACCURACIES
"""Means over the row's positions, in the order the evaluation program sums them."""
PROPORTIONS = ("same_pred", *ACCURACIES)
"""Those that are shares of the row's n positions (JSD is a mean of bits)."""

JSD_QUANTILES = {"jsd_p95": 0.95, "jsd_p99": 0.99}
"""Quantiles of per-position JSD, on `all` rows only (NaN elsewhere)."""

DICTIONARY_METRICS = ("fvu", "l0", "dead", "ce_score", "kl_score")
"""Of vector proxies only, on `all` rows (faithfulness/dictionary_metrics.py), in the order the
evaluation program computes them."""

ROW = KEYS + POSITION_METRICS + tuple(JSD_QUANTILES)
"""An in-memory row's columns, before the dictionary metrics of the proxies that have them."""

ACC = "acc"  # results.csv: the accuracy of the row's own model (the original, or the proxy)
CSV = KEYS + (ACC,) + FAITHFULNESS
"""results.csv's first columns; any further metric columns follow in the rows' order."""

NO_SIZE = 0  # `size` of the original model and of data-independent proxies
ALL_BINS = -1  # `bin` of breakdown == "all" rows in load_results' DataFrame ("" in memory, CSV)
ORIGINAL = "original"  # `method` of the original model's rows in results.csv


def one_group(df, where: str):
    """`df` (results rows as a pandas DataFrame) as it is; a one-line ValueError naming `where`
    where two rows share a name (KEYS but n): rows of several groups of members, as
    `load_results` reads a run whose members differ in a hyper-parameter (train.null's trained
    and untrained copy of each seed), which a statistic over seeds would mix."""
    if df.duplicated([k for k in KEYS if k != "n" and k in df]).any():
        raise ValueError(f"{where}: the rows hold several groups of members (a run whose members "
                         "differ in a hyper-parameter, e.g. train.null); select one group's rows "
                         "first, e.g. df[df.null == 'trained']")
    return df
