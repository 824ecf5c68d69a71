"""Analysis of training runs (docs/RUNS.md): load runs, derive numbers from metrics.jsonl, plotly figures, reports.

    from pretok_lib.analysis import load_runs, summary_table, figures, report
    runs = load_runs("runs")
"""

from .bench_tables import isolated_tokenization_speedups, storage_rows, tokenization_speedups
from .metrics import RunMetrics, all_metrics, path_speedups, precision_groups, run_metrics, scaling_efficiency, summary_table
from .series import time_to_target
from .text import rows_to_text
from .mixture import mixture_figure, mixture_rows
from .runs import Records, Run, config_signature, load_run, load_runs

__all__ = ["Records", "Run", "RunMetrics", "all_metrics", "config_signature", "isolated_tokenization_speedups",
           "load_run", "load_runs", "mixture_figure", "mixture_rows", "path_speedups", "precision_groups", "rows_to_text", "run_metrics",
           "scaling_efficiency", "storage_rows", "summary_table", "time_to_target", "tokenization_speedups"]
