"""Tolerant matching of GPU names to the GRES types sites actually use.

Sites spell one GPU many ways: `H100`, `h100`, `nvidia_h100_80gb_hbm3`, `h100-sxm5-80gb`. Users
write the marketing name. Matching normalises both sides to a canonical model name, token by token, so
that `H100` matches `nvidia_h100_80gb_hbm3` while `L4` never matches `L40` or `L40S`.
"""

from __future__ import annotations

import re
from functools import lru_cache

# Canonical model names, most specific first where one is a prefix of another (L40S before L40).
KNOWN_MODELS: tuple[str, ...] = (
    "GB300", "GB200", "B300", "B200", "B100",
    "GH200", "H200", "H100", "H800", "H20",
    "A100", "A800", "A40", "A30", "A10G", "A10", "A16", "A2",
    "L40S", "L40", "L20", "L4",
    "V100", "T4", "P100", "P40", "P4", "K80",
    "RTXPRO6000", "RTX6000ADA", "RTXA6000", "RTXA5000", "RTXA4000", "RTX8000", "RTX6000",
    "RTX5090", "RTX4090", "RTX3090", "RTX3080", "RTX2080TI",
    "MI355X", "MI325X", "MI300X", "MI300A", "MI250X", "MI250", "MI210", "MI100",
    "GAUDI3", "GAUDI2",
)
_VENDOR_TOKENS = {"nvidia", "amd", "tesla", "geforce", "quadro", "intel", "habana", "instinct"}
_SEPARATORS = re.compile(r"[\s_\-./]+")
_MODELS_LOWER = tuple(m.lower() for m in KNOWN_MODELS)


@lru_cache(maxsize=1024)
def normalize_gpu_name(name: str) -> str:
    """The canonical model name for a GRES type or a user's GPU name (`nvidia_h100_80gb_hbm3` → `H100`).

    Unknown names come back upper-cased with separators removed, so they still compare equal to
    themselves across sites.
    """
    tokens = [t for t in _SEPARATORS.split(name.strip().lower()) if t and t not in _VENDOR_TOKENS]
    # Each token on its own first, then joined with the next ("rtx" + "a6000").
    for i in range(len(tokens)):
        for candidate in (tokens[i], tokens[i] + (tokens[i + 1] if i + 1 < len(tokens) else "")):
            model = _model_prefix(candidate)
            if model:
                return model
    return "".join(tokens).upper() or name.strip().upper()


def _model_prefix(token: str) -> str | None:
    """A known model that `token` starts with, if the rest is not more digits (`l40` is not `l4`)."""
    for model, lower in zip(KNOWN_MODELS, _MODELS_LOWER):
        if token == lower:
            return model
        if token.startswith(lower):
            rest = token[len(lower):]
            if not rest[0].isdigit():
                return model
    return None


def gpu_matches(requested: str, gres_type: str | None) -> bool:
    """Whether a user's GPU name means this site's GRES type. Untyped GRES matches nothing named."""
    if gres_type is None:
        return False
    if requested.strip().lower() == gres_type.lower():
        return True
    return normalize_gpu_name(requested) == normalize_gpu_name(gres_type)


def accelerators_of(gres: str | None) -> str | None:
    """A node's GPUs as a task names them and `corral gpus` shows them: `L4:1` for Slurm's
    `gpu:nvidia_l4:1` or a pool's `gpu:NVIDIA L4:1`, `gpu:2` untyped; None for none; any other GRES
    as it is."""
    if not gres:
        return None
    name, _, rest = gres.partition(":")
    kind, _, count = rest.rpartition(":")
    if name != "gpu" or not count.isdigit() or "," in rest:
        return gres
    return f"{normalize_gpu_name(kind)}:{count}" if kind else f"gpu:{count}"
