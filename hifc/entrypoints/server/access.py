"""Who may use the server: the API key (from a file, the environment or the command line) and
the refusal to serve beyond loopback without one."""
from __future__ import annotations

import ipaddress
from collections.abc import Mapping

API_KEY_ENV = "HIFC_API_KEY"


def resolve_api_key(flag: str | None, key_file: str | None,
                    environ: Mapping[str, str]) -> str | None:
    """The key of ``--api-key``, else of ``--api-key-file`` (its first line), else of
    ``$HIFC_API_KEY``; None for no key. The file and the environment keep the key out of ``ps``."""
    if flag is not None and key_file is not None:
        raise ValueError("give --api-key or --api-key-file, not both")
    if key_file is not None:
        with open(key_file, encoding="utf-8") as f:
            key = f.readline().strip()
        if not key:
            raise ValueError(f"--api-key-file {key_file}: the file holds no key")
        return key
    if flag is not None:
        if not flag.strip():
            raise ValueError("--api-key must not be empty")
        return flag
    return environ.get(API_KEY_ENV) or None


def check_exposure(host: str, api_key: str | None, allow_unauthenticated: bool) -> str | None:
    """Refuse (ValueError) to serve beyond loopback without an API key unless the operator
    allowed it; then return the warning to log (None when there is nothing to warn about)."""
    if api_key or is_loopback(host):
        return None
    if not allow_unauthenticated:
        raise ValueError(f"--host {host}: refusing to serve beyond loopback without an API key "
                         f"(anyone who can reach the address could use the model); set "
                         f"{API_KEY_ENV} or --api-key-file, bind to 127.0.0.1, or pass "
                         "--allow-unauthenticated")
    return (f"serving on {host} without an API key (--allow-unauthenticated): anyone who can "
            "reach this address can use the model")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
