"""The seam holds: nothing outside `corral/infra/` imports a backend's module."""

from __future__ import annotations

import ast
from pathlib import Path

import corral

SOURCE = Path(corral.__file__).parent
BACKENDS = ("corral.infra.slurm", "corral.infra.sshpool", "corral.infra.kube")


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_no_module_outside_infra_imports_a_backend():
    offenders = {}
    for path in SOURCE.rglob("*.py"):
        if (SOURCE / "infra") in path.parents:
            continue
        bad = sorted(m for m in imported_modules(path) if m.startswith(BACKENDS))
        if bad:
            offenders[str(path.relative_to(SOURCE))] = bad
    assert offenders == {}


def test_backends_do_not_import_each_other():
    """Each backend stands on the seam alone (corral/infra/__init__.py's `connect` is the one place that
    names them all)."""
    offenders = {}
    for backend in BACKENDS:
        folder = SOURCE / "infra" / backend.rsplit(".", 1)[1]
        others = tuple(b for b in BACKENDS if b != backend)
        for path in folder.rglob("*.py"):
            bad = sorted(m for m in imported_modules(path) if m.startswith(others))
            if bad:
                offenders[str(path.relative_to(SOURCE))] = bad
    assert offenders == {}


def test_the_check_would_see_an_offender(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("def f():\n    from corral.infra.slurm.jobs import parse_status\n")
    assert "corral.infra.slurm.jobs" in imported_modules(sample)
