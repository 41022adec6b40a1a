"""Does interpretation predict behaviour when the models differ in depth? The held-out prediction
test on Li et al.'s design: 3 depths (a grid: one program each) x 3 weight decays x 30 seeds =
270 trained members, and their 270 untrained copies (docs/prediction.md, "A grid of depths").

    jaxillusions sweep --config=dyck_grid --workdir=runs/dyck_grid

Each depth runs in runs/dyck_grid/model.n_layers=<n> as the run that depth's config would be
alone (its own reports, figures and timing line); the grid joins their results.csv (columns
model.n_layers, weight_decay, null) and tests every member together, leaving one (depth,
weight decay) setting out at a time. TIME: not yet measured here (see docs/prediction.md).
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
