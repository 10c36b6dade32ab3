/* One training run (and the runs it is compared with): loss smoothed on the server over every raw
 * point before any reduction (TensorBoard's debiased EMA, the raw line faint), learning rate (log y),
 * grad norm, throughput, checkpoint durations as markers, log events, and the run's GPUs on the same
 * time axis. Names, hosts and log lines come from outside: text only (gw.el, gw.text, gw.esc). */
(function () {
  'use strict';
  var run = gw.data.run;
  var PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#17becf'];
  var MAX_CHECKPOINT_LINES = 60;
  var smoothing = document.getElementById('smoothing');
  var smoothingOut = document.getElementById('smoothing-value');
  var xaxis = document.getElementById('xaxis');
  var lrLog = document.getElementById('lr-log');
  var compareInput = document.getElementById('compare-input');
  var last = null;

  function weight() {
    var w = parseFloat(gw.param('smoothing', '0.6'));
    return isFinite(w) && w >= 0 && w < 1 ? w : 0.6;
  }
  function xMode() { var x = gw.param('x', 'wall'); return x === 'step' || x === 'relative' ? x : 'wall'; }
  smoothing.value = String(weight());
  gw.text(smoothingOut, weight());
  xaxis.value = xMode();
  lrLog.checked = gw.param('log_lr') === '1';
  compareInput.value = gw.param('compare', '');

  function chartEl(id) {
    var box = document.getElementById('chart-' + id);
    var chart = box.querySelector('.gw-chart');
    if (!chart) { box.innerHTML = ''; chart = gw.el('div', { class: 'gw-chart' }); box.appendChild(chart); }
    return chart;
  }
  function absent(id, state) {
    var box = document.getElementById('chart-' + id);
    box.closest('section').dataset.state = state;
    gw.showState(box, state);
  }

  /** x values of a run's points for the chosen axis. */
  function xs(d, ts, steps) {
    var mode = xMode(), start = d.range.run_start || (ts.length ? ts[0] : 0);
    if (mode === 'step') return steps;
    if (mode === 'relative') return ts.map(function (t) { return (t - start) / 3600000; });
    return ts.map(gw.localTime);
  }
  /** The step at time t (for markers in step mode), from the loss curve's points. */
  function stepAt(d, t) {
    var c = d.curves.loss || d.curves[Object.keys(d.curves)[0]];
    if (!c || !c.t.length) return null;
    var lo = 0, hi = c.t.length - 1;
    while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (c.t[mid] <= t) lo = mid; else hi = mid - 1; }
    return c.step[lo];
  }
  function xOne(d, t, step) {
    var mode = xMode();
    if (mode === 'step') return step === null || step === undefined ? stepAt(d, t) : step;
    return xs(d, [t], [step])[0];
  }
  function layout(unit, logY) {
    var c = gw.colors();
    var mode = xMode();
    var l = {
      uirevision: gw.rangeKey() + '|' + mode, margin: { l: 56, r: 12, t: 8, b: 36 }, height: 260,
      paper_bgcolor: 'rgba(0,0,0,0)', plot_bgcolor: 'rgba(0,0,0,0)', font: { color: c.fg, size: 11 },
      hovermode: 'closest', showlegend: true, legend: { orientation: 'h', y: -0.22, font: { size: 10 } },
      xaxis: { type: mode === 'wall' ? 'date' : 'linear', gridcolor: c.grid, linecolor: c.grid, zeroline: false,
        title: { text: mode === 'wall' ? '' : gw.t('training.x.' + mode), font: { size: 10 } } },
      yaxis: { gridcolor: c.grid, linecolor: c.grid, zeroline: false, automargin: true, type: logY ? 'log' : 'linear' }
    };
    if (mode === 'wall') { var r = gw.range(); l.xaxis.range = [gw.localTime(r.start), gw.localTime(r.end)]; }
    if (unit === 'per_second') { l.yaxis.tickformat = '.3~s'; l.yaxis.ticksuffix = '/s'; }
    return l;
  }

  function drawCurve(id, runs, opts) {
    var traces = [], points = 0, shapes = [];
    runs.forEach(function (d, i) {
      var cv = d.curves[id];
      if (!cv) return;
      points += cv.points;
      var color = PALETTE[i % PALETTE.length], name = gw.esc(d.run.run);
      var x = xs(d, cv.t, cv.step);
      if (cv.smoothed) {
        traces.push({ type: 'scatter', mode: 'lines', name: name + ' ' + gw.esc(gw.t('training.raw')), x: x, y: cv.raw,
          line: { color: color, width: 1 }, opacity: 0.28, hovertemplate: '%{y:.5~g}<extra>' + name + ' raw</extra>' });
        traces.push({ type: 'scatter', mode: 'lines', name: name, x: x, y: cv.smoothed, line: { color: color, width: 2 },
          hovertemplate: '%{y:.5~g}<extra>' + name + '</extra>' });
      } else {
        traces.push({ type: 'scatter', mode: 'lines', name: name, x: x, y: cv.raw, line: { color: color, width: 1.5 },
          hovertemplate: '%{y:.5~g}<extra>' + name + '</extra>' });
      }
      var ev2 = id === 'loss' ? d.curves.eval_loss : null;  // eval loss, dashed, on the same axes
      if (ev2) {
        traces.push({ type: 'scatter', mode: 'lines+markers', name: name + ' ' + gw.esc(gw.t('training.eval')), x: xs(d, ev2.t, ev2.step),
          y: ev2.smoothed || ev2.raw, line: { color: color, width: 1.5, dash: 'dash' }, marker: { size: 4 },
          hovertemplate: '%{y:.5~g}<extra>' + name + ' eval</extra>' });
      }
      if (opts.checkpoints) {
        // a line a checkpoint; past a few dozen in view (a week of the demo: 1,500) they would hatch the
        // chart, and the checkpoint chart below shows them anyway
        (d.checkpoints.length <= MAX_CHECKPOINT_LINES ? d.checkpoints : []).forEach(function (cp) {
          var cx = xOne(d, cp.t, cp.step);
          shapes.push({ type: 'line', xref: 'x', yref: 'paper', x0: cx, x1: cx, y0: 0, y1: 1, line: { color: color, width: 1, dash: 'dot' } });
        });
        var ev = d.logs.events, top = 0;
        cv.raw.forEach(function (v) { if (v !== null && v > top) top = v; });
        if (ev.length) {
          traces.push({ type: 'scatter', mode: 'markers', name: name + ' ' + gw.esc(gw.t('training.events')),
            x: ev.map(function (e) { return xOne(d, e.t, null); }), y: ev.map(function () { return top; }),
            text: ev.map(function (e) { return gw.esc(e.event + ': ' + e.text.slice(0, 120)); }),
            marker: { symbol: 'x', size: 10, color: gw.colors().crit }, hovertemplate: '%{text}<extra></extra>' });
        }
        cv.nonfinite.forEach(function (nf) {
          var nx = xOne(d, nf.t, nf.step);
          shapes.push({ type: 'line', xref: 'x', yref: 'paper', x0: nx, x1: nx, y0: 0, y1: 1, line: { color: gw.colors().crit, width: 2 } });
        });
      }
    });
    if (!traces.length) { absent(id, 'nodata'); return; }
    var l = layout(opts.unit, opts.logY);
    l.shapes = shapes;
    // A flat curve (a constant learning rate): Plotly would centre it in [v-1, v+1], far from v.
    var lo = Infinity, hi = -Infinity;
    traces.forEach(function (t) { (t.y || []).forEach(function (v) { if (v !== null && isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } }); });
    if (isFinite(lo) && lo === hi && lo !== 0 && !opts.logY) l.yaxis.range = [lo - Math.abs(lo) * 0.5, hi + Math.abs(hi) * 0.5];
    l.yaxis.tickformat = l.yaxis.tickformat || '.4~g';
    document.getElementById('chart-' + id).closest('section').dataset.state = 'data';
    gw.plot(chartEl(id), { data: traces, layout: l });
    return points;
  }

  function drawCheckpoints(runs) {
    var traces = [];
    runs.forEach(function (d, i) {
      if (!d.checkpoints.length) return;
      traces.push({ type: 'scatter', mode: 'markers', name: gw.esc(d.run.run),
        x: d.checkpoints.map(function (cp) { return xOne(d, cp.t, cp.step); }),
        y: d.checkpoints.map(function (cp) { return cp.seconds; }),
        marker: { symbol: 'diamond', size: 10, color: PALETTE[i % PALETTE.length] },
        hovertemplate: '%{y:.3~g} s<extra>' + gw.esc(d.run.run) + '</extra>' });
    });
    if (!traces.length) { absent('checkpoints', 'nodata'); return; }
    var l = layout('seconds', false);
    l.yaxis.ticksuffix = ' s';
    l.yaxis.rangemode = 'tozero';
    document.getElementById('chart-checkpoints').closest('section').dataset.state = 'data';
    gw.plot(chartEl('checkpoints'), { data: traces, layout: l });
  }

  function drawSummary(d) {
    var r = d.run;
    var badge = document.getElementById('run-state');
    badge.className = 'gw-badge gw-run-' + r.state;
    gw.text(badge, gw.t('training.state.' + r.state));
    var pct = r.progress === null ? null : Math.round(r.progress * 1000) / 10;
    document.getElementById('run-progress-fill').style.width = (pct || 0) + '%';
    document.getElementById('run-progress').setAttribute('aria-valuenow', String(pct || 0));
    gw.text(document.getElementById('run-progress-text'), pct === null ? '–' : pct + ' %');
    gw.text(document.getElementById('run-eta'), r.eta_seconds === null ? '–' : gw.format(r.eta_seconds, 'seconds'));
    gw.text(document.getElementById('run-step'), r.last_step === null ? '–' : (r.last_step + (r.total_steps ? ' / ' + r.total_steps : '')));
    gw.text(document.getElementById('run-host'), d.gpus.hostname || (d.gpus.hosts || []).join(', ') || '–');
    gw.text(document.getElementById('run-gpus'), (d.gpus.gpus || []).join(', ') || '–');
    gw.text(document.getElementById('run-energy'), d.energy_joules === null ? gw.t('training.unknown') : gw.format(d.energy_joules / 3.6e6, 'kwh'));
  }

  function drawLogs(d) {
    var body = document.getElementById('logs-body');
    body.innerHTML = '';
    document.getElementById('logs-empty').hidden = d.logs.lines.length > 0;
    d.logs.lines.forEach(function (x) {
      body.appendChild(gw.el('tr', { class: x.event ? 'gw-log-event' : '', 'data-level': x.level }, [
        gw.el('td', { class: 'num' }, gw.localTime(x.t).slice(0, 19)),
        gw.el('td', null, x.level || ''),
        gw.el('td', null, x.event ? gw.t('logs.event.' + x.event) : ''),
        gw.el('td', { class: 'gw-log-text' }, x.text)
      ]));
    });
    var events = document.getElementById('events');
    events.innerHTML = '';
    var counts = {};
    d.logs.events.forEach(function (e) { counts[e.event] = (counts[e.event] || 0) + 1; });
    Object.keys(counts).forEach(function (k) {
      events.appendChild(gw.el('span', { class: 'gw-badge gw-event-' + k }, gw.t('logs.event.' + k) + ' × ' + counts[k]));
    });
  }

  function drawGpus() {
    var g = gw.data.gpus || {}, src = document.getElementById('gpu-source');
    if (!g.matchers) { gw.text(src, gw.t('training.gpus_unknown')); src.dataset.state = 'none'; return; }
    gw.text(src, gw.t('training.gpus_from.' + g.source) + ': ' + g.matchers);
    gw.drawPanels(document.getElementById('gpu-panels'), gw.panels, {});
  }
  drawGpus();

  function draw(body) {
    var runs = body.data.runs || [];
    if (!runs.length) return;
    last = body;
    drawSummary(runs[0]);
    var n = drawCurve('loss', runs, { checkpoints: true });
    var skipped = runs.reduce(function (acc, d) { return acc + ((d.curves.loss || {}).skipped_before || 0); }, 0);
    gw.text(document.getElementById('loss-points'), (n ? n + ' ' + gw.t('training.points') : '') +
      (skipped ? ' · ' + skipped + ' ' + gw.t('training.skipped') : ''));
    drawCurve('learning_rate', runs, { logY: lrLog.checked });
    drawCurve('grad_norm', runs, {});
    drawCurve('throughput', runs, { unit: 'per_second' });
    drawCheckpoints(runs);
    drawLogs(runs[0]);
  }

  var retry = null;
  function load(r) {
    var width = (document.getElementById('chart-loss').clientWidth || 800);
    var q = new URLSearchParams({ smoothing: String(weight()), max_points: String(Math.max(200, Math.min(8000, width * 2))),
      start: String(r.start / 1000), end: String(r.end / 1000) });
    var cmp = gw.param('compare', '');
    if (cmp) q.set('compare', cmp);
    return gw.getJson('/api/ui/training/' + encodeURIComponent(run) + '?' + q.toString()).then(function (res) {
      if (gw.isBusy(res)) {  // the server takes no more queries now: keep what is shown, ask again in 1 s
        if (!retry) retry = setTimeout(function () { retry = null; load(gw.range()); }, 1000);
        return;
      }
      if (!res.ok) {
        ['loss', 'learning_rate', 'grad_norm', 'throughput', 'checkpoints'].forEach(function (id) {
          gw.showState(document.getElementById('chart-' + id), res.offline ? 'offline' : 'error', res.body && res.body.error);
        });
        return;
      }
      draw(res.body);
    });
  }

  smoothing.addEventListener('input', function () { gw.text(smoothingOut, smoothing.value); });
  smoothing.addEventListener('change', function () { gw.setParams({ smoothing: smoothing.value === '0.6' ? null : smoothing.value }); });
  xaxis.addEventListener('change', function () { gw.setParams({ x: xaxis.value === 'wall' ? null : xaxis.value }, false, true); if (last) draw(last); });
  lrLog.addEventListener('change', function () { gw.setParams({ log_lr: lrLog.checked ? '1' : null }, false, true); if (last) draw(last); });
  compareInput.addEventListener('change', function () { gw.setParams({ compare: compareInput.value.trim() || null }, true); });

  // A run's page opens on the run's whole life unless the URL names a range.
  if (!gw.param('from') && gw.data.start_ms) {
    gw.setParams({ from: String(gw.data.start_ms), to: gw.data.end_ms ? String(gw.data.end_ms) : 'now' }, false, true);
  }
  gw.onRefresh(load);
})();
