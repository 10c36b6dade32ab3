"""Read a receiver of `notify:` into a frozen `Receiver`: its integrations, one per entry of its `*_configs`
lists; every problem is one sentence naming its path.

Receivers: `webhook_configs`, `email_configs`, `slack_configs` as Alertmanager writes them, plus
`dingtalk_configs`, `feishu_configs`, `wecom_configs` (group robots) and `apprise_configs` (any
Apprise URL; needs `pip install 'gpuwatch[apprise]'`). Message options (`title`, `text`, `html`, e-mail
`headers`, ...) are Go templates as in Alertmanager (`notify/templates.py`), checked here; without them
gpuwatch sends its own default message. `http_config` (`HttpOptions`) is read here for the
Alertmanagers of `alerting.py` too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from gpuwatch.notify.templates import default_set
from gpuwatch.notify.yamlread import boolean, check_keys, duration, fail, listing, mapping, text
from gpuwatch.templating.template import TemplateError

DEFAULT_TIMEOUT_S = 10.0
WECOM_URL = "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key="


@dataclass(frozen=True)
class HttpOptions:
    """The parts of Alertmanager's `http_config` gpuwatch uses."""

    basic_auth: tuple[str, str] | None = None
    authorization: tuple[str, str] | None = None  # (type, credentials)
    insecure_skip_verify: bool = False
    ca_file: str = ""
    proxy_url: str = ""


@dataclass(frozen=True)
class Integration:
    """One entry of a receiver's `*_configs` list; `kind` says which sender uses it."""

    kind: str  # webhook, email, slack, dingtalk, feishu, wecom, apprise
    name: str  # e.g. "webhook[0]", as the delivery log shows it
    send_resolved: bool
    url: str = ""
    secret: str = ""
    max_alerts: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    http: HttpOptions = HttpOptions()
    options: tuple[tuple[str, Any], ...] = ()  # kind-specific: channel, to, smarthost, urls, ...
    templated: tuple[str, ...] = ()  # option keys whose values are Go templates
    templates: Any = field(default=None, compare=False, repr=False)  # TemplateSet: config.load_templates

    def option(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)


@dataclass(frozen=True)
class Receiver:
    """A named receiver and its integrations (a receiver with none swallows notifications)."""

    name: str
    integrations: tuple[Integration, ...] = ()


def http_options(path: str, raw: object) -> HttpOptions:
    data = mapping(path, raw)
    check_keys(
        path,
        data,
        (
            "basic_auth",
            "authorization",
            "bearer_token",
            "tls_config",
            "proxy_url",
            "follow_redirects",
            "enable_http2",
        ),
    )
    basic = auth = None
    if "basic_auth" in data:
        b = mapping(f"{path}.basic_auth", data["basic_auth"])
        check_keys(f"{path}.basic_auth", b, ("username", "password"))
        basic = (
            text(f"{path}.basic_auth.username", b.get("username", "")),
            text(f"{path}.basic_auth.password", b.get("password", "")),
        )
    if "authorization" in data:
        a = mapping(f"{path}.authorization", data["authorization"])
        check_keys(f"{path}.authorization", a, ("type", "credentials"))
        auth = (
            text(f"{path}.authorization.type", a.get("type", "Bearer")),
            text(f"{path}.authorization.credentials", a.get("credentials", "")),
        )
    if "bearer_token" in data:
        auth = ("Bearer", text(f"{path}.bearer_token", data["bearer_token"]))
    if basic and auth:
        raise fail(path, "use basic_auth or authorization, not both")
    tls = mapping(f"{path}.tls_config", data.get("tls_config"))
    check_keys(f"{path}.tls_config", tls, ("insecure_skip_verify", "ca_file", "server_name"))
    return HttpOptions(
        basic_auth=basic,
        authorization=auth,
        insecure_skip_verify=boolean(
            f"{path}.tls_config.insecure_skip_verify", tls.get("insecure_skip_verify", False)
        ),
        ca_file=text(f"{path}.tls_config.ca_file", tls.get("ca_file", "")),
        proxy_url=http_url(f"{path}.proxy_url", data["proxy_url"]) if data.get("proxy_url") else "",
    )


def http_url(path: str, raw: object) -> str:
    url = text(path, raw).strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise fail(path, f"expected an http:// or https:// URL, got {url!r}")
    return url


