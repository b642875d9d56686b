"""The probe's output, recorded verbatim from the testbed's clusters in various states."""

import pytest

from corral.errors import ClusterError, ProbeParseError, SlurmControllerError
from corral.infra.slurm.probe import parse_probe_output, probe_script
from corral.inventory import gpu_availability
from tests.conftest import FIXTURES


def fixture(name: str) -> str:
    return (FIXTURES / "probe" / f"{name}.txt").read_text()


def rows(snapshot):
    return {(r.partition, r.gres_type): (r.free, r.total, r.nodes, r.pending) for r in gpu_availability(snapshot)}


def test_busy_cluster():
    snap = parse_probe_output("alpine", fixture("alpine-busy"), 5)
    assert snap.slurm_version == "22.05.8"
    assert [p.name for p in snap.partitions] == ["gpu", "cpu", "inference"]
    assert [p.default for p in snap.partitions] == [True, False, False]
    assert snap.gpu_types == ["nvidia_h100_80gb_hbm3", "nvidia_l4"]
    # a1 has 2 of 4 in use, a2 all 4; a4 (inference) is drained; two jobs wait for 8 and 3 GPUs.
    assert rows(snap) == {
        ("gpu", "nvidia_h100_80gb_hbm3"): (2, 8, 2, 11),
        ("inference", "nvidia_l4"): (0, 2, 1, 0),
    }


def test_a_gpu_count_filters_to_where_one_node_has_that_many():
    """`corral gpus H100:8`, as `sky show-gpus H100:8`: partitions with a node of 8, busy or not."""
    from corral.inventory import filter_rows

    snap = parse_probe_output("alpine", fixture("alpine-busy"), 5)  # a1, a2: 4 H100 each; a4: 2 L4
    found = gpu_availability(snap)
    assert [r.max_per_node for r in found] == [4, 2]
    assert [r.partition for r in filter_rows(found, "h100:4")] == ["gpu"]
    assert filter_rows(found, "H100:8") == [] and [r.partition for r in filter_rows(found, "l4")] == ["inference"]


def test_draining_and_fully_used_nodes():
    snap = parse_probe_output("borealis", fixture("borealis-draining"), 5)
    assert snap.nodes[1].state == "draining" and not snap.nodes[1].usable
    assert rows(snap)[("h100-cluster", "H100")] == (0, 16, 2, 0)
    assert rows(snap)[("l40s", "l40s")] == (4, 4, 1, 0)


def test_node_not_responding():
    snap = parse_probe_output("borealis", fixture("borealis-node-down"), 5)
    assert snap.nodes[2].state == "down*" and snap.nodes[2].reason == "Not responding"
    assert rows(snap)[("l40s", "l40s")] == (0, 4, 1, 0)


def test_untyped_gres_and_empty_partition():
    snap = parse_probe_output("cirrus", fixture("cirrus-idle"), 5)
    assert [p.name for p in snap.partitions] == ["b300", "debug", "maint"]
    assert snap.partitions[2].total_nodes == 0 and snap.nodes_in("maint") == []
    assert rows(snap) == {("b300", "b300"): (16, 16, 2, 0), ("debug", None): (2, 2, 1, 0)}
    assert [r.gpu for r in gpu_availability(snap)] == ["B300", "gpu"]


def test_controller_down_is_reported_from_ping():
    with pytest.raises(SlurmControllerError, match="cirrus: Slurm controller is down: .*cirrus-ctl is DOWN"):
        parse_probe_output("cirrus", fixture("cirrus-controller-down"), 5)


def test_no_room_for_a_temporary_folder_is_said_so():
    """Recorded with /tmp mounted read-only, TMPDIR unset and an unwritable home (the probe tries
    $TMPDIR, /tmp, then the home folder): the reason, not 'the output ended early'."""
    with pytest.raises(ClusterError, match=r"^alpine: the login node has no room for a temporary folder in \$TMPDIR, "
                                           r"/tmp or the home folder \(mktemp: failed to create directory via "
                                           r"template '/proc/nonexistent/\.corral-scratch\.XXXXXX': No such file or "
                                           r"directory\); free some space there$"):
        parse_probe_output("alpine", fixture("no-scratch"), 5)


def test_login_banner_before_the_first_section_is_ignored():
    noisy = "Welcome to the cluster!\n@@corral is not a mark here\n" + fixture("cirrus-idle")
    assert len(parse_probe_output("cirrus", noisy, 5).nodes) == 3


