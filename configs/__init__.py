"""The experiment configs: ml-collections files for `--config=configs/<name>.py`. Each starts
from `defaults(task)` or from another config's `get_config()` and sets only the keys whose
values differ (tests/test_config_files.py fails on a key set to the value it already has)."""

from ml_collections import ConfigDict

from jaxillusions.config import settings


def defaults(task: str) -> ConfigDict:
    """Every settings key of `task` at its default (config/settings.py), in its section."""
    return ConfigDict(settings.defaults(task))
