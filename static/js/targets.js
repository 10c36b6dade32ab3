/* Scrape targets by job: health, last scrape, duration, samples, last error. Text only. */
(function () {
  'use strict';
  var jobsEl = document.getElementById('jobs');
  var samples = {};  // job|instance -> scrape_samples_scraped

  function labelsOf(t) {
    var out = {};
    Object.keys(t.labels || {}).forEach(function (k) { if (k !== 'job' && k !== 'instance') out[k] = t.labels[k]; });
    return out;
  }
  function draw(d) {
    jobsEl.innerHTML = '';
    document.getElementById('targets-empty').hidden = d.jobs.length > 0;
    gw.text(document.getElementById('dropped'), d.dropped ? d.dropped + ' ' + gw.t('targets.dropped') : '');
    d.jobs.forEach(function (j) {
      var tbody = gw.el('tbody');
      j.targets.forEach(function (t) {
        var inst = (t.labels || {}).instance || '';
        var last = t.lastScrape && t.lastScrape.indexOf('0001-') !== 0 ? Date.parse(t.lastScrape) : NaN;
        var n = samples[j.job + '|' + inst];
        var extra = labelsOf(t);
        tbody.appendChild(gw.el('tr', { class: 'target ' + t.health, 'data-health': t.health, 'data-url': t.scrapeUrl }, [
          gw.el('td', null, [gw.el('a', { href: t.scrapeUrl, rel: 'noopener noreferrer' }, t.scrapeUrl)]),
          gw.el('td', null, [gw.el('span', { class: 'gw-badge gw-health-' + t.health }, gw.t('targets.health.' + t.health))]),
          gw.el('td', null, [gw.el('span', { class: 'gw-labels' }, Object.keys(extra).sort().map(function (k) { return gw.el('span', { class: 'gw-chip' }, k + '=' + extra[k]); }))]),
          gw.el('td', { class: 'num' }, isNaN(last) ? gw.t('common.never') : gw.ago(last, d.now_ms)),
          gw.el('td', { class: 'num' }, t.lastScrapeDuration ? gw.format(t.lastScrapeDuration, 'seconds') : '–'),
          gw.el('td', { class: 'num samples' }, n === undefined ? '–' : gw.format(n, 'count')),
          gw.el('td', { class: 'error last-error' }, t.lastError || '')
        ]));
      });
      var head = gw.el('h2', { 'data-job': j.job }, [document.createTextNode(j.job + ' '),
        gw.el('span', { class: 'muted' }, '(' + j.up + '/' + j.targets.length + ' ' + gw.t('targets.up') + ')')]);
      var table = gw.el('table', { class: 'gw-table targets-table' }, [
        gw.el('thead', null, [gw.el('tr', null, ['targets.endpoint', 'targets.state', 'targets.labels', 'targets.last_scrape', 'targets.duration', 'targets.samples', 'targets.error'].map(function (k, i) {
          return gw.el('th', { class: i >= 3 && i <= 5 ? 'num' : null }, gw.t(k));
        }))]), tbody]);
      jobsEl.appendChild(gw.el('section', { class: 'gw-job', 'data-job': j.job }, [head, gw.el('div', { class: 'gw-table-wrap' }, [table])]));
    });
  }
  function load() {
    return Promise.all([gw.getJson('/api/ui/targets'), gw.query('scrape_samples_scraped')]).then(function (res) {
      samples = {};
      (res[1].result || []).forEach(function (s) { samples[(s.metric.job || '') + '|' + (s.metric.instance || '')] = parseFloat(s.value[1]); });
      if (res[0].ok && res[0].body.data) draw(res[0].body.data);
    });
  }
  draw(gw.data);
  gw.onRefresh(load);
})();
