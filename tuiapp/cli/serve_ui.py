"""`llmtui serve-ui`: the same TUI in a browser, through textual-serve.

Each browser tab gets its own `llmtui` TUI process (the one the terminal runs, no second UI);
closing the tab ends that process only. Runs live in their own sessions, so training goes on.

Whoever drives the page drives llmtui (launch, stop, delete), so the server lets in only the
browser that opened the URL it printed:
- a random token per start, in the page's URL (`/?token=...`) and in the WebSocket's path
  (`/ws/<token>`): a page on another site cannot read it, so it cannot connect;
- the Host header must name this machine (a loopback name when serving on localhost): a DNS
  rebinding page (evil.example resolving to 127.0.0.1) sends Host: evil.example and is refused;
- an Origin header, when the browser sends one, must be the page's own origin;
- listening beyond loopback needs --allow-remote (the token is required there too).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import shlex
import socket
import sys
from urllib.parse import urlsplit

from tuiapp.cli import numbers
from tuiapp.core.common.errors import EXIT_OK, UserError
from tuiapp.core.store import served
from tuiapp.core.store.runs import RunStore

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
TOKEN_BYTES = 24


def add_command(add) -> None:
    p = add("serve-ui", cmd_serve_ui, "the TUI in a browser (textual-serve); each tab is its own TUI")
    p.add_argument("--host", default="localhost",
                   help="address to listen on (default: localhost; over SSH forward the port instead of opening it)")
    p.add_argument("--port", type=numbers.port(), default=8000, help="port (default: 8000)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a --host beyond this machine's loopback (the URL's token is still required)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="another name browsers may use for this server (e.g. a reverse proxy's); repeat")


def tui_command(runs_dir: str) -> str:
    """The command textual-serve starts for each tab: this Python's bare `llmtui` on the runs folder."""
    return shlex.join([sys.executable, "-m", "tuiapp.cli", "--runs-dir", runs_dir])


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_free(host: str, port: int) -> list[str]:
    """Refuse a port something already listens on, before the server prints its banner; returns
    the addresses the host name resolves to."""
    return served.check_free(host, port, fix="pick another --port, or stop what uses this one")


def allowed_host_names(host: str, addresses: list[str], extra: list[str]) -> set[str]:
    """The names a browser may put in the Host header: loopback names on localhost; beyond it also
    the --host given, this machine's names and its interfaces' addresses, and --allowed-host."""
    names = {"localhost", "127.0.0.1", "::1", *extra}
    if not all(is_loopback(a) for a in addresses) or not is_loopback(host):
        import psutil

        names |= {host, socket.gethostname(), socket.getfqdn()}
        for addresses_of in psutil.net_if_addrs().values():
            names |= {a.address.split("%")[0] for a in addresses_of if a.family in (socket.AF_INET, socket.AF_INET6)}
        names -= {"0.0.0.0", "::", ""}
    return {n.lower().strip("[]") for n in names}


