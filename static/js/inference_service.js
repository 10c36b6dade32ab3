/* One inference service: tiles judged by thresholds ("not available" where the engine has no such
 * metric, "no data" where it has but nothing was measured), charts from the panel registry, a latency
 * distribution heatmap from the histogram buckets, and the GPUs serving it. Text only. */
(function () {
  'use strict';
  var job = gw.data.job;
  var tilesEl = document.getElementById('tiles');

  function drawTiles(tiles) {
    tilesEl.innerHTML = '';
    tiles.forEach(function (t) {
      var value;
      if (!t.available) value = gw.t('inference.na');
      else if (t.value === null) value = gw.t('state.nodata');
      else value = gw.format(t.value, t.unit === 'req/s' || t.unit === 'tok/s' ? 'per_second' : t.unit === 's' ? 'seconds' : t.unit === 'ratio' ? 'ratio' : 'count');
      var tile = gw.el('div', { class: 'gw-tile gw-inf-tile ' + t.state, id: 'tile-' + t.id, 'data-state': t.state, title: t.expr || t.note || '' }, [
        gw.el('div', { class: 'name' }, gw.t('inference.tile.' + t.id) === 'inference.tile.' + t.id ? t.title : gw.t('inference.tile.' + t.id)),
        gw.el('div', { class: 'value' }, value),
        t.note ? gw.el('div', { class: 'facts' }, t.note) : null,
        t.available && t.expr ? gw.el('a', { class: 'gw-explore facts', href: gw.exploreUrl(t.expr) }, gw.t('panel.explore')) : null
      ]);
      tilesEl.appendChild(tile);
    });
  }

  function drawServing(s) {
    var el = document.getElementById('serving');
    var msg = gw.t('inference.serving.' + s.state);
    if (s.ports.length) msg += ' (' + gw.t('inference.ports') + ' ' + s.ports.join(', ') + (s.pids.length ? '; PID ' + s.pids.join(', ') : '') + ')';
    if (s.state === 'found') msg += ': ' + s.gpus.map(function (g) { return g.hostname + '/' + g.gpu + ' ' + gw.format(g.memory_bytes, 'bytes'); }).join(', ');
    gw.text(el, msg);
    el.dataset.state = s.state;
  }

  // The latency distribution: per-bucket request rates (cumulative buckets differenced) over time.
  var heatKey = '', heatAsked = 0;
  function heatmap(r) {
    var el = document.getElementById('chart-heatmap');
    var section = el.closest('section');
    var expr = gw.data.heatmap_expr;
    if (!expr) { section.dataset.state = 'unsupported'; gw.showState(el, 'unsupported', gw.data.heatmap_note || ''); return; }
    // Once a step, as the panels ask (gpuwatch.js): a 1 s refresh would only redraw the last column.
    var width = el.clientWidth || 800, step = gw.stepFor(r.start, r.end, width), key = gw.rangeKey() + '|' + step + '|' + gw.theme();
    if (!r.force && key === heatKey && Date.now() - heatAsked < step * 1000) return;
    heatKey = key; heatAsked = Date.now();
    return gw.queryRange(expr, r.start, r.end, width).then(function (res) {
      if (res.status === 'busy') { heatAsked = 0; return; }  // ask again at the next refresh
      if (res.status !== 'ok') { section.dataset.state = res.status; gw.showState(el, res.status, res.error); return; }
      var rows = res.result.map(function (s) { return { le: parseFloat(s.metric.le), values: s.values }; })
        .filter(function (x) { return !isNaN(x.le); }).sort(function (a, b) { return a.le - b.le; });
      if (!rows.length) { section.dataset.state = 'nodata'; gw.showState(el, 'nodata'); return; }
      var step = res.step * 1000, n = Math.round((res.end - res.start) / step) + 1, x = [];
      for (var i = 0; i < n; i++) x.push(gw.localTime(res.start + i * step));
      var cum = rows.map(function (row) {
        var a = new Array(n).fill(null);
        row.values.forEach(function (v) { var k = Math.round((v[0] * 1000 - res.start) / step); if (k >= 0 && k < n) a[k] = parseFloat(v[1]); });
        return a;
      });
      var z = [], y = [], any = false;
      for (var b = 0; b < rows.length; b++) {
        var lo = b === 0 ? 0 : rows[b - 1].le;
        var zr = cum[b].map(function (v, k) {
          if (v === null || !isFinite(v) && v !== Infinity) return null;
          var prev = b === 0 ? 0 : cum[b - 1][k];
          var d = prev === null ? v : v - prev;
          if (d > 0) any = true;
          return d > 0 ? d : null;
        });
        z.push(zr);
        y.push(gw.esc((rows[b].le === Infinity ? '> ' + gw.format(lo, 'seconds') : '≤ ' + gw.format(rows[b].le, 'seconds'))));
      }
      if (!any) { section.dataset.state = 'nodata'; gw.showState(el, 'nodata', gw.t('inference.no_requests')); return; }
      var c = gw.colors();
      var layout = { uirevision: gw.rangeKey(), margin: { l: 80, r: 12, t: 8, b: 44 }, height: Math.max(260, 30 + 14 * y.length),
        paper_bgcolor: 'rgba(0,0,0,0)', plot_bgcolor: 'rgba(0,0,0,0)', font: { color: c.fg, size: 11 },
        xaxis: { type: 'date', gridcolor: c.grid, range: [gw.localTime(r.start), gw.localTime(r.end)] },
        yaxis: { type: 'category', automargin: true, tickfont: { size: 10 }, showgrid: false } };
      var chart = el.querySelector('.gw-chart');
      if (!chart) { el.innerHTML = ''; chart = gw.el('div', { class: 'gw-chart' }); el.appendChild(chart); }
      section.dataset.state = 'data';
      gw.text(document.getElementById('heatmap-note'), gw.t('inference.heatmap_note'));
      return gw.plot(chart, { data: [{ type: 'heatmap', x: x, y: y, z: z, colorscale: 'Viridis', hoverongaps: false,
        colorbar: { thickness: 10, title: { text: 'req/s', side: 'right' } },
        hovertemplate: '%{y}<br>%{x}<br>%{z:.3~g} req/s<extra></extra>' }], layout: layout });
    });
  }

  drawTiles(gw.data.tiles || []);
  drawServing(gw.data.serving);
  var vars = gw.config.variables || {};
  var service = gw.panels.filter(function (p) { return p.id.indexOf('gpu_') !== 0; });
  var gpus = gw.panels.filter(function (p) { return p.id.indexOf('gpu_') === 0; });
  gw.drawPanels(document.getElementById('charts'), service, vars);
  if (gpus.length) gw.drawPanels(document.getElementById('gpu-panels'), gpus, vars);
  gw.onRefresh(heatmap);
  // Tiles and the serving GPUs come from the page's JSON twin, at most every 5 s (as the cluster page's).
  var lastTwin = Date.now();
  gw.onRefresh(function (range) {
    if (!range.force && Date.now() - lastTwin < 4500) return;
    lastTwin = Date.now();
    return gw.getJson('/api/ui/inference/' + encodeURIComponent(job)).then(function (r) {
      if (gw.isBusy(r)) lastTwin = 0;  // ask again at the next refresh
      else if (r.ok && r.body.data) { drawTiles(r.body.data.tiles); drawServing(r.body.data.serving); }
    });
  }, true);
})();
