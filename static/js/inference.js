/* The inference services list: one row per scrape job of vLLM, SGLang or TGI. Text only. */
(function () {
  'use strict';
  var body = document.getElementById('services-body');
  var empty = document.getElementById('services-empty');
  function cell(v, unit, state) {
    return gw.el('td', { class: 'num' + (state && state !== 'ok' && state !== 'none' ? ' ' + state : '') }, v === null ? '–' : gw.format(v, unit));
  }
  function draw(rows) {
    body.innerHTML = '';
    empty.hidden = rows.length > 0;
    rows.forEach(function (s) {
      body.appendChild(gw.el('tr', { 'data-job': s.job }, [
        gw.el('td', null, [gw.el('a', { class: 'service-link', href: gw.link('/inference/' + encodeURIComponent(s.job)) }, s.job)]),
        gw.el('td', null, s.engine),
        gw.el('td', null, s.models.join(', ')),
        cell(s.requests, 'per_second'),
        cell(s.e2e_p99, 'seconds'),
        cell(s.error_ratio, 'ratio', s.error_state),
        cell(s.kv_cache, 'ratio', s.kv_state),
        cell(s.waiting, 'count'),
        cell(s.unreachable, 'count', s.unreachable ? 'crit' : 'ok')
      ]));
    });
  }
  if (gw.data.services) draw(gw.data.services);
  gw.onRefresh(function () {
    return gw.getJson('/api/ui/inference').then(function (r) { if (r.ok && r.body.data) draw(r.body.data.services); });
  }, true);
})();
