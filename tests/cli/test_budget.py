"""The Slurm command budget on the testbed: with `rpc_budget` at 8 commands a minute for alpine (a burst
of 2, then one every 7.5 s), the server's probes (4 commands each: scontrol ping, sinfo, scontrol show
partition, squeue) stop once the burst is spent, `corral gpus` shows alpine as busy and says when the next slot comes, the other clusters are
not held up, and `corral server status` reports what was used. Counted, not timed."""

from __future__ import annotations

import json

from tests.helpers import counting_ssh


def test_the_budget_holds_corral_to_its_commands_a_minute(corral, corral_env, tmp_path):
    home = tmp_path / "corral-home"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(json.dumps({"clusters": {"alpine": {"rpc_budget": {"commands_per_minute": 8}}}}))
    env, calls = counting_ssh(tmp_path, {**corral_env, "CORRAL_TIMEOUT": "3"})
    try:
        answers = []
        for _ in range(3):
            gpus = corral("gpus", "--json", env=env)
            answers.append({r["cluster"]: r for r in gpus.json()})
        assert "error" not in answers[0]["alpine"]
        assert answers[1]["alpine"]["error_kind"] == "busy"  # the next slot is 15 s away; the call's timeout is 3 s
        refused = answers[2]["alpine"]
        assert refused["error_kind"] == "busy", refused
        assert "budget of 8 Slurm commands a minute there is spent" in refused["error"]
        assert "next slot comes in" in refused["error"]
        assert all("error" not in answers[2][c] for c in ("borealis", "cirrus"))  # not held up
        assert calls().count("alpine") == 1 and calls().count("borealis") == 3
        status = corral("server", "status", "--json", env=env).json()
        assert status["rpc_budget"]["alpine"]["used_last_minute"] == 4
        assert status["rpc_budget"]["alpine"]["commands_per_minute"] == 8
        assert status["rpc_budget"]["borealis"] == {"commands_per_minute": 600, "configured_per_minute": 600,
                                                    "replicas": 1, "used_last_minute": 12, "waiting": 0,
                                                    "backoff_seconds": 0.0, "busy_reason": None}
        assert "alpine: 4 of 8 Slurm commands in the last minute" in corral("server", "status", env=env).stdout
    finally:
        corral("server", "stop", env=env)
