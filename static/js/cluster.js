/* The cluster page: stats, heatmap and charts from the panel registry; node tiles and GPU links
 * keep the time range; clicking a heatmap row opens that GPU. */
(function () {
  'use strict';
  var vars = gw.config.variables || {};
  var stats = gw.panels.filter(function (p) { return p.kind === 'stat'; });
  var charts = gw.panels.filter(function (p) { return p.kind !== 'stat'; });
  gw.drawPanels(document.getElementById('stats'), stats, vars);
  var drawn = gw.drawPanels(document.getElementById('charts'), charts, vars);

  function keepRange() {
    document.querySelectorAll('a.gw-tile, a.gpu-link, #all-nodes').forEach(function (a) {
      var base = a.dataset.base || a.getAttribute('href');
      a.dataset.base = base;
      var u = new URL(base, location.href);
      var extra = {};
      u.searchParams.forEach(function (v, k) { extra[k] = v; });
      a.setAttribute('href', gw.link(u.pathname, extra));
    });
  }
  keepRange();
  gw.onRefresh(keepRange, true);

  // Node tiles and the GPU table come from the page's JSON twin, at most every 5 s.
  var lastTwin = Date.now();
  function tile(n) {
    var facts = n.gpus + ' GPU';
    if (n.hottest_c !== null && n.hottest_c !== undefined) facts += ' · ' + gw.t('cluster.hottest') + ' GPU ' + n.hottest_gpu + ' ' + Math.round(n.hottest_c) + ' °C';
    facts += ' · ' + n.firing + ' ' + gw.t('cluster.alerts');
    return gw.el('a', { class: 'gw-tile ' + n.state, href: '/?hostname=' + encodeURIComponent(n.name),
      'data-node': n.instance || n.name, 'data-host': n.name, 'data-state': n.state }, [
      gw.el('div', { class: 'name' }, n.name), gw.el('div', { class: 'state' }, gw.t('state.' + n.state)), gw.el('div', { class: 'facts' }, facts)
    ]);
  }
  function fmt(f, key, pattern) { return Object.prototype.hasOwnProperty.call(f, key) ? pattern(f[key]) : '–'; }
  function gpuRow(g, multiHost) {
    var f = g.figures || {}, cells = [];
    if (multiHost) cells.push(gw.el('td', null, g.hostname));
    cells.push(gw.el('td', { title: g.uuid + ' · ' + g.pci_bus_id }, [gw.el('a', { class: 'gpu-link', href: '/gpus/' + encodeURIComponent(g.hostname) + '/' + encodeURIComponent(g.gpu) }, g.gpu)]));
    cells.push(gw.el('td', null, g.model));
    if (g.is_lost) cells.push(gw.el('td', { colspan: 7, class: 'error' }, gw.t('cluster.lost')));
    else {
      var r0 = function (v) { return String(Math.round(v)); };
      cells.push(gw.el('td', { class: 'num' }, fmt(f, 'DCGM_FI_DEV_GPU_UTIL', function (v) { return r0(v) + ' %'; })));
      cells.push(gw.el('td', { class: 'num' }, fmt(f, 'DCGM_FI_DEV_FB_USED', r0) + ' / ' + fmt(f, 'DCGM_FI_DEV_FB_TOTAL', r0) + ' MiB'));
      cells.push(gw.el('td', { class: 'num' }, fmt(f, 'DCGM_FI_DEV_GPU_TEMP', function (v) { return r0(v) + ' °C'; })));
      cells.push(gw.el('td', { class: 'num' }, fmt(f, 'DCGM_FI_DEV_POWER_USAGE', r0) + (f.DCGM_FI_DEV_ENFORCED_POWER_LIMIT !== undefined ? ' / ' + r0(f.DCGM_FI_DEV_ENFORCED_POWER_LIMIT) : '') + ' W'));
      cells.push(gw.el('td', { class: 'num' }, fmt(f, 'DCGM_FI_DEV_SM_CLOCK', function (v) { return r0(v) + ' MHz'; })));
      cells.push(gw.el('td', { class: 'num' }, fmt(f, 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL', r0)));
      var procs = (g.processes || []).map(function (p) {
        var who = p.pid + (p.user ? ', ' + p.user : '') + (p.container_id ? ', ' + p.container_id.slice(0, 12) : '');
        return gw.el('div', null, p.name + ' (' + who + ') ' + Math.round(p.used_memory_mib) + ' MiB');
      });
      cells.push(gw.el('td', null, procs.length ? procs : '–'));
    }
    return gw.el('tr', { class: g.is_lost ? 'lost' : '', 'data-uuid': g.uuid }, cells);
  }
  function updateTwin(data) {
    var tiles = document.getElementById('tiles');
    if (tiles) { tiles.innerHTML = ''; (data.tiles || []).forEach(function (n) { tiles.appendChild(tile(n)); }); }
    var tbody = document.querySelector('#gpus tbody');
    var gpus = data.gpus_seen || [];
    if (tbody && gpus.length) {
      var multi = document.querySelectorAll('#gpus thead th').length === 11;
      tbody.innerHTML = '';
      gpus.forEach(function (g) { tbody.appendChild(gpuRow(g, multi)); });
    }
    keepRange();
  }
  gw.onRefresh(function () {
    if (Date.now() - lastTwin < 4500) return;
    lastTwin = Date.now();
    var host = vars.hostname;
    return gw.getJson('/api/ui/cluster' + (host ? '?hostname=' + encodeURIComponent(host) : '')).then(function (r) {
      if (gw.isBusy(r)) lastTwin = 0;  // ask again at the next refresh
      else if (r.ok && r.body && r.body.data) updateTwin(r.body.data);
    });
  }, true);

  // A heatmap row is "<host>/<gpu>": a click opens that GPU's page with the same range.
  var util = drawn.cards.util;
  if (util) {
    var obs = new MutationObserver(function () {
      var chart = util.querySelector('.gw-chart');
      if (chart && chart.on && !chart.dataset.gwClick) {
        chart.dataset.gwClick = '1';
        chart.on('plotly_click', function (ev) {
          var pt = ev && ev.points && ev.points[0];
          if (!pt) return;
          var name = gw.unesc(pt.y), i = name.lastIndexOf('/');
          if (i > 0) location.href = gw.link('/gpus/' + encodeURIComponent(name.slice(0, i)) + '/' + encodeURIComponent(name.slice(i + 1)));
        });
      }
    });
    obs.observe(util, { childList: true, subtree: true });
  }
})();
