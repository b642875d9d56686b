"""Property: no argument list, for any command, ends in a traceback. Each ends with exit 0, or with
one `corral: error:` line and a non-zero exit (a command's own report, such as `check`'s table of
failed clusters, may come before it). The clusters refuse connections at once, so every command
runs its whole path without a testbed."""

from __future__ import annotations

import json

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.cli.main import EXIT_INTERNAL, cli
from tests.helpers import run_cli

# Commands that start the background controller on valid input are left out: `jobs launch`,
# `jobs cancel` and `server start` (their argument handling is `launch`'s and `cancel`'s), and so is
# `sbatch --managed` without `--dryrun` (`dry_managed`): the managed job it records stays PENDING while
# the clusters refuse, and a later `jobs logs` would follow it for ever, as it should.
COMMANDS = [["check"], ["gpus"], ["launch"], ["queue"], ["logs"], ["cancel"], ["exec"], ["ssh"], ["status"],
            ["down"], ["schema"], ["jobs", "queue"], ["jobs", "logs"], ["jobs", "events"], ["jobs", "why"],
            ["server", "status"], []]
VALUES = ["--", "-", "H100:8", "0", "-1", "100000000", "1e400", "nan", "slurm/alpine", "slurm/nope/x", "k8s/a",
          "A=1", "=", "CORRAL_X=1", "PATH", "c-", "c-0", "task.yaml", "missing.yaml", "bad.yaml", "latin1.yaml",
          "/", "", " ", "\n", "x\ny", "-esh -c 'touch /tmp/p' #", "--help", "é", "4:00:00", "dev", "all"]


def flags(path: list[str]) -> list[str]:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return [opt for param in command.params for opt in getattr(param, "opts", []) if opt.startswith("-")]


def argv_for(path: list[str]) -> st.SearchStrategy[list[str]]:
    words = st.one_of(st.sampled_from(flags(path) or ["--help"]), st.sampled_from(VALUES), st.text(max_size=12))
    return st.lists(words, max_size=8).map(lambda rest: [*path, *rest])


def with_values(path: list[str], targets: list[list[str]]) -> st.SearchStrategy[list[str]]:
    """Well-formed shapes (each flag with a value where it takes one), so that parsing succeeds and the
    values reach the task model, placement and the probe."""
    command: click.Command = cli
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    options = [p for p in command.params if isinstance(p, click.Option)]
    pair = st.sampled_from(options).flatmap(
        lambda o: st.just([o.opts[0]]) if o.is_flag else st.sampled_from(VALUES).map(lambda v: [o.opts[0], v]))
    return st.builds(lambda pairs, target: [*path, *sum(pairs, []), *target],
                     st.lists(pair, max_size=5), st.sampled_from(targets))


TARGETS = [["task.yaml"], ["bad.yaml"], ["--", "echo", "hi"], ["--", "true"], []]
# Not --workdir: its handling is launch's, fuzzed above (`--workdir /` is refused: it holds the temporary
# folder, where packing writes).
SBATCH_WORDS = ["--dryrun", "--managed", "--json", "--infra", "--env", "-p", "gpu", "-N", "2", "-M", "x",
                "--gres=gpu:h100:2", "--array=0-3:x", "-d", "afterok:c-0123abcd", "--dependency=afterok:7", ":",
                "--bogus", "-q", "--wrap", "--partition=a b", "job.sh", "badjob.sh", "missing.sh", "task.yaml"]
sbatch_argvs = st.lists(st.one_of(st.sampled_from(SBATCH_WORDS), st.sampled_from(VALUES), st.text(max_size=12)),
                        max_size=8).map(lambda words: ["sbatch", *words])
argvs = st.one_of(st.sampled_from(COMMANDS).flatmap(argv_for), with_values(["launch"], TARGETS), sbatch_argvs,
                  st.lists(st.sampled_from(SBATCH_WORDS), max_size=5).map(lambda w: ["sbatch", *w, "job.sh"]),
                  with_values(["launch"], [["job.sh"], ["badjob.sh"]]),
                  with_values(["exec"], [["dev", "--", "true"], ["dev", "task.yaml"]]),
                  with_values(["gpus"], [[], ["H100"]]), with_values(["check"], [[], ["alpine"], ["nope"]]))


