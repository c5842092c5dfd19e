"""The import walls of architecture.md: the report path and the model's facts (config, byte accounting) import no
jax, and the `model` package names its public API without importing it eagerly.

Each check runs in a fresh interpreter: this test process has long imported jax through other tests."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runfolders import REPO

NO_JAX = "assert not any(m == 'jax' or m.startswith('jax.') or m.startswith('jaxlib') for m in sys.modules)"


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_report_path_and_model_facts_import_no_jax() -> None:
    out = _python(f"import bench.report, bench.profile.roofline, model.config, model.accounting; import sys; {NO_JAX}")
    assert out.returncode == 0, out.stderr


def test_model_facts_import_no_numpy() -> None:
    out = _python("import sys, model.config, model.accounting; assert 'numpy' not in sys.modules, 'numpy imported'")
    assert out.returncode == 0, out.stderr


def test_importing_the_model_package_imports_nothing_until_a_name_is_used() -> None:
    code = (
        f"import sys, model; {NO_JAX}; "
        "from model import ModelConfig; assert 'model.engine' not in sys.modules; "
        "from model import Engine; assert 'model.engine' in sys.modules and Engine.__module__ == 'model.engine'"
    )
    out = _python(code)
    assert out.returncode == 0, out.stderr


def test_every_public_name_resolves_and_others_raise_attribute_error() -> None:
    import model
    from model.config import PRESETS
    from model.engine import Engine

    for name in model.__all__:
        assert getattr(model, name) is not None and name in dir(model), name
    assert model.PRESETS is PRESETS and model.Engine is Engine
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        model.not_a_name  # noqa: B018
