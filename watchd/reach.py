"""How every command that talks to a running engine reaches it: its address, its token and TLS, from the
flags, the environment or the engine's config file, in one order everywhere (docs/cli.md, "Reaching the
engine"), and one HTTP client whose failures carry the exit status that tells them apart.

For each setting, the first that gives it wins: the flag (``--url``, ``--token-file``, ``--ca-file``, ...),
then the environment (``WATCHD_URL``, ``WATCHD_TOKEN`` or ``WATCHD_TOKEN_FILE``, ``WATCHD_CA_FILE``, ...),
then ``--config`` (the engine's own YAML: its listen address and a token it accepts), then the default
(``http://127.0.0.1:9120``, no token)."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from watchd.errors import Failed, NotEnabled, Refused, Unreachable, UsageError
from watchd.progress import progress

__all__ = [
    "DEFAULT_URL",
    "Answer",
    "EngineClient",
    "Feature",
    "Settings",
    "Target",
    "add_arguments",
    "client_for",
    "resolve",
]

DEFAULT_URL = "http://127.0.0.1:9120"
ENV_URL = "WATCHD_URL"
ENV_TOKEN = "WATCHD_TOKEN"
ENV_TOKEN_FILE = "WATCHD_TOKEN_FILE"
ENV_CA_FILE = "WATCHD_CA_FILE"
ENV_CLIENT_CERT = "WATCHD_CLIENT_CERT"
ENV_CLIENT_KEY = "WATCHD_CLIENT_KEY"
ENV_INSECURE = "WATCHD_TLS_INSECURE"
#: seconds a read waits for the engine's answer
READ_TIMEOUT_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every command that talks to an engine takes, as one group of its ``--help``."""
    group = parser.add_argument_group(
        "reaching the engine (each: the flag, else the environment, else --config)"
    )
    group.add_argument("--url", help=f"the engine's URL (${ENV_URL}; default {DEFAULT_URL})")
    group.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help=f"a file holding your token (${ENV_TOKEN}, ${ENV_TOKEN_FILE})",
    )
    group.add_argument(
        "-c",
        "--config",
        type=Path,
        metavar="FILE",
        help="the engine's YAML config: its address, and a token it accepts",
    )
    group.add_argument(
        "--ca-file", type=Path, metavar="FILE", help=f"the CA of the engine's certificate (${ENV_CA_FILE})"
    )
    group.add_argument(
        "--client-cert", type=Path, metavar="FILE", help=f"mutual TLS: your certificate (${ENV_CLIENT_CERT})"
    )
    group.add_argument(
        "--client-key", type=Path, metavar="FILE", help=f"mutual TLS: its key (${ENV_CLIENT_KEY})"
    )
    group.add_argument(
        "--insecure",
        action="store_true",
        help=f"do not verify the engine's certificate (${ENV_INSECURE}=1; for a test bench only)",
    )


@dataclass(frozen=True, slots=True)
class Settings:
    """What the command line said (None: not given)."""

    url: str | None = None
    token_file: Path | None = None
    config: Path | None = None
    ca_file: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    insecure: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        return cls(
            url=args.url,
            token_file=args.token_file,
            config=args.config,
            ca_file=args.ca_file,
            client_cert=args.client_cert,
            client_key=args.client_key,
            insecure=args.insecure,
        )


@dataclass(frozen=True, slots=True)
class Target:
    """The engine as this command reaches it; ``token_from`` says where the token came from (for errors)."""

    url: str
    token: str | None
    token_from: str
    tls: ssl.SSLContext | None = None
    insecure: bool = False


def _read_token(path: Path, what: str) -> str:
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror}") from None
    if not value:
        raise UsageError(f"{what} {path}: the file is empty")
    return value


def _from_config(path: Path, user: str) -> tuple[str, str | None, str]:
    """The URL of the engine that ``path`` configures, a token it accepts and where that token came from:
    the operator token named as ``user`` when the config has one, else the shared token."""
    from watchd.config import EngineConfig, load_config

    config = load_config(EngineConfig, path)
    listen = config.listen
    if listen.tls_cert is not None and config.external_url:
        url = config.external_url.rstrip("/")  # the name its certificate carries, as people reach it
    else:
        host = listen.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        elif ":" in host:
            host = f"[{host}]"
        scheme = "https" if listen.tls_cert is not None else "http"
        url = f"{scheme}://{host}:{listen.port}"
    for i, operator in enumerate(config.auth.operators):
        if operator.name == user:
            key = f"auth.operators[{i}] ({user})"
            return url, operator.resolve(key), f"--config {path} ({key})"
    return url, config.auth.resolve(), f"--config {path} (the shared token, auth)"


