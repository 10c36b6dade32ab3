"""Alerts: `/alerts` (firing and pending alerts, rule groups, transitions, silences) and its JSON twin
`/api/ui/alerts`. Silences are made, listed and expired through `/api/v2/silences`."""

from __future__ import annotations

from typing import Any

from flask import Blueprint
from flask.typing import ResponseReturnValue

from gpuwatch.web.dash.alertsdata import active, group_rows, history_rows
from gpuwatch.web.dash.page import page_json, render_page
from gpuwatch.web.runtime import runtime

bp = Blueprint("dash_alerts", __name__)
HISTORY_SHOWN = 500

STRINGS = {
    "alerts.title": ("Alerts", "告警"),
    "alerts.no_rules": ("Rules are not evaluated in this process.", "此进程不评估告警规则。"),
    "alerts.active": ("Firing and pending", "告警中与待定"),
    "alerts.alert": ("Alert", "告警"),
    "alerts.state": ("State", "状态"),
    "alerts.state.firing": ("firing", "告警中"),
    "alerts.state.pending": ("pending", "待定"),
    "alerts.state.inactive": ("inactive", "未激活"),
    "alerts.gstate.firing": ("firing", "告警中"),
    "alerts.gstate.pending": ("pending", "待定"),
    "alerts.gstate.ok": ("ok", "正常"),
    "alerts.gstate.err": ("errors", "出错"),
    "alerts.labels": ("Labels", "标签"),
    "alerts.annotations": ("Annotations", "说明"),
    "alerts.value": ("Value", "值"),
    "alerts.for": ("For", "持续"),
    "alerts.active_since": ("active since", "激活于"),
    "alerts.silenced": ("silenced", "已静默"),
    "alerts.silence": ("Silence…", "静默…"),
    "alerts.new_silence": ("New silence", "新建静默"),
    "alerts.duration": ("Duration", "时长"),
    "alerts.author": ("Author", "创建者"),
    "alerts.comment": ("Comment", "备注"),
    "alerts.default_comment": ("silenced from the alerts page", "从告警页静默"),
    "alerts.create_silence": ("Create silence", "创建静默"),
    "alerts.cancel": ("Cancel", "取消"),
    "alerts.need_matcher": ("Keep at least one matcher.", "至少保留一个匹配条件。"),
    "alerts.silence_created": ("Silence created:", "已创建静默："),
    "alerts.silence_failed": ("Could not create the silence", "创建静默失败"),
    "alerts.silences": ("Silences", "静默"),
    "alerts.matchers": ("Matchers", "匹配条件"),
    "alerts.ends": ("Ends", "结束"),
    "alerts.expire": ("Expire", "使失效"),
    "alerts.none_active": ("Nothing is firing or pending.", "没有告警中或待定的告警。"),
    "alerts.none_silences": ("No silences.", "没有静默。"),
    "alerts.groups": ("Rule groups", "规则组"),
    "alerts.group": ("Group", "组"),
    "alerts.file": ("File", "文件"),
    "alerts.interval": ("Interval", "间隔"),
    "alerts.last_eval": ("Last evaluation", "上次评估"),
    "alerts.eval_time": ("Took", "耗时"),
    "alerts.rules": ("Rules", "规则"),
    "alerts.errors": ("Errors", "错误"),
    "alerts.history": ("Transitions", "状态变化"),
    "alerts.history_help": (
        "The latest transitions (kept in the store across restarts), newest first.",
        "最近的状态变化（保存在存储中，重启后仍在），最新在前。",
    ),
    "alerts.time": ("Time", "时间"),
    "alerts.transition": ("Change", "变化"),
    "alerts.none_history": ("No transitions yet.", "还没有状态变化。"),
}


def _alerts() -> dict[str, Any]:
    rt = runtime()
    now = rt.clock.now_ms()
    manager = rt.rules
    silences = rt.silences
    muted_by = silences.muted_by if silences is not None else None
    groups = manager.groups() if manager is not None else []
    return {
        "rules_enabled": manager is not None,
        "silences_enabled": silences is not None,
        "alerts": active(groups, now, muted_by, rt.received.firing(now) if rt.received is not None else []),
        "groups": group_rows(groups),
        "history": history_rows(manager.history(HISTORY_SHOWN)) if manager is not None else [],
        "silences": [s.to_json(now) for s in silences.list()] if silences is not None else [],
    }


@bp.get("/api/ui/alerts")
def alerts_json() -> ResponseReturnValue:
    return page_json("alerts", (), _alerts(), {}, [STRINGS])


@bp.get("/alerts")
def alerts_page() -> ResponseReturnValue:
    return render_page("alerts.html", page="alerts", data=_alerts(), tables=[STRINGS], title="Alerts")
