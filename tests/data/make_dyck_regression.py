"""Writes tests/data/dyck_regression_results.csv (run from the repository root at commit
dfaa7c8, the code before the task interface): python tests/data/make_dyck_regression.py"""

import os
import shutil
import sys
import tempfile

sys.path[:0] = [".", "tests"]
from test_tasks import FIXTURE, regression_config  # noqa: E402

from jaxillusions.pipeline import sweep  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    sweep.run(regression_config(os.path.join(tmp, "cache")), os.path.join(tmp, "run"),
              verbose=False)
    shutil.copy(os.path.join(tmp, "run", "results.csv"), FIXTURE)
