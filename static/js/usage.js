/* The usage page: who held the GPUs over the range (tiles, busy and idle-held bars, the table) from the
 * page's JSON twin, and the same figures over time from the panel registry. User, run, job and pod
 * names come from outside: text only (gw.el, gw.esc for Plotly). */
(function () {
  'use strict';
  var data = gw.data || {};
  var by = data.by || 'user';
  var tilesEl = document.getElementById('usage-tiles');
  var barsEl = document.getElementById('usage-bars');
  var barsCard = document.getElementById('panel-usage_bars');
  var head = document.getElementById('usage-head');
  var body = document.getElementById('usage-body');
  var empty = document.getElementById('usage-empty');
  var rangeEl = document.getElementById('usage-range');
  var jsonLink = document.getElementById('usage-json');
  var TWIN_EVERY_MS = 60000;  // the report reads every counter over the range: at most once a minute

  gw.drawPanels(document.getElementById('charts'), gw.panels, gw.config.variables || {});

  function hours(v) {
    if (v === null || v === undefined || isNaN(v)) return '–';
    var a = Math.abs(v);
    return (a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : v.toFixed(2)) + ' ' + gw.t('usage.unit_h');
  }
  function pct(part, whole) { return whole > 0 ? gw.format(100 * part / whole, 'percent') : '–'; }
  function money(v, currency) { return v === null || v === undefined ? '–' : v.toFixed(2) + ' ' + currency; }

  /** A group's name as the table and the chart show it. */
  function groupName(g) {
    var none = gw.t('usage.no_group');
    switch (by) {
      case 'host': return g.Hostname || none;
      case 'job': return g.slurm_job ? g.slurm_job + (g.user ? ' (' + g.user + ')' : '') : none;
      case 'pod': return g.pod ? (g.namespace ? g.namespace + '/' : '') + g.pod : g.pod_uid || none;
      default: return g[by] || none;
    }
  }

  /** Each group's figures summed over the report's periods, most GPU-hours held first. */
  function byGroup(rows) {
    var out = {}, order = [];
    rows.forEach(function (r) {
      var key = JSON.stringify(r.group);
      if (!out[key]) { out[key] = { group: r.group, allocated: 0, busy: 0, idle: 0 }; order.push(key); }
      out[key].allocated += r.allocated_gpu_hours; out[key].busy += r.busy_gpu_hours; out[key].idle += r.idle_held_gpu_hours;
    });
    return order.map(function (k) { return out[k]; }).sort(function (a, b) { return b.allocated - a.allocated; });
  }

  /** The bars: busy and idle-but-held GPU-hours of the top 15 groups (and, where a GPU reports no
   * utilization, the rest of what they held), one stacked bar each, largest on top. */
  gw.usageFigure = function (rows, colors) {
    var c = colors || gw.colors();
    var groups = byGroup(rows).slice(0, 15).reverse();
    var names = groups.map(function (g) { return gw.esc(groupName(g.group)); });
    function trace(name, values, color) {
      return { type: 'bar', orientation: 'h', name: gw.esc(name), y: names, x: values, marker: { color: color },
        text: values.map(function (v) { return gw.esc(hours(v)); }), textposition: 'none',
        hovertemplate: '%{y}: %{text} ' + gw.esc(name) + '<extra></extra>' };
    }
    var data = [trace(gw.t('usage.busy'), groups.map(function (g) { return g.busy; }), c.accent),
      trace(gw.t('usage.idle_held'), groups.map(function (g) { return g.idle; }), c.warn)];
    // increase() extrapolates each counter on its own, so busy + idle-held may differ from allocated by
    // seconds; only a GPU that reports no utilization (MIG) leaves a visible rest.
    var top = Math.max.apply(null, groups.map(function (g) { return g.allocated; }).concat([0]));
    var other = groups.map(function (g) { var v = g.allocated - g.busy - g.idle; return v > 0.005 * top ? v : 0; });
    if (other.some(function (v) { return v > 0; })) data.push(trace(gw.t('usage.no_util'), other, c.muted));
    return { data: data, layout: {
      barmode: 'stack', height: Math.max(140, 34 + 26 * groups.length), margin: { l: 12, r: 12, t: 8, b: 32 },
      paper_bgcolor: 'rgba(0,0,0,0)', plot_bgcolor: 'rgba(0,0,0,0)', font: { color: c.fg, size: 11 },
      showlegend: true, legend: { orientation: 'h', y: -0.2 }, hovermode: 'closest',
      xaxis: { gridcolor: c.grid, zeroline: false, ticksuffix: ' ' + gw.t('usage.unit_h') },
      yaxis: { type: 'category', automargin: true, gridcolor: c.grid }
    } };
  };

  function tile(id, name, value, note, state) {
    return gw.el('div', { class: 'gw-tile gw-inf-tile ' + (state || ''), id: 'tile-' + id, 'data-state': state || 'data' }, [
      gw.el('div', { class: 'name' }, name), gw.el('div', { class: 'value' }, value), gw.el('div', { class: 'facts' }, note || '')
    ]);
  }
  function drawTiles(rep) {
    var t = rep.total || {}, rate = t.allocation_rate;
    tilesEl.innerHTML = '';
    [
      tile('gpu_hours', gw.t('usage.gpu_hours'), hours(t.gpu_hours)),
      tile('allocated', gw.t('usage.allocated'), hours(t.allocated_gpu_hours),
        gw.t('usage.allocation_rate') + ' ' + (rate === null || rate === undefined ? '–' : gw.format(100 * rate, 'percent'))),
      tile('busy', gw.t('usage.busy'), hours(t.busy_gpu_hours), pct(t.busy_gpu_hours, t.allocated_gpu_hours)),
      tile('idle_held', gw.t('usage.idle_held'), hours(t.idle_held_gpu_hours), pct(t.idle_held_gpu_hours, t.allocated_gpu_hours),
        t.idle_held_gpu_hours > 0 ? 'warn' : ''),
      tile('energy', gw.t('usage.energy'), gw.format(t.energy_kwh, 'kwh')),
      tile('cost', gw.t('usage.cost'), money(t.cost, rep.currency), t.cost === null || t.cost === undefined ? gw.t('usage.no_price') : '',
        t.cost === null || t.cost === undefined ? 'na' : '')
    ].forEach(function (el) { tilesEl.appendChild(el); });
  }

  function drawTable(rep) {
    var split = !!rep.every;
    head.innerHTML = '';
    var cols = (split ? [[gw.t('usage.period'), '']] : []).concat([[gw.t('usage.by.' + by), ''],
      [gw.t('usage.allocated'), 'num'], [gw.t('usage.busy'), 'num'], [gw.t('usage.idle_held'), 'num'],
      [gw.t('usage.idle_share'), 'num'], [gw.t('usage.energy'), 'num'], [gw.t('usage.cost'), 'num']]);
    cols.forEach(function (c) { head.appendChild(gw.el('th', c[1] ? { class: c[1] } : null, c[0])); });
    body.innerHTML = '';
    empty.hidden = rep.rows.length > 0;
    rep.rows.forEach(function (r) {
      var cells = [];
      if (split) cells.push(gw.el('td', { class: 'gw-nowrap' }, gw.localTime(r.start_ms).slice(0, 10)));
      cells.push(gw.el('td', { class: 'group' }, groupName(r.group)));
      cells.push(gw.el('td', { class: 'num' }, hours(r.allocated_gpu_hours)));
      cells.push(gw.el('td', { class: 'num' }, hours(r.busy_gpu_hours)));
      cells.push(gw.el('td', { class: 'num' + (r.idle_held_gpu_hours > 0 ? ' gw-idle' : '') }, hours(r.idle_held_gpu_hours)));
      cells.push(gw.el('td', { class: 'num' }, pct(r.idle_held_gpu_hours, r.allocated_gpu_hours)));
      cells.push(gw.el('td', { class: 'num' }, gw.format(r.energy_kwh, 'kwh')));
      cells.push(gw.el('td', { class: 'num' }, money(r.cost, rep.currency)));
      body.appendChild(gw.el('tr', { 'data-group': JSON.stringify(r.group) }, cells));
    });
  }

  function drawBars(rep) {
    if (!rep.rows.length) { barsCard.dataset.state = 'nodata'; gw.showState(barsEl, 'nodata'); return; }
    barsCard.dataset.state = 'data';
    if (!barsEl.querySelector('.gw-chart')) { barsEl.innerHTML = ''; barsEl.appendChild(gw.el('div', { class: 'gw-chart' })); }
    return gw.plot(barsEl.querySelector('.gw-chart'), gw.usageFigure(rep.rows));
  }

  function draw(rep) {
    rangeEl.textContent = gw.localTime(rep.start_ms).slice(0, 16) + ' – ' + gw.localTime(rep.end_ms).slice(0, 16);
    drawTiles(rep);
    drawTable(rep);
    return drawBars(rep);
  }

  document.getElementById('usage-by').addEventListener('change', function (e) {
    location.href = gw.link('/usage', { by: e.target.value, every: gw.param('every') });  // other panels
  });
  document.getElementById('usage-every').addEventListener('change', function (e) {
    gw.setParams({ every: e.target.value || null }, false);
  });

  var fetched = { key: null, at: 0 };
  gw.onRefresh(function (r) {
    var q = { start: String(r.start / 1000), end: String(r.end / 1000), by: by };
    if (gw.param('every')) q.every = gw.param('every');
    var url = '/api/ui/usage?' + new URLSearchParams(q).toString();
    var key = gw.rangeKey() + '|' + (q.every || '') + '|' + gw.theme();
    if (!r.force && fetched.key === key && Date.now() - fetched.at < TWIN_EVERY_MS) return Promise.resolve();
    fetched = { key: key, at: Date.now() };
    jsonLink.href = url;
    return gw.getJson(url).then(function (res) {
      if (gw.isBusy(res)) { fetched.at = 0; return; }
      if (!res.ok || !res.body || !res.body.data) {
        barsCard.dataset.state = res.offline ? 'offline' : 'error';
        return gw.showState(barsEl, barsCard.dataset.state, res.body && res.body.error);
      }
      return draw(res.body.data.report);
    });
  });
})();
