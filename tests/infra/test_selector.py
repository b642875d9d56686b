import pytest

from corral.errors import InvalidInfraError
from corral.infra.selector import InfraSelector, parse_infra


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("slurm", InfraSelector("slurm")),
        ("slurm/alpine", InfraSelector("slurm", "alpine")),
        ("slurm/alpine/h100-cluster", InfraSelector("slurm", "alpine", "h100-cluster")),
        ("Slurm/alpine/", InfraSelector("slurm", "alpine")),
        ("ssh/lab", InfraSelector("ssh", "lab")),
        ("k8s", InfraSelector("k8s")),
        ("k8s/kind-fake", InfraSelector("k8s", "kind-fake")),
        ("kubernetes/gke_proj_us-central1_ml", InfraSelector("k8s", "gke_proj_us-central1_ml")),  # SkyPilot's spelling
    ],
)
def test_parse(text: str, expected: InfraSelector) -> None:
    assert parse_infra(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("slurm/a/b/c", "expected slurm"),
    ("slurm//b", "expected slurm"),
    ("", "expected slurm"),
    ("aws/us-east-1", "not supported"),
    ("k8s/ctx/part", "expected slurm"),  # a context is one place
])
def test_invalid(text: str, message: str) -> None:
    with pytest.raises(InvalidInfraError, match=message):
        parse_infra(text)
