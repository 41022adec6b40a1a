"""Analysis of finished runs: tables, figures, and results as data (`load_results`, `load_run`)."""

from jaxillusions.report.results import ALL_BINS, NO_SIZE, ORIGINAL, Run, load_results, load_run

__all__ = ["ALL_BINS", "NO_SIZE", "ORIGINAL", "Run", "load_results", "load_run"]
