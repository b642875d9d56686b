"""`corral users`: a team server's users and service accounts (admins only). Each command is one
request to the server this CLI uses (`corral api info` says which)."""

from __future__ import annotations

import click

from corral.cli.common import NumberRange, print_json, reports_errors


@click.group()
def users() -> None:
    """A team server's users: add one (its token is printed once), set their Unix accounts, list, remove."""


@users.command(name="add")
@click.argument("name")
@click.option("--role", type=click.Choice(["user", "admin"]), default="user", show_default=True,
              help="An admin sees everyone's jobs and manages users.")
@click.option("--unix-user", "unix_users", multiple=True, metavar="CLUSTER=NAME",
              help="The user's own account on a cluster (repeat per cluster). Their jobs run as it.")
@click.option("--service", is_flag=True, help="A service account (CI, bots): its token must expire.")
@click.option("--expires", "expires_days", type=NumberRange(min=0, min_open=True, max=3650), metavar="DAYS",
              help="The token stops working after DAYS days.")
@click.option("--json", "as_json", is_flag=True, help='Print {"name", "token"} as JSON.')
@reports_errors
def users_add(name: str, role: str, unix_users: tuple[str, ...], service: bool, expires_days: float | None,
              as_json: bool) -> None:
    """Add a user and print their token, this once (the server keeps only its hash)."""
    from corral.sdk import Client

    added = Client().add_user(name, role=role, unix_users=_mapping(unix_users), service=service,
                              expires_in_days=expires_days)
    if as_json:
        print_json({"name": added["name"], "token": added["token"]})
        return
    click.echo(f"added {added['name']} ({added['role']}). Their token, shown this once:\n\n  {added['token']}\n")
    click.echo(f"They run: corral api login URL --token {added['token'][:12]}…")
    if added.get("ssh_public_key"):
        click.echo("and, on each cluster where their jobs run as their own account (submit_as: ssh), add the "
                   f"server's key for them to ~/.ssh/authorized_keys:\n\n  {added['ssh_public_key']}")


def _mapping(items: tuple[str, ...]) -> dict[str, str]:
    from corral.errors import TaskError

    mapping: dict[str, str] = {}
    for item in items:
        cluster, sep, unix = item.partition("=")
        if not sep or not cluster or not unix:
            raise TaskError(f"--unix-user {item!r}: expected CLUSTER=NAME, such as alpine=alice")
        mapping[cluster] = unix
    return mapping


@users.command(name="set")
@click.argument("name")
@click.option("--unix-user", "unix_users", multiple=True, metavar="CLUSTER=NAME", required=True,
              help="The user's own account on a cluster (repeat per cluster); replaces the mapping.")
@reports_errors
def users_set(name: str, unix_users: tuple[str, ...]) -> None:
    """Set a user's Unix accounts (their token stays the same). Clusters left out are refused to them."""
    from corral.sdk import Client

    changed = Client().set_unix_users(name, _mapping(unix_users))
    click.echo(f"{changed['name']}: " + ", ".join(f"{c}={n}" for c, n in sorted(changed["unix_users"].items())))


@users.command(name="list")
@click.option("--json", "as_json", is_flag=True)
@reports_errors
def users_list(as_json: bool) -> None:
    """The server's users, their roles and Unix accounts (never their tokens)."""
    import time

    from corral.sdk import Client

    found = Client().users()
    if as_json:
        print_json(found)
        return
    if not found:
        click.echo("no users yet: `corral users add NAME`")
        return
    click.echo(f"{'NAME':<24} {'ROLE':<6} {'EXPIRES':<11} UNIX ACCOUNTS")
    for user in found:
        expires = time.strftime("%Y-%m-%d", time.localtime(user["expires_at"])) if user["expires_at"] else "never"
        accounts = ", ".join(f"{c}={n}" for c, n in sorted(user["unix_users"].items())) or "-"
        kind = user["role"] + ("*" if user["service"] else "")
        click.echo(f"{user['name']:<24} {kind:<6} {expires:<11} {accounts}")
    if any(u["service"] for u in found):
        click.echo("* a service account")


@users.command(name="remove")
@click.argument("name")
@reports_errors
def users_remove(name: str) -> None:
    """Remove a user: their token stops working at once (their jobs stay, and keep running)."""
    from corral.sdk import Client

    click.echo(f"removed {name}" if Client().remove_user(name) else f"no user {name!r}")
