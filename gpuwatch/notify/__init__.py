"""Notifications: Alertmanager's routing, grouping and inhibition in-process, a durable delivery queue,
receivers (webhook, e-mail, Slack, DingTalk, Feishu, WeCom, Apprise) and forwarding to Alertmanagers.

Modules: `config` (the `notify:` and `alerting:` blocks), `matchers`, `route`, `alert` (alerts and
payloads), `dispatcher` (groups and dedup), `receivers` and `email` (senders), `notifier` (the worker,
the queue and the hook into the rule manager), `testsend` (`gpuwatch notify test`).
"""
