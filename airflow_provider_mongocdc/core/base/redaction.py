"""Credentials never leave the connector: :func:`redact_uri` hides them inside any text (connection
strings, signed URLs, error messages, logged values), :func:`error_text` is a driver error's own
message with them hidden, :func:`redact_secrets` also hides known secret values (the storage options'
of the Delta tables, :func:`secret_values`) wherever they appear in a text."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, unquote

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
# Signed-URL and API-key parameters, by their exact names (``name=value``, also URL-encoded inside
# another URL: ``%3D``, ``%26``): S3 SigV4 presigned URLs (X-Amz-Signature, X-Amz-Credential,
# X-Amz-Security-Token), S3 SigV2 and GCS V2 (AWSAccessKeyId, GoogleAccessId, Signature), GCS V4
# (X-Goog-Signature, X-Goog-Credential), an Azure SAS (sig: its sv, se, sp, st... are no secret),
# Azure connection strings (AccountKey, SharedAccessKey) and API keys (key, api_key, apiKey,
# x-api-key, subscription-key). A value ends at "&", ";", ",", a blank, a quote or a bracket.
_SIGNED_PARAMETER = re.compile(
    r"(?:(?<![\w.\-])|(?<=%3F)|(?<=%26))"
    r"((?:x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|x-goog-credential"
    r"|signature|sig|\w*accesskeyid|googleaccessid|accountkey|sharedaccesskey"
    r"|key|api[_\-]?key|x-api-key|subscription-key)\s*(?:=|%3D))"
    r"((?:(?!%26)[^&;,\s'\"<>()\[\]#])+)",
    re.IGNORECASE,
)
# An OAuth authorization code: a query or fragment parameter only (``status code=403`` stays).
_OAUTH_CODE = re.compile(
    r"(?:(?<=[?&#])|(?<=%3F)|(?<=%26))(code(?:=|%3D))((?:(?!%26)[^&;,\s'\"<>()#])+)", re.IGNORECASE
)
# An HTTP bearer token (``Authorization: Bearer ...``).
_BEARER = re.compile(r"(\bBearer\s+)[A-Za-z0-9\-._~+/]{8,}=*")
# The driver's timeout settings inside a server selection error: "(configured timeouts: ...)".
_DRIVER_TIMEOUTS = re.compile(r"\s*\(configured timeouts:[^)]*\)")


def redact_uri(text: str) -> str:
    """``text`` with every credential inside it replaced by ``***``: the password of any
    ``scheme://user:password@`` URI (user names are kept), password-like options
    (``password=``, ``sasl.password=``, ``...Password=``, ``...token=``, ``...secret=``), secret
    authentication properties (``authMechanismProperties=AWS_SESSION_TOKEN:...``), the secret
    parameters of signed URLs (S3, GCS, an Azure SAS's ``sig``), OAuth codes, API keys, account
    keys of Azure connection strings and bearer tokens.

    The one place that hides credentials in connection strings, error messages and logged values.
    """
    text = _USERINFO.sub(r"\1\2:***@", text)
    text = _SIGNED_PARAMETER.sub(r"\1***", text)
    text = _OAUTH_CODE.sub(r"\1***", text)
    text = _BEARER.sub(r"\1***", text)
    text = _SECRET_OPTION.sub(r"\1***", text)
    return _SECRET_PROPERTY.sub(r"\1***", text)


# Storage options (object_store's keys and their aliases, any case) whose value is a credential:
# AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN,
# AZURE_CLIENT_SECRET, google_service_account_key, a connection's password... (and the access key id).
_SECRET_OPTION_NAME = re.compile(
    r"secret|password|passwd|token|credential|signature|sas|key|private", re.IGNORECASE
)
# A shorter value is no real credential, and hiding it would blank out words of the text ("true").
MIN_SECRET_CHARS = 6


def secret_values(options: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The values of ``options`` (the Delta tables' storage options) whose names say they are
    credentials, as a text may show them: as given, URL-encoded and URL-decoded, and an Azure SAS
    token's signature alone; longest first, none shorter than :data:`MIN_SECRET_CHARS`."""
    found: set[str] = set()
    for name, value in (options or {}).items():
        if value is None or not _SECRET_OPTION_NAME.search(str(name)):
            continue
        text = str(value)
        forms = [text, unquote(text), quote(text, safe=""), quote(text)]
        for part_name, part in re.findall(r"(?:^|[?&])([^=&?]+)=([^&]*)", text):
            if part_name.lower() in ("sig", "signature"):
                forms += [part, unquote(part)]
        found.update(form for form in forms if len(form) >= MIN_SECRET_CHARS)
    return tuple(sorted(found, key=lambda form: (-len(form), form)))


def redact_secrets(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with each of ``secrets`` (:func:`secret_values`), wherever it appears, and every
    credential :func:`redact_uri` finds replaced by ``***``: for the errors of a store whose text
    this connector does not control."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return redact_uri(text)


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
