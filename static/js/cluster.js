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
