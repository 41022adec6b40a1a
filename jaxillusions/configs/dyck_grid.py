"""Does interpretation predict behaviour when the models differ in depth? The held-out prediction
test on Li et al.'s design: 3 depths (a grid: one program each) x 3 weight decays x 30 seeds =
270 trained members, and their 270 untrained copies (docs/prediction.md, "A grid of depths").

    jaxillusions sweep --config=dyck_grid --workdir=runs/dyck_grid

Each depth runs in runs/dyck_grid/model.n_layers=<n> as the run that depth's config would be
alone (its own reports, figures and timing line); the grid joins their results.csv (columns
model.n_layers, weight_decay, null) and tests every member together, leaving one (depth,
weight decay) setting out at a time.

On the 2-core CPU machine (AMD EPYC, `lscpu`: AuthenticAMD family 25 model 17; data cached) the
grid took 40 min 43 s wall, its last line `time 2437 s: training 1591 s, collection 286 s,
fitting 14 s, evaluation 174 s, probes 293 s, reports 13 s, prediction 57 s` (training per depth
279 s, 580 s, 733 s). A second run, after training's packed batches and gradient rules, on the
AMD EPYC of family 26 model 2: 11 min 32 s, `time 689 s: training 425 s, collection 89 s,
fitting 9 s, evaluation 69 s, proxies 2 s, probes 67 s, reports 10 s, figures 1 s, prediction
16 s` (every verdict below held: docs/prediction.md). A third, with today's code on the AMD EPYC
of family 25 model 17 (alone, data cached): 16 min 7 s, `time 965 s: training 636 s, ...,
prediction 24 s`; every verdict held again. A fourth, the same code on the Intel Xeon of
family 6 model 207 (alone, data cached): 23 min 18 s, `time 1396 s: training 921 s, ...,
prediction 49 s`, peak memory 2.9 GB; every verdict held. What the first run showed (prediction.txt;
docs/prediction.md, "Findings on depth x weight decay"), AUROC of each member's OOD accuracy
above the median, 270 members: with depth in the grid the interpretation features lose to the
hyper-parameters under random splits (0.880 vs 0.959 on unseen_depth, 0.847 vs 0.935 on longer)
and are at chance with a setting held out (0.501, 0.535; within noise of the hyper-parameters'
0.5); the untrained copies' features predict accuracy too under random splits (0.820), since
they still tell the depth. The proxies' faithfulness predicts their own OOD gaps with a setting
held out (SVD rank 2 on unseen_depth: 0.974, +0.474 [+0.430, +0.518] over the hyper-parameters).
"""

from ml_collections import ConfigDict

from jaxillusions.configs import dyck_predict


def get_config() -> ConfigDict:
    # dyck_predict's data, model width, steps, proxies, probe and test; one learning rate.
    config = dyck_predict.get_config()
    config.train.learning_rates = ()  # train.learning_rate (3e-3, the middle one) for all

    # The depth changes the programs' shapes: one run per depth, joined by the grid.
    config.grid = ("model.n_layers=1,2,3",)
    # No per-group figures (18 groups); the test's own figure is drawn, and `jaxillusions
    # figures runs/dyck_grid/model.n_layers=<n>` draws a depth's later.
    config.figures = "none"
    return config