def _url_or_file(path: str, data: dict[str, Any], key: str, default: str = "") -> str:
    if key in data and f"{key}_file" in data:
        raise fail(path, f"use {key} or {key}_file, not both")
    if f"{key}_file" in data:
        where = f"{path}.{key}_file"
        try:
            with open(text(where, data[f"{key}_file"]), encoding="utf-8") as f:
                return http_url(where, f.read().strip())
        except OSError as e:
            raise fail(where, f"cannot read the file: {e.strerror or e}") from None
    if key in data:
        return http_url(f"{path}.{key}", data[key])
    if default:
        return default
    raise fail(path, f"{key} is missing")


_TEMPLATE_KEYS = {
    "slack": (
        "title",
        "title_link",
        "text",
        "pretext",
        "fallback",
        "footer",
        "color",
        "fields",
        "actions",
        "callback_id",
        "short_fields",
        "mrkdwn_in",
        "link_names",
        "image_url",
        "thumb_url",
        "icon_emoji",
        "icon_url",
        "username",
    ),
    "email": ("html", "text", "headers"),
}
_COMMON = ("send_resolved", "http_config")
_SLACK_TEXT = (
    "channel",
    "username",
    "icon_emoji",
    "icon_url",
    "title",
    "title_link",
    "pretext",
    "text",
    "fallback",
    "footer",
    "color",
    "callback_id",
)


def _template(path: str, raw: object) -> str:
    """Read a message option: a Go template as in Alertmanager, checked for syntax now."""

    value = text(path, raw)
    try:
        default_set().check(value)
    except TemplateError as e:
        raise fail(path, f"template error: {e}") from None
    return value


def _integration(  # noqa: C901 - one check per receiver option
    path: str, kind: str, index: int, raw: object, glob: dict[str, Any], ignored: list[str]
) -> Integration:
    data = mapping(path, raw)
    name = f"{kind}[{index}]"
    default_resolved = kind not in ("email", "slack")  # Alertmanager's defaults
    resolved = boolean(f"{path}.send_resolved", data.get("send_resolved", default_resolved))
    http = http_options(f"{path}.http_config", data.get("http_config") or glob.get("http_config"))
    if kind == "webhook":
        check_keys(path, data, (*_COMMON, "url", "url_file", "max_alerts", "timeout"))
        max_alerts = data.get("max_alerts", 0)
        if isinstance(max_alerts, bool) or not isinstance(max_alerts, int) or max_alerts < 0:
            raise fail(f"{path}.max_alerts", f"expected a whole number (0 means all), got {max_alerts!r}")
        timeout = duration(f"{path}.timeout", data["timeout"]) if data.get("timeout") else DEFAULT_TIMEOUT_S
        return Integration(
            kind,
            name,
            resolved,
            _url_or_file(path, data, "url"),
            max_alerts=max_alerts,
            timeout_s=timeout,
            http=http,
        )
    if kind == "slack":
        check_keys(path, data, (*_COMMON, "api_url", "api_url_file", "channel", *_TEMPLATE_KEYS["slack"]))
        url = _url_or_file(path, data, "api_url", glob.get("slack_api_url", ""))
        opts: dict[str, Any] = {k: _template(f"{path}.{k}", data[k]) for k in _SLACK_TEXT if k in data}
        for k in ("fields", "actions", "short_fields", "mrkdwn_in", "link_names", "image_url", "thumb_url"):
            if k in data:
                ignored.append(f"{path}.{k}")
        return Integration(
            kind, name, resolved, url, http=http, options=tuple(sorted(opts.items())), templated=tuple(opts)
        )
    if kind in ("dingtalk", "feishu", "wecom"):
        check_keys(
            path,
            data,
            (*_COMMON, "url", "secret", "title", "message", *(("key",) if kind == "wecom" else ())),
        )
        opts = {k: _template(f"{path}.{k}", data[k]) for k in ("title", "message") if k in data}
        if kind == "wecom" and "key" in data:
            if "url" in data:
                raise fail(path, "use url or key, not both")
            url = WECOM_URL + text(f"{path}.key", data["key"])
        else:
            url = _url_or_file(path, data, "url")
        secret = text(f"{path}.secret", data.get("secret", ""))
        return Integration(
            kind,
            name,
            resolved,
            url,
            secret=secret,
            http=http,
            options=tuple(sorted(opts.items())),
            templated=tuple(opts),
        )
    if kind == "email":
        keys = (
            "to",
            "from",
            "smarthost",
            "hello",
            "auth_username",
            "auth_password",
            "auth_identity",
            "auth_secret",
            "require_tls",
            "tls_config",
            *_TEMPLATE_KEYS["email"],
        )
        check_keys(path, data, ("send_resolved", *keys))
        opts = {}
        if "to" not in data:
            raise fail(path, "to is missing (the address to send to)")
        opts["to"] = text(f"{path}.to", data["to"])
        for key, gkey in (
            ("from", "smtp_from"),
            ("smarthost", "smtp_smarthost"),
            ("hello", "smtp_hello"),
            ("auth_username", "smtp_auth_username"),
            ("auth_password", "smtp_auth_password"),
        ):
            value = data.get(key, glob.get(gkey, ""))
            opts[key] = text(f"{path}.{key}", value) if value != "" else ""
        for key in ("from", "smarthost"):
            if not opts[key]:
                raise fail(path, f"{key} is missing (set it here or as global.smtp_{key})")
        host, _, port = opts["smarthost"].rpartition(":")
        if not host or not port.isdigit():
            raise fail(f"{path}.smarthost", f"expected host:port, got {opts['smarthost']!r}")
        opts["require_tls"] = boolean(
            f"{path}.require_tls", data.get("require_tls", glob.get("smtp_require_tls", True))
        )
        tls = http_options(path, {"tls_config": data.get("tls_config")} if data.get("tls_config") else {})
        headers = mapping(f"{path}.headers", data.get("headers"))
        templated = []
        for k, v in headers.items():
            if k.lower() in ("from", "to"):
                raise fail(f"{path}.headers.{k}", f"set {k.lower()} as the integration's own key instead")
            opts[f"header:{k.title()}"] = _template(f"{path}.headers.{k}", v)
            templated.append(f"header:{k.title()}")
        for k in ("html", "text"):
            if k in data:
                opts[k] = _template(f"{path}.{k}", data[k])
                templated.append(k)
        return Integration(
            kind, name, resolved, http=tls, options=tuple(sorted(opts.items())), templated=tuple(templated)
        )
    if kind == "apprise":
        check_keys(path, data, ("send_resolved", "url", "urls", "title", "message"))
        texts = {k: _template(f"{path}.{k}", data[k]) for k in ("title", "message") if k in data}
        urls = [text(f"{path}.url", data["url"])] if "url" in data else []
        urls += [
            text(f"{path}.urls[{i}]", u) for i, u in enumerate(listing(f"{path}.urls", data.get("urls")))
        ]
        if not urls:
            raise fail(path, "url is missing (an Apprise URL such as tgram://TOKEN/CHAT_ID)")
        _check_apprise(path, urls)
        return Integration(
            kind,
            name,
            resolved,
            options=(("urls", tuple(urls)), *sorted(texts.items())),
            templated=tuple(texts),
        )
    raise AssertionError(kind)


