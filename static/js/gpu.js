/* The GPU page: health cards from instant queries, then the panels. */
(function () {
  'use strict';
  var vars = gw.config.variables || {};
  var q = gw.data.health_queries || {};
  var back = document.getElementById('back');
  if (back) gw.onRefresh(function () { back.href = gw.link('/', { hostname: vars.hostname }); });
  gw.drawPanels(document.getElementById('panels'), gw.panels, vars);

  function card(name) { return document.querySelector('[data-health="' + name + '"]'); }
  function set(name, text, level, state) {
    var el = card(name);
    if (!el) return;
    el.className = 'gw-card' + (level === 'bad' ? ' bad' : level === 'warn' ? ' warnc' : '');
    el.dataset.state = state || 'data';
    gw.text(el.querySelector('.value'), text);
  }
  function values(res) { return res.status === 'ok' ? res.result : null; }
  function first(res) { var r = values(res); return r && r.length ? gw.lastValue(r[0]) : null; }

  gw.onRefresh(function (r) {
    var names = Object.keys(q);
    return Promise.all(names.map(function (k) { return gw.query(gw.fill(q[k], vars), r.end); })).then(function (answers) {
      var a = {};
      names.forEach(function (k, i) { a[k] = answers[i]; });
      var present = values(a.present) && values(a.present).length > 0;
      var lost = values(a.lost) && values(a.lost).length > 0;
      function absent(name) {
        if (lost) return set(name, gw.t('state.failed'), 'bad', 'failed');
        if (present) return set(name, gw.t('state.unsupported'), null, 'unsupported');
        return set(name, gw.t('state.nodata'), null, 'nodata');
      }
      // Throttle reasons now: the gpuwatch_clock_throttled reasons at 1.
      var th = values(a.throttle);
      if (th && th.length) {
        var on = th.filter(function (s) { return gw.lastValue(s) >= 1; }).map(function (s) { return s.metric.reason || '?'; });
        set('throttle', on.length ? on.join(', ') : gw.t('gpu.none'), on.some(function (x) { return /hw_|thermal/.test(x); }) ? 'bad' : on.length ? 'warn' : null);
      } else absent('throttle');
      var sbe = first(a.ecc_sbe), dbe = first(a.ecc_dbe);
      if (sbe === null && dbe === null) absent('ecc');
      else set('ecc', (sbe === null ? '–' : gw.format(sbe, 'count')) + ' / ' + (dbe === null ? '–' : gw.format(dbe, 'count')), dbe > 0 ? 'bad' : sbe > 0 ? 'warn' : null);
      var xid = first(a.xid);
      if (xid === null) absent('xid');
      else if (!xid) set('xid', gw.t('gpu.since_start'));
      else {
        set('xid', 'XID ' + xid, 'bad');
        // When: the last rise of the XID counter within the range.
        gw.queryRange(gw.fill(q.xid_total, vars), r.start, r.end, 600).then(function (res) {
          var s = values(res) && values(res)[0];
          if (!s) return;
          var last = null, prev = null;
          s.values.forEach(function (p) { var v = parseFloat(p[1]); if (prev !== null && v > prev) last = p[0] * 1000; prev = v; });
          if (last) set('xid', 'XID ' + xid + ' · ' + gw.ago(last, r.end), 'bad');
        });
      }
      var cor = first(a.remap_cor), unc = first(a.remap_unc);
      if (cor === null && unc === null) absent('remap');
      else set('remap', (cor === null ? '–' : gw.format(cor, 'count')) + ' / ' + (unc === null ? '–' : gw.format(unc, 'count')), unc > 0 ? 'bad' : cor > 0 ? 'warn' : null);
      var pend = first(a.remap_pending), fail = first(a.remap_failure);
      if (pend === null && fail === null) absent('remap_state');
      else set('remap_state', (pend ? 'pending' : 'no') + ' / ' + (fail ? 'FAILED' : 'no'), fail ? 'bad' : pend ? 'warn' : null);
    });
  });
})();
