"""Fixtures and helpers for testing hookrun plugins: a pytest plugin (entry point ``pytest11``).

pytest loads this module into every session where hookrun is installed, so importing it
changes nothing: no autouse fixture, no environment change, no torch import (helpers import
torch when called). A test opts in by asking for a fixture; docs/testing.md lists them all.
``python -m hookrun.testing WORK_DIR OPTIONS_JSON`` runs :func:`resume_job` (the harness's
subprocess).
"""

from __future__ import annotations

import pytest

from hookrun.testing.conformance import (
    CONFORMANCE_CHECKS,
    check_default_settings,
    check_docs_page,
    check_no_internal_imports,
    check_plugin_conformance,
    check_settings_described,
    check_state_round_trip,
    check_works_alone,
    internal_imports,
    is_test_file,
    plugin_class,
    plugin_source_files,
)
from hookrun.testing.harness import (
    KillAt,
    NoisyData,
    RaiseAt,
    SaveEvery,
    SignalAt,
    check_kill_and_resume,
    free_port,
    kill_and_resume,
    once_per_session,
    resume_job,
    resume_task_kwargs,
    run_job,
    run_ranks,
    run_resume_job,
    toy_task,
    train_reference,
)
from hookrun.testing.isolation import (
    hookrun_isolated,
    hookrun_one_thread,
    isolated_env,
    jsonl_series,
    layered_venv,
    make_dist,
    network_guard_env,
    train_without_network,
)
from hookrun.testing.states import (
    assert_same_checkpoint,
    assert_states_equal,
    load_checkpoint,
    tensors,
)
from hookrun.testing.task import (
    TOY_TASK_SOURCE,
    LossRecorder,
    accuracy,
    make_toy_runner,
    run_cli,
    toy_data,
    toy_model,
    toy_runner_kwargs,
    two_loss_model,
    write_toy_task,
    writer_errors,
)

__all__ = [
    "pytest_configure",
    "isolated_env",
    "hookrun_isolated",
    "network_guard_env",
    "train_without_network",
    "jsonl_series",
    "hookrun_one_thread",
    "make_dist",
    "layered_venv",
    "toy_data",
    "toy_model",
    "two_loss_model",
    "LossRecorder",
    "accuracy",
    "toy_runner_kwargs",
    "make_toy_runner",
    "TOY_TASK_SOURCE",
    "write_toy_task",
    "run_cli",
    "tensors",
    "assert_states_equal",
    "assert_same_checkpoint",
    "load_checkpoint",
    "writer_errors",
    "NoisyData",
    "resume_task_kwargs",
    "KillAt",
    "SignalAt",
    "RaiseAt",
    "toy_task",
    "SaveEvery",
    "resume_job",
    "train_reference",
    "run_job",
    "once_per_session",
    "free_port",
    "run_ranks",
    "run_resume_job",
    "check_kill_and_resume",
    "kill_and_resume",
    "plugin_class",
    "check_settings_described",
    "check_docs_page",
    "check_default_settings",
    "check_works_alone",
    "check_state_round_trip",
    "plugin_source_files",
    "internal_imports",
    "is_test_file",
    "check_no_internal_imports",
    "CONFORMANCE_CHECKS",
    "check_plugin_conformance",
]


def pytest_configure(config: pytest.Config) -> None:
    """The ``timing`` marker: a test asserting wall-clock durations (sleeps, deadlines), which
    a busy neighbour can break; ``nox -s tests`` runs these alone after the parallel part."""
    config.addinivalue_line(
        "markers", "timing: asserts wall-clock durations; run without parallel neighbours"
    )