def _check_apprise(path: str, urls: list[str]) -> None:

    try:
        apprise = import_apprise()
    except ImportError:
        raise fail(
            path, "apprise is not installed; install it with pip install 'gpuwatch[apprise]'"
        ) from None
    for i, url in enumerate(urls):
        if apprise.Apprise.instantiate(url) is None:
            raise fail(f"{path}", f"Apprise does not understand URL {i + 1} (check its scheme and form)")


_KINDS = ("webhook", "email", "slack", "dingtalk", "feishu", "wecom", "apprise")
_UNSUPPORTED = (
    "pagerduty",
    "opsgenie",
    "victorops",
    "pushover",
    "sns",
    "telegram",
    "discord",
    "msteams",
    "msteamsv2",
    "webex",
    "wechat",
    "jira",
    "rocketchat",
)


def parse_receiver(path: str, raw: object, glob: dict[str, Any], ignored: list[str]) -> Receiver:
    data = mapping(path, raw)
    for key in data:
        if key.endswith("_configs") and key[: -len("_configs")] in _UNSUPPORTED:
            hint = " (WeCom group robots: use wecom_configs)" if key == "wechat_configs" else ""
            raise fail(
                f"{path}.{key}",
                f"not supported by gpuwatch; use apprise_configs with an Apprise URL or webhook_configs instead{hint}",
            )
    check_keys(path, data, ("name", *(f"{k}_configs" for k in _KINDS)))
    if not data.get("name"):
        raise fail(f"{path}.name", "a receiver needs a name")
    out = []
    for kind in _KINDS:
        key = f"{kind}_configs"
        for i, item in enumerate(listing(f"{path}.{key}", data.get(key))):
            out.append(_integration(f"{path}.{key}[{i}]", kind, i, item, glob, ignored))
    return Receiver(text(f"{path}.name", data["name"]), tuple(out))


def import_apprise() -> Any:
    """Import apprise (an optional extra) without the DeprecationWarnings it causes on import."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import apprise  # type: ignore[import-not-found,unused-ignore]

        apprise.Apprise.instantiate("json://localhost/")  # loads every plugin module now, inside the filter
    return apprise
