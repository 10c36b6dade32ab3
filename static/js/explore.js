/* Explore: a PromQL box with completion, graph and table views, parse errors where they are. */
(function () {
  'use strict';
  var box = document.getElementById('expr');
  var list = document.getElementById('complete');
  var errorEl = document.getElementById('parse-error');
  var info = document.getElementById('info');
  var card = document.getElementById('panel-explore');
  var body = document.getElementById('result-body');
  var chart = null;
  var metrics = [], labels = [];
  var FUNCS = ['abs', 'absent', 'absent_over_time', 'avg', 'avg_over_time', 'bottomk', 'ceil', 'changes', 'clamp', 'clamp_max',
    'clamp_min', 'count', 'count_over_time', 'count_values', 'delta', 'deriv', 'exp', 'floor', 'group', 'histogram_quantile',
    'holt_winters', 'idelta', 'increase', 'irate', 'label_join', 'label_replace', 'last_over_time', 'ln', 'log2', 'log10',
    'max', 'max_over_time', 'min', 'min_over_time', 'predict_linear', 'present_over_time', 'quantile', 'quantile_over_time',
    'rate', 'resets', 'round', 'scalar', 'sort', 'sort_desc', 'sqrt', 'stddev', 'stddev_over_time', 'sum', 'sum_over_time',
    'time', 'timestamp', 'topk', 'vector', 'by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'offset', 'and', 'or', 'unless'];

  gw.getJson('/api/v1/label/__name__/values').then(function (r) { if (r.ok) metrics = r.body.data || []; });
  gw.getJson('/api/v1/labels').then(function (r) { if (r.ok) labels = (r.body.data || []).filter(function (l) { return l !== '__name__'; }); });

  function view() { var v = document.querySelector('input[name="view"]:checked'); return v ? v.value : 'graph'; }

  // -- completion -------------------------------------------------------------------------------
  var items = [], sel = 0;
  function currentWord() {
    var pos = box.selectionStart, text = box.value.slice(0, pos);
    var m = /[A-Za-z_:][A-Za-z0-9_:]*$/.exec(text);
    var word = m ? m[0] : '';
    var before = text.slice(0, pos - word.length);
    var opens = (before.match(/\{/g) || []).length, closes = (before.match(/\}/g) || []).length;
    var inBraces = opens > closes;
    var inGrouping = /\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*$/.test(before);
    return { word: word, start: pos - word.length, end: pos, labelsOnly: inBraces || inGrouping };
  }
  function hide() { list.hidden = true; items = []; }
  function suggest() {
    var w = currentWord();
    if (!w.word) return hide();
    var pool = w.labelsOnly ? labels : metrics.concat(FUNCS);
    var low = w.word.toLowerCase();
    items = pool.filter(function (x) { return x.toLowerCase().indexOf(low) === 0 && x !== w.word; })
      .concat(pool.filter(function (x) { var i = x.toLowerCase().indexOf(low); return i > 0; })).slice(0, 40);
    if (!items.length) return hide();
    sel = 0;
    list.innerHTML = '';
    items.forEach(function (x, i) {
      var li = gw.el('li', { class: i === sel ? 'sel' : '', 'data-value': x }, x);
      li.addEventListener('mousedown', function (ev) { ev.preventDefault(); accept(x); });
      list.appendChild(li);
    });
    list.hidden = false;
  }
  function mark() { Array.prototype.forEach.call(list.children, function (li, i) { li.className = i === sel ? 'sel' : ''; if (i === sel) li.scrollIntoView({ block: 'nearest' }); }); }
  function accept(x) {
    var w = currentWord();
    box.value = box.value.slice(0, w.start) + x + box.value.slice(w.end);
    var p = w.start + x.length;
    box.setSelectionRange(p, p);
    hide();
    box.focus();
  }
  box.addEventListener('input', suggest);
  box.addEventListener('blur', function () { setTimeout(hide, 100); });
  box.addEventListener('keydown', function (ev) {
    if (!list.hidden && items.length) {
      if (ev.key === 'ArrowDown') { sel = (sel + 1) % items.length; mark(); ev.preventDefault(); return; }
      if (ev.key === 'ArrowUp') { sel = (sel + items.length - 1) % items.length; mark(); ev.preventDefault(); return; }
      if (ev.key === 'Tab' || (ev.key === 'Enter' && !ev.shiftKey && !ev.ctrlKey)) { accept(items[sel]); ev.preventDefault(); return; }
      if (ev.key === 'Escape') { hide(); ev.preventDefault(); return; }
    }
    if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); run(); }
  });
  document.getElementById('run').addEventListener('click', run);
  document.querySelectorAll('input[name="view"]').forEach(function (r) {
    r.addEventListener('change', function () { gw.setParams({ view: view() === 'table' ? 'table' : null }, false); });
  });

  function run() {
    hide();
    var expr = box.value.trim();
    gw.setParams({ expr: expr || null, step: null }, expr !== (gw.param('expr') || ''));
  }

  // -- results ----------------------------------------------------------------------------------
  function showParseError(found, expr) {
    errorEl.innerHTML = '';
    if (!found) { errorEl.hidden = true; return; }
    errorEl.hidden = false;
    var lines = [found.error];
    if (found.position !== null && found.position !== undefined) {
      var before = expr.slice(0, found.position), lineNo = before.split('\n').length, lineStart = before.lastIndexOf('\n') + 1;
      var lineText = expr.split('\n')[lineNo - 1], col = found.position - lineStart;
      lines = [gw.t('explore.parse_error') + ' ' + lineNo + ':' + (col + 1) + ': ' + String(found.error).replace(/^parse error: /, ''), lineText, ' '.repeat(col) + '^'];
      errorEl.dataset.position = String(found.position);
    } else delete errorEl.dataset.position;
    errorEl.appendChild(gw.el('div', null, lines.join('\n')));
  }
  function dropChart() { if (chart && window.Plotly) Plotly.purge(chart); chart = null; }
  function drawTable(result, resultType) {
    dropChart();
    var keys = {};
    result.forEach(function (s) { Object.keys(s.metric || {}).forEach(function (k) { keys[k] = 1; }); });
    var cols = Object.keys(keys).sort(function (a, b) { return a === '__name__' ? -1 : b === '__name__' ? 1 : a.localeCompare(b); });
    var table = gw.el('table', { class: 'gw-table', id: 'result-table' });
    table.appendChild(gw.el('thead', null, [gw.el('tr', null, cols.map(function (k) { return gw.el('th', null, k); }).concat([gw.el('th', { class: 'num' }, gw.t('common.value'))]))]));
    var tb = gw.el('tbody');
    result.forEach(function (s) {
      var tr = gw.el('tr', null, cols.map(function (k) { return gw.el('td', null, (s.metric || {})[k] || ''); }));
      var v = s.value ? s.value[1] : '';
      tr.appendChild(gw.el('td', { class: 'num' }, v));
      tb.appendChild(tr);
    });
    if (resultType === 'scalar' || resultType === 'string') tb.appendChild(gw.el('tr', null, [gw.el('td', { class: 'num' }, String(result[1]))]));
    table.appendChild(tb);
    body.innerHTML = '';
    body.appendChild(gw.el('div', { class: 'gw-table-wrap' }, [table]));
  }
  // A busy answer (503 `unavailable`: as many queries running as the server takes) is asked again in
  // 1 s, whether or not the page refreshes by itself; what is shown stays until then.
  var retry = null;
  function busy(res) {
    if (res.status !== 'busy') return false;
    if (!retry) retry = setTimeout(function () { retry = null; gw.refresh(); }, 1000);
    if (!chart && !body.querySelector('#result-table')) { card.dataset.state = 'busy'; gw.showState(body, 'busy', res.error); }
    return true;
  }
  var panel = { id: 'explore', kind: 'timeseries', unit: 'none', legend: '', thresholds: {}, height: 360, width: 12 };

  gw.onRefresh(function (r) {
    var expr = gw.param('expr', '');
    if (box !== document.activeElement && box.value !== expr) box.value = expr;
    if (!expr) { card.dataset.state = 'empty'; dropChart(); gw.showState(body, 'empty', null, gw.t('explore.empty')); gw.text(info, ''); showParseError(null); return; }
    return gw.getJson('/api/ui/explore/parse?' + new URLSearchParams({ expr: expr }).toString()).then(function (p) {
      var found = p.ok && p.body.data && !p.body.data.valid ? p.body.data : null;
      showParseError(found, expr);
      if (found) { card.dataset.state = 'error'; dropChart(); gw.showState(body, 'error', found.error); gw.text(info, ''); return; }
      if (view() === 'table') {
        return gw.query(expr, r.end).then(function (res) {
          if (busy(res)) return;
          if (res.status !== 'ok') { card.dataset.state = res.status; dropChart(); gw.showState(body, res.status, res.error); return; }
          gw.text(info, res.result.length + ' ' + gw.t('explore.series'));
          if (res.resultType === 'scalar' || res.resultType === 'string') { card.dataset.state = 'data'; drawTable([], res.resultType); return; }
          if (!res.result.length) { card.dataset.state = 'nodata'; dropChart(); gw.showState(body, 'nodata'); return; }
          card.dataset.state = 'data';
          drawTable(res.result, res.resultType);
        });
      }
      var asked = parseInt(gw.param('step', ''), 10);
      var width = body.clientWidth || 900;
      var q = asked > 0 && (r.end - r.start) / (asked * 1000) <= 11000
        ? gw.getJson('/api/v1/query_range?' + new URLSearchParams({ query: expr, start: String(r.start / 1000), end: String(r.end / 1000), step: String(asked) }).toString())
          .then(function (x) { var ok = x.ok && x.body.status === 'success'; return { status: x.offline ? 'offline' : gw.isBusy(x) ? 'busy' : ok ? 'ok' : 'error', result: ok ? x.body.data.result : [], error: (x.body || {}).error, step: asked, start: r.start, end: r.end }; })
        : gw.queryRange(expr, r.start, r.end, width);
      return q.then(function (res) {
        if (busy(res)) return;
        if (res.status !== 'ok') { card.dataset.state = res.status; dropChart(); gw.showState(body, res.status, res.error); gw.text(info, ''); return; }
        gw.text(info, gw.t('panel.step') + ' ' + res.step + ' s · ' + res.result.length + ' ' + gw.t('explore.series'));
        if (!res.result.length) { card.dataset.state = 'nodata'; dropChart(); gw.showState(body, 'nodata'); return; }
        card.dataset.state = 'data';
        var fig = gw.figures.timeseries(res.result, panel, { uirevision: gw.rangeKey() + expr, start: r.start, end: r.end, step: res.step });
        fig.layout.showlegend = res.result.length <= 12;
        fig.layout.legend = { orientation: 'h', y: -0.2, font: { size: 10 } };
        if (!chart || !body.contains(chart)) { body.innerHTML = ''; chart = gw.el('div', { class: 'gw-chart' }); body.appendChild(chart); }
        return gw.plot(chart, fig);
      });
    });
  });
})();
