"""The study: notebooks 01-05 executed in order (papermill) with one profile's parameters, then one HTML report.

    run_study("quick")           # ~10 min on 2 CPU cores -> runs/study-quick/report_nocode.html
    pretok study --profile quick

`steps` holds what each notebook does (so it is tested), `plots` the benchmark figures, `profiles` the
parameters, `run` the execution and the report.
"""

from .profiles import PROFILES, profile_parameters
from .run import NOTEBOOKS, run_study
from .steps import StudyPaths, resolve, study_paths

__all__ = ["NOTEBOOKS", "PROFILES", "StudyPaths", "profile_parameters", "resolve", "run_study", "study_paths"]
