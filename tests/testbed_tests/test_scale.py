"""The testbed's scale mode: many small clusters of their own, beside the main three, that Corral sees as
any others (one probe round trip each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from testbed.bed import daemons_memory_mb, scale_testbed
from testbed.spec import SCALE_GPU_TYPES
from tests.helpers import counting_ssh

COUNT = 6  # enough to rotate through every GPU spelling and wrap around


def test_scale_clusters_come_up_beside_the_main_ones_and_answer_one_probe_each(testbed, tmp_path):
    bed = scale_testbed(COUNT)
    bed.up(install_user_config=False)
    env, calls = counting_ssh(tmp_path, {**os.environ, "CORRAL_SLURM_CONFIG": str(bed.cluster_config),
                                         "CORRAL_HOME": str(tmp_path / "home")})
    try:
        assert all(all(daemons.values()) for daemons in bed.status().values())
        assert testbed.status()["alpine"]["slurmctld"]  # the main testbed is untouched
        assert 0 < daemons_memory_mb(bed) < 100 * COUNT
        shown = subprocess.run([sys.executable, "-m", "corral", "gpus", "--json"], env=env, capture_output=True,
                               text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        rows = [r for r in json.loads(shown.stdout) if r.get("total")]
        assert sorted({r["cluster"] for r in rows}) == [f"s{i:02d}" for i in range(1, COUNT + 1)]
        assert {r["gres_type"] for r in rows} == set(SCALE_GPU_TYPES)
        assert all(r["free"] == r["total"] == 4 for r in rows)
        assert sorted(calls()) == [f"s{i:02d}" for i in range(1, COUNT + 1)]  # one round trip per cluster
    finally:
        subprocess.run([sys.executable, "-m", "corral", "server", "stop"], env=env, capture_output=True)
        bed.down()
    assert not any(any(daemons.values()) for daemons in bed.status().values())
