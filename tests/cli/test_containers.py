"""Containers on the testbed: the runtime found in the probe's one round trip (cirrus offers Apptainer,
here a stand-in that runs the command on the host and names the image: no real runtime can run on
these machines; alpine and borealis offer none), placement that skips clusters without one and says
so, and a task whose setup and run go through the wrapper Corral generates."""

from __future__ import annotations

TASK = """\
resources:
  image_id: docker:ubuntu:22.04
  cpus: 1
setup: echo "setup in $CORRAL_TESTBED_CONTAINER"
run: echo "run in $CORRAL_TESTBED_CONTAINER on $CORRAL_CLUSTER"
"""


def test_an_image_runs_where_a_runtime_is_and_the_plan_says_why_not_elsewhere(corral, clean_queues, tmp_path):
    task = tmp_path / "image.yaml"
    task.write_text(TASK)
    planned = corral("launch", "--dryrun", "--json", str(task))
    assert planned.exit_code == 0, planned.stderr
    rows = [r for r in planned.json() if r.get("partition")]
    for row in rows:
        if row["cluster"] == "cirrus":
            continue
        assert row["reason"] == ("image_id needs a container runtime (Pyxis, Apptainer or Singularity); "
                                 f"{row['cluster']} has none") or row["reason"].startswith("partition "), row
    assert {r["cluster"] for r in rows if r["feasible"]} == {"cirrus"}

    ran = corral("launch", str(task))
    assert ran.exit_code == 0, ran.stderr
    assert ran.stdout.splitlines()[-2:] == ["setup in ubuntu:22.04", "run in ubuntu:22.04 on cirrus"]
    # --image-id, as SkyPilot's: the image of a one-line command
    other = corral("launch", "--image-id", "docker:python:3.12-slim", "--cpus", "1", "--",
                   'echo "in $CORRAL_TESTBED_CONTAINER"')
    assert other.exit_code == 0 and other.stdout.splitlines()[-1] == "in python:3.12-slim", other.stderr
