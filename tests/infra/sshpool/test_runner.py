"""The scripts a pool's machine runs (runner.py): what reaches the command line is checked first."""

from __future__ import annotations

import pytest

from corral.infra.sshpool import runner


def test_an_ended_ranks_env_file_is_removed_by_its_checked_token():
    assert runner.remove_env_script(["0123456789ab", "0123456789ab.1"]) == (
        'cd "$HOME" && rm -f -- .corral/runs/0123456789ab/env.sh .corral/runs/0123456789ab.1/env.sh\n')
    assert runner.remove_env_script([]) == "exit 0\n"


@pytest.mark.parametrize("bad", ["", "..", "0123456789ab/../x", "0123456789ab.x", "*", "0123456789ab\n"])
def test_anything_but_a_token_is_refused_before_a_script_is_made(bad):
    with pytest.raises(ValueError, match="not an attempt token"):
        runner.remove_env_script(["0123456789ab", bad])