def _tls(settings: Settings, env: Mapping[str, str]) -> tuple[ssl.SSLContext | None, bool]:
    ca = settings.ca_file or _env_path(env, ENV_CA_FILE)
    cert = settings.client_cert or _env_path(env, ENV_CLIENT_CERT)
    key = settings.client_key or _env_path(env, ENV_CLIENT_KEY)
    insecure = settings.insecure or env.get(ENV_INSECURE, "") not in ("", "0")
    if (cert is None) != (key is None):
        raise UsageError(
            f"give a client certificate and its key together (--client-cert/--client-key, "
            f"${ENV_CLIENT_CERT}/${ENV_CLIENT_KEY})"
        )
    if ca is None and cert is None and not insecure:
        return None, False  # an https:// engine is checked against the system's CAs
    try:
        context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cert is not None:
            context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"TLS files (CA {ca}, certificate {cert}, key {key}): cannot load: {exc}") from None
    return context, insecure


def _env_path(env: Mapping[str, str], name: str) -> Path | None:
    value = env.get(name, "")
    return Path(value) if value else None


def resolve(settings: Settings, env: Mapping[str, str] | None = None, user: str | None = None) -> Target:
    """The engine to reach and how: each setting from the flag, else the environment, else ``--config``,
    else the default. ``user``: whose operator token ``--config`` looks for (default: this user)."""
    env = os.environ if env is None else env
    configured: tuple[str, str | None, str] | None = None
    if settings.config is not None:
        configured = _from_config(settings.config, user or getpass.getuser())
    url = settings.url or env.get(ENV_URL) or (configured[0] if configured else None) or DEFAULT_URL
    if not url.startswith(("http://", "https://")):
        where = "--url" if settings.url else (f"${ENV_URL}" if env.get(ENV_URL) else "the config")
        raise UsageError(f"{where} {url}: expected http:// or https://")
    if env.get(ENV_TOKEN) and env.get(ENV_TOKEN_FILE) and settings.token_file is None:
        raise UsageError(f"set ${ENV_TOKEN} or ${ENV_TOKEN_FILE}, not both")
    token: str | None
    if settings.token_file is not None:
        token, token_from = (
            _read_token(settings.token_file, "--token-file"),
            f"--token-file {settings.token_file}",
        )
    elif env.get(ENV_TOKEN, "").strip():
        token, token_from = env[ENV_TOKEN].strip(), f"${ENV_TOKEN}"
    elif env.get(ENV_TOKEN_FILE):
        path = Path(env[ENV_TOKEN_FILE])
        token, token_from = _read_token(path, f"${ENV_TOKEN_FILE}"), f"${ENV_TOKEN_FILE} ({path})"
    elif configured is not None:
        token, token_from = configured[1], configured[2]
    else:
        token, token_from = None, "no token"
    tls, insecure = _tls(settings, env)
    return Target(url.rstrip("/"), token, token_from, tls, insecure)


@dataclass(frozen=True, slots=True)
class Feature:
    """A part of the engine that its config may leave off: what it is called, and the key that turns it on."""

    name: str
    key: str


CHECKS = Feature("active checks", "checks.enabled: true")


@dataclass(frozen=True, slots=True)
class Answer:
    """An action's answer: its HTTP status and the document (which says the outcome and why)."""

    status: int
    doc: dict[str, Any]


