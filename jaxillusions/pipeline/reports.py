"""The reports stage of the main job and its figures stage: results.csv, the statistics of
report/stats.py (gap_table.txt and its CSV tables), each study's lines and tables (its stage's
`report` hook), the figures and TensorBoard views of the results, then the activation figures.
Process 0 writes them.
"""

from __future__ import annotations

import os
import time

from jaxillusions import tasks
from jaxillusions.pipeline.proxy_stage import with_proxies
from jaxillusions.report import drawing, results, tables
from jaxillusions.runtime import distributed, stages, timing
from jaxillusions.studies.stage import PROXIES, Context, Stage
from jaxillusions.training import train


def _report(ctx: Context) -> Context:
    """results.csv, the statistics and tables (write_reports) with each enabled stage's report
    lines (Stage.report: the headline's, then the others at the end); process 0."""
    if not distributed.is_main():  # process 0 writes the reports
        return ctx
    config, workdir, rows = ctx.settings, ctx.directory, ctx.proxies.rows
    with stages.writing("report", os.path.join(workdir, "results.csv")):
        results.write_csv(rows, os.path.join(workdir, "results.csv"))
    drawing.stop_in_reports(workdir)
    lines: dict[bool, list[str]] = {True: [], False: []}  # headline or not -> lines
    for stage in ctx.pipeline:
        if stage.report is not None and stage.enabled(config):
            lines[stage.headline] += stage.report(ctx)
    write_reports(ctx, headline=lines[True], tail=lines[False])
    return ctx


def write_reports(ctx: Context, *, headline: list[str] | tuple = (),
                  tail: list[str] | tuple = ()) -> None:
    """Statistics (gap_table.txt and its CSV tables, report/stats.py), figures and
    TensorBoard views from the group's result rows, and baselines.csv: the task's data-only
    predictors per split (e.g. a unigram model). `headline`, `tail`: the studies' lines in
    gap_table.txt, after the headline and at the end."""
    rows, config, workdir = ctx.proxies.rows, ctx.settings, ctx.directory
    data_baselines = tasks.get(config).baselines(ctx.splits, list(config.proxies.eval_splits))
    splits = list(config.proxies.eval_splits)
    baseline = config.proxies.gap_baseline
    task = tasks.get(config)
    labelled = {b: task.bin_labels(b) for b in task.BREAKDOWNS if task.bin_labels(b)}
    text, stat_tables = tables.statistics_report(rows, splits, baseline=baseline,
                                                 evaluated=task.EVALUATED,
                                                 by_bin=labelled,
                                                 data_baselines=data_baselines,
                                                 in_distribution=task.IN_DISTRIBUTION)
    if headline:
        head, sep, rest = text.partition("\n\n")
        text = "\n".join([head, *headline]) + sep + rest
    text = "\n".join([text, *tail])
    # One group of a run whose members differ in a hyper-parameter: the summary names it.
    sweep = train.members(config)
    varying = [sweep.varying(m) for m in ctx.members]
    if varying[0]:
        kind = varying[0].get(train.NULL, "")  # trained, untrained, shuffled
        with_ = ", ".join(f"{k} {v:g}" for k, v in varying[0].items() if k != train.NULL)
        text = text.replace("SUMMARY, ", f"SUMMARY of the {kind} members".replace("  ", " ")
                            + (f" with {with_}" if with_ else "") + ", ", 1)
    if data_baselines:
        names = list(dict.fromkeys(m for b in data_baselines.values() for m in b))
        with stages.writing("report", os.path.join(workdir, "baselines.csv")):
            tables.write_csv([{"split": s, **b} for s, b in data_baselines.items()],
                             os.path.join(workdir, "baselines.csv"), ("split", *names))
    for name, table in stat_tables.items():
        columns = tables.STAT_COLUMNS.get(name, tables.BIN_GAP_COLUMNS)
        with stages.writing("report", os.path.join(workdir, f"{name}.csv")):
            tables.write_csv(table, os.path.join(workdir, f"{name}.csv"), columns)
    with stages.writing("report", os.path.join(workdir, "gap_table.txt")), \
            open(os.path.join(workdir, "gap_table.txt"), "w") as f:
        f.write(text + "\n")
    if ctx.verbose:  # the headline only; the full tables are in the file
        print(tables.summary_of(text))
        print(f"(full tables: {os.path.join(workdir, 'gap_table.txt')})")

    # Figures and TensorBoard show the same paired gaps as gaps.csv (the chosen baseline), the
    # other in-distribution split (iid_with_train) included: the control, a gap near 0.
    gaps = [g for g in stat_tables["gaps"] if g["baseline"] == baseline
            and g["split"] != baseline]
    # HPARAMS shows those at each member in place of the config's single value (e.g.
    # train.weight_decay's).
    with timing.stage("figures"):  # and the TensorBoard views
        drawing.write_views(rows, config, workdir, ctx.seeds, ctx.healthy,
                            model_cfg=ctx.model_cfg, gaps=gaps,
                            hparams={k: [v[k] for v in varying] for k in varying[0]} or None)


def _figures(ctx: Context) -> Context:
    """The activation figures (the result figures are the report's); process 0."""
    if not distributed.is_main():
        return ctx
    drawing.stop_in_reports(ctx.directory)
    drawing.write_activation_figures(ctx.params, ctx.splits, ctx.model_cfg, ctx.settings,
                                     ctx.directory, ctx.seeds, ctx.healthy)
    ctx.say(f"[{time.perf_counter() - ctx.start:.0f}s] proxies done: {ctx.directory}/results.csv, "
            f"{ctx.directory}/figures/")
    return ctx


REPORTS = Stage("reports", _report, enabled=with_proxies, keys=("proxies.*",),
                clocks=("reports", "figures"), needs=(PROXIES,), outputs=(
    "results.csv", "gap_table.txt", "gaps.csv", "proxy_vs_original.csv", "id_predicts_gap.csv",
    "min_size.csv", "baselines.csv", "gaps_by_*.csv", "identifier_gap.csv"))
# Which figures (the setting `figures`) is not an analysis key: complete_figures draws the rest.
FIGURES = Stage("figures", _figures, enabled=with_proxies, outputs=("figures",))
