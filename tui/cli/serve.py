"""`eagle3-tui serve`: the same dashboard (fleet, log viewer, every key) in a browser.

Each browser session runs its own `eagle3-tui connect …` process (textual-serve's
model: the app as it is, drawn by Textual's web driver), so `q` ends only that session.
Safe by default: 127.0.0.1, a token in the printed URL (printed again by `serve --url`
to this user only: tui/cli/servestate.py), no plain HTTP off this machine
(tui/cli/webserve.py holds the guard).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import secrets
import shutil
import socket
import ssl
import sys
import tempfile
import time
import webbrowser
from pathlib import Path

import click

from tui.cli import servestate
from tui.cli.common import EXIT_CONNECT, EXIT_FAILED, EXIT_USAGE, Ctx, fail
from tui.cli.connect import read_only_opt
from tui.cli.fleet import fleet_hosts, hosts_file_opt, targets_arg
from tui.protocol.hosttext import clean
from tui.services.config import ConfigError
from tui.transport import ConfigError as TargetError
from tui.transport.targets import parse_target

DEFAULT_PORT = 8765


def is_loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, not this machine alone


def session_command(obj: Ctx, targets: tuple[str, ...], hosts_file: str | None, read_only: bool) -> list[str]:
    """The argv each browser session runs: this Python's `connect` with the same options."""
    argv = [sys.executable, "-m", "tui"]
    if obj.config_path:
        argv += ["--config", str(Path(obj.config_path).resolve())]
    if obj.ssh_config:
        argv += ["-F", str(Path(obj.ssh_config).expanduser().resolve())]
    if obj.accept_new:
        argv.append("--accept-new-host-key")
    argv.append("connect")
    if hosts_file:
        argv += ["--hosts-file", str(Path(hosts_file).resolve())]
    if read_only:
        argv.append("--read-only")
    return [*argv, "--", *targets]  # a target is never taken for an option


def page_title(obj: Ctx, hosts: list[str]) -> str:
    """The browser tab's name: the host(s) and the config's run, so tabs tell apart."""
    shown = ", ".join(hosts[:3]) + (f" +{len(hosts) - 3}" if len(hosts) > 3 else "")
    run = obj.cfg.run.name if obj.cfg.run.command else ""
    return clean(" · ".join(x for x in (shown, run, "eagle3-tui") if x), newline=False)[:120]


