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
    ],
)
def test_parse(text: str, expected: InfraSelector) -> None:
    assert parse_infra(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("slurm/a/b/c", "expected slurm"),
    ("slurm//b", "expected slurm"),
    ("", "expected slurm"),
    ("k8s/ctx", "not supported"),
])
def test_invalid(text: str, message: str) -> None:
    with pytest.raises(InvalidInfraError, match=message):
        parse_infra(text)
