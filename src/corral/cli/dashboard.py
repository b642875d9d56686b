"""`corral dashboard`: open the server's web dashboard, logged in as this CLI's user (one request)."""

from __future__ import annotations

import click

from corral.cli.common import reports_errors


@click.command()
@click.option("--print-url", is_flag=True, help="Print the one-time login link instead of opening a browser.")
@reports_errors
def dashboard(print_url: bool) -> None:
    """Open the dashboard in your browser through a one-time login link (valid once, for a minute)."""
    import webbrowser

    from corral.sdk import Client

    url = Client().dashboard_url()
    if print_url or not webbrowser.open(url):
        click.echo(url)