def dry_managed(argv: list[str]) -> list[str]:
    """`sbatch … --managed …` as a dry run: it plans and records nothing (see COMMANDS)."""
    return ["sbatch", "--dryrun", *argv[1:]] if argv[:1] == ["sbatch"] and "--managed" in argv else argv


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=argvs.map(dry_managed))
def test_no_argument_list_ends_in_a_traceback(refusing_clusters, argv):
    code, _out, err = run_cli(argv)
    assert "Traceback" not in err and code != EXIT_INTERNAL, (argv, err)
    errors = [line for line in err.splitlines() if line.startswith("corral: error:")]
    assert len(errors) <= 1, (argv, err)
    if code == 2:  # a usage error: exactly one line
        assert err.count("\n") == 1 and errors, (argv, err)
    if errors:  # the last thing said, with the list it introduces (each place's reason) on indented lines
        listed = err[err.index(errors[0]):].splitlines()[1:]
        assert code != 0 and err.endswith("\n") and all(line.startswith("  ") for line in listed), (argv, err)


@pytest.mark.parametrize(("argv", "fragment", "exit_code"), [
    (["sbatch", "--bogus-option", "job.sh"], "command line: --bogus-option is not an sbatch option", 65),
    (["sbatch", "badjob.sh"], "badjob.sh:2: --gress is not an sbatch option", 65),
    (["launch", "--infra", "slurm/nope", "--", "true"], "unknown cluster 'nope'; known clusters: alpine, borealis", 66),
    (["launch", "latin1.yaml"], "latin1.yaml: not UTF-8 text", 65),
    (["launch", "--num-jobs", "100000000", "--", "true"], "a sweep has 1 to 10,000 jobs", 65),
    (["launch", "--num-jobs", "0", "--", "true"], "a sweep has 1 to 10,000 jobs", 65),
    (["gpus", "--infra", "slurm/nope"], "unknown cluster 'nope'", 66),
    (["gpus", "--max-age", "nan"], "Invalid value for '--max-age': 'nan' is not a number.", 2),
    (["launch", "--env", "CORRAL_TASK_ID=1", "--", "true"], "Corral's own variables", 65),
    (["launch", "--secret", "NOT_IN_ENV_FOR_SURE", "--", "true"], "is not set in your environment", 65),
])
def test_regressions_are_one_line_errors(refusing_clusters, argv, fragment, exit_code):
    code, _out, err = run_cli(argv)
    assert code == exit_code and err.startswith("corral: error: ") and err.count("\n") == 1 and fragment in err, err


def test_no_place_able_to_run_a_task_lists_each_place_on_its_own_line(refusing_clusters):
    """It was one line of every place's reason joined by `;`, some 900 characters on the testbed."""
    code, _out, err = run_cli(["launch", "-d", "task.yaml"])
    head, *places = err.splitlines()
    assert code == 69 and head == "corral: error: no cluster can run this task:", err
    assert places and all(line.startswith("  slurm/") and ": " in line for line in places), err


def test_a_managed_dry_run_plans_and_records_nothing(refusing_clusters):
    code, out, err = run_cli(["sbatch", "--dryrun", "--managed", "--json", "job.sh"])  # no cluster answers: 69
    assert code == 69 and "Traceback" not in err and all(row["unreachable"] for row in json.loads(out)), err
    code, out, err = run_cli(["jobs", "queue", "--json"])
    assert code == 0 and json.loads(out) == [], (out, err)


def test_a_bug_is_one_line_and_a_crash_log(refusing_clusters, monkeypatch):
    import corral.sdk

    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(corral.sdk.Client, "gpus", broken)
    code, _out, err = run_cli(["gpus"])
    assert code == EXIT_INTERNAL and err.count("\n") == 1 and "internal error: ZeroDivisionError: boom" in err
    assert "Traceback" in (refusing_clusters / "home" / "crash.log").read_text()
