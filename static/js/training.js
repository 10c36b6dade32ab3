/* The training runs list: state, progress, ETA, last loss, host, GPUs, energy; pick runs to compare.
 * Run names and hosts come from outside: text only. */
(function () {
  'use strict';
  var body = document.getElementById('runs-body');
  var empty = document.getElementById('runs-empty');
  var compare = document.getElementById('compare');
  var chosen = {};

  function progressBar(p) {
    if (p === null || p === undefined) return gw.el('span', { class: 'muted' }, '–');
    var pct = Math.round(p * 1000) / 10;
    var bar = gw.el('div', { class: 'gw-progress', role: 'progressbar', 'aria-valuenow': String(pct), 'aria-valuemin': '0', 'aria-valuemax': '100' },
      [gw.el('div', { class: 'gw-progress-fill', style: 'width:' + pct + '%' })]);
    return gw.el('span', { class: 'gw-progress-wrap' }, [bar, gw.el('span', { class: 'num' }, pct + ' %')]);
  }

  function draw(runs, nowMs) {
    body.innerHTML = '';
    empty.hidden = runs.length > 0;
    runs.forEach(function (r) {
      var box = gw.el('input', { type: 'checkbox', class: 'pick', 'aria-label': r.run });
      box.checked = !!chosen[r.run];
      box.addEventListener('change', function () { if (box.checked) chosen[r.run] = 1; else delete chosen[r.run]; sync(); });
      var gpus = (r.gpu_info && r.gpu_info.gpus) || [];
      body.appendChild(gw.el('tr', { 'data-run': r.run, 'data-state': r.state }, [
        gw.el('td', null, [box]),
        gw.el('td', null, [gw.el('a', { class: 'run-link', href: gw.link('/training/' + encodeURIComponent(r.run)) }, r.run)]),
        gw.el('td', null, [gw.el('span', { class: 'gw-badge gw-run-' + r.state }, gw.t('training.state.' + r.state))]),
        gw.el('td', null, [progressBar(r.progress)]),
        gw.el('td', { class: 'num' }, r.eta_seconds === null ? '–' : gw.format(r.eta_seconds, 'seconds')),
        gw.el('td', { class: 'num' }, r.last_loss === null ? '–' : gw.format(r.last_loss, 'none')),
        gw.el('td', null, r.host || '–'),
        gw.el('td', null, gpus.length ? gpus.join(', ') : '–'),
        gw.el('td', { class: 'num' }, r.energy_joules === null ? gw.t('training.unknown') : gw.format(r.energy_joules / 3.6e6, 'kwh')),
        gw.el('td', { class: 'num' }, r.last_seen ? gw.ago(r.last_seen * 1000, nowMs) : '–')
      ]));
    });
  }
  function sync() {
    var names = Object.keys(chosen);
    compare.disabled = names.length < 2;
  }
  compare.addEventListener('click', function () {
    var names = Object.keys(chosen);
    if (names.length < 2) return;
    location.href = gw.link('/training/' + encodeURIComponent(names[0]), { compare: names.slice(1).join(',') });
  });
  var first = gw.data.runs ? gw.data : null;
  if (first) draw(first.runs, first.now_ms);
  gw.onRefresh(function () {
    return gw.getJson('/api/ui/training').then(function (r) {
      if (r.ok && r.body && r.body.data) draw(r.body.data.runs, r.body.data.now_ms || Date.now());
    });
  }, true);
})();
