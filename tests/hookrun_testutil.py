"""The toy task of the core tests, kept importable under its old name: it lives in
``hookrun.testing`` now, with the other fixtures and helpers plugin authors use."""

from __future__ import annotations

from hookrun.testing import toy_data, toy_runner_kwargs

__all__ = ["toy_data", "toy_runner_kwargs"]
