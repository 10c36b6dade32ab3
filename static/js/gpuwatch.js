/* gpuwatch dashboard framework: time range, auto-refresh, URL state, theme, i18n, panels.
 * Plain ES2017, no build step; Plotly is the only library. Exposes window.gw (see docs/dashboard.md).
 * Every value from outside (labels, log lines, names) goes to the page as text: gw.text() or
 * textContent, never innerHTML; strings handed to Plotly pass through gw.esc().
 */
(function () {
  'use strict';

  function readJson(id, fallback) {
    var el = document.getElementById(id);
    if (!el) return fallback;
    try { return JSON.parse(el.textContent); } catch (e) { return fallback; }
  }

  var config = readJson('gw-config', {});
  var strings = config.strings || {};
  var RANGES = ['5m', '15m', '1h', '6h', '12h', '24h', '2d', '7d', '30d', '90d', '1y'];
  var REFRESH = { '1s': 1000, '5s': 5000, '30s': 30000, 'off': 0 };
  var DEFAULTS = { from: 'now-1h', to: 'now', refresh: '5s' };
  var UNIT_MS = { s: 1000, m: 60000, h: 3600000, d: 86400000, w: 604800000, y: 31536000000 };
  var MAX_POINTS = 1500;

  var gw = {};
  window.gw = gw;
  gw.config = config;
  gw.panels = readJson('gw-panels', []);
  gw.data = readJson('gw-data', {});

  // -- text and translation -------------------------------------------------------------------
  gw.t = function (key) { return Object.prototype.hasOwnProperty.call(strings, key) ? strings[key] : key; };
  gw.text = function (el, s) { el.textContent = s === null || s === undefined ? '' : String(s); return el; };
  /** A string escaped for Plotly, which reads a few HTML tags in names and hover text. */
  gw.esc = function (s) {
    return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
      .replace(/"/g, '&#34;').replace(/'/g, '&#39;');  // Plotly decodes numeric entities, not &quot;
  };
  /** The inverse of gw.esc (names Plotly hands back in events). */
  gw.unesc = function (s) {
    return String(s).replace(/&#39;/g, "'").replace(/&#34;/g, '"').replace(/&gt;/g, '>').replace(/&lt;/g, '<').replace(/&amp;/g, '&');
  };
  /** Build an element: gw.el('td', {class: 'num', title: x}, 'text' or [children]). Text only. */
  gw.el = function (tag, attrs, content) {
    var el = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        var v = attrs[k];
        if (v === null || v === undefined || v === false) return;
        if (k === 'class') el.className = v;
        else if (k === 'dataset') Object.keys(v).forEach(function (d) { el.dataset[d] = v[d]; });
        else if (k.slice(0, 2) === 'on' && typeof v === 'function') el.addEventListener(k.slice(2), v);
        else el.setAttribute(k, v === true ? '' : String(v));
      });
    }
    if (Array.isArray(content)) content.forEach(function (c) { if (c) el.appendChild(typeof c === 'string' ? document.createTextNode(c) : c); });
    else if (content !== undefined && content !== null) el.textContent = String(content);
    return el;
  };

  // -- time and the URL -----------------------------------------------------------------------
  /** 'now', 'now-6h', 'now-90m', epoch ms, or an ISO date -> epoch ms (NaN when unreadable). */
  gw.parseTime = function (s, nowMs) {
    s = String(s === undefined || s === null ? '' : s).trim();
    var now = nowMs === undefined ? Date.now() : nowMs;
    if (s === 'now') return now;
    var m = /^now-(\d+(?:\.\d+)?)([smhdwy])$/.exec(s);
    if (m) return now - Math.round(parseFloat(m[1]) * UNIT_MS[m[2]]);
    if (/^\d+$/.test(s)) return parseInt(s, 10);
    var d = Date.parse(s);
    return isNaN(d) ? NaN : d;
  };
  // A page may start on another range than the last hour (the usage page: a week), where the URL names none.
  if (typeof config.default_from === 'string' && !isNaN(gw.parseTime(config.default_from))) DEFAULTS.from = config.default_from;
  gw.parseDuration = function (s) {
    var m = /^(\d+(?:\.\d+)?)([smhdwy])$/.exec(String(s));
    return m ? Math.round(parseFloat(m[1]) * UNIT_MS[m[2]]) : NaN;
  };

  function params() { return new URLSearchParams(location.search); }
  /** A URL parameter (page state), or `fallback`. */
  gw.param = function (name, fallback) {
    var v = params().get(name);
    return v === null || v === '' ? (fallback === undefined ? null : fallback) : v;
  };
  function validTime(s) { return !isNaN(gw.parseTime(s)); }
  gw.state = function () {
    var from = gw.param('from', DEFAULTS.from), to = gw.param('to', DEFAULTS.to);
    if (!validTime(from)) from = DEFAULTS.from;
    if (!validTime(to)) to = DEFAULTS.to;
    var refresh = gw.param('refresh', DEFAULTS.refresh);
    if (!Object.prototype.hasOwnProperty.call(REFRESH, refresh)) refresh = DEFAULTS.refresh;
    return { from: from, to: to, refresh: refresh };
  };
  /** The current range as {start, end} in epoch ms (relative ends read against now). */
  gw.range = function () {
    var st = gw.state(), now = Date.now();
    var start = gw.parseTime(st.from, now), end = gw.parseTime(st.to, now);
    if (!(end > start)) { start = now - 3600000; end = now; }
    return { start: start, end: end, from: st.from, to: st.to };
  };
  /** A string that changes only when the chosen range does (not on refresh ticks): Plotly's uirevision. */
  gw.rangeKey = function () { var st = gw.state(); return st.from + '|' + st.to; };

  /** Set URL parameters (null removes one); `push` adds a history entry. Fires a refresh. */
  gw.setParams = function (changes, push, quiet) {
    var p = params();
    Object.keys(changes).forEach(function (k) {
      var v = changes[k];
      if (v === null || v === undefined || v === '') p.delete(k); else p.set(k, String(v));
    });
    var qs = p.toString();
    var url = location.pathname + (qs ? '?' + qs : '') + location.hash;
    if (push) history.pushState(null, '', url); else history.replaceState(null, '', url);
    syncControls();
    restartTimer();
    if (!quiet) tick(true);
  };
  gw.setRange = function (from, to, push) { gw.setParams({ from: from, to: to }, push === undefined ? true : push); };

  /** The URL parameters that carry the view (range, refresh, theme, lang), for links between pages. */
  gw.viewParams = function () {
    var p = params(), out = new URLSearchParams();
    ['from', 'to', 'refresh', 'theme', 'lang'].forEach(function (k) { if (p.get(k)) out.set(k, p.get(k)); });
    return out;
  };
  /** `path` with the current view's parameters (and `extra`) appended: drill-downs keep the range. */
  gw.link = function (path, extra) {
    var p = gw.viewParams();
    if (extra) Object.keys(extra).forEach(function (k) { if (extra[k] !== null && extra[k] !== undefined) p.set(k, extra[k]); });
    var qs = p.toString();
    return path + (qs ? (path.indexOf('?') >= 0 ? '&' : '?') + qs : '');
  };
  gw.exploreUrl = function (expr, extra) { return gw.link('/explore', Object.assign({ expr: expr }, extra || {})); };

  // -- refresh --------------------------------------------------------------------------------
  var listeners = [];
  var timer = null;
  var ticking = false;
  /** Call `cb(range)` now, on each range change and on each auto-refresh tick (not while hidden). */
  gw.onRefresh = function (cb, noInitial) {
    listeners.push(cb);
    if (!noInitial) Promise.resolve().then(function () { safeCall(cb, gw.range()); });
    return cb;
  };
  function safeCall(cb, r) {
    try { return Promise.resolve(cb(r)); } catch (e) { console.warn('gpuwatch: refresh callback failed', e); return Promise.resolve(); }
  }
  function tick(force) {
    if (document.hidden && !force) return;
    if (ticking && !force) return;  // the last tick's requests are still out: skip, never pile up
    ticking = true;
    var r = gw.range();
    r.force = !!force;  // a range change, a theme change or "refresh now": every panel asks again
    Promise.all(listeners.map(function (cb) { return safeCall(cb, r).catch(function () {}); }))
      .then(function () { ticking = false; }, function () { ticking = false; });
  }
  gw.refresh = function () { tick(true); };  // every panel asks again
  function restartTimer() {
    if (timer) clearInterval(timer);
    timer = null;
    var ms = REFRESH[gw.state().refresh];
    if (ms) timer = setInterval(function () { tick(false); }, ms);
  }
  document.addEventListener('visibilitychange', function () { if (!document.hidden) tick(false); });
  window.addEventListener('popstate', function () { syncControls(); restartTimer(); tick(true); });

  // -- theme ----------------------------------------------------------------------------------
  var THEME_KEY = 'gw-theme';
  gw.theme = function () { return document.documentElement.getAttribute('data-theme') === 'dark' ? 'dark' : 'light'; };
  gw.setTheme = function (theme) {
    document.documentElement.setAttribute('data-theme', theme);
    try { localStorage.setItem(THEME_KEY, theme); } catch (e) { /* private mode: the URL keeps it */ }
    gw.setParams({ theme: theme }, false, true);
    redrawAll();
  };
  function themeColors() {
    var cs = getComputedStyle(document.documentElement);
    function v(name, d) { var x = cs.getPropertyValue(name).trim(); return x || d; }
    return {
      fg: v('--fg', '#1b1f24'), muted: v('--muted', '#6b7480'), grid: v('--grid', '#e3e6ea'),
      panel: v('--panel', '#ffffff'), warn: v('--warn', '#d9a400'), crit: v('--crit', '#d03030'),
      accent: v('--accent', '#76b900')
    };
  }
  gw.colors = themeColors;

  // -- formatting -----------------------------------------------------------------------------
  var SI = [[1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'k']];
  function num(v, digits) {
    if (!isFinite(v)) return String(v);
    var a = Math.abs(v);
    var d = digits === undefined ? (a >= 100 ? 0 : a >= 10 ? 1 : 2) : digits;
    return v.toFixed(d).replace(/\.0+$/, '').replace(/(\.\d*[1-9])0+$/, '$1');
  }
  function si(v, suffix) {
    var a = Math.abs(v);
    for (var i = 0; i < SI.length; i++) if (a >= SI[i][0]) return num(v / SI[i][0]) + ' ' + SI[i][1] + suffix;
    return num(v) + (suffix ? ' ' + suffix : '');
  }
  function bytes(v, suffix) {
    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'], a = Math.abs(v), i = 0;
    while (a >= 1024 && i < units.length - 1) { a /= 1024; v /= 1024; i++; }
    return num(v) + ' ' + units[i] + (suffix || '');
  }
  function seconds(v) {
    var a = Math.abs(v);
    if (a === 0) return '0 s';
    if (a < 1e-3) return num(v * 1e6) + ' µs';
    if (a < 1) return num(v * 1e3) + ' ms';
    if (a < 120) return num(v) + ' s';
    if (a < 7200) return num(v / 60) + ' min';
    if (a < 172800) return num(v / 3600) + ' h';
    return num(v / 86400) + ' d';
  }
  /** A value with its unit, for stats, tables and hover text. */
  gw.format = function (v, unit) {
    if (v === null || v === undefined || isNaN(v)) return '–';
    switch (unit) {
      case 'percent': return num(v) + ' %';
      case 'ratio': return num(v * 100) + ' %';
      case 'bytes': return bytes(v);
      case 'mib': return bytes(v * 1048576);
      case 'bytes_per_second': return bytes(v, '/s');
      case 'watts': return si(v, 'W');
      case 'joules': return si(v, 'J');
      case 'kwh': return num(v) + ' kWh';
      case 'celsius': return num(v) + ' °C';
      case 'seconds': return seconds(v);
      case 'hz': return si(v, 'Hz');
      case 'mhz': return num(v, 0) + ' MHz';
      case 'per_second': return si(v, '/s');
      case 'count': return num(v, Math.abs(v) >= 1 || v === 0 ? 0 : 2);
      default: return si(v, '');
    }
  };
  /** "5 min ago" from a time in ms. */
  gw.ago = function (ms, nowMs) {
    var s = Math.max(0, ((nowMs || Date.now()) - ms) / 1000);
    return seconds(s) + ' ' + gw.t('common.ago');
  };
  /** Local wall time for Plotly's date axes: Plotly draws dates as given, so the browser's zone. */
  gw.localTime = function (ms) {
    var d = new Date(ms);
    function p(n, w) { n = String(n); while (n.length < (w || 2)) n = '0' + n; return n; }
    return d.getFullYear() + '-' + p(d.getMonth() + 1) + '-' + p(d.getDate()) + ' ' + p(d.getHours()) + ':' +
      p(d.getMinutes()) + ':' + p(d.getSeconds()) + '.' + p(d.getMilliseconds(), 3);
  };
  /** The inverse of gw.localTime (Plotly's relayout ranges come back in that form). */
  gw.parseLocal = function (s) {
    if (typeof s === 'number') return s;
    var m = /^(\d{4})-(\d\d)-(\d\d)(?:[ T](\d\d):(\d\d)(?::(\d\d)(?:\.(\d+))?)?)?/.exec(String(s));
    if (!m) return NaN;
    var ms = m[7] ? Math.round(parseFloat('0.' + m[7]) * 1000) : 0;
    return new Date(+m[1], +m[2] - 1, +m[3], +(m[4] || 0), +(m[5] || 0), +(m[6] || 0), ms).getTime();
  };

  // -- queries --------------------------------------------------------------------------------
  var csrfMeta = document.querySelector('meta[name="csrf-token"]');
  gw.csrfToken = function () { return csrfMeta ? csrfMeta.getAttribute('content') || '' : ''; };
  /** fetch() that sends the CSRF token on every non-GET request. */
  gw.fetch = function (url, opts) {
    opts = Object.assign({ credentials: 'same-origin' }, opts || {});
    var method = (opts.method || 'GET').toUpperCase();
    if (method !== 'GET' && method !== 'HEAD') {
      opts.headers = Object.assign({}, opts.headers || {}, { 'X-CSRF-Token': gw.csrfToken() });
    }
    return fetch(url, opts);
  };
  /** The one-line banner of a face whose remote store is down (base.html's #gw-remote): shown while
   * answers come from the local buffer (header Gpuwatch-Answered-By: local-buffer, the line being the
   * answer's first warning), dropped once one comes from the remote again. */
  gw.remoteAnswer = function (by, body) {
    var el = document.getElementById('gw-remote');
    if (!el || !by) return;
    if (by === 'local-buffer') {
      var w = body && Array.isArray(body.warnings) && body.warnings.length ? body.warnings[0] : '';
      if (w) gw.text(el, w);
      el.hidden = false;
    } else if (by === 'remote') {
      el.hidden = true;
    }
  };
  /** GET a JSON API; resolves {ok, status, body} or {ok:false, offline:true} when nothing answers. */
  gw.getJson = function (url) {
    return gw.fetch(url).then(function (resp) {
      return resp.text().then(function (text) {
        var by = resp.headers.get('Gpuwatch-Answered-By');
        try {
          var body = JSON.parse(text);
          gw.remoteAnswer(by, body);
          return { ok: resp.ok, status: resp.status, body: body, text: text };
        } catch (e) {
          return { ok: false, status: resp.status, body: { error: 'HTTP ' + resp.status } };
        }
      });
    }, function (err) { return { ok: false, offline: true, status: 0, body: { error: String(err) } }; });
  };
  /** A 503 `unavailable`: the server is answering as many queries as it takes (query_max_concurrency
   * and query_max_queued); nothing is wrong, ask again at the next refresh. */
  gw.isBusy = function (r) { return r.status === 503 && !!r.body && r.body.errorType === 'unavailable'; };
  function promResult(r, extra) {
    if (r.offline) return Object.assign({ status: 'offline', error: gw.t('state.offline'), result: [] }, extra);
    if (gw.isBusy(r)) return Object.assign({ status: 'busy', error: r.body.error, result: [] }, extra);
    if (!r.ok || !r.body || r.body.status !== 'success') {
      var b = r.body || {};
      return Object.assign({ status: 'error', errorType: b.errorType || '', error: b.error || ('HTTP ' + r.status), result: [] }, extra);
    }
    return Object.assign({ status: 'ok', resultType: r.body.data.resultType, result: r.body.data.result || [], warnings: r.body.warnings || [], text: r.text }, extra);
  }
  var NICE_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
  /** The step (seconds) for a range drawn `widthPx` wide: about one point per 2 px, at most 1500 points. */
  gw.stepFor = function (startMs, endMs, widthPx) {
    var points = Math.max(30, Math.min(MAX_POINTS, Math.floor((widthPx || 600) / 2)));
    var raw = (endMs - startMs) / 1000 / points;
    for (var i = 0; i < NICE_STEPS.length; i++) if (NICE_STEPS[i] >= raw) return NICE_STEPS[i];
    return Math.ceil(raw / 86400) * 86400;
  };
  /** /api/v1/query_range with a step from the pixel width; start and end aligned to the step. */
  gw.queryRange = function (expr, startMs, endMs, widthPx) {
    var step = gw.stepFor(startMs, endMs, widthPx);
    var stepMs = step * 1000;
    var start = Math.floor(startMs / stepMs) * stepMs, end = Math.ceil(endMs / stepMs) * stepMs;
    var q = new URLSearchParams({ query: expr, start: String(start / 1000), end: String(end / 1000), step: String(step) });
    return gw.getJson('/api/v1/query_range?' + q.toString()).then(function (r) { return promResult(r, { step: step, start: start, end: end }); });
  };
  /** /api/v1/query at `timeMs` (default now). */
  gw.query = function (expr, timeMs) {
    var q = new URLSearchParams({ query: expr });
    if (timeMs !== undefined && timeMs !== null) q.set('time', String(timeMs / 1000));
    return gw.getJson('/api/v1/query?' + q.toString()).then(function (r) { return promResult(r, {}); });
  };

  // -- panels: variables, legends -------------------------------------------------------------
  function promString(s) { return String(s).replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n'); }
  /** `$name` in a query replaced from `vars` (escaped for a PromQL double-quoted string). */
  gw.fill = function (query, vars) {
    return String(query || '').replace(/\$([A-Za-z_][A-Za-z0-9_]*)/g, function (m, name) {
      return vars && Object.prototype.hasOwnProperty.call(vars, name) ? promString(vars[name]) : m;
    });
  };
  /** The variables every query may use: $__rate (a rate() window for the step), $__range (the range),
   * $__today (local midnight to the range's end), $__interval (the step). */
  gw.builtinVars = function (r, stepS) {
    var step = stepS || 0;
    var midnight = new Date(r.end); midnight.setHours(0, 0, 0, 0);
    return {
      __rate: Math.max(60, 4 * step) + 's',
      __interval: Math.max(1, step) + 's',
      __range: Math.max(1, Math.round((r.end - r.start) / 1000)) + 's',
      __today: Math.max(1, Math.round((r.end - midnight.getTime()) / 1000)) + 's'
    };
  };
  /** A series' name from a legend template ('{{Hostname}}/{{gpu}}'), else its labels; a metric name
   *  with a UI string (`metric.<name>`: 'used', 'total') is shown as that. */
  gw.seriesName = function (metric, legend) {
    metric = metric || {};
    if (legend) {
      return legend.replace(/\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}/g, function (m, k) {
        var v = metric[k];
        if (v === undefined) return '';
        return k === '__name__' && Object.prototype.hasOwnProperty.call(strings, 'metric.' + v) ? strings['metric.' + v] : v;
      });
    }
    var keys = Object.keys(metric).filter(function (k) { return k !== '__name__'; });
    if (!keys.length) return metric.__name__ || 'value';
    return (metric.__name__ || '') + '{' + keys.map(function (k) { return k + '="' + metric[k] + '"'; }).join(', ') + '}';
  };

  // -- figures: pure functions from query results to Plotly figures ----------------------------
  var figures = {};
  gw.figures = figures;
  function baseLayout(panel, opts) {
    var c = opts.colors || themeColors();
    return {
      uirevision: opts.uirevision || 'gw',
      margin: { l: 56, r: 12, t: 8, b: 32 },
      height: panel.height || 240,
      paper_bgcolor: 'rgba(0,0,0,0)', plot_bgcolor: 'rgba(0,0,0,0)',
      font: { color: c.fg, size: 11 },
      showlegend: false,
      hovermode: 'closest',
      xaxis: { type: 'date', gridcolor: c.grid, linecolor: c.grid, zeroline: false },
      yaxis: { gridcolor: c.grid, linecolor: c.grid, zeroline: false, automargin: true }
    };
  }
  function yAxisUnit(unit) {
    return { percent: { ticksuffix: ' %' }, mib: { ticksuffix: ' MiB', tickformat: '.4~s' }, celsius: { ticksuffix: ' °C' }, watts: { ticksuffix: ' W' },
      mhz: { ticksuffix: ' MHz' }, ratio: { tickformat: '.0%' }, bytes: { tickformat: '.3~s', ticksuffix: 'B' },
      bytes_per_second: { tickformat: '.3~s', ticksuffix: 'B/s' }, per_second: { tickformat: '.3~s', ticksuffix: '/s' },
      hz: { tickformat: '.3~s', ticksuffix: 'Hz' }, seconds: { tickformat: '.3~s', ticksuffix: 's' },
      count: { tickformat: '.3~g' } }[unit] || { tickformat: '.3~s' };  // a count of 0.05 GPUs is not '50m'
  }
  function thresholdShapes(panel, c) {
    var th = panel.thresholds || {}, shapes = [];
    [['warn', c.warn], ['crit', c.crit]].forEach(function (x) {
      if (th[x[0]] !== null && th[x[0]] !== undefined) {
        shapes.push({ type: 'line', xref: 'paper', x0: 0, x1: 1, yref: 'y', y0: th[x[0]], y1: th[x[0]],
          line: { color: x[1], width: 1, dash: 'dot' } });
      }
    });
    return shapes;
  }
  /** Points of one range-query series as [x (local time strings), y], gaps (missing steps) as null. */
  function seriesXY(values, stepS) {
    var x = [], y = [], prev = null;
    for (var i = 0; i < values.length; i++) {
      var t = values[i][0] * 1000, v = parseFloat(values[i][1]);
      if (prev !== null && stepS && t - prev > stepS * 1000 * 1.5) { x.push(gw.localTime(prev + stepS * 1000)); y.push(null); }
      x.push(gw.localTime(t)); y.push(isFinite(v) ? v : null);
      prev = t;
    }
    return [x, y];
  }
  /** Lines over time, one per series. */
  figures.timeseries = function (result, panel, opts) {
    opts = opts || {};
    var c = opts.colors || themeColors(), layout = baseLayout(panel, opts);
    Object.assign(layout.yaxis, yAxisUnit(panel.unit));
    if (panel.min !== null && panel.min !== undefined && panel.max !== null && panel.max !== undefined) layout.yaxis.range = [panel.min, panel.max];
    else if (panel.min === 0) layout.yaxis.rangemode = 'tozero';
    if (opts.logY) { layout.yaxis.type = 'log'; delete layout.yaxis.range; }
    if (opts.start !== undefined) layout.xaxis.range = [gw.localTime(opts.start), gw.localTime(opts.end)];
    layout.shapes = thresholdShapes(panel, c);
    var data = (result || []).map(function (s) {
      var xy = seriesXY(s.values || [], opts.step);
      var name = gw.esc(gw.seriesName(s.metric, panel.legend));
      return { type: 'scatter', mode: 'lines', name: name, x: xy[0], y: xy[1], line: { width: 1.5 },
        stackgroup: panel.stacked ? 'one' : undefined, connectgaps: false,
        hovertemplate: '%{y:.4~g}<extra>' + name + '</extra>' };
    });
    layout.showlegend = data.length > 1 && data.length <= 8 && (panel.width || 6) >= 6;
    if (layout.showlegend) layout.legend = { orientation: 'h', y: -0.18, font: { size: 10 } };
    var m = opts.marks && opts.marks.length ? gw.markLayers(opts.marks, c) : null;
    if (m && m.trace.x.length) {
      layout.shapes = layout.shapes.concat(m.shapes);
      layout.yaxis2 = m.yaxis2;
      data.push(m.trace);
    }
    return { data: data, layout: layout };
  };
  /** The kind of event a series of an events panel stands for, by its metric name. */
  function eventKind(metric) {
    var n = (metric || {}).__name__ || '';
    if (/xid/i.test(n)) return 'xid';
    if (/ECC/.test(n)) return 'ecc';
    if (/throttl/.test(n)) return metric.reason === 'sw_power_cap' ? 'power_cap' : 'throttle';
    if (n === 'ALERTS') return 'alert';
    return 'other';
  }
  /** The events of a range-query answer: [{t (ms), name, kind, value}] where a series rises
   * (counters) or leaves 0 (gauges); with `panel.counter`, only series that appear non-zero after
   * the range's start (opts.qstart) count, not those already there. Series by series, each in time
   * order (the events chart's rows come in the order of their series). */
  gw.eventList = function (result, panel, opts) {
    opts = opts || {};
    var stepMs = (opts.step || 60) * 1000, first = opts.qstart, out = [];
    (result || []).forEach(function (s) {
      var name = gw.seriesName(s.metric, panel.legend).replace(/\s+/g, ' ').trim(), kind = eventKind(s.metric), prev = null, prevT = null;
      (s.values || []).forEach(function (p) {
        var v = parseFloat(p[1]), t = p[0] * 1000;
        if (prevT !== null && t - prevT > 1.5 * stepMs) prev = null;  // the series was gone: it reappears
        var appeared = prev === null && v > 0 && (!panel.counter || first === undefined || t > first + 1.5 * stepMs);
        if (appeared || (prev !== null && v > prev)) out.push({ t: t, name: name, kind: kind, value: v });
        prev = v; prevT = t;
      });
    });
    return out;
  };
  // The events marked on time charts, by kind, and their colours. Not a GPU held at its power limit
  // (sw_power_cap, which a busy GPU meets all day: the events chart still shows it).
  var MARK_COLOR = { xid: 'crit', ecc: 'crit', throttle: 'warn', alert: 'accent', other: 'muted' };
  /** Events drawn on a time chart: a dashed vertical line each (shapes on the chart's x axis, full
   * height) and a hoverable marker at the top of each line naming the event (on a hidden y axis).
   * Events of a kind not in MARK_COLOR are left out. */
  gw.markLayers = function (marks, c) {
    var shapes = [], x = [], y = [], text = [], color = [];
    marks.filter(function (m) { return Object.prototype.hasOwnProperty.call(MARK_COLOR, m.kind); }).forEach(function (m) {
      var col = c[MARK_COLOR[m.kind] || 'muted'], t = gw.localTime(m.t);
      shapes.push({ type: 'line', xref: 'x', x0: t, x1: t, yref: 'paper', y0: 0, y1: 1, layer: 'below',
        line: { color: col, width: 1, dash: 'dash' } });
      x.push(t); y.push(1); text.push(gw.esc(m.name)); color.push(col);
    });
    return {
      shapes: shapes,
      yaxis2: { overlaying: 'y', range: [0, 1.02], visible: false, fixedrange: true },
      trace: { type: 'scatter', mode: 'markers', name: 'events', yaxis: 'y2', x: x, y: y, text: text, showlegend: false,
        marker: { symbol: 'triangle-down', size: 8, color: color }, hovertemplate: '%{text}<br>%{x}<extra></extra>' }
    };
  };
  /** One row per series over time (y = series name, x = time, colour = value). */
  figures.heatmap = function (result, panel, opts) {
    opts = opts || {};
    var layout = baseLayout(panel, opts);
    var rows = (result || []).slice().sort(function (a, b) {
      var na = gw.seriesName(a.metric, panel.legend), nb = gw.seriesName(b.metric, panel.legend);
      return na.localeCompare(nb, undefined, { numeric: true });
    });
    var step = (opts.step || 60) * 1000, start = opts.qstart, end = opts.qend;
    if (start === undefined) {
      start = Infinity; end = -Infinity;
      rows.forEach(function (s) { (s.values || []).forEach(function (v) { start = Math.min(start, v[0] * 1000); end = Math.max(end, v[0] * 1000); }); });
    }
    var n = isFinite(start) ? Math.round((end - start) / step) + 1 : 0, x = [];
    for (var i = 0; i < n; i++) x.push(gw.localTime(start + i * step));
    var z = [], y = [];
    rows.forEach(function (s) {
      var row = new Array(n).fill(null);
      (s.values || []).forEach(function (v) { var k = Math.round((v[0] * 1000 - start) / step); if (k >= 0 && k < n) row[k] = parseFloat(v[1]); });
      z.push(row); y.push(gw.esc(gw.seriesName(s.metric, panel.legend)));
    });
    // No row grid: Plotly's default (near white) showed through empty cells in dark mode.
    layout.yaxis = { type: 'category', automargin: true, autorange: 'reversed', tickfont: { size: 10 }, showgrid: false };
    layout.margin.b = 44;  // its two-line date ticks (no legend below it makes room for them)
    if (opts.start !== undefined) layout.xaxis.range = [gw.localTime(opts.start), gw.localTime(opts.end)];
    layout.height = Math.max(panel.height || 240, 40 + 14 * y.length);
    var zmin = panel.min === null || panel.min === undefined ? undefined : panel.min;
    var zmax = panel.max === null || panel.max === undefined ? undefined : panel.max;
    return { data: [{ type: 'heatmap', x: x, y: y, z: z, zmin: zmin, zmax: zmax, colorscale: 'Viridis', hoverongaps: false,
      colorbar: { thickness: 10, ticksuffix: panel.unit === 'percent' ? ' %' : '' },
      hovertemplate: '%{y}<br>%{x}<br>%{z:.4~g}<extra></extra>' }], layout: layout };
  };
  function lastValue(s) {
    if (s.value) return parseFloat(s.value[1]);
    var v = s.values || [];
    return v.length ? parseFloat(v[v.length - 1][1]) : NaN;
  }
  /** The latest value per series as bars. */
  figures.bars = function (result, panel, opts) {
    opts = opts || {};
    var c = opts.colors || themeColors(), layout = baseLayout(panel, opts);
    var rows = (result || []).map(function (s) { return { name: gw.seriesName(s.metric, panel.legend), v: lastValue(s), metric: s.metric }; });
    rows.sort(function (a, b) { return a.name.localeCompare(b.name, undefined, { numeric: true }); });
    var th = panel.thresholds || {};
    var colors = rows.map(function (r) {
      var above = th.above !== false;
      function past(t) { return t !== null && t !== undefined && (above ? r.v >= t : r.v <= t); }
      return past(th.crit) ? c.crit : past(th.warn) ? c.warn : c.accent;
    });
    layout.xaxis = { type: 'category', automargin: true, tickangle: rows.length > 8 ? -45 : 0, gridcolor: c.grid };
    Object.assign(layout.yaxis, yAxisUnit(panel.unit));
    if (panel.max !== null && panel.max !== undefined) layout.yaxis.range = [panel.min || 0, panel.max];
    layout.shapes = thresholdShapes(panel, c);
    var names = rows.map(function (r) { return gw.esc(r.name); });
    return { data: [{ type: 'bar', x: names, y: rows.map(function (r) { return r.v; }), marker: { color: colors },
      text: rows.map(function (r) { return gw.esc(gw.format(r.v, panel.unit)); }), textposition: 'none',
      hovertemplate: '%{x}: %{text}<extra></extra>' }], layout: layout };
  };
  /** Markers at the times a series rises (counters) or leaves 0 (gauges), one row per series. */
  figures.events = function (result, panel, opts) {
    opts = opts || {};
    var c = opts.colors || themeColors(), layout = baseLayout(panel, opts);
    var x = [], y = [], text = [];
    gw.eventList(result, panel, opts).forEach(function (e) {
      x.push(gw.localTime(e.t)); y.push(gw.esc(e.name)); text.push(gw.esc(gw.format(e.value, panel.unit)));
    });
    layout.yaxis = { type: 'category', automargin: true, gridcolor: c.grid };
    layout.margin.b = 44;  // two-line date ticks, as the heatmap's
    if (opts.start !== undefined) layout.xaxis.range = [gw.localTime(opts.start), gw.localTime(opts.end)];
    return { data: [{ type: 'scatter', mode: 'markers', x: x, y: y, text: text, marker: { symbol: 'diamond', size: 9, color: c.crit },
      hovertemplate: '%{y}<br>%{x}<br>%{text}<extra></extra>' }], layout: layout, count: x.length };
  };
  gw.lastValue = lastValue;

  // -- drawing panels -------------------------------------------------------------------------
  var PLOTLY_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ['select2d', 'lasso2d', 'toImage'] };

  /** Draw (or update) a Plotly figure in `el` with Plotly.react; drag-to-zoom sets the page's range. */
  gw.plot = function (el, fig) {
    if (!window.Plotly) { gw.text(el, 'Plotly did not load'); return Promise.resolve(); }
    var p = Plotly.react(el, fig.data, fig.layout, PLOTLY_CONFIG);
    el.gwFigure = fig;
    if (!el.dataset.gwZoom) {
      el.dataset.gwZoom = '1';
      el.on('plotly_relayout', function (ev) {
        var a = ev && ev['xaxis.range[0]'], b = ev && ev['xaxis.range[1]'];
        if (ev && ev['xaxis.range'] && ev['xaxis.range'].length === 2) { a = ev['xaxis.range'][0]; b = ev['xaxis.range'][1]; }
        if (a === undefined || b === undefined || ((el.gwFigure || fig).layout.xaxis || {}).type !== 'date') return;
        var s = gw.parseLocal(a), e = gw.parseLocal(b);
        if (isFinite(s) && isFinite(e) && e > s) gw.setParams({ from: Math.round(s), to: Math.round(e), refresh: 'off' }, true);
      });
    }
    return p;
  };
  function redrawAll() { tick(true); }  // figures read the theme's colours when drawn

  /** Show one of the absence states (nodata, unsupported, failed, error, offline, loading) in `el`. */
  gw.showState = function (el, state, detail, label) {
    el.innerHTML = '';
    var box = gw.el('div', { class: 'gw-state gw-state-' + state, 'data-state': state }, [
      gw.el('span', { class: 'gw-state-label' }, label || gw.t('state.' + state)),
      detail ? gw.el('span', { class: 'gw-state-detail' }, detail) : null
    ]);
    el.appendChild(box);
  };

  function panelCard(panel, vars) {
    var expr = gw.fill(panel.query, vars);
    var explore = gw.el('a', { class: 'gw-explore', href: gw.exploreUrl(expr) }, gw.t('panel.explore'));
    var step = gw.el('span', { class: 'gw-step muted' });
    var head = gw.el('div', { class: 'gw-panel-head' }, [
      gw.el('h3', { title: panel.description || null }, panel.title), step
    ]);
    var logBox = null;
    if (panel.log_y) {
      logBox = gw.el('input', { type: 'checkbox', class: 'gw-logy' });
      logBox.checked = gw.param('log_' + panel.id) === '1';
      head.appendChild(gw.el('label', { class: 'gw-logy-label muted' }, [logBox, ' ' + gw.t('panel.logy')]));
    }
    head.appendChild(explore);
    var status = gw.el('div', { class: 'gw-panel-status' });
    var body = gw.el('div', { class: 'gw-panel-body' });
    var card = gw.el('section', { class: 'gw-panel gw-kind-' + panel.kind, id: 'panel-' + panel.id,
      'data-panel': panel.id, 'data-kind': panel.kind, 'data-query': expr,
      style: '--span:' + (panel.width || 6) }, [head, status, body]);
    return { card: card, body: body, status: status, step: step, explore: explore, logBox: logBox, expr: expr };
  }

  function absenceState(panel, vars, timeMs) {
    // Which kind of nothing: collection failed, not available on this GPU, a real empty answer
    // (panel.empty: "no process"), or no data.
    function has(q) { return q ? gw.query(gw.fill(q, vars), timeMs).then(function (r) { return r.status === 'busy' ? 'busy' : r.result.length > 0; }) : Promise.resolve(null); }
    return Promise.all([has(panel.failed_if), has(panel.unsupported_if)]).then(function (x) {
      if (x[0] === 'busy' || x[1] === 'busy') return 'busy';
      if (x[0]) return 'failed';
      if (panel.empty && x[1] !== false) return 'empty';
      if (x[1]) return 'unsupported';
      return 'nodata';
    });
  }

  function dropChart(c) {
    if (c.chart && window.Plotly) Plotly.purge(c.chart);
    c.chart = null;
  }

  // A container id is shown as `docker ps` shows it, 12 characters, the whole id on hover.
  function tableCell(key, value) {
    if (key === 'container_id' && value.length > 12) return gw.el('td', { title: value }, value.slice(0, 12));
    return gw.el('td', null, value);
  }

  function drawTable(body, result, panel) {
    var keys = {};
    result.forEach(function (s) { Object.keys(s.metric || {}).forEach(function (k) { if (k !== '__name__') keys[k] = 1; }); });
    var cols = (panel.columns && panel.columns.length) ? panel.columns : Object.keys(keys).sort();
    var table = gw.el('table', { class: 'gw-table' });
    var thead = gw.el('tr', null, cols.map(function (k) { return gw.el('th', null, k); }).concat([gw.el('th', { class: 'num' }, gw.t('common.value') === 'common.value' ? 'value' : gw.t('common.value'))]));
    table.appendChild(gw.el('thead', null, [thead]));
    var tb = gw.el('tbody');
    result.forEach(function (s) {
      var tr = gw.el('tr', null, cols.map(function (k) { return tableCell(k, (s.metric || {})[k] || ''); }));
      tr.appendChild(gw.el('td', { class: 'num' }, gw.format(lastValue(s), panel.unit)));
      tb.appendChild(tr);
    });
    table.appendChild(tb);
    body.innerHTML = '';
    body.appendChild(gw.el('div', { class: 'gw-table-wrap' }, [table]));
  }

  function drawStat(body, result, panel) {
    var v = lastValue(result[0]);
    var th = panel.thresholds || {}, above = th.above !== false, cls = 'gw-stat';
    function past(t) { return t !== null && t !== undefined && (above ? v >= t : v <= t); }
    if (past(th.crit)) cls += ' crit'; else if (past(th.warn)) cls += ' warn';
    body.innerHTML = '';
    body.appendChild(gw.el('div', { class: cls, 'data-value': String(v) }, gw.format(v, panel.unit)));
  }

  /** Draw `panels` into `container` (a grid), filling `$vars`; they update on every refresh.
   * Returns {refresh(), cards: {id: element}}. */
  gw.drawPanels = function (container, panels, vars) {
    vars = vars || {};
    var items = (panels || []).map(function (panel) {
      var c = panelCard(panel, vars);
      container.appendChild(c.card);
      gw.showState(c.body, 'loading');
      c.panel = panel;
      if (c.logBox) c.logBox.addEventListener('change', function () {
        var ch = {}; ch['log_' + panel.id] = c.logBox.checked ? '1' : null; gw.setParams(ch, false, true); update(c, gw.range());
      });
      return c;
    });
    function update(c, r) {
      var panel = c.panel;
      var ranged = panel.kind === 'timeseries' || panel.kind === 'heatmap' || panel.kind === 'events';
      var width = c.body.clientWidth || container.clientWidth || 600;
      var step = ranged ? gw.stepFor(r.start, r.end, width) : 0;
      var allVars = Object.assign(gw.builtinVars(r, step), vars);
      // A chart's points are `step` apart: asking more often than once a step (a 1 s refresh of a
      // 1 h chart has a 10 s step) only redraws the last point. Range changes always ask.
      var key = gw.rangeKey() + '|' + step + '|' + gw.theme();
      var every = Math.max(ranged ? step : 0, panel.min_interval || 0) * 1000;
      if (every && !r.force && c.fetchKey === key && Date.now() - c.fetchedAt < every) return Promise.resolve();
      c.fetchKey = key; c.fetchedAt = Date.now();
      c.expr = gw.fill(panel.query, allVars);
      c.card.dataset.query = c.expr;
      c.explore.href = gw.exploreUrl(c.expr);
      var req = ranged ? gw.queryRange(c.expr, r.start, r.end, width) : gw.query(c.expr, r.end);
      c.answer = req;  // charts that draw this panel's events as marks wait for it (panel.marks)
      var src = panel.marks ? byId[panel.marks] : null;
      var marksReq = src && src.answer ? src.answer : Promise.resolve(null);
      return Promise.all([req, marksReq]).then(function (both) {
        var res = both[0], marksRes = both[1] && both[1].status === 'ok' ? both[1] : null;
        var failing = null;
        // Busy: keep what is drawn and ask again at the next refresh, not once a step.
        if (res.status === 'busy') { c.fetchedAt = 0; return; }
        if (res.status !== 'ok') {
          c.card.dataset.state = res.status;
          dropChart(c);
          gw.showState(c.body, res.status, res.error);
          return;
        }
        if (ranged) { gw.text(c.step, gw.t('panel.step') + ' ' + res.step + ' s'); c.explore.href = gw.exploreUrl(c.expr, { step: res.step }); }
        if (!res.result.length) {
          return absenceState(panel, allVars, r.end).then(function (st) {
            if (st === 'busy') { c.fetchedAt = 0; return; }
            c.card.dataset.state = st; dropChart(c);
            gw.showState(c.body, st, null, st === 'empty' ? gw.t(panel.empty) : null);
          });
        }
        c.card.dataset.state = 'data';
        if (panel.kind === 'table') return drawTable(c.body, res.result, panel);
        if (panel.kind === 'stat') return drawStat(c.body, res.result, panel);
        var opts = { uirevision: gw.rangeKey(), start: r.start, end: r.end, step: res.step, qstart: res.start, qend: res.end,
          logY: c.logBox ? c.logBox.checked : false };
        if (marksRes) opts.marks = gw.eventList(marksRes.result, src.panel, { step: marksRes.step, qstart: marksRes.start });
        // The same answer as last time (start and end are aligned to the step, so a refresh within
        // one step usually gets the same bytes): nothing to redraw.
        var sig = res.text + '|' + opts.uirevision + '|' + opts.logY + '|' + gw.theme() + '|' + (r.end - r.start) +
          '|' + (marksRes ? marksRes.text : '');
        if (c.chart && c.body.contains(c.chart) && c.sig === sig) return;
        c.sig = sig;
        var fig = figures[panel.kind](res.result, panel, opts);
        if (panel.kind === 'events' && !fig.count && panel.empty) {
          c.card.dataset.state = 'empty'; dropChart(c);
          return gw.showState(c.body, 'empty', null, gw.t(panel.empty));
        }
        if (!c.chart || !c.body.contains(c.chart)) { c.body.innerHTML = ''; c.chart = gw.el('div', { class: 'gw-chart' }); c.body.appendChild(c.chart); }
        if (panel.failed_if) {
          failing = gw.query(gw.fill(panel.failed_if, allVars), r.end).then(function (f) {
            if (f.status === 'busy') return;
            c.status.innerHTML = '';
            if (f.result.length) c.status.appendChild(gw.el('span', { class: 'gw-state-failed', 'data-state': 'failing' }, gw.t('state.failing')));
          });
        }
        return Promise.all([gw.plot(c.chart, fig), failing]);
      });
    }
    var byId = {};
    items.forEach(function (c) { byId[c.panel.id] = c; });
    // Panels whose events other charts mark ask first, so that those charts can wait for their answer.
    var sources = {};
    items.forEach(function (c) { if (c.panel.marks) sources[c.panel.marks] = true; });
    var ordered = items.filter(function (c) { return sources[c.panel.id]; }).concat(items.filter(function (c) { return !sources[c.panel.id]; }));
    function updateAll(r) { return Promise.all(ordered.map(function (c) { return update(c, r); })); }
    gw.onRefresh(updateAll);
    var cards = {};
    items.forEach(function (c) { cards[c.panel.id] = c.card; });
    return { refresh: function () { return updateAll(gw.range()); }, cards: cards };
  };

  // -- the header's controls ------------------------------------------------------------------
  function localInput(ms) { return gw.localTime(ms).slice(0, 19).replace(' ', 'T'); }
  function syncControls() {
    var st = gw.state();
    var rangeSel = document.getElementById('gw-range');
    var custom = document.getElementById('gw-custom');
    if (rangeSel) {
      var m = /^now-(\d+[smhdwy])$/.exec(st.from);
      var preset = m && st.to === 'now' && RANGES.indexOf(m[1]) >= 0 ? m[1] : 'custom';
      rangeSel.value = preset;
      if (custom) {
        custom.hidden = preset !== 'custom';
        var r = gw.range();
        document.getElementById('gw-from').value = localInput(r.start);
        document.getElementById('gw-to').value = localInput(r.end);
      }
    }
    var ref = document.getElementById('gw-refresh');
    if (ref) ref.value = st.refresh;
    var zoomed = document.getElementById('gw-zoomed');
    if (zoomed) zoomed.hidden = !(/^\d+$/.test(st.from) && st.refresh === 'off');
    var lang = document.getElementById('gw-lang');
    if (lang) { var p = params(); p.set('lang', lang.dataset.lang); lang.href = location.pathname + '?' + p.toString(); }
    document.querySelectorAll('a[data-nav]').forEach(function (a) {
      var path = a.getAttribute('href').split('?')[0];
      a.setAttribute('href', gw.link(path));
    });
  }
  function wireControls() {
    var rangeSel = document.getElementById('gw-range');
    if (rangeSel) rangeSel.addEventListener('change', function () {
      if (rangeSel.value === 'custom') { document.getElementById('gw-custom').hidden = false; return; }
      gw.setParams({ from: 'now-' + rangeSel.value, to: 'now', refresh: gw.state().refresh === 'off' && /^\d+$/.test(gw.state().from) ? DEFAULTS.refresh : null }, true);
    });
    var apply = document.getElementById('gw-apply');
    if (apply) apply.addEventListener('click', function () {
      var s = gw.parseLocal(document.getElementById('gw-from').value), e = gw.parseLocal(document.getElementById('gw-to').value);
      if (isFinite(s) && isFinite(e) && e > s) gw.setParams({ from: s, to: e }, true);
    });
    var ref = document.getElementById('gw-refresh');
    if (ref) ref.addEventListener('change', function () { gw.setParams({ refresh: ref.value }, false, true); });
    var now = document.getElementById('gw-now');
    if (now) now.addEventListener('click', function () { tick(true); });
    var theme = document.getElementById('gw-theme');
    if (theme) theme.addEventListener('click', function () { gw.setTheme(gw.theme() === 'dark' ? 'light' : 'dark'); });
    var mq = window.matchMedia ? matchMedia('(prefers-color-scheme: dark)') : null;
    if (mq && mq.addEventListener) mq.addEventListener('change', function (e) {
      var stored = null; try { stored = localStorage.getItem(THEME_KEY); } catch (x) { /* none */ }
      if (!stored && !gw.param('theme')) { document.documentElement.setAttribute('data-theme', e.matches ? 'dark' : 'light'); redrawAll(); }
    });
  }
  function init() {
    wireControls();
    syncControls();
    restartTimer();
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init); else init();
})();
