"""Parsers on verbatim strings from real `sinfo`/`squeue` output (Slurm 22.05.8, the testbed)."""

import pytest

from corral.infra.slurm.parsing import (
    controller_answered,
    parse_gres,
    parse_pending,
    parse_sinfo_nodes,
    split_state,
    split_top_level,
    state_usable,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu:nvidia_h100_80gb_hbm3:4", [("nvidia_h100_80gb_hbm3", 4)]),
        ("gpu:H100:8(S:0-1)", [("H100", 8)]),
        ("gpu:h100:8(S:0-1)", [("h100", 8)]),
        ("gpu:2", [(None, 2)]),
        ("gpu:0", [(None, 0)]),
        ("gpu:nvidia_l4:0(IDX:N/A)", [("nvidia_l4", 0)]),
        ("gpu:nvidia_h100_80gb_hbm3:2(IDX:0-1)", [("nvidia_h100_80gb_hbm3", 2)]),
        ("gpu:a100:1(IDX:0,2-3),gpu:v100:0(IDX:N/A)", [("a100", 1), ("v100", 0)]),
        ("gpu:h100:8(S:0-1),shard:h100:64", [("h100", 8)]),
        ("gpu", [(None, 1)]),
        ("(null)", []),
        ("", []),
    ],
)
def test_parse_gres(text, expected):
    assert parse_gres(text) == expected


def test_split_top_level_ignores_commas_in_parentheses():
    assert split_top_level("gpu:a:1(IDX:0,2),gpu:b:0") == ["gpu:a:1(IDX:0,2)", "gpu:b:0"]


@pytest.mark.parametrize(
    ("state", "usable"),
    [
        ("idle", True), ("mixed", True), ("allocated", True), ("completing", True),
        ("mixed-", True), ("idle~", True), ("idle#", True),
        ("drained", False), ("draining", False), ("down*", False), ("idle*", False),
        ("mixed*", False), ("down", False), ("inval", False), ("unknown*", False), ("maint", False),
        ("reserved", False), ("idle+drain", False), ("idle%", False), ("fail", False),
    ],
)
def test_state_usable(state, usable):
    assert state_usable(state) is usable


def test_split_state():
    assert split_state("down*") == ("down", "*")
    assert split_state("DRAINED") == ("drained", "")


def test_sinfo_merges_rows_of_a_node_in_several_partitions():
    text = (
        "a1|gpu*|mixed|gpu:nvidia_h100_80gb_hbm3:4|gpu:nvidia_h100_80gb_hbm3:2(IDX:0-1)|1/7/0/8|64000|1000|(null)|none\n"
        "a1|debug|mixed|gpu:nvidia_h100_80gb_hbm3:4|gpu:nvidia_h100_80gb_hbm3:2(IDX:0-1)|1/7/0/8|64000|1000|(null)|none\n"
        "a4|inference|drained|gpu:nvidia_l4:2|gpu:nvidia_l4:0(IDX:N/A)|0/0/8/8|64000|0|(null)|maintenance: bad | fan\n"
    )
    nodes, warnings = parse_sinfo_nodes(text)
    assert warnings == []
    a1, a4 = nodes
    assert a1.partitions == ("gpu", "debug")
    assert (a1.cpus_alloc, a1.cpus_total, a1.memory_alloc_mb) == (1, 8, 1000)
    assert a1.gpus[0].total == 4 and a1.gpus[0].used == 2
    assert a1.gpus_free("nvidia_h100_80gb_hbm3") == 2
    assert not a4.usable and a4.gpus_free("nvidia_l4") == 0
    assert a4.reason == "maintenance: bad | fan"  # free text, last field, may hold the separator


def test_sinfo_cpu_only_and_untyped():
    nodes, _ = parse_sinfo_nodes(
        "a3|cpu|allocated|(null)|gpu:0|16/0/0/16|64000|16000|(null)|none\nc3|debug|idle|gpu:2|gpu:0|0/8/0/8|64000|0|(null)|none\n"
    )
    assert nodes[0].gpus == ()
    assert nodes[1].gpus[0].gres_type is None and nodes[1].gpus_free(None) == 2


def test_node_with_all_cpus_allocated_has_no_free_gpus():
    nodes, _ = parse_sinfo_nodes("x1|p|allocated|gpu:h100:4|gpu:h100:1(IDX:0)|8/0/0/8|64000|8000|(null)|none\n")
    assert nodes[0].gpus_free("h100") == 0


def test_unreadable_sinfo_line_is_a_warning_not_a_crash():
    nodes, warnings = parse_sinfo_nodes("garbage\nc3|debug|idle|gpu:2|gpu:0|0/8/0/8|64000|0|(null)|none\n")
    assert [n.name for n in nodes] == ["c3"]
    assert warnings == ["unreadable sinfo line: 'garbage'"]


def test_pending_demand_per_job_node_and_task():
    # Verbatim rows from `squeue -h -t PENDING -O ...` on the testbed.
    text = (
        "1|gpu|2|2|N/A|gres:gpu:4|N/A|None\n"
        "2|gpu|1|1|gres:gpu:3|N/A|N/A|Priority\n"
        "3|gpu|2|2|N/A|gres:gpu:nvidia_h100_80gb_hbm3:2|N/A|Priority\n"
        "4|gpu,inference|1|4|N/A|N/A|gres:gpu:1|Priority\n"
        "5|inference|1|1|N/A|gres:gpu:nvidia_l4:1|N/A|JobHeldUser\n"
        "6|cpu|1|1|N/A|N/A|N/A|Resources\n"
        "7|gpu|1|1|gres/gpu:h100=2|N/A|N/A|Priority\n"  # newer Slurm spelling
    )
    demand, warnings = parse_pending(text)
    assert warnings == []
    summary = [(d.partitions, d.gres_type, d.gpus) for d in demand]
    assert summary == [
        (("gpu",), None, 8),
        (("gpu",), None, 3),
        (("gpu",), "nvidia_h100_80gb_hbm3", 4),
        (("gpu", "inference"), None, 4),
        (("inference",), "nvidia_l4", 1),
        (("gpu",), "h100", 2),
    ]


def test_controller_answered():
    assert controller_answered("Slurmctld(primary) at alpine-ctl is UP")
    assert not controller_answered("Slurmctld(primary) at cirrus-ctl is DOWN\n*****\n** RESTORE SLURMCTLD **")
    assert controller_answered("Slurmctld(primary) at a is DOWN\nSlurmctld(backup) at b is UP")