def test_output_cut_short():
    text = fixture("cirrus-idle")
    with pytest.raises(ProbeParseError, match="ended early") as cut:
        parse_probe_output("cirrus", text[: text.index("@@corral end")], 5)
    assert "(sections: " in str(cut.value) and "ping" in str(cut.value)  # what came, to tell where it stopped
    with pytest.raises(ProbeParseError, match=r"has no controller check \(sections: end\)"):
        parse_probe_output("cirrus", "@@corral end 0\n", 5)


def test_controller_timeout_and_missing_slurm():
    timed_out = "@@corral version 0\nslurm 22.05.8\n@@corral ping 124\n\n@@corral end 0\n"
    with pytest.raises(SlurmControllerError, match="within 5s"):
        parse_probe_output("x", timed_out, 5)
    no_slurm = "@@corral version 127\nbash: sinfo: command not found\n@@corral ping 127\nbash: scontrol: command not found\n@@corral end 0\n"
    with pytest.raises(SlurmControllerError, match="Slurm commands not found"):
        parse_probe_output("x", no_slurm, 5)


def test_script_is_constant_apart_from_the_timeout():
    assert probe_script(5) == probe_script(5)
    assert "timeout 7 " in probe_script(7) and "timeout 5 " not in probe_script(7)


def test_associations_are_read_only_when_asked_and_only_when_accounting_answers():
    from corral.infra.slurm.probe import ASSOCIATIONS, Section, parse_associations

    assert "sacctmgr" not in probe_script(10) and ASSOCIATIONS in probe_script(10, associations=True)
    # Recorded on the testbed: borealis keeps accounting, alpine does not (sacctmgr still exits 0).
    assert parse_associations(Section(0, "research|normal\nresearch|high,normal\nops|")) == \
        (("ops", "research"), ("high", "normal"), [])
    accounts, qos, warnings = parse_associations(Section(0, "You are not running a supported accounting_storage "
                                                            "plugin\nOnly 'accounting_storage/slurmdbd' is supported."))
    assert (accounts, qos) == (None, None) and warnings[0].startswith("accounts and QOS unknown: sacctmgr: You are")
    assert parse_associations(None) == (None, None, [])


def test_the_home_filesystem_and_the_paths_asked_about_come_in_the_same_round_trip():
    script = probe_script(10, paths=("/datasets/imagenet", "~/data", "$USER-x"))
    assert '[ -e "$HOME/data" ] && echo \'~/data\'' in script and "stat -f -c %T \"$HOME\"" in script
    with pytest.raises(ValueError):
        probe_script(10, paths=('/x"; rm -rf ~; "',))
    recorded = (FIXTURES / "probe" / "cirrus-idle.txt").read_text()
    out = recorded.replace("@@corral ping 0", "@@corral homefs 0\nnfs4\n@@corral paths 0\n~/data\n\n@@corral ping 0")
    snapshot = parse_probe_output("cirrus", out, 5)
    assert (snapshot.home_filesystem, snapshot.home_shared, snapshot.existing_paths) == ("nfs4", True,
                                                                                      frozenset({"~/data"}))
    old = parse_probe_output("cirrus", recorded, 5)  # a probe from before: nothing known, nothing assumed
    assert (old.home_filesystem, old.home_shared, old.existing_paths) == (None, None, None)


def test_the_filesystem_of_a_path_is_that_of_its_nearest_folder_that_exists(tmp_path):
    import subprocess

    from corral.infra.slurm.probe import split_sections

    script = probe_script(10, filesystems=("$HOME/not/yet/there", "/proc"))
    block = script[script.index("pathfs"):script.index('} >"$d/static"')]
    lines = [line for line in block.splitlines() if line.startswith("p=")]
    out = subprocess.run(["bash", "-c", "\n".join(lines)], env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True).stdout
    found = dict(line.rsplit("|", 1) for line in out.splitlines())
    assert found["/proc"] == "proc" and found["$HOME/not/yet/there"]  # tmp_path's own filesystem
    assert "pathfs" in split_sections("@@corral pathfs 0\n/x|nfs\n@@corral end 0\n")


def test_a_probe_without_the_login_nodes_facts_is_read_with_those_kept_from_before():
    from corral.infra.slurm.probe import read_probe

    without = probe_script(10, facts=False, paths=("~/data",))
    assert "srun --help" not in without and "sinfo --version" not in without and "~/data" in without
    recorded = fixture("cirrus-idle")
    snapshot, kept = read_probe("cirrus", recorded, 5)
    assert set(kept) == {"version"}  # recorded before the home and the runtimes were asked for
    bare = recorded.replace("@@corral version 0\nslurm-wlm 22.05.8\n", "")
    assert bare != recorded and parse_probe_output("cirrus", bare, 5).slurm_version is None
    assert read_probe("cirrus", bare, 5, known=kept) == (snapshot, {})
