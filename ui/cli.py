"""`tracemill ui` (start the app) and `tracemill users` (who may sign in)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from tracemill.store.cli import database_option, open_store

APP = Path(__file__).resolve().parent / "app.py"
ROLES = click.Choice(["viewer", "reviewer", "admin"])


@click.command()
@database_option
@click.option("--host", default=None, help="Interface to listen on (default: TRACEMILL_UI_HOST, else 127.0.0.1; "
              "0.0.0.0 only behind a reverse proxy with TLS).")
@click.option("--port", default=None, type=click.IntRange(1, 65535), help="Port (default 8501).")
@click.option("--base-path", default="", help="URL path the app is served under behind a reverse proxy (/tracemill).")
def ui(db_url: str | None, host: str | None, port: int | None, base_path: str) -> None:
    """Run the UI: traces, failure modes, the review queue, datasets, models and deployments."""
    from tracemill.settings import get_settings
    from tracemill.ui import users

    settings = get_settings()
    engine = open_store(db_url)
    if not users.users(engine):
        click.echo("No user may sign in yet: add one with `tracemill users add NAME --role admin`.", err=True)
    url = engine.url.render_as_string(hide_password=False)
    engine.dispose()
    env = {**os.environ, "TRACEMILL_DATABASE_URL": url}
    args = [sys.executable, "-m", "streamlit", "run", str(APP),
            "--server.address", host or settings.ui_host, "--server.port", str(port or settings.ui_port),
            "--server.headless", "true", "--server.enableXsrfProtection", "true", "--server.enableCORS", "true",
            "--server.baseUrlPath", base_path.strip("/"), "--server.fileWatcherType", "none",
            "--browser.gatherUsageStats", "false", "--global.developmentMode", "false",
            "--client.toolbarMode", "viewer", "--client.showErrorDetails", "none", "--theme.base", "light"]
    click.echo(f"Tracemill UI on http://{host or settings.ui_host}:{port or settings.ui_port}/{base_path.strip('/')}")
    os.execve(sys.executable, args, env)


@click.group()
def users() -> None:
    """Manage who may sign in to the UI."""


def _password(prompt: bool, from_stdin: bool) -> str | None:
    if from_stdin:
        return sys.stdin.readline().rstrip("\n")
    if prompt:
        return click.prompt("Password", hide_input=True, confirmation_prompt=True)
    return None


@users.command("add")
@click.argument("name")
@click.option("--role", type=ROLES, required=True)
@click.option("--email", default=None, help="Signs in through single sign-on as this address.")
@click.option("--sso-only", is_flag=True, help="No password: single sign-on only (needs --email).")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input instead of a prompt.")
@database_option
def add(name: str, role: str, email: str | None, sso_only: bool, password_stdin: bool, db_url: str | None) -> None:
    """Add a user; the password is asked for (never given as an argument, so it stays out of shell history)."""
    from tracemill.ui import users as people
    from tracemill.ui.access import Role

    password = None if sso_only else _password(True, password_stdin)
    try:
        added = people.add_user(open_store(db_url), name, Role(role), password, email)
    except people.UserError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"added {added.name} ({added.role.value})")


@users.command("list")
@database_option
def list_users(db_url: str | None) -> None:
    """List the users and their roles."""
    from tracemill.ui import users as people

    for u in people.users(open_store(db_url)):
        state = "disabled" if u.disabled_at else "active"
        how = ", ".join(w for w, on in (("password", u.has_password), (f"sso {u.email}", bool(u.email))) if on)
        click.echo(f"{u.name}\t{u.role.value}\t{state}\t{how}")


@users.command("set-role")
@click.argument("name")
@click.argument("role", type=ROLES)
@database_option
def set_role(name: str, role: str, db_url: str | None) -> None:
    """Change a user's role."""
    from tracemill.ui import users as people
    from tracemill.ui.access import Role

    try:
        people.set_role(open_store(db_url), name, Role(role))
    except people.UserError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{name} is now a {role}")


@users.command("passwd")
@click.argument("name")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input instead of a prompt.")
@database_option
def passwd(name: str, password_stdin: bool, db_url: str | None) -> None:
    """Set a user's password."""
    from tracemill.ui import users as people

    password = _password(True, password_stdin)
    assert password is not None
    try:
        people.set_password(open_store(db_url), name, password)
    except people.UserError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"password of {name} changed")


@users.command("disable")
@click.argument("name")
@database_option
def disable(name: str, db_url: str | None) -> None:
    """Stop a user from signing in (their past decisions stay theirs)."""
    from tracemill.ui import users as people

    try:
        people.disable(open_store(db_url), name)
    except people.UserError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{name} can no longer sign in")
