import pytest

from corral.gpu_names import accelerators_of, gpu_matches, normalize_gpu_name


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("nvidia_h100_80gb_hbm3", "H100"),
        ("H100", "H100"),
        ("h100-sxm5-80gb", "H100"),
        ("H100_NVL", "H100"),
        ("h100nvl", "H100"),
        ("nvidia_l4", "L4"),
        ("l40s", "L40S"),
        ("NVIDIA-L40S-48GB", "L40S"),
        ("l40-48gb", "L40"),
        ("Tesla_V100-SXM2-16GB", "V100"),
        ("a100-sxm4-40gb", "A100"),
        ("rtx_a6000", "RTXA6000"),
        ("b300", "B300"),
        ("mi300x", "MI300X"),
        ("a10g", "A10G"),
        ("a10", "A10"),
        ("some_future_gpu", "SOMEFUTUREGPU"),
    ],
)
def test_normalize(raw: str, canonical: str) -> None:
    assert normalize_gpu_name(raw) == canonical


@pytest.mark.parametrize(
    ("requested", "gres_type", "expected"),
    [
        ("H100", "nvidia_h100_80gb_hbm3", True),
        ("h100", "H100", True),
        ("L4", "nvidia_l4", True),
        ("L4", "l40s", False),
        ("L4", "L40", False),
        ("L40", "l40s", False),
        ("L40S", "NVIDIA-L40S-48GB", True),
        ("A10", "a10g", False),
        ("A100", "a100-sxm4-80gb", True),
        ("H100", None, False),  # untyped GRES matches no named GPU
        ("gpu_x", "GPU_X", True),  # unknown names still match themselves, case-insensitively
    ],
)
def test_matches(requested: str, gres_type: str | None, expected: bool) -> None:
    assert gpu_matches(requested, gres_type) is expected


@pytest.mark.parametrize(
    ("gres", "shown"),
    [
        ("gpu:nvidia_h100_80gb_hbm3:2", "H100:2"),  # Slurm's
        ("gpu:NVIDIA L4:1", "L4:1"),  # a pool's, nvidia-smi's name
        ("gpu:4", "gpu:4"),  # untyped
        (None, None),
        ("", None),
        ("gpu:h100:2,shard:1", "gpu:h100:2,shard:1"),  # anything else as it is
        ("mps:100", "mps:100"),
    ],
)
def test_accelerators_of_a_gres_are_named_as_corral_gpus_names_them(gres: str | None, shown: str | None) -> None:
    assert accelerators_of(gres) == shown
