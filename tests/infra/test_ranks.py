"""Rank labels on several nodes' output (corral/infra/ranks.py): as `srun --label` writes a Slurm job's log."""

from corral.infra.ranks import labelled, rank_label


def test_a_rank_s_label_is_srun_s_right_aligned_to_the_highest_rank_and_none_on_one_node():
    assert rank_label(0, 2) == b"0: " and rank_label(1, 2) == b"1: "
    assert rank_label(3, 12) == b" 3: " and rank_label(11, 12) == b"11: "
    assert rank_label(0, 1) == b""


def test_each_line_gets_the_label_an_unfinished_one_a_newline_and_a_progress_update_a_line_of_its_own():
    assert labelled(b"1: ", b"epoch 1\nepoch 2\n") == b"1: epoch 1\n1: epoch 2\n"
    assert labelled(b"1: ", b"no newline") == b"1: no newline\n"
    assert labelled(b"1: ", b"\r") == b"" and labelled(b"1: ", b"10%|#\r") == b"1: 10%|#\n"
    assert labelled(b"1: ", b"\r20%|##\r") == b"1: 20%|##\n"
    assert labelled(b"1: ", b"\n") == b"1: \n"  # an empty line stays a line
    assert labelled(b"", b"as it is\r") == b"as it is\r"
