"""Run tracking. Methods talk to `Tracker`; only `tracking.mlflow` imports mlflow."""

from distill.tracking.base import NullTracker, Tracker

__all__ = ["NullTracker", "Tracker"]
