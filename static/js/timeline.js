/* The timeline: every event source's markers on one time axis, one colour per source. */
(function () {
  'use strict';
  var card = document.getElementById('panel-timeline');
  var body = document.getElementById('timeline-body');
  var stepEl = document.getElementById('timeline-step');
  var sources = document.querySelector('#sources tbody');
  var COLORS = ['#d03030', '#e08a00', '#2463c4', '#8a3ffc', '#0f9d8a'];
  var chart = null;
  var rows = {};
  gw.panels.forEach(function (p, i) {
    var count = gw.el('td', { class: 'num', 'data-count': p.id }, '…');
    var link = gw.el('a', { class: 'gw-explore', href: gw.exploreUrl(p.query) }, gw.t('panel.explore'));
    var tr = gw.el('tr', { 'data-source': p.id }, [
      gw.el('td', null, [gw.el('span', { style: 'color:' + COLORS[i % COLORS.length] }, '◆ '), p.title]), count, gw.el('td', null, [link])
    ]);
    rows[p.id] = { count: count, link: link, tr: tr };
    sources.appendChild(tr);
  });

  gw.onRefresh(function (r) {
    var width = body.clientWidth || 1200;
    return Promise.all(gw.panels.map(function (p) {
      var step = gw.stepFor(r.start, r.end, width);
      var expr = gw.fill(p.query, gw.builtinVars(r, step));
      rows[p.id].link.href = gw.exploreUrl(expr);
      return gw.queryRange(expr, r.start, r.end, width).then(function (res) { return { panel: p, res: res }; });
    })).then(function (answers) {
      var data = [], layout = null, total = 0, failed = [];
      answers.forEach(function (a, i) {
        var row = rows[a.panel.id];
        if (a.res.status !== 'ok') { gw.text(row.count, gw.t('state.' + a.res.status)); row.tr.dataset.state = a.res.status; failed.push(a.res.error); return; }
        gw.text(stepEl, gw.t('panel.step') + ' ' + a.res.step + ' s');
        var fig = gw.figures.events(a.res.result, a.panel, { uirevision: gw.rangeKey(), start: r.start, end: r.end, step: a.res.step, qstart: a.res.start, qend: a.res.end });
        gw.text(row.count, String(fig.count));
        row.tr.dataset.state = fig.count ? 'data' : 'empty';
        total += fig.count;
        if (!layout) layout = fig.layout;
        var t = fig.data[0];
        t.name = gw.esc(a.panel.title);
        t.marker = { symbol: 'diamond', size: 9, color: COLORS[i % COLORS.length] };
        if (t.x.length) data.push(t);
      });
      if (!total) {
        card.dataset.state = failed.length === answers.length ? 'error' : 'empty';
        if (chart && window.Plotly) Plotly.purge(chart);
        chart = null;
        gw.showState(body, card.dataset.state, failed[0] || null, failed.length === answers.length ? null : gw.t('timeline.none'));
        return;
      }
      card.dataset.state = 'data';
      layout.height = Math.max(260, 60 + 18 * new Set([].concat.apply([], data.map(function (t) { return t.y; }))).size);
      layout.showlegend = true;
      layout.legend = { orientation: 'h', y: -0.15, font: { size: 10 } };
      if (!chart || !body.contains(chart)) { body.innerHTML = ''; chart = gw.el('div', { class: 'gw-chart' }); body.appendChild(chart); }
      return gw.plot(chart, { data: data, layout: layout });
    });
  });
})();
