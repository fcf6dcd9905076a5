"""Run tracking and the run folder. Methods talk to `Tracker` and `StepLog`; only
`tracking.mlflow` imports mlflow; `RunDir` is the one home of a run folder's file names."""

from distill.tracking.base import NullTracker, Tracker
from distill.tracking.rundir import RunDir, live_status
from distill.tracking.steplog import SilentLog, StepLog, StepRecord

__all__ = ["NullTracker", "RunDir", "SilentLog", "StepLog", "StepRecord", "Tracker", "live_status"]
