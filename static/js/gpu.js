/* The GPU page: health cards from instant queries, then the panels. */
(function () {
  'use strict';
  var vars = gw.config.variables || {};
  var healthQuery = gw.data.health_query, xidTotalQuery = gw.data.xid_total_query;
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

  gw.onRefresh(function (r) {
    // One query brings every health figure; its series are split by metric name.
    return gw.query(gw.fill(healthQuery, vars), r.end).then(function (res) {
      if (res.status === 'busy') return;  // the cards stay as they are until the next refresh
      var byName = {};
      (values(res) || []).forEach(function (s) {
        var n = s.metric.__name__;
        (byName[n] = byName[n] || []).push(s);
      });
      function series(n) { return byName[n] || []; }
      function first(n) { var s = series(n); return s.length ? gw.lastValue(s[0]) : null; }
      var lostFlag = first('gpuwatch_gpu_lost');
      var present = lostFlag === 0, lost = lostFlag === 1;
      function absent(name) {
        if (lost) return set(name, gw.t('state.failed'), 'bad', 'failed');
        if (present) return set(name, gw.t('state.unsupported'), null, 'unsupported');
        return set(name, gw.t('state.nodata'), null, 'nodata');
      }
      // Throttle reasons now: the gpuwatch_clock_throttled reasons at 1.
      var th = series('gpuwatch_clock_throttled');
      if (th.length) {
        var on = th.filter(function (s) { return gw.lastValue(s) >= 1; }).map(function (s) { return s.metric.reason || '?'; });
        set('throttle', on.length ? on.join(', ') : gw.t('gpu.none'), on.some(function (x) { return /hw_|thermal/.test(x); }) ? 'bad' : on.length ? 'warn' : null);
      } else absent('throttle');
      var sbe = first('DCGM_FI_DEV_ECC_SBE_VOL_TOTAL'), dbe = first('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL');
      if (sbe === null && dbe === null) absent('ecc');
      else set('ecc', (sbe === null ? '–' : gw.format(sbe, 'count')) + ' / ' + (dbe === null ? '–' : gw.format(dbe, 'count')), dbe > 0 ? 'bad' : sbe > 0 ? 'warn' : null);
      var xid = first('DCGM_FI_DEV_XID_ERRORS');
      if (xid === null) absent('xid');
      else if (!xid) set('xid', gw.t('gpu.since_start'));
      else {
        set('xid', 'XID ' + xid, 'bad');
        // When: the last rise of the XID counter within the range.
        gw.queryRange(gw.fill(xidTotalQuery, vars), r.start, r.end, 600).then(function (res) {
          var s = values(res) && values(res)[0];
          if (!s) return;
          var last = null, prev = null;
          s.values.forEach(function (p) { var v = parseFloat(p[1]); if (prev !== null && v > prev) last = p[0] * 1000; prev = v; });
          if (last) set('xid', 'XID ' + xid + ' · ' + gw.ago(last, r.end), 'bad');
        });
      }
      var cor = first('DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS'), unc = first('DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS');
      if (cor === null && unc === null) absent('remap');
      else set('remap', (cor === null ? '–' : gw.format(cor, 'count')) + ' / ' + (unc === null ? '–' : gw.format(unc, 'count')), unc > 0 ? 'bad' : cor > 0 ? 'warn' : null);
      var pend = first('DCGM_FI_DEV_ROW_REMAP_PENDING'), fail = first('DCGM_FI_DEV_ROW_REMAP_FAILURE');
      if (pend === null && fail === null) absent('remap_state');
      else set('remap_state', (pend ? 'pending' : 'no') + ' / ' + (fail ? 'FAILED' : 'no'), fail ? 'bad' : pend ? 'warn' : null);
    });
  });
})();