def url_host(bind: str, given: str | None) -> str:
    """The host the printed URL names: the one given; else the bound address; for a
    wildcard bind, this machine's name as others resolve it (never `localhost`)."""
    if given:
        return given
    if bind not in ("0.0.0.0", "::"):
        return bind
    for name in (socket.getfqdn(), socket.gethostname()):
        try:
            addrs = {str(info[4][0]) for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
        except OSError:
            continue
        if name and not name.startswith("localhost") and not all(is_loopback(a) for a in addrs):
            return name
    return socket.gethostname()


def print_running(targets: tuple[str, ...]) -> None:
    """`serve --url`: each running server's URL on stdout, what it serves on stderr."""
    try:
        servers = [s for s in servestate.running() if not targets or set(targets) <= set(s.targets)]
    except servestate.StateError as exc:
        fail(str(exc), EXIT_USAGE)
    if not servers:
        fail("no eagle3-tui serve is running" + (f" for {' '.join(targets)}" if targets else "")
             + " (start one: eagle3-tui serve [TARGET])", EXIT_FAILED)
    for server in servers:
        since = time.strftime("%Y-%m-%d %H:%M", time.localtime(server.started))
        what = clean(" ".join(server.targets), newline=False)
        click.echo(f"eagle3-tui: serving {what}"
                   f"{' read-only' if server.read_only else ''} since {since} (pid {server.pid}):", err=True)
        click.echo(server.url)


@click.command()
@targets_arg
@hosts_file_opt
@read_only_opt
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port (0: any free one).")
@click.option("--bind", default="127.0.0.1", show_default=True, metavar="ADDR",
              help="Address to listen on; off this machine only with --tls-cert.")
@click.option("--tls-cert", type=click.Path(dir_okay=False), metavar="FILE",
              help="PEM certificate (chain): serve HTTPS.")
@click.option("--tls-key", type=click.Path(dir_okay=False), metavar="FILE",
              help="PEM private key, when not in --tls-cert.")
@click.option("--url-host", "url_host_given", metavar="NAME",
              help="The host name the printed URL names (default: the bound "
              "address; for 0.0.0.0, this machine's name).")
@click.option("--token-file", type=click.Path(dir_okay=False), metavar="FILE",
              help=f"A fixed token (a file only you can read), so bookmarks survive a restart; "
                   f"or ${servestate.TOKEN_ENV}.")
@click.option("--open", "open_browser", is_flag=True, help="Open the URL in this machine's browser.")
@click.option("--url", "show_url", is_flag=True, help="Print the running server's URL (and exit).")
@click.pass_obj
def serve(obj: Ctx, targets: tuple[str, ...], hosts_file: str | None, read_only: bool, port: int,
          bind: str, tls_cert: str | None, tls_key: str | None, url_host_given: str | None, token_file: str | None,
          open_browser: bool, show_url: bool) -> None:
    """Serve the dashboard to a browser, behind a token printed as a URL.

    Listens on 127.0.0.1 unless --bind says otherwise; another address needs TLS. From
    another machine, tunnel instead: `ssh -L 8765:127.0.0.1:8765 HOST`, then open the
    printed URL there. Each browser session is its own `eagle3-tui connect` (q ends it);
    a page that loses its connection comes back to the same session within a minute.
    `serve --url` prints a running server's URL again.
    """
    if show_url:
        print_running(targets)
        return
    if tls_key and not tls_cert:
        fail("--tls-key needs --tls-cert", EXIT_USAGE)
    if not is_loopback(bind) and not tls_cert:
        fail(f"refusing to serve on {bind} without TLS (the token would cross the network in clear): "
             f"give --tls-cert/--tls-key, or keep 127.0.0.1 and tunnel: "
             f"ssh -L {port or DEFAULT_PORT}:127.0.0.1:{port or DEFAULT_PORT} HOST", EXIT_USAGE)
    try:
        from tui.cli import webserve
    except ImportError as exc:
        fail(f"serve needs textual-serve ({exc.name} is missing): pip install 'eagle3-tui[serve]'", EXIT_USAGE)
    try:
        obj.cfg  # a broken eagle3.toml is one line here, not one per browser session
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    hosts = fleet_hosts(obj, targets, hosts_file)  # so is a broken --hosts-file
    for target in targets if len(hosts) > 1 else hosts:  # a bad one: every session would fail on it
        try:
            parse_target(target)
        except TargetError as exc:
            fail(f"{exc} (serve refuses it before any browser session)", EXIT_USAGE)
    try:
        token = servestate.fixed_token(token_file) or secrets.token_urlsafe(32)
        servestate.state_dir()
    except servestate.StateError as exc:
        fail(str(exc), EXIT_USAGE)
    ssl_context = None
    if tls_cert:
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ssl_context.load_cert_chain(tls_cert, tls_key)
        except (OSError, ssl.SSLError) as exc:
            fail(f"cannot use --tls-cert/--tls-key: {exc}", EXIT_USAGE)
    try:
        info = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(128)
    except OSError as exc:
        hint = ""
        if exc.errno == errno.EADDRINUSE:
            hint = (" (in use: `eagle3-tui serve --url` prints a running server's URL; "
                    "--port 0 picks a free port)")
        fail(f"cannot listen on {bind}:{port}: {exc.strerror or exc}{hint}", EXIT_CONNECT)
    port = sock.getsockname()[1]
    command = session_command(obj, targets, hosts_file, read_only)
    from tui.views.served import SESSIONS_ENV

    private = Path(tempfile.mkdtemp(prefix="eagle3-tui-serve-"))  # mode 0700
    sessions_file = private / "sessions.json"
    sessions_file.write_text("[]")
    os.environ[SESSIONS_ENV] = str(sessions_file)  # each session's app inherits it
    server = webserve.WebServer(command, token, port=port, tls=ssl_context is not None,
                                sessions_file=sessions_file, title=page_title(obj, hosts),
                                read_only=read_only)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    host = url_host(bind, url_host_given)
    host = f"[{host}]" if ":" in host else host
    scheme = "https" if ssl_context else "http"
    url = f"{scheme}://{host}:{port}/?token={token}"
    shown = clean(" ".join(x for x in command[3:] if x != "--"), newline=False)
    click.echo(f"eagle3-tui: serving `eagle3-tui {shown}`{' (read-only)' if read_only else ''} on port {port}; "
               f"Ctrl+C stops; `eagle3-tui serve --url` prints the URL again. Open:", err=True)
    click.echo(url)  # stdout only, never a log
    sys.stdout.flush()
    state = servestate.record(port, url, hosts, read_only)
    opened = None
    if open_browser:
        opened = servestate.opener(url)
        try:
            if not webbrowser.open(opened.as_uri()):
                click.echo("eagle3-tui: --open: no browser on this machine; open the URL above", err=True)
        except webbrowser.Error as exc:
            click.echo(f"eagle3-tui: --open: {clean(str(exc), newline=False)}; open the URL above", err=True)
    try:
        webserve.run(server, sock, ssl_context)
    finally:
        shutil.rmtree(private, ignore_errors=True)
        state.unlink(missing_ok=True)
        if opened is not None:
            opened.unlink(missing_ok=True)
