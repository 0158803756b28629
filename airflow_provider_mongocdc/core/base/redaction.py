"""Credentials never leave the connector: :func:`redact_uri` hides them inside any text (connection
strings, error messages, logged values), :func:`error_text` is a driver error's own message with them
hidden."""

from __future__ import annotations

import re

_SECRET_WORD = r"(?:password|passwd|pwd|secret|token|credential)"
# Userinfo: the password runs to the last "@" before the next blank or quote, so that an unescaped
# "@", "/" or "?" in it does not leave a part visible.
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://)([^:@/?#\s'\"]*):([^\s'\"]*)@")
# name=value where the name says secret (password=, sasl.password=, tlsCertificateKeyFilePassword=).
_SECRET_OPTION = re.compile(
    rf"(?<![\w.\-])([\w.\-]*{_SECRET_WORD}[\w.\-]*\s*=\s*)(\"[^\"]*\"|'[^']*'|[^&\s'\"]+)", re.IGNORECASE
)
# NAME:value pairs of authMechanismProperties (AWS_SESSION_TOKEN:..., also URL-encoded: %3A, %2C).
_SECRET_PROPERTY = re.compile(
    rf"(?<![\w/])(\w*{_SECRET_WORD}\w*(?::|%3A))((?:(?!%2C)[^,&\s'\"])+)", re.IGNORECASE
)
# The driver's timeout settings inside a server selection error: "(configured timeouts: ...)".
_DRIVER_TIMEOUTS = re.compile(r"\s*\(configured timeouts:[^)]*\)")


def redact_uri(text: str) -> str:
    """``text`` with every credential inside it replaced by ``***``: the password of any
    ``scheme://user:password@`` URI (user names are kept), password-like options
    (``password=``, ``sasl.password=``, ``...Password=``, ``...token=``, ``...secret=``) and
    secret authentication properties (``authMechanismProperties=AWS_SESSION_TOKEN:...``).

    The one place that hides credentials in connection strings, error messages and logged values.
    """
    text = _USERINFO.sub(r"\1\2:***@", text)
    text = _SECRET_OPTION.sub(r"\1***", text)
    return _SECRET_PROPERTY.sub(r"\1***", text)


def error_text(error: BaseException, *, brief: bool = False) -> str:
    """The server's ``errmsg`` of an :class:`OperationFailure`, else ``str(error)``, without the
    driver's ``, full error: {...}`` and with credentials hidden.

    ``brief`` also drops what a server selection error adds after the cause: the driver's
    ``(configured timeouts: ...)`` and the ``, Timeout: ..., Topology Description: ...`` tail.
    """
    from pymongo.errors import OperationFailure  # here: the DAG files import this module, not pymongo

    text = str(error)
    if isinstance(error, OperationFailure) and error.details:
        text = str(error.details.get("errmsg") or text)
    text = text.split(", full error:")[0]
    if brief:
        text = _DRIVER_TIMEOUTS.sub("", text.split(", Timeout:")[0])
    return redact_uri(text)


# Connector properties whose value is a credential (or holds one): a JAAS line, a password, a key,
# a token, the user:password of a schema registry (``*.basic.auth.user.info``).
_CREDENTIAL_PROPERTY = re.compile(
    r"(password|passwd|secret|token|credential|jaas|user\.info|private\.key|\.key\.pem|keystore\.key|"
    r"api\.key|access\.key)",
    re.IGNORECASE,
)


def credential_properties(properties) -> list[str]:
    """The names among ``properties`` that name a credential (a password, a JAAS configuration, a
    schema registry's ``basic.auth.user.info``, a key or a token), sorted."""
    return sorted(str(name) for name in properties if _CREDENTIAL_PROPERTY.search(str(name)))
