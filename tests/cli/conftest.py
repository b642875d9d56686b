"""Fixtures shared by the CLI's integration tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