def host_name(header: str) -> str:
    """'localhost' of 'localhost:8000', '::1' of '[::1]:8000'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def refusal(request, allowed: set[str], token: str) -> str | None:
    """Why a request is refused (None: let it in). Pure, so the rules are tested one by one too."""
    if host_name(request.host or "") not in allowed:
        return f"Host '{request.host}' is not this server (DNS rebinding?)"
    origin = request.headers.get("Origin")
    if origin is not None:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or (parts.netloc or "").lower() != (request.host or "").lower():
            return f"Origin '{origin}' is not this server's page"
    path = request.path
    if path.startswith("/static/"):
        return None  # textual-serve's own script and styles: nothing private
    if path == "/":
        given = request.query.get("token", "")
    elif path.startswith("/ws/"):
        given = path[len("/ws/"):]
    elif path.startswith("/download/"):
        return None  # a file the TUI delivers: unguessable keys, asked for by the page itself
    else:
        return "not found"
    if not hmac.compare_digest(given.encode(), token.encode()):
        return "a missing or wrong token: open the URL `llmtui serve-ui` printed (with its ?token=...)"
    return None


def make_server(command: str, host: str, port: int, token: str, allowed: set[str]):
    """textual-serve's Server with the token, Host and Origin checks in front of every route."""
    import aiohttp_jinja2
    import jinja2
    from aiohttp import web
    from textual_serve.server import Server, to_int

    class GuardedServer(Server):
        async def _make_app(self) -> web.Application:
            @web.middleware
            async def guard(request, handler):
                why = refusal(request, allowed, token)
                if why == "not found":
                    raise web.HTTPNotFound()
                if why is not None:
                    raise web.HTTPForbidden(text=f"llmtui serve-ui refused this request: {why}\n")
                response = await handler(request)
                response.headers.setdefault("Referrer-Policy", "no-referrer")  # the token stays out of Referer
                response.headers.setdefault("Cache-Control", "no-store")
                return response

            app = web.Application(middlewares=[guard])
            aiohttp_jinja2.setup(app, loader=jinja2.FileSystemLoader(self.templates_path))
            app.add_routes([
                web.get("/", self.handle_index, name="index"),
                web.get("/ws/{token}", self.handle_websocket, name="websocket"),
                web.get("/download/{key}", self.handle_download, name="download"),
                web.static("/static", self.statics_path, show_index=False, name="static"),
            ])
            app.on_startup.append(self.on_startup)
            app.on_shutdown.append(self.on_shutdown)
            return app

        async def on_startup(self, app) -> None:
            pass  # llmtui printed its own line, with the token

        async def handle_index(self, request):
            """The page, its URLs on the address the browser used (so `ssh -L 9000:localhost:8000`
            works too) and its WebSocket carrying the token."""
            scheme = "https" if request.secure else "http"
            base = f"{scheme}://{request.host}"
            context = {
                "font_size": to_int(request.query.get("fontsize", "16"), 16),
                "app_websocket_url": f"{'wss' if scheme == 'https' else 'ws'}://{request.host}/ws/{token}",
                "config": {"static": {"url": f"{base}/static/"}},
                "application": {"name": self.title},
            }
            return aiohttp_jinja2.render_template("app_index.html", request, context)

    return GuardedServer(command, host=host, port=port, title="llmtui")


def cmd_serve_ui(args) -> int:
    if not 1 <= args.port <= 65535:
        raise UserError(message=f"--port {args.port} is not a TCP port", fix="use a port from 1 to 65535, e.g. --port 8000")
    addresses = _check_free(args.host, args.port)
    local = is_loopback(args.host) and all(is_loopback(a) for a in addresses)
    if not local and not args.allow_remote:
        raise UserError(message=f"--host {args.host} listens beyond this machine: whoever reaches port {args.port} "
                        "with the URL's token drives llmtui (launch, stop, delete)",
                        fix=f"keep --host localhost and forward the port over SSH (ssh -L {args.port}:localhost:"
                        f"{args.port} THIS_HOST), or add --allow-remote on a network you trust")
    root = RunStore(args.runs_dir).root
    token = secrets.token_urlsafe(TOKEN_BYTES)
    allowed = allowed_host_names(args.host, addresses, args.allowed_host)
    shown = "localhost" if local else (args.host if args.host not in ("0.0.0.0", "::") else socket.gethostname())
    url = f"http://{shown}:{args.port}/?token={token}"
    if not local:
        print(f"warning: listening on {args.host}: anyone on the network who gets this URL (its token) controls "
              "llmtui, and the traffic is not encrypted. Prefer --host localhost and an SSH tunnel.", file=sys.stderr)
    print(f"llmtui on {url} (runs folder {root})", flush=True)
    if local:
        print(f"From another machine: ssh -L {args.port}:localhost:{args.port} THIS_HOST, then open "
              f"http://localhost:{args.port}/?token={token}", flush=True)
    server = make_server(tui_command(str(root)), args.host, args.port, token, allowed)
    server.serve()
    return EXIT_OK
