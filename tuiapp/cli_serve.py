"""`llmtui serve-ui`: the same TUI in a browser, through textual-serve.

Each browser tab gets its own `llmtui` TUI process (the one the terminal runs, no second UI);
closing the tab ends that process only. Runs live in their own sessions, so training goes on.
"""

from __future__ import annotations

import shlex
import socket
import sys

from tuiapp.core.errors import EXIT_OK, UserError
from tuiapp.core.runs import RunStore

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def add_command(add) -> None:
    p = add("serve-ui", cmd_serve_ui, "the TUI in a browser (textual-serve); each tab is its own TUI")
    p.add_argument("--host", default="localhost",
                   help="address to listen on (default: localhost; over SSH forward the port instead of opening it)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")


def tui_command(runs_dir: str) -> str:
    """The command textual-serve starts for each tab: this Python's bare `llmtui` on the runs folder."""
    return shlex.join([sys.executable, "-m", "tuiapp.entry", "--runs-dir", runs_dir])


def _check_free(host: str, port: int) -> None:
    """Refuse a port something already listens on, before the server prints its banner."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(message=f"--host {host}: {exc.strerror}", fix="use localhost or an address of this machine") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            try:
                probe.bind(address)
            except OSError as exc:
                raise UserError(message=f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                                fix="pick another --port, or stop what uses this one") from None


def cmd_serve_ui(args) -> int:
    if not 1 <= args.port <= 65535:
        raise UserError(message=f"--port {args.port} is not a TCP port", fix="use a port from 1 to 65535, e.g. --port 8000")
    _check_free(args.host, args.port)
    root = RunStore(args.runs_dir).root
    from textual_serve.server import Server

    if args.host not in LOCAL_HOSTS:
        print(f"warning: listening on {args.host}: anyone who reaches port {args.port} controls llmtui, with no "
              "password. On a shared network keep --host localhost and forward the port over SSH.", file=sys.stderr)
    print(f"llmtui on http://{args.host}:{args.port} (runs folder {root}). From another machine: "
          f"ssh -L {args.port}:localhost:{args.port} THIS_HOST, then open http://localhost:{args.port}", flush=True)
    server = Server(tui_command(str(root)), host=args.host, port=args.port, title="llmtui")
    server.serve()
    return EXIT_OK
