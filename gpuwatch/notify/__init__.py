"""Notifications: Alertmanager's routing, grouping and inhibition in-process, a durable delivery queue,
receivers (webhook, e-mail, Slack, DingTalk, Feishu, WeCom, Apprise) and forwarding to Alertmanagers.

Modules: `config` (the `notify:` block), `receiverconfig` (a receiver's integrations in it), `alerting`
(the `alerting:` block), `matchers`, `route`, `alert` (alerts and payloads), `dispatcher` (groups,
inhibition, dedup), `receivers` and `email` (senders), `forward` (posting to Alertmanagers), `notifier`
(the worker, the queue and the hook into the rule manager), `testsend` (`gpuwatch notify test`).
"""
