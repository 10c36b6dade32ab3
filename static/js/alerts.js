/* Alerts: firing and pending alerts (labels and annotations as text), a silence from an alert in two
 * clicks (its labels as matchers, a comment and a duration; POST /api/v2/silences with the CSRF token),
 * silences with expire, rule groups, and the latest transitions (stored). */
(function () {
  'use strict';
  var form = document.getElementById('silence-form');
  var current = null;  // the alert a silence is being made from
  var SKIP_SUMMARY = { alertname: 1 };

  function chips(labels, skip) {
    return gw.el('span', { class: 'gw-labels' }, Object.keys(labels).sort().filter(function (k) { return !(skip && skip[k]); }).map(function (k) {
      return gw.el('span', { class: 'gw-chip' }, k + '=' + labels[k]);
    }));
  }
  function notes(ann) {
    return gw.el('div', { class: 'gw-annotations' }, Object.keys(ann).sort(function (a, b) {
      var order = { summary: 0, description: 1 };
      return (order[a] === undefined ? 9 : order[a]) - (order[b] === undefined ? 9 : order[b]) || a.localeCompare(b);
    }).map(function (k) {
      return gw.el('div', { class: 'gw-annotation', 'data-key': k }, [gw.el('b', null, k + ': '), document.createTextNode(ann[k])]);
    }));
  }
  function duration(ms) { return gw.format(ms / 1000, 'seconds'); }

  function drawAlerts(rows) {
    var body = document.getElementById('alerts-body');
    body.innerHTML = '';
    document.getElementById('alerts-empty').hidden = rows.length > 0;
    gw.text(document.getElementById('active-count'), rows.length ? '(' + rows.length + ')' : '');
    rows.forEach(function (a) {
      var silence = gw.el('button', { type: 'button', class: 'silence-btn' }, gw.t('alerts.silence'));
      silence.addEventListener('click', function () { openForm(a); });
      var explore = a.explore ? gw.el('a', { class: 'gw-explore', href: gw.exploreUrl(a.explore.expr, { from: String(a.explore.start), to: String(a.explore.end), refresh: 'off' }) }, gw.t('panel.explore')) : null;
      body.appendChild(gw.el('tr', { class: 'alert-row ' + a.state, 'data-alertname': a.labels.alertname || a.rule, 'data-state': a.state }, [
        gw.el('td', null, [gw.el('b', null, a.labels.alertname || a.rule), gw.el('div', { class: 'muted' }, a.group)]),
        gw.el('td', null, [gw.el('span', { class: 'gw-badge gw-alert-' + a.state }, gw.t('alerts.state.' + a.state)),
          a.silenced_by.length ? gw.el('span', { class: 'gw-badge gw-silenced' }, gw.t('alerts.silenced')) : null]),
        gw.el('td', null, [chips(a.labels, SKIP_SUMMARY)]),
        gw.el('td', null, [notes(a.annotations)]),
        gw.el('td', { class: 'num' }, a.value === null ? (a.value_text || '–') : gw.format(a.value, 'none')),
        gw.el('td', { class: 'num', title: gw.t('alerts.active_since') + ' ' + gw.localTime(a.active_at).slice(0, 19) }, duration(a.for_ms)),
        gw.el('td', null, [silence, ' ', explore])
      ]));
    });
  }

  function openForm(a) {
    current = a;
    form.hidden = false;
    gw.text(document.getElementById('silence-for'), a.labels.alertname || a.rule);
    var box = document.getElementById('silence-matchers');
    box.innerHTML = '';
    a.silence_matchers.forEach(function (m, i) {
      var cb = gw.el('input', { type: 'checkbox', class: 'matcher', 'data-i': String(i) });
      cb.checked = true;
      box.appendChild(gw.el('label', { class: 'gw-chip' }, [cb, ' ' + m.name + '="' + m.value + '"']));
    });
    var comment = document.getElementById('silence-comment');
    if (!comment.value) comment.value = gw.t('alerts.default_comment');
    gw.text(document.getElementById('silence-result'), '');
    document.getElementById('silence-create').focus();
  }
  document.getElementById('silence-cancel').addEventListener('click', function () { form.hidden = true; current = null; });
  form.addEventListener('submit', function (ev) {
    ev.preventDefault();
    if (!current) return;
    var matchers = [];
    form.querySelectorAll('input.matcher').forEach(function (cb) { if (cb.checked) matchers.push(current.silence_matchers[+cb.dataset.i]); });
    var result = document.getElementById('silence-result');
    if (!matchers.length) { gw.text(result, gw.t('alerts.need_matcher')); return; }
    var now = Date.now(), dur = gw.parseDuration(document.getElementById('silence-duration').value);
    var body = { matchers: matchers, startsAt: new Date(now).toISOString(), endsAt: new Date(now + dur).toISOString(),
      createdBy: document.getElementById('silence-author').value || 'gpuwatch-ui', comment: document.getElementById('silence-comment').value };
    gw.fetch('/api/v2/silences', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) })
      .then(function (resp) { return resp.json().then(function (j) { return { ok: resp.ok, body: j }; }); })
      .then(function (r) {
        if (r.ok) { gw.text(result, gw.t('alerts.silence_created') + ' ' + r.body.silenceID); form.hidden = true; current = null; gw.refresh(); }
        else gw.text(result, gw.t('alerts.silence_failed') + ': ' + (typeof r.body === 'string' ? r.body : JSON.stringify(r.body)));
      }, function (e) { gw.text(result, gw.t('alerts.silence_failed') + ': ' + e); });
  });

  function matcherText(m) { return m.name + (m.isEqual === false ? '!' : '') + (m.isRegex ? '=~' : '=') + '"' + m.value + '"'; }
  function drawSilences(rows) {
    var body = document.getElementById('silences-body');
    body.innerHTML = '';
    document.getElementById('silences-empty').hidden = rows.length > 0;
    rows.forEach(function (s) {
      var expire = null;
      if (s.status.state !== 'expired') {
        expire = gw.el('button', { type: 'button', class: 'expire-btn' }, gw.t('alerts.expire'));
        expire.addEventListener('click', function () {
          gw.fetch('/api/v2/silence/' + encodeURIComponent(s.id), { method: 'DELETE' }).then(function () { gw.refresh(); });
        });
      }
      body.appendChild(gw.el('tr', { 'data-silence': s.id, 'data-state': s.status.state }, [
        gw.el('td', { class: 'muted' }, s.id.slice(0, 8)),
        gw.el('td', null, [gw.el('span', { class: 'gw-labels' }, s.matchers.map(function (m) { return gw.el('span', { class: 'gw-chip' }, matcherText(m)); }))]),
        gw.el('td', null, s.status.state),
        gw.el('td', null, String(s.endsAt).slice(0, 19).replace('T', ' ')),
        gw.el('td', null, s.createdBy),
        gw.el('td', null, s.comment),
        gw.el('td', null, [expire])
      ]));
    });
  }

  function drawGroups(groups, nowMs) {
    var body = document.getElementById('groups-body');
    body.innerHTML = '';
    groups.forEach(function (g) {
      var firing = g.rules.filter(function (r) { return r.state === 'firing'; }).length;
      body.appendChild(gw.el('tr', { 'data-group': g.name, 'data-state': g.state, class: g.state === 'err' ? 'crit' : '' }, [
        gw.el('td', null, g.name),
        gw.el('td', { class: 'muted' }, g.file),
        gw.el('td', null, [gw.el('span', { class: 'gw-badge gw-alert-' + g.state }, gw.t('alerts.gstate.' + g.state))]),
        gw.el('td', { class: 'num' }, gw.format(g.interval_s, 'seconds')),
        gw.el('td', { class: 'num' }, g.last_eval ? gw.ago(g.last_eval, nowMs) : gw.t('common.never')),
        gw.el('td', { class: 'num' }, gw.format(g.duration_s, 'seconds')),
        gw.el('td', null, g.rules.length + (firing ? ' (' + firing + ' ' + gw.t('alerts.state.firing') + ')' : '')),
        gw.el('td', { class: 'error' }, g.errors.map(function (e) { return e.rule + ': ' + e.error; }).join('; '))
      ]));
    });
  }

  function drawHistory(rows) {
    var body = document.getElementById('history-body');
    body.innerHTML = '';
    document.getElementById('history-empty').hidden = rows.length > 0;
    rows.forEach(function (h) {
      body.appendChild(gw.el('tr', { 'data-to': h.to }, [
        gw.el('td', { class: 'num' }, gw.localTime(h.at).slice(0, 19)),
        gw.el('td', null, h.labels.alertname || h.rule),
        gw.el('td', null, gw.t('alerts.state.' + h.from) + ' → ' + gw.t('alerts.state.' + h.to)),
        gw.el('td', null, [chips(h.labels, SKIP_SUMMARY)])
      ]));
    });
  }

  function draw(d) {
    drawAlerts(d.alerts || []);
    drawSilences(d.silences || []);
    drawGroups(d.groups || [], d.now_ms);
    drawHistory(d.history || []);
  }
  draw(gw.data);
  gw.onRefresh(function () {
    if (!form.hidden) return;  // do not redraw under a half-made silence
    return gw.getJson('/api/ui/alerts').then(function (r) { if (r.ok && r.body.data) draw(r.body.data); });
  }, true);
})();
