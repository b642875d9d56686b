"""`corral server` (the one engine process on this machine) and `corral api` (which server this CLI
talks to: the local one, started on demand, or a remote one)."""

from __future__ import annotations

import sys

import click

from corral.cli.common import piped_stdin, print_json, reports_errors


@click.group()
def server() -> None:
    """The Corral server: the one engine that answers every command and drives managed jobs (one per
    state store; commands start this user's local one on demand)."""


@server.command(name="start")
@click.option("--host", help="Serve a team on this address (such as 0.0.0.0); default: loopback, this user only.")
@click.option("--port", type=click.IntRange(1, 65535), help="The port to serve on (default: any free one).")
@click.option("--db", "db_url", metavar="URL", help="The state store: postgresql+psycopg://… for a team "
              "(default: SQLite under CORRAL_HOME).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="Serve HTTPS with this certificate.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="The certificate's private key.")
@click.option("--sso-header", metavar="HEADER", help="Believe a trusted reverse proxy's header naming the user "
              "(such as X-Auth-Request-Email). Off by default.")
@click.option("--trusted-proxy", "trusted_proxies", multiple=True, metavar="CIDR",
              help="Where --sso-header may come from (default: loopback). Repeat for several.")
@click.option("--foreground", is_flag=True, help="Run in this process (for systemd) instead of in the background.")
@reports_errors
def server_start(host: str | None, port: int | None, db_url: str | None, tls_cert: str | None, tls_key: str | None,
                 sso_header: str | None, trusted_proxies: tuple[str, ...], foreground: bool) -> None:
    """Start the server unless it runs: this user's local one, or with --host/--port a team server."""
    from corral.controller import server as controller

    options = controller.ServerOptions(host=host, port=port, db_url=db_url, tls_cert=tls_cert, tls_key=tls_key,
                                       sso_header=sso_header, trusted_proxies=trusted_proxies)
    options.check()
    if foreground:
        controller.run(options)
        return
    pid = controller.start(options)
    endpoint = controller.read_endpoint() or {}
    where = f" at {endpoint['url']}" if endpoint.get("team") else ""
    click.echo(f"controller running (pid {pid}){where}; log: {controller.log_file()}")


@server.command(name="stop")
@reports_errors
def server_stop() -> None:
    """Stop the server and its SSH connections (jobs keep running in Slurm; the next command, or a
    restart, carries on)."""
    from corral.controller import server as controller

    click.echo("controller stopped" if controller.stop() else "controller was not running")


@server.command(name="status")
@click.option("--json", "as_json", is_flag=True, help="Print the controller's health as JSON.")
@reports_errors
def server_status(as_json: bool) -> None:
    """Is the server running, its controller's last tick, who holds the store's lease, and each
    cluster's Slurm command budget used."""
    import time

    from corral.controller import server as controller
    from corral.errors import CorralError
    from corral.sdk import Client

    endpoint = controller.read_endpoint()
    try:  # answered by the server: this process loads neither the engine nor the database
        if endpoint is None:
            raise controller.ControllerUnavailable("not running")
        client = (Client(timeout=3) if endpoint.get("team")  # its own URL and certificate (controller.json)
                  else Client(f"http://127.0.0.1:{endpoint['port']}", endpoint["token"], timeout=3))
        health = client.health()
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
                       + (f", errors {last['errors']}" if last["errors"] else "")
                       + (f", {last['submitting']} still being submitted" if last.get("submitting") else ""))
        if last and last.get("disagreement"):
            click.echo(f"drives nothing: {last['disagreement']}")
        if lease:
            click.echo(f"lease held by {lease['holder']} for {max(0, lease['expires_at'] - time.time()):.0f}s more")
        shards = health.get("shards") or {}
        held = sorted(c for c, h in (shards.get("clusters") or {}).items() if h == health["holder"])
        replicas = len(shards.get("replicas") or {}) or 1
        if replicas > 1 or held:
            click.echo(f"drives {', '.join(held) or 'no cluster'} ({len(held)} of {len(shards.get('clusters') or {})}"
                       f" held; {replicas} replica{'s' if replicas != 1 else ''} on this store)")
        for cluster, used in (health.get("rpc_budget") or {}).items():
            busy = (f", backing off {used['backoff_seconds']}s ({used['busy_reason']})" if used.get("busy_reason")
                    else "")
            shared = (f" (this replica's share of {used['configured_per_minute']})"
                      if used.get("replicas", 1) > 1 else "")
            click.echo(f"{cluster}: {used['used_last_minute']} of {used['commands_per_minute']}{shared} Slurm "
                       f"commands in the last minute, {used['waiting']} waiting{busy}")
    if health is None:
        sys.exit(1)


@click.group()
def api() -> None:
    """Which Corral server this CLI uses: a remote one (team server), or the local one started on demand."""


def _server_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """The URL checked before the token is asked for."""
    from corral.errors import CorralError
    from corral.sdk.endpoint import server_url

    try:
        return server_url(value, "URL")
    except CorralError as exc:
        raise click.BadParameter(str(exc).removeprefix("URL "), ctx, param) from None


@api.command(name="login")
@click.argument("url", callback=_server_url)
@click.option("--token", help="The server's API token; else read from standard input, or asked for on a "
                              "terminal (without echo).")
@reports_errors
def api_login(url: str, token: str | None) -> None:
    """Use the server at URL from now on (saved, mode 600, in CORRAL_HOME/api.json)."""
    from corral.sdk import Client
    from corral.sdk.endpoint import save_login

    if token is None:
        piped = piped_stdin()
        if piped is not None:
            token = piped.readline().strip()
        elif sys.stdin is not None:  # a terminal: asked without echo
            token = click.prompt("Token", hide_input=True, default="", show_default=False).strip()
    if not token:
        raise click.UsageError("no token given: pass --token, pipe it in (`corral api login URL < token-file`), "
                               "or type it when asked")
    client = Client(url, token)
    health = client.health()  # refuses a wrong URL or token before anything is saved
    me = client.me()
    path = save_login(url, token)
    click.echo(f"logged in to {url} as {me['name']} ({me['role']}; Corral {health.get('version', '?')}, "
               f"API {health.get('api', '?')}); saved in {path}")


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
    me = client.me()
    point = client.endpoint
    if as_json:
        print_json({"url": point.url, "local": point.local, "user": me, **health})
    else:
        where = "local server" if point.local else "server"
        click.echo(f"{where} {point.url}: Corral {health.get('version', '?')}, API {health.get('api', '?')}, "
                   f"pid {health['pid']}, up {health['uptime_seconds']:.0f}s")
        accounts = ", ".join(f"{c}={n}" for c, n in sorted(me["unix_users"].items()))
        click.echo(f"you are {me['name']} ({me['role']}" + (", the server's own account" if me["local"] else "")
                   + ")" + (f"; Unix accounts: {accounts}" if accounts else ""))
        if me.get("ssh_public_key"):
            click.echo("the server reaches your accounts with its key for you: `corral api ssh-key` prints it, to add "
                       "to ~/.ssh/authorized_keys on each cluster")


@api.command(name="ssh-key")
@reports_errors
def api_ssh_key() -> None:
    """The public key a team server uses to reach your own account on each cluster: add this line to
    ~/.ssh/authorized_keys there, e.g. `corral api ssh-key | ssh CLUSTER 'cat >> ~/.ssh/authorized_keys'`."""
    from corral.errors import CorralError
    from corral.sdk import Client

    key = Client().me().get("ssh_public_key")
    if not key:
        raise CorralError("this server acts as its own account on the clusters (you are its own user): "
                          "there is no key to authorize")
    click.echo(key)
