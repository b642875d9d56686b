"""The controller's tick in-process on the real testbed: what it costs in SSH round trips."""

from __future__ import annotations

import asyncio
import subprocess

import yaml

from tests.helpers import H100_BLOCKERS, fill_h100s


def test_pending_jobs_cost_a_bounded_number_of_round_trips(corral_env, testbed):
    from corral import managed
    from corral.client import Client
    from corral.controller.engine import Controller, ControllerSettings
    from corral.state import open_store
    from corral.task import parse_task

    config = testbed.cluster_config
    try:
        fill_h100s(config)
        store = open_store()
        task = parse_task(yaml.safe_load("resources:\n  accelerators: H100:4\nrun: 'true'\n"), "test")
        managed.record(store, task, "test", 40)
        controller = Controller(Client(), store, "test", ControllerSettings(reroute_after=0, predict_interval=3600,
                                                                           submit_wait=120))
        first = asyncio.run(controller.tick())
        assert first.submitted == 40
        # Pending everywhere, nowhere can start them: each tick is one status query per cluster with jobs
        # and one probe per cluster; the first of these also predicts start times (one round trip per
        # cluster for all 40 jobs), the next does not (predict_interval). None of it grows with the jobs.
        predicting = asyncio.run(controller.tick())
        quiet = asyncio.run(controller.tick())
        clusters_with_jobs = {v.latest.cluster for v in managed.views(store) if v.latest}
        assert clusters_with_jobs <= {"alpine", "borealis"}
        for cluster in clusters_with_jobs:
            assert quiet.round_trips[cluster] == 2, quiet.round_trips  # status + probe
            assert predicting.round_trips[cluster] == 3, predicting.round_trips  # + sbatch --test-only
        assert quiet.round_trips.get("cirrus", 0) <= 1 and predicting.round_trips.get("cirrus", 0) <= 1
        assert predicting.moved == quiet.moved == 0  # the other cluster is 10 h away: no margin to move
    finally:
        for cluster in H100_BLOCKERS:
            subprocess.run(["ssh", "-F", str(config), cluster, "scancel -u corral-test"], capture_output=True)


def test_a_predicted_move_needs_a_margin_that_grows_with_the_wait():
    from corral.controller.engine import ControllerSettings

    settings = ControllerSettings()  # at least 300 s, and 20 % of the wait
    assert settings.margin(here_start=1000 + 600, now=1000) == 300  # 10 min away: 5 min sooner needed
    assert settings.margin(here_start=1000 + 3600, now=1000) == 720  # 1 h away: 12 min
    assert settings.margin(here_start=1000 + 36000, now=1000) == 7200  # 10 h away: 2 h
    assert settings.margin(here_start=900, now=1000) == 300  # an estimate already past
