"""The Kubernetes API client (lightkube) as watchd configures it, and API errors as one line of text."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from watchd.errors import ConfigError
from watchd.extras import missing_extra

try:
    import httpx2
    from lightkube import ApiError, AsyncClient, KubeConfig, operators
    from lightkube.config.kubeconfig import SERVICE_ACCOUNT
    from lightkube.core.exceptions import ConfigError as LightkubeConfigError
except ImportError as exc:  # the optional dependency: name the extra, not a traceback
    raise missing_extra("kubernetes", exc) from exc


def make_client(
    kubeconfig: Path | None = None,
    context: str | None = None,
    *,
    in_cluster: bool | None = None,
    timeout_s: float = 10.0,
    field_manager: str = "watchd",
) -> AsyncClient:
    """A client from ``kubeconfig`` (and ``context``), or the pod's service account (:func:`kube_config`)."""
    single = kube_config(kubeconfig, context, in_cluster=in_cluster)
    return AsyncClient(
        single, timeout=httpx2.Timeout(timeout_s), field_manager=field_manager, trust_env=False, lazy=False
    )


def kube_config(kubeconfig: Path | None, context: str | None, *, in_cluster: bool | None) -> Any:
    """The cluster and credentials a client would use, read without connecting; a ConfigError (watchd's,
    one line) when they cannot be. ``in_cluster`` None: the service account when running in a pod
    (``KUBERNETES_SERVICE_HOST`` set and no kubeconfig given), else ``$KUBECONFIG`` / ``~/.kube/config``."""
    if in_cluster is None:
        in_cluster = kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ
    try:
        if in_cluster:
            config = KubeConfig.from_service_account(SERVICE_ACCOUNT)
        elif kubeconfig is not None:
            config = KubeConfig.from_file(kubeconfig)
        else:
            config = KubeConfig.from_env()
        return config.get(context_name=context)
    except (LightkubeConfigError, OSError) as exc:
        raise ConfigError(f"kubernetes.kubeconfig/context/in_cluster: {exc}") from None


def describe_error(what: str, exc: BaseException) -> str:
    """``PATCH nodes/gpu-1: 409 Conflict: the object has been modified...`` (one line, for outcomes)."""
    if isinstance(exc, ApiError):
        st = exc.status
        code = st.code if st is not None and st.code else exc.response.status_code
        reason = (st.reason if st is not None else None) or exc.response.reason_phrase
        message = (st.message if st is not None else None) or ""
        return f"{what}: {code} {reason}: {message}".rstrip(": ")
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"{what}: {exc.response.status_code} {exc.response.reason_phrase}"
    if isinstance(exc, httpx2.TimeoutException):
        return f"{what}: timed out ({type(exc).__name__})"
    if isinstance(exc, httpx2.HTTPError):
        return f"{what}: {type(exc).__name__}: {exc}"
    return f"{what}: {exc!r}"


def status_code(exc: BaseException) -> int | None:
    if isinstance(exc, ApiError):
        st = exc.status
        return st.code if st is not None and st.code else exc.response.status_code
    if isinstance(exc, httpx2.HTTPStatusError):  # an error body that is not a Status (a proxy's, say)
        return exc.response.status_code
    return None


# What an API call can raise that is the API's or the network's fault (not watchd's).
API_ERRORS: tuple[type[BaseException], ...] = (ApiError, httpx2.HTTPError, OSError)


def label_selector(selector: str | None) -> dict[str, Any] | None:
    """A label selector string (``a=b,c!=d,e``) as lightkube's ``labels`` argument."""
    if not selector:
        return None
    out: dict[str, Any] = {}
    for part in (p.strip() for p in selector.split(",") if p.strip()):
        if "!=" in part:
            k, v = part.split("!=", 1)
            out[k.strip()] = operators.not_equal(v.strip())
        elif "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
        else:
            out[part] = operators.exists()
    return out
