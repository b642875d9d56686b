"""`corral server` (the one engine process on this machine) and `corral api` (which server this CLI
talks to: the local one, started on demand, or a remote one)."""

from __future__ import annotations

import sys

import click

from corral.cli.common import print_json, reports_errors


@click.group()
def server() -> None:
    """The background controller that drives managed jobs (one per state store)."""


@server.command(name="start")
@reports_errors
def server_start() -> None:
    """Start the controller unless it runs."""
    from corral.controller import server as controller

    click.echo(f"controller running (pid {controller.start()}); log: {controller.log_file()}")


@server.command(name="stop")
@reports_errors
def server_stop() -> None:
    """Stop the controller (managed jobs keep running in Slurm; a restart carries on)."""
    from corral.controller import server as controller

    click.echo("controller stopped" if controller.stop() else "controller was not running")


@server.command(name="status")
@click.option("--json", "as_json", is_flag=True, help="Print the controller's health as JSON.")
@reports_errors
def server_status(as_json: bool) -> None:
    """Is the controller running, its last tick, and who holds the store's lease."""
    import time

    from corral.controller import server as controller
    from corral.errors import CorralError
    from corral.sdk import Client

    endpoint = controller.read_endpoint()
    try:  # answered by the server: this process loads neither the engine nor the database
        if endpoint is None:
            raise controller.ControllerUnavailable("not running")
        health = Client(f"http://127.0.0.1:{endpoint['port']}", endpoint["token"], timeout=3).health()
        lease = health["lease"]
    except CorralError as exc:
        from corral.controller.engine import LEASE
        from corral.state import open_store

        health = None
        pid = controller.running_pid()
        problem = f"pid {pid} runs, but its API did not answer: {exc}" if pid else "not running"
        row = open_store().lease(LEASE)  # another machine's server may hold a shared store's lease
        lease = {"holder": row.holder, "expires_at": row.expires_at} if row else None
    if as_json:
        print_json({"running": health is not None, **(health or {"problem": problem}), "lease": lease})
    elif health is None:
        click.echo(f"controller {problem}")
    else:
        last = health["last_tick"]
        click.echo(f"controller running (pid {health['pid']}, up {health['uptime_seconds']:.0f}s, "
                   f"{health['ticks']} ticks, every {health['interval']:g}s)")
        if last:
            click.echo(f"last tick {time.time() - last['at']:.1f}s ago: {last['jobs']} live jobs, "
                       f"{last['seconds']:.3f}s, SSH calls {last['round_trips'] or {}}"
                       + (f", errors {last['errors']}" if last["errors"] else ""))
        if lease:
            click.echo(f"lease held by {lease['holder']} for {max(0, lease['expires_at'] - time.time()):.0f}s more")
    if health is None:
        sys.exit(1)


@click.group()
def api() -> None:
    """Which Corral server this CLI uses: a remote one (team server), or the local one started on demand."""


@api.command(name="login")
@click.argument("url")
@click.option("--token", prompt=True, hide_input=True, help="The server's API token (asked for if not given).")
@reports_errors
def api_login(url: str, token: str) -> None:
    """Use the server at URL from now on (saved, mode 600, in CORRAL_HOME/api.json)."""
    from corral.errors import CorralError
    from corral.sdk import Client
    from corral.sdk.endpoint import save_login

    if not url.startswith(("http://", "https://")):
        raise CorralError(f"{url!r}: give the server's URL, such as https://corral.example.org:8765")
    health = Client(url, token).health()  # refuses a wrong URL or token before anything is saved
    path = save_login(url, token)
    click.echo(f"logged in to {url} (Corral {health.get('version', '?')}, API {health.get('api', '?')}); "
               f"saved in {path}")


@api.command(name="logout")
@reports_errors
def api_logout() -> None:
    """Forget the saved server: commands use the local one again."""
    from corral.sdk.endpoint import forget_login

    click.echo("logged out: commands use the local server" if forget_login() else "not logged in to a server")


@api.command(name="info")
@click.option("--json", "as_json", is_flag=True, help="Print the server's URL and health as JSON.")
@reports_errors
def api_info(as_json: bool) -> None:
    """The server this CLI uses, and its health (starts the local one if needed)."""
    from corral.sdk import Client

    client = Client()
    health = client.health()
    point = client.endpoint
    if as_json:
        print_json({"url": point.url, "local": point.local, **health})
    else:
        where = "local server" if point.local else "server"
        click.echo(f"{where} {point.url}: Corral {health.get('version', '?')}, API {health.get('api', '?')}, "
                   f"pid {health['pid']}, up {health['uptime_seconds']:.0f}s")
