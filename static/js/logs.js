/* Search the tailed log lines by run, level, text and the page's time range (GET /api/v1/logs).
 * The filters live in the URL; every line is shown as text. */
(function () {
  'use strict';
  var run = document.getElementById('log-run'), level = document.getElementById('log-level');
  var q = document.getElementById('log-q'), limit = document.getElementById('log-limit');
  function fromUrl() {
    var r = gw.param('run', '');
    if (r && !Array.prototype.some.call(run.options, function (o) { return o.value === r; })) run.appendChild(gw.el('option', { value: r }, r));
    run.value = r;
    level.value = gw.param('level', '');
    q.value = gw.param('q', '');
    limit.value = gw.param('limit', '200');
  }
  fromUrl();
  document.getElementById('log-search').addEventListener('submit', function (ev) {
    ev.preventDefault();
    gw.setParams({ run: run.value || null, level: level.value || null, q: q.value || null, limit: limit.value === '200' ? null : limit.value }, true);
  });
  window.addEventListener('popstate', fromUrl);

  function load(r) {
    var p = new URLSearchParams({ start: String(r.start / 1000), end: String(r.end / 1000), limit: gw.param('limit', '200') });
    ['run', 'level', 'q'].forEach(function (k) { var v = gw.param(k); if (v) p.set(k, v); });
    var body = document.getElementById('log-body');
    return gw.getJson('/api/v1/logs?' + p.toString()).then(function (res) {
      var count = document.getElementById('log-count');
      if (!res.ok) { gw.text(count, (res.body && res.body.error) || gw.t('state.error')); return; }
      var lines = res.body.data || [];
      body.innerHTML = '';
      document.getElementById('log-empty').hidden = lines.length > 0;
      gw.text(count, lines.length + ' ' + gw.t('logs.lines'));
      lines.forEach(function (x) {
        var ev = x.event;
        body.appendChild(gw.el('tr', { class: 'log-line' + (ev ? ' gw-log-event' : ''), 'data-level': x.level }, [
          gw.el('td', { class: 'num gw-nowrap' }, gw.localTime(x.time * 1000).slice(0, 23)),
          gw.el('td', null, x.level),
          gw.el('td', { class: 'gw-nowrap' }, x.run ? [gw.el('a', { href: gw.link('/training/' + encodeURIComponent(x.run)) }, x.run)] : ''),
          gw.el('td', null, ev ? gw.t('logs.event.' + ev) : ''),
          gw.el('td', { class: 'gw-log-text' }, x.text),
          gw.el('td', { class: 'muted', title: x.file }, x.file.split('/').pop())
        ]));
      });
    });
  }
  gw.onRefresh(load);
})();