class EngineClient:
    """Calls to one engine's API. A failure raises the error whose ``exit_code`` tells it apart: usage (2),
    unreachable (3), refused (4), not enabled (5), failed (1)."""

    def __init__(self, target: Target, *, by: str | None = None, err: TextIO | None = None) -> None:
        self.target = target
        self.url = target.url
        self.by = by
        self._err = err
        self._warned = False

    def get(self, path: str, *, feature: Feature | None = None, timeout_s: float = READ_TIMEOUT_S) -> Any:
        answer = self._request("GET", path, None, feature, timeout_s, None)
        return answer.doc

    def post(
        self,
        path: str,
        body: Any = None,
        *,
        feature: Feature | None = None,
        timeout_s: float = READ_TIMEOUT_S,
        waiting: str | None = None,
    ) -> Answer:
        """An action: its answer, also when the engine says it did not happen (the document's ``outcome``
        then says why: not_held, refused, failed, ...). ``waiting``: the progress line while it runs."""
        return self._request("POST", path, body, feature, timeout_s, waiting)

    def _request(
        self,
        method: str,
        path: str,
        body: Any,
        feature: Feature | None,
        timeout_s: float,
        waiting: str | None,
    ) -> Answer:
        data = None if method == "GET" else json.dumps(body if body is not None else {}).encode()
        request = urllib.request.Request(f"{self.url}{path}", method=method, data=data)
        if data is not None:
            request.add_header("Content-Type", "application/json")
            request.add_header("X-Watchd-Operator", self.by or getpass.getuser())
        if self.target.token:
            request.add_header("Authorization", f"Bearer {self.target.token}")
        if self.target.insecure and not self._warned and self._err is not None:
            self._warned = True
            print(
                f"watchd: warning: the certificate of {self.url} is not verified (--insecure)", file=self._err
            )
        try:
            if waiting is not None and self._err is not None:
                with progress(waiting, self._err):
                    return self._send(request, timeout_s)
            return self._send(request, timeout_s)
        except urllib.error.HTTPError as exc:
            try:
                doc = json.loads(exc.read())
            except ValueError:
                doc = {}
            if not isinstance(doc, dict):
                doc = {}
            if method == "POST" and "outcome" in doc:
                return Answer(exc.code, doc)
            raise self._error(exc.code, str(doc.get("error") or exc.reason), path, feature) from None
        except TimeoutError:
            raise Unreachable(f"the engine at {self.url} did not answer within {timeout_s:g} s") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise Unreachable(f"the engine at {self.url} did not answer within {timeout_s:g} s") from None
            hint = "is `watchd engine` running?"
            if isinstance(reason, ssl.SSLCertVerificationError):
                hint = "give the engine's CA with --ca-file or $WATCHD_CA_FILE"
            elif isinstance(reason, ssl.SSLError):
                hint = "TLS failed: an http:// engine, or one that wants a client certificate?"
            raise Unreachable(f"cannot reach the engine at {self.url}: {reason} ({hint})") from None

    def _send(self, request: urllib.request.Request, timeout_s: float) -> Answer:
        with urllib.request.urlopen(request, timeout=timeout_s, context=self.target.tls) as resp:
            doc = json.loads(resp.read())
            return Answer(resp.status, doc if isinstance(doc, dict) else {"value": doc})

    def _error(self, status: int, reason: str, path: str, feature: Feature | None) -> UsageError:
        where = f"{self.url}{path}"
        if status == 401:
            if self.target.token is None:
                return Refused(
                    f"{where}: HTTP 401: the engine wants a token: "
                    f"give --token-file, ${ENV_TOKEN} or --config"
                )
            return Refused(
                f"{where}: HTTP 401: the engine does not know the token from {self.target.token_from}"
            )
        if status == 403:
            return Refused(
                f"{where}: HTTP 403: the token from {self.target.token_from} may not do this ({reason}); "
                "reads need a viewer's or an operator's token, actions an operator's"
            )
        if status == 409:
            return Refused(f"{where}: HTTP 409: {reason}")
        if status == 404 and reason == "Not Found":  # no such route: the router's own answer
            if feature is not None:
                return NotEnabled(
                    f"{feature.name} are not enabled on the engine at {self.url} "
                    f"({feature.key} in its config)"
                )
            return NotEnabled(f"the engine at {self.url} does not serve {path} (an older version?)")
        if status == 503:
            return Unreachable(f"the engine at {self.url} cannot answer now: {reason} (HTTP 503)")
        if status >= 500:
            return Failed(f"{where}: HTTP {status}: {reason}")
        return UsageError(f"{where}: HTTP {status}: {reason}")


def client_for(args: argparse.Namespace, err: TextIO | None = None) -> EngineClient:
    """The client for a command's parsed arguments (the flags of :func:`add_arguments`, and ``by``)."""
    return EngineClient(resolve(Settings.from_args(args)), by=getattr(args, "by", None), err=err)


def connect(
    url: str | None = None,
    token_file: Path | None = None,
    config: Path | None = None,
    *,
    by: str | None = None,
    err: TextIO | None = None,
) -> EngineClient:
    """A client as the command line would make it with these flags (the rest from the environment)."""
    return EngineClient(resolve(Settings(url=url, token_file=token_file, config=config)), by=by, err=err)
