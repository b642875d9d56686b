"""Reading job scripts and sbatch command lines the way sbatch does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.sbatch_script import (
    OPTIONS,
    ScriptError,
    array_indices,
    array_spec,
    effective,
    is_batch_script,
    read_script,
    expand_hostlist,
    split_command_line,
    wrap_script,
)
from tests.conftest import FIXTURES

CORPUS = sorted((FIXTURES / "scripts").glob("*.sh"))


def values(text: str) -> dict[str, str | None]:
    return {name: option.value for name, option in effective([], read_script(text).directives).items()}


def test_directives_end_at_the_first_command():
    text = "#!/bin/bash\n#SBATCH -N 2\n\n# a comment\n#SBATCH --time=5\necho hi\n#SBATCH --partition=never\n"
    assert values(text) == {"nodes": "2", "time": "5"}


def test_quotes_escapes_and_inline_comments_as_sbatch_splits_them():
    text = ('#!/bin/bash\n#SBATCH --job-name="two words"  # the name\n#SBATCH --comment=a\\ b -c 4 #-p x\n'
            "#SBATCH -J 'quoted#hash'\n")
    found = read_script(text).directives
    assert [(o.name, o.value) for o in found] == [("job-name", "two words"), ("comment", "a b"),
                                                  ("cpus-per-task", "4"), ("job-name", "quoted#hash")]


def test_long_short_attached_and_abbreviated_forms():
    text = "#!/bin/sh\n#SBATCH -N2 -pgpu --ntasks-per-node 4 --part=debug --exclusive -H\n"
    assert values(text) == {"nodes": "2", "partition": "debug", "ntasks-per-node": "4", "exclusive": None,
                            "hold": None}
    [nodes] = [o for o in read_script(text).directives if o.name == "nodes"]
    assert nodes.spelling == "-N" and nodes.line == 1 and text.splitlines()[1][slice(*nodes.span)] == "-N2"


def test_a_directive_line_that_is_not_sbatch_is_refused_with_its_line():
    for line, message in (("#SBATCH --gpu=1", "--gpu is ambiguous"), ("#SBATCH --frobnicate", "not an sbatch option"),
                          ("#SBATCH -N", "-N needs a value"), ("#SBATCH --hold=yes", "takes no value"),
                          ('#SBATCH -J "open', "unclosed"), ("#SBATCH partition=gpu", "not an option")):
        with pytest.raises(ScriptError, match=message) as caught:
            read_script(f"#!/bin/bash\n#SBATCH -t 5\n{line}\n", "job.sh")
        assert str(caught.value).startswith("job.sh:3")


def test_a_script_needs_its_interpreter_line():
    with pytest.raises(ScriptError, match="starts with a '#!' line"):
        read_script("#SBATCH -N 1\necho\n")
    assert not is_batch_script("echo hi\n") and not is_batch_script("#!/bin/bash\necho hi\n")
    assert is_batch_script("#!/bin/bash\n#SBATCH --bogus\n")  # still a script: reading it says what is wrong
    assert all(is_batch_script(path.read_text()) for path in CORPUS)


def test_heterogeneous_components():
    script = read_script((FIXTURES / "scripts" / "het_mem_per_cpu.sh").read_text())
    assert script.components == 2 and script.separators == (6,)
    assert effective([], script.directives, 0)["mem-per-cpu"].value == "2000M"
    assert effective([], script.directives, 1)["mem-per-cpu"].value == "500M"
    assert script.component_end(0) == 5 and script.component_end(1) == 7


def test_the_command_line_splits_like_sbatch_and_wins():
    options, words, script, args, wrap, wait, test_only = split_command_line(
        ["-p", "gpu", "--time=5", "-N2", "--exclusive", "job.sh", "-p", "x", "--", "y"])
    assert [(o.name, o.value) for o in options] == [("partition", "gpu"), ("time", "5"), ("nodes", "2"),
                                                    ("exclusive", None)]
    assert words == ["-p", "gpu", "--time=5", "-N2", "--exclusive"] and script == "job.sh"
    assert args == ["-p", "x", "--", "y"] and wrap is None and not wait
    text = "#!/bin/bash\n#SBATCH -p cpu -t 10\n"
    merged = effective(options, read_script(text).directives)
    assert merged["partition"].value == "gpu" and merged["partition"].line is None and merged["time"].value == "5"
    assert split_command_line(["--", "job.sh"])[2] == "job.sh"
    with pytest.raises(ScriptError, match="heterogeneous"):
        split_command_line(["-N1", ":", "-N2", "job.sh"])
    with pytest.raises(ScriptError, match="-y is not an sbatch option"):
        split_command_line(["-y", "job.sh"])


def test_wrap_takes_the_place_of_the_script():
    line = split_command_line(["-HN2", "--wrap", "echo a; echo b", "--wra=last", "-t", "5"])
    assert line.wrap == "last" and line.script is None and line.args == []  # the last --wrap, as getopt's
    assert line.words == ["-HN2", "-t", "5"] and [o.name for o in line.options] == ["hold", "nodes", "time"]
    assert wrap_script("echo a; echo b") == "#!/bin/sh\n# This script was created by sbatch --wrap.\n\necho a; echo b\n"
    with pytest.raises(ScriptError, match="Script arguments not permitted with --wrap"):
        split_command_line(["--wrap", "true", "job.sh"])
    with pytest.raises(ScriptError, match="--wrap needs a value"):
        split_command_line(["--wrap"])


def test_wait_is_the_clients_and_leaves_a_cluster_of_short_options_whole_otherwise():
    line = split_command_line(["-WHN", "2", "--wait", "-p", "gpu", "job.sh", "-W"])
    assert line.wait and line.words == ["-H", "-N2", "-p", "gpu"] and line.args == ["-W"] and not line.test_only
    assert split_command_line(["--test-only", "-t", "5", "job.sh"])[1:] == (["-t", "5"], "job.sh", [], None, False,
                                                                           True)
    assert [(o.name, o.value) for o in line.options] == [("hold", None), ("nodes", "2"), ("partition", "gpu")]
    assert not split_command_line(["-HN2", "job.sh"]).wait and split_command_line(["-HN2", "job.sh"]).words == ["-HN2"]


def test_array_specs():
    assert array_indices("0-6:2%2") == ((0, 2, 4, 6), "2")
    assert array_indices("1,3,5-7") == ((1, 3, 5, 6, 7), None)
    assert array_spec((1, 3, 5, 6, 7), None) == "1,3,5-7" and array_spec((4,), "2") == "4%2"
    for bad in ("5-1", "a", "0-3:0", "1%x", "0-20000"):
        with pytest.raises(ScriptError):
            array_indices(bad)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_text_is_read_or_refused_with_a_script_error(text):
    for candidate in (text, "#!/bin/bash\n" + text, "#!/bin/bash\n#SBATCH " + text):
        try:
            read_script(candidate)
        except ScriptError as exc:
            assert str(exc)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=20), max_size=8))
def test_any_command_line_is_split_or_refused_with_a_script_error(argv):
    try:
        options, words, script, args, wrap, wait, test_only = split_command_line(argv)
    except ScriptError:
        return
    assert script is None or argv[len(argv) - len(args) - 1] == script
    assert all(o.name in OPTIONS for o in options)


def test_a_hostlist_expands_as_slurm_reads_it():
    assert expand_hostlist("a1,b[1-3,07-08],rack[1-2]-n[1-2]") == [
        "a1", "b1", "b2", "b3", "b07", "b08", "rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
    assert expand_hostlist("gpu[009-011]") == ["gpu009", "gpu010", "gpu011"]  # the first bound's padding
    for bad in ("a[1-", "a[x]", "a,,b", "a[[1]]", "a[3-1]", "a]", "n[0-99999999]"):
        with pytest.raises(ScriptError):
            expand_hostlist(bad)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab01-9[],", max_size=30))
def test_any_hostlist_is_expanded_or_refused_with_a_script_error(text):
    try:
        names = expand_hostlist(text)
    except ScriptError as exc:
        assert str(exc)
        return
    assert names and all(name and "," not in name for name in names)
