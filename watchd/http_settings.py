"""The config sections of an HTTP server, which both daemons run: where it listens (and its TLS), and what
one client may hold of it. Pydantic and watchd's vocabulary only, so the config loads without aiohttp."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, model_validator

from watchd.model.durations import Seconds
from watchd.strict import Strict

Port = Annotated[int, Field(ge=0, le=65535)]


class Listen(Strict):
    host: str = "127.0.0.1"
    port: Port
    tls_cert: Path | None = None  # serve HTTPS with this certificate (chain) ...
    tls_key: Path | None = None  # ... and its private key
    client_ca: Path | None = None  # mutual TLS: clients must present a certificate this CA signed

    @model_validator(mode="after")
    def _tls_pair(self) -> Listen:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("listen: give tls_cert and tls_key together")
        if self.client_ca is not None and self.tls_cert is None:
            raise ValueError("listen.client_ca needs tls_cert and tls_key (mutual TLS runs over TLS)")
        return self


class HttpConfig(Strict):
    """What one HTTP client may hold of a server (docs/configuration.md, "HTTP limits"): a client that sends
    its headers or its body too slowly is cut, and connections past the cap are closed on accept."""

    header_timeout_s: Seconds = 5.0  # from the connection (or the end of the previous request) to the headers
    body_timeout_s: Seconds = 5.0  # to read one request's whole body
    # each agent keeps one connection open between its batches: size this above the number of agents
    max_connections: Annotated[int, Field(ge=1)] = 16384
