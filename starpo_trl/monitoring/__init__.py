"""Watching a run: episode metrics, echo-trap diagnostics, the collapse guard, plots and the model card."""
