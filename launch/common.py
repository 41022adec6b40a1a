"""Flags shared by the launchers: --config (an ml-collections file with overrides) and --workdir."""

from __future__ import annotations

import sys

from absl import flags
from ml_collections import config_flags

CONFIG = config_flags.DEFINE_config_file("config", None, "ml-collections config file.",
                                         lock_config=True)
WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and results.")


def parse(argv: list[str]):
    """Parses the flags; a bad flag or config override is a one-line error, not a traceback."""
    try:
        flags.FLAGS(argv)
    except (flags.Error, KeyError, AttributeError, ValueError, TypeError) as err:
        sys.exit(f"error: {str(err).splitlines()[0]}")
    if CONFIG.value is None or WORKDIR.value is None:
        sys.exit("error: --config and --workdir are required, e.g. "
                 "--config=configs/dyck_small.py --workdir=runs/dyck_small")
    return CONFIG.value, WORKDIR.value


def run(main) -> None:
    """Runs main(config, workdir), turning configuration errors into one-line messages."""
    config, workdir = parse(sys.argv)
    try:
        main(config, workdir)
    except ValueError as err:
        sys.exit(f"error: {err}")
