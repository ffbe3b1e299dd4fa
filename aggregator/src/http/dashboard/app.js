// The hourglass dashboard: one page over the aggregator's JSON API (/api/v1/...), same
// origin, no framework. The view lives in the URL's query string, so a view can be shared
// and loaded directly; every number a panel shows is also on its element as a data
// attribute holding the API's own value, and <body data-state="ready"> says that every
// panel has finished (tests/browser/ reads both).
(() => {
  'use strict';

  const TOKEN_KEY = 'hourglass.token';
  const HOUR_MS = 3600 * 1000;
  const DAY_MS = 24 * HOUR_MS;
  // Ranges up to this long are shown per hour when the view says `auto`.
  const AUTO_HOURLY_MAX_MS = 3 * DAY_MS;
  const DEFAULT_K = 10;
  const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
  const WEEKDAYS = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];
  const SVG_NS = 'http://www.w3.org/2000/svg';

  const $ = (selector, root = document) => root.querySelector(selector);

  /** An HTML element with attributes (`dataset` and `text` handled) and children. */
  function h(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    node.append(...children.filter((c) => c !== null && c !== undefined));
    return node;
  }

  /** An SVG element, the same way. */
  function s(tag, attrs = {}, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    node.append(...children.filter((c) => c !== null && c !== undefined));
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [key, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (key === 'text') node.textContent = value;
      else if (key === 'dataset') {
        for (const [k, v] of Object.entries(value)) {
          if (v !== null && v !== undefined) node.dataset[k] = String(v);
        }
      } else node.setAttribute(key, value === true ? '' : String(value));
    }
  }

  // ---------------------------------------------------------------- formatting

  const grouped = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });

  /** A count as people read it: 1,204,331. */
  function count(n) {
    return grouped.format(Math.round(n));
  }

  /** An axis label: short (12k, 1.25M) with the digits that tell ticks `step` apart. */
  function axisCount(v, step, max) {
    const [unit, suffix] = max >= 1e9 ? [1e9, 'G'] : max >= 1e6 ? [1e6, 'M'] : max >= 1e4 ? [1e3, 'k'] : [1, ''];
    if (unit === 1 || v === 0) return count(v);
    const digits = Math.max(0, Math.ceil(-Math.log10(step / unit) - 1e-9));
    return `${(v / unit).toFixed(digits)}${suffix}`;
  }

  /** A fraction as a percentage with enough digits to be read: 0.81%, 0.0042%. */
  function percent(fraction) {
    const p = fraction * 100;
    if (p === 0) return '0%';
    if (p >= 10) return `${p.toFixed(1)}%`;
    if (p >= 0.1) return `${p.toFixed(2)}%`;
    if (p >= 0.0001) return `${Number(p.toPrecision(2))}%`;
    return 'under 0.0001%';
  }

  /** A standard error: whole above 10, else with a decimal (a small sparse count's is 0.4). */
  function spread(n) {
    return n >= 10 ? count(n) : n.toFixed(1);
  }

  function pad2(n) {
    return String(n).padStart(2, '0');
  }

  /** `Mon 23 Nov` (UTC). */
  function dayLabel(ms) {
    const d = new Date(ms);
    return `${WEEKDAYS[d.getUTCDay()]} ${d.getUTCDate()} ${MONTHS[d.getUTCMonth()]}`;
  }

  /** `23 Nov 14:00` (UTC). */
  function hourLabel(ms) {
    const d = new Date(ms);
    return `${d.getUTCDate()} ${MONTHS[d.getUTCMonth()]} ${pad2(d.getUTCHours())}:00`;
  }

  /** `2026-11-23 14:00` (UTC). */
  function isoMinute(ms) {
    return new Date(ms).toISOString().slice(0, 16).replace('T', ' ');
  }

  // ---------------------------------------------------------------- the view (URL state)

  /** Splits a list typed as `a, b c` into its entries. */
  function splitList(text) {
    return text.split(/[\s,]+/).filter(Boolean);
  }

  function readView() {
    const p = new URLSearchParams(location.search);
    const groupBy = p.get('group_by');
    const k = Number.parseInt(p.get('k') || '', 10);
    return {
      metric: p.get('metric') || '',
      from: p.get('from') || '-7d',
      to: p.get('to') || 'now',
      // Repeated as the API takes them (only the form's boxes split lists).
      servers: p.getAll('server').filter(Boolean),
      labels: p.getAll('label').filter(Boolean),
      tags: p.getAll('tag').filter(Boolean),
      groupBy: groupBy === 'hour' || groupBy === 'day' ? groupBy : 'auto',
      k: Number.isFinite(k) && k > 0 ? k : DEFAULT_K,
      item: p.get('item') || '',
    };
  }

  function viewQuery(view) {
    const p = new URLSearchParams();
    if (view.metric) p.set('metric', view.metric);
    p.set('from', view.from);
    p.set('to', view.to);
    for (const server of view.servers) p.append('server', server);
    for (const label of view.labels) p.append('label', label);
    for (const tag of view.tags) p.append('tag', tag);
    if (view.groupBy !== 'auto') p.set('group_by', view.groupBy);
    if (view.k !== DEFAULT_K) p.set('k', String(view.k));
    if (view.item) p.set('item', view.item);
    return p.toString();
  }

  function showView(view, how) {
    const url = `${location.pathname}?${viewQuery(view)}`;
    if (how === 'push' && url !== location.pathname + location.search) history.pushState(null, '', url);
    else history.replaceState(null, '', url);
  }

  function viewToForm(view) {
    $('#from').value = view.from;
    $('#to').value = view.to;
    $('#servers').value = view.servers.join(', ');
    $('#labels').value = view.labels.join(', ');
    $('#tags').value = view.tags.join(', ');
    $('#group-by').value = view.groupBy;
    $('#k').value = String(view.k);
    $('#member-item').value = view.item;
    for (const button of document.querySelectorAll('[data-preset]')) {
      const active = view.to === 'now' && view.from === `-${button.dataset.preset}`;
      button.classList.toggle('active', active);
      button.setAttribute('aria-pressed', String(active));
    }
  }

  function formToView() {
    const k = Number.parseInt($('#k').value, 10);
    return {
      metric: $('#metric').value,
      from: $('#from').value.trim() || '-7d',
      to: $('#to').value.trim() || 'now',
      servers: splitList($('#servers').value),
      labels: splitList($('#labels').value),
      tags: splitList($('#tags').value),
      groupBy: $('#group-by').value,
      k: Number.isFinite(k) && k > 0 ? k : DEFAULT_K,
      item: $('#member-item').value,
    };
  }

  /**
   * A time as the API reads it (`now`, `-7d`, a date, RFC 3339), only to pick hours or
   * days for `auto`; the API parses it for real and says what it understood.
   */
  function roughTime(text, now) {
    const t = text.trim();
    if (t === 'now') return now;
    const relative = /^-(\d+)([dhms])$/.exec(t);
    if (relative) {
      const unit = { d: DAY_MS, h: HOUR_MS, m: 60000, s: 1000 }[relative[2]];
      return now - Number(relative[1]) * unit;
    }
    if (/^\d{4}-\d{2}-\d{2}$/.test(t)) return Date.parse(`${t}T00:00:00Z`);
    const parsed = Date.parse(t);
    return Number.isNaN(parsed) ? null : parsed;
  }

  function chartGrouping(view) {
    if (view.groupBy !== 'auto') return view.groupBy;
    const now = Date.now();
    const from = roughTime(view.from, now);
    const to = roughTime(view.to, now);
    if (from === null || to === null) return 'day';
    return to - from <= AUTO_HOURLY_MAX_MS ? 'hour' : 'day';
  }

  // ---------------------------------------------------------------- the API

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
    toString() {
      const where = this.status ? `HTTP ${this.status}, ` : '';
      return `${this.message} (${where}${this.code})`;
    }
  }

  function token() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || '';
    } catch {
      return '';
    }
  }

  /** GETs `path` with `params` (arrays repeat the key) and returns its JSON. */
  async function api(path, params = {}) {
    const query = new URLSearchParams();
    for (const [key, value] of Object.entries(params)) {
      for (const v of Array.isArray(value) ? value : [value]) {
        if (v !== undefined && v !== null) query.append(key, String(v));
      }
    }
    const headers = { Accept: 'application/json' };
    const bearer = token();
    if (bearer) headers.Authorization = `Bearer ${bearer}`;
    const url = query.toString() ? `${path}?${query}` : path;
    let response;
    try {
      response = await fetch(url, { headers, cache: 'no-store' });
    } catch (e) {
      throw new ApiError(0, 'UNAVAILABLE', `could not reach the aggregator (${e.message})`);
    }
    const text = await response.text();
    let body = null;
    try {
      body = JSON.parse(text);
    } catch {
      body = null;
    }
    if (!response.ok) {
      const error = (body && body.error) || {};
      const message = error.message || text.trim() || response.statusText || 'no message';
      if (response.status === 401) askForToken(message);
      throw new ApiError(response.status, error.code || 'HTTP_ERROR', message);
    }
    if (body === null) {
      throw new ApiError(response.status, 'BAD_RESPONSE', `${path} answered something that is not JSON`);
    }
    return body;
  }

  /** The selector every query of the view shares. */
  function selector(view) {
    return {
      metric: view.metric,
      from: view.from,
      to: view.to,
      server: view.servers,
      label: view.labels,
      tag: view.tags,
    };
  }

  // ---------------------------------------------------------------- token

  function askForToken(message) {
    const box = $('#auth');
    box.hidden = false;
    box.dataset.reason = token() ? 'refused' : 'missing';
    $('#auth-message').textContent = token()
      ? `The aggregator refused the token: ${message}`
      : `The aggregator asks for a bearer token (a token with the query or admin role): ${message}`;
  }

  // ---------------------------------------------------------------- panels

  function panelError(panel, error) {
    const p = $(':scope > .error', panel);
    if (!error) {
      p.hidden = true;
      p.textContent = '';
      return;
    }
    p.hidden = false;
    p.textContent = error instanceof ApiError ? String(error) : `${error.message || error}`;
  }

  function hourOfDayStart(day) {
    return Date.parse(`${day}T00:00:00Z`) / HOUR_MS;
  }

  function dayOfGroup(group) {
    if (/^\d{4}-\d{2}-\d{2}$/.test(group.key)) return group.key;
    return (group.time || group.key).slice(0, 10);
  }

  function rangeText(range) {
    const hours = range.end_hour - range.start_hour;
    return `${isoMinute(range.start_hour * HOUR_MS)} to ${isoMinute(range.end_hour * HOUR_MS)} UTC, ${count(hours)} hours`;
  }

  /** The most servers one answer's `coverage.missing` names (the aggregator's MAX_MISSING_LISTED). */
  const MAX_MISSING_LISTED = 100;

  /** The server-hours that `coverage.missing` names: below `server_hours_missing` when it names only some. */
  function listedHours(coverage) {
    return (coverage.missing || []).reduce((sum, m) => sum + m.hours, 0);
  }

  /**
   * What an answer lacks, as a warning says it: server-hours without data, and in a
   * cluster the partitions whose owners did not answer (the answer holds nothing of their
   * series); '' when it lacks nothing. The one wording of the coverage warning, for every
   * panel that shows an answer (total and chart, top-K, membership, coverage grid).
   * `consequence` says what it means for the panel; `who` also names the servers.
   */
  function coverageWarning(coverage, { consequence = 'the numbers may be low', who = false } = {}) {
    if (!coverage) return '';
    const parts = [];
    const hours = coverage.server_hours_missing || 0;
    if (hours > 0) {
      const missing = coverage.missing || [];
      const unnamed = listedHours(coverage) < hours;
      let text = `${count(hours)} server-hours without data`;
      if (who && missing.length) {
        text += `: ${missing.map((m) => `${m.server} (${count(m.hours)})`).join(', ')}`;
        if (unnamed) text += ` and servers not named (the API names at most ${MAX_MISSING_LISTED} servers per answer)`;
      } else if (unnamed) {
        text += ` (the API names at most ${MAX_MISSING_LISTED} servers per answer: some are not named)`;
      }
      parts.push(text);
    }
    const partitions = coverage.partitions_missing || 0;
    if (partitions > 0) {
      const ids = coverage.missing_partitions || [];
      const which = ids.length ? ` (${ids.join(', ')}${ids.length < partitions ? ', …' : ''})` : '';
      parts.push(
        `${count(partitions)} ${partitions === 1 ? 'partition' : 'partitions'}${which} of the cluster did not answer, so the answer is incomplete`,
      );
    }
    return parts.length ? `${parts.join('; ')}${consequence ? `: ${consequence}` : ''}.` : '';
  }

  /** The coverage warning of a panel as a `p.coverage-note.warn`, or null when the answer lacks nothing. */
  function coverageNote(coverage, options) {
    const text = coverageWarning(coverage, options);
    if (!text) return null;
    return h('p', {
      class: 'coverage-note warn',
      dataset: {
        serverHoursMissing: coverage.server_hours_missing,
        partitionsMissing: coverage.partitions_missing || 0,
      },
      text,
    });
  }

  function renderTotal(answer, coverage) {
    const box = $('#distinct-total');
    const relative = answer.estimate > 0 ? answer.std_error / answer.estimate : 0;
    const warning = coverageWarning(coverage, { consequence: 'the count may be low', who: true });
    // Nothing stored and nothing missing: no server reported in the range (none existed
    // yet, or none sent this metric). That is no data, not a complete zero.
    const empty = coverage.sketches_merged === 0 && !warning;
    box.replaceChildren(
      h(
        'div',
        {
          class: empty ? 'figure empty' : 'figure',
          dataset: {
            state: empty ? 'empty' : 'data',
            estimate: answer.estimate,
            stdError: answer.std_error,
            lower95: answer.lower95,
            upper95: answer.upper95,
          },
        },
        h('span', { class: 'estimate', text: empty ? 'no data' : count(answer.estimate) }),
        empty ? null : h('span', { class: 'pm', text: `± ${percent(relative)} (±${spread(answer.std_error)})` }),
        empty ? null : h('span', { class: 'interval', text: `95%: ${count(answer.lower95)} – ${count(answer.upper95)}` }),
      ),
      h('p', {
        class: warning ? 'coverage-note warn' : 'coverage-note muted',
        dataset: {
          serverHoursMissing: coverage.server_hours_missing,
          partitionsMissing: coverage.partitions_missing || 0,
          sketchesMerged: coverage.sketches_merged,
        },
        text: empty
          ? 'no data in this range: nothing was stored for the selected servers and hours, and none of their hours is missing (no server reported in it)'
          : `${count(coverage.sketches_merged)} sketches merged; ${warning || 'every selected server reported every hour'}`,
      }),
    );
  }

  /** Round step for about `target` ticks over [0, max]: 1, 2 or 5 times a power of ten. */
  function niceStep(max, target) {
    const raw = max / Math.max(1, target);
    const power = 10 ** Math.floor(Math.log10(raw));
    const fraction = raw / power;
    const nice = fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10;
    return Math.max(1, nice * power);
  }

  let chartData = null;

  /** The distinct chart: the 95% band, the estimate line and a point per group. */
  function renderChart() {
    const box = $('#distinct-chart');
    if (!chartData) {
      box.replaceChildren();
      return;
    }
    const { groups, grouping, range } = chartData;
    const width = Math.max(280, Math.floor(box.clientWidth || 800));
    const height = width < 560 ? 220 : 300;
    const margin = { left: width < 560 ? 44 : 60, right: 14, top: 26, bottom: 34 };
    const plotW = width - margin.left - margin.right;
    const plotH = height - margin.top - margin.bottom;
    const step = grouping === 'hour' ? HOUR_MS : DAY_MS;

    const points = groups.map((g) => {
      const t = g.time ? Date.parse(g.time) : hourOfDayStart(dayOfGroup(g)) * HOUR_MS;
      // The hours of its period the range holds: a day cut by the range's start or end
      // counts fewer hours, and its count is lower for that, not for less traffic.
      const start = t / HOUR_MS;
      const length = grouping === 'hour' ? 1 : 24;
      const hours = Math.min(range.end_hour, start + length) - Math.max(range.start_hour, start);
      return { group: g, t, hours, short: hours < length };
    });
    let t0 = points.length ? points[0].t : range.start_hour * HOUR_MS;
    let t1 = points.length ? points[points.length - 1].t : range.end_hour * HOUR_MS;
    if (t1 <= t0) {
      t0 -= step / 2;
      t1 += step / 2;
    }
    // The count axis starts at zero unless every value is far from it: then it zooms in
    // on the values, so that the band (about ±1.6% at precision 14) and the dips show.
    const hi = Math.max(1, ...groups.map((g) => Math.max(g.answer.upper95, g.answer.estimate)));
    const lo = Math.min(hi, ...groups.map((g) => Math.min(g.answer.lower95, g.answer.estimate)));
    const tickCount = height < 260 ? 4 : 5;
    let yMin = 0;
    if (lo > hi * 0.5) yMin = Math.max(0, lo - Math.max(hi - lo, hi * 0.02) * 0.15);
    const yStep = niceStep(hi - yMin, tickCount);
    yMin = Math.floor(yMin / yStep) * yStep;
    const yMax = Math.max(yMin + yStep, Math.ceil(hi / yStep) * yStep);
    const x = (t) => margin.left + ((t - t0) / (t1 - t0)) * plotW;
    const y = (v) => margin.top + plotH - ((Math.max(yMin, v) - yMin) / (yMax - yMin)) * plotH;
    const fmt = (v) => v.toFixed(1);

    const chart = s('svg', {
      width,
      height,
      viewBox: `0 0 ${width} ${height}`,
      role: 'img',
      'aria-label': `distinct ${chartData.metric} per ${grouping} with the 95% interval`,
      dataset: { grouping, points: points.length },
    });

    // Y axis: grid lines and counts.
    const yAxis = s('g', { class: 'axis y', 'data-role': 'y-axis' });
    for (let i = 0; yMin + i * yStep <= yMax + yStep / 2; i++) {
      const v = yMin + i * yStep;
      yAxis.append(
        s('line', { x1: margin.left, x2: width - margin.right, y1: fmt(y(v)), y2: fmt(y(v)), class: v === yMin ? 'base' : 'grid' }),
        s('text', { x: margin.left - 6, y: fmt(y(v)), dy: '0.32em', 'text-anchor': 'end', text: axisCount(v, yStep, yMax) }),
      );
    }
    // The axis's title, above it: what is counted, and per what.
    yAxis.append(
      s('text', {
        class: 'axis-title',
        'data-role': 'y-title',
        x: 4,
        y: 12,
        'text-anchor': 'start',
        text: `distinct ${chartData.metric} per ${grouping} (estimate, 95% band)`,
      }),
    );
    chart.append(yAxis);

    // X axis: days (each one when they fit, else every few), or hours within days.
    const xAxis = s('g', { class: 'axis x', 'data-role': 'x-axis' });
    const labelRoom = grouping === 'day' ? 64 : 56;
    const maxLabels = Math.max(2, Math.floor(plotW / labelRoom));
    let ticks = [];
    if (grouping === 'day' || t1 - t0 > 2 * DAY_MS) {
      const firstDay = Math.ceil(t0 / DAY_MS) * DAY_MS;
      const days = [];
      for (let t = firstDay; t <= t1; t += DAY_MS) days.push(t);
      const every = Math.ceil(days.length / maxLabels);
      ticks = days.filter((_, i) => i % every === 0).map((t) => ({ t, text: dayLabel(t) }));
    } else {
      const hours = (t1 - t0) / HOUR_MS;
      const every = [1, 2, 3, 6, 12, 24].find((n) => hours / n <= maxLabels) || 24;
      for (let t = Math.ceil(t0 / (every * HOUR_MS)) * every * HOUR_MS; t <= t1; t += every * HOUR_MS) {
        const d = new Date(t);
        ticks.push({ t, text: d.getUTCHours() === 0 ? dayLabel(t) : `${pad2(d.getUTCHours())}:00` });
      }
    }
    let taken = -Infinity;
    for (const tick of ticks) {
      const at = x(tick.t);
      // Labels at the edges lean inwards instead of being cut off; one that would overlap
      // the label before it is left out.
      const textWidth = tick.text.length * 6.2;
      const anchor = at + textWidth / 2 > width ? 'end' : at - textWidth / 2 < 0 ? 'start' : 'middle';
      const left = anchor === 'end' ? at - textWidth : anchor === 'start' ? at : at - textWidth / 2;
      if (left < taken + 8) continue;
      taken = left + textWidth;
      xAxis.append(
        s('line', { x1: fmt(at), x2: fmt(at), y1: margin.top + plotH, y2: margin.top + plotH + 5, class: 'tick' }),
        s('text', { x: fmt(at), y: margin.top + plotH + 18, 'text-anchor': anchor, text: tick.text }),
      );
    }
    chart.append(xAxis);

    // The band between lower95 and upper95, then the estimate line.
    if (points.length) {
      const upper = points.map((p) => `${fmt(x(p.t))},${fmt(y(p.group.answer.upper95))}`);
      const lower = points.map((p) => `${fmt(x(p.t))},${fmt(y(p.group.answer.lower95))}`).reverse();
      const at = (p) => `${fmt(x(p.t))},${fmt(y(p.group.answer.estimate))}`;
      // The line is solid between whole periods; a partial period (the range holds only
      // some of its hours) is reached by a dashed segment, so that its lower count does
      // not read as a fall in traffic.
      const cut = (i) => i === 0 || points[i].short || points[i - 1].short;
      const partial = points
        .map((p, i) => (i > 0 && cut(i) ? `M${at(points[i - 1])}L${at(p)}` : ''))
        .join('');
      chart.append(
        s('path', { d: `M${upper.join('L')}L${lower.join('L')}Z`, class: 'band', 'data-role': 'band' }),
        s('path', {
          d: points.map((p, i) => `${cut(i) ? 'M' : 'L'}${at(p)}`).join(''),
          class: 'line',
          'data-role': 'line',
        }),
        ...(partial ? [s('path', { d: partial, class: 'line partial-period', 'data-role': 'line-partial' })] : []),
      );
    }

    const dense = points.length > plotW / 10;
    const pointGroup = s('g', { class: dense ? 'points dense' : 'points', 'data-role': 'points' });
    for (const p of points) {
      const a = p.group.answer;
      const when = grouping === 'hour' ? `${hourLabel(p.t)} UTC` : dayLabel(p.t);
      const missing = p.group.coverage ? p.group.coverage.server_hours_missing : 0;
      const partitions = p.group.coverage ? p.group.coverage.partitions_missing || 0 : 0;
      const lacks = coverageWarning(p.group.coverage, { consequence: 'the count may be low' });
      pointGroup.append(
        s(
          'circle',
          {
            cx: fmt(x(p.t)),
            cy: fmt(y(a.estimate)),
            r: dense ? (lacks ? 2.4 : 1.6) : 3.2,
            class: `point${lacks ? ' partial' : ''}${p.short ? ' short' : ''}`,
            'data-role': 'point',
            dataset: {
              key: p.group.key,
              time: p.group.time || dayOfGroup(p.group),
              estimate: a.estimate,
              stdError: a.std_error,
              lower95: a.lower95,
              upper95: a.upper95,
              missing,
              partitionsMissing: partitions,
              hours: p.hours,
            },
          },
          s('title', {
            text:
              `${when}: ${count(a.estimate)} (95%: ${count(a.lower95)} – ${count(a.upper95)})` +
              (p.short ? `; a partial day: the range holds ${p.hours} of its 24 hours` : '') +
              (lacks ? `; ${lacks}` : ''),
          }),
        ),
      );
    }
    chart.append(pointGroup);

    // A cursor that follows the pointer and reads out the nearest point.
    const cursor = s('line', { class: 'cursor', y1: margin.top, y2: margin.top + plotH, x1: -10, x2: -10 });
    chart.append(cursor);
    const readout = (event) => {
      if (!points.length) return;
      const rect = chart.getBoundingClientRect();
      const px = ((event.clientX - rect.left) / rect.width) * width;
      const t = t0 + ((px - margin.left) / plotW) * (t1 - t0);
      let best = points[0];
      for (const p of points) if (Math.abs(p.t - t) < Math.abs(best.t - t)) best = p;
      const cx = fmt(x(best.t));
      cursor.setAttribute('x1', cx);
      cursor.setAttribute('x2', cx);
      const a = best.group.answer;
      const when = grouping === 'hour' ? `${hourLabel(best.t)} UTC` : dayLabel(best.t);
      const lacks = coverageWarning(best.group.coverage, { consequence: 'the count may be low' });
      $('#chart-readout').textContent =
        `${when}: ${count(a.estimate)} ± ${spread(a.std_error)} (95%: ${count(a.lower95)} – ${count(a.upper95)})` +
        (best.short ? `; a partial day: ${best.hours} of its 24 hours are in the range` : '') +
        (lacks ? `; ${lacks}` : '');
    };
    // A mouse moving over the chart, or a finger touching it, reads out the nearest point.
    chart.addEventListener('pointermove', readout);
    chart.addEventListener('pointerdown', readout);
    const shortPeriods = points.filter((p) => p.short).length;
    box.replaceChildren(
      chart,
      ...(shortPeriods
        ? [h('p', { class: 'muted chart-note', text: `dashed: ${shortPeriods === 1 ? 'a partial day' : `${shortPeriods} partial days`} (the range holds only some of ${shortPeriods === 1 ? 'its' : 'their'} hours; each point's readout says how many)` })]
        : []),
    );
  }

  function renderTopK(reply) {
    const table = $('#topk-table');
    const items = reply.items || [];
    const most = Math.max(1, ...items.map((i) => i.upper));
    const head = h(
      'thead',
      {},
      h(
        'tr',
        {},
        h('th', { class: 'num', text: '#' }),
        h('th', { text: 'item' }),
        h('th', { class: 'num', text: 'estimate' }),
        h('th', { class: 'num', text: 'lower' }),
        h('th', { class: 'num', text: 'upper' }),
        h('th', { class: 'bar-cell', 'aria-hidden': 'true' }),
      ),
    );
    const body = h('tbody');
    items.forEach((item, i) => {
      // An item that is not UTF-8 comes as base64 only.
      const name = item.item !== undefined ? item.item : `bytes (base64) ${item.item_base64}`;
      // Widths through the CSSOM, not style attributes: the page needs no 'unsafe-inline'
      // under a Content-Security-Policy.
      const certain = h('span', { class: 'certain' });
      certain.style.width = `${((item.lower / most) * 100).toFixed(2)}%`;
      const possible = h('span', { class: 'possible' });
      possible.style.width = `${(((item.upper - item.lower) / most) * 100).toFixed(2)}%`;
      const bar = h('div', { class: 'bar' }, certain, possible);
      body.append(
        h(
          'tr',
          {
            dataset: {
              rank: i + 1,
              item: item.item,
              itemBase64: item.item_base64,
              estimate: item.estimate,
              lower: item.lower,
              upper: item.upper,
            },
          },
          h('td', { class: 'num', text: String(i + 1) }),
          h('td', { class: 'item', text: name }),
          h('td', { class: 'num', text: count(item.estimate) }),
          h('td', { class: 'num', text: count(item.lower) }),
          h('td', { class: 'num', text: count(item.upper) }),
          h('td', { class: 'bar-cell' }, bar),
        ),
      );
    });
    if (!items.length) {
      body.append(h('tr', {}, h('td', { colspan: 6, class: 'muted', text: 'no items in this range' })));
    }
    table.replaceChildren(head, body);
    const note = coverageNote(reply.coverage, { consequence: 'counts may be low and items missing' });
    $('#topk-coverage').replaceChildren(...(note ? [note] : []));
  }

  /**
   * The filters that say "maybe" as spans: consecutive filters of one server (each
   * starting where the one before ends) make one span, with their hours summed and the
   * lowest and highest of their rates.
   */
  function seenSpans(seenIn) {
    const spans = [];
    for (const f of seenIn) {
      const last = spans[spans.length - 1];
      if (last && last.server === f.server && last.start + last.hours === f.start_hour) {
        last.hours += f.hours;
        last.filters += 1;
        last.fprLow = Math.min(last.fprLow, f.fpr);
        last.fprHigh = Math.max(last.fprHigh, f.fpr);
      } else {
        spans.push({ server: f.server, start: f.start_hour, hours: f.hours, filters: 1, fprLow: f.fpr, fprHigh: f.fpr });
      }
    }
    return spans;
  }

  /** A span of hours as a row says it: its start, and its end when it is longer than an hour. */
  function spanText(span) {
    const from = isoMinute(span.start * HOUR_MS);
    if (span.hours === 1) return `${from} (1 hour)`;
    return `${from} → ${isoMinute((span.start + span.hours) * HOUR_MS)} (${count(span.hours)} hours)`;
  }

  function renderMembership(item, reply) {
    const a = reply.answer;
    const box = $('#member-result');
    // "Absent" is certain only when every server reported every hour and every partition
    // answered; otherwise the item may be in what is missing.
    const note = coverageNote(reply.coverage, {
      consequence: a.maybe_present ? 'what was not reported may hold it too' : '“absent” covers only what was reported',
    });
    const verdict = a.maybe_present
      ? h('p', { class: 'verdict maybe', text: `“${item}” may be present: seen in ${count(a.seen_in_count)} of ${count(a.filters_consulted)} filters` })
      : note
        ? h('p', { class: 'verdict absent uncertain', text: `“${item}” is absent from what was reported` })
        : h('p', { class: 'verdict absent', text: `“${item}” is absent (certain)` });
    // The item is looked up in each stored filter (server × hour), never in a merge of
    // them: the rates say how likely an absent item would have been answered this way.
    const rates = a.maybe_present
      ? `an absent item would be seen somewhere here with probability ${percent(a.range_fpr)}, and in all of these with probability ${percent(a.all_false_probability)}`
      : `${count(a.filters_consulted)} filters consulted; an absent item would have been seen somewhere with probability ${percent(a.range_fpr)}`;
    let seen = null;
    if (a.seen_in.length) {
      const head = h(
        'thead',
        {},
        h('tr', {}, h('th', { text: 'server' }), h('th', { text: 'hours (UTC)' }), h('th', { class: 'num', text: 'false-positive rate' })),
      );
      const body = h('tbody');
      for (const span of seenSpans(a.seen_in)) {
        const [low, high] = [percent(span.fprLow), percent(span.fprHigh)];
        const rate = low === high ? high : `${low} – ${high}`;
        body.append(
          h(
            'tr',
            {
              dataset: { server: span.server, startHour: span.start, hours: span.hours, filters: span.filters, fprHigh: span.fprHigh },
              title: `${span.filters} ${span.filters === 1 ? 'filter' : 'filters'} say “maybe”; each one's own rate is what an absent item would get from it`,
            },
            h('td', { text: span.server }),
            h('td', { text: spanText(span) }),
            h('td', { class: 'num', text: rate }),
          ),
        );
      }
      seen = h(
        'div',
        { class: 'scroll' },
        h('table', { id: 'member-seen', class: 'compact' }, head, body),
        a.seen_in_count > a.seen_in.length
          ? h('p', { class: 'muted', text: `the first ${a.seen_in.length} of ${count(a.seen_in_count)} filters that say “maybe”` })
          : null,
      );
    }
    box.replaceChildren(
      h(
        'div',
        {
          class: 'member-answer',
          dataset: {
            item,
            maybePresent: a.maybe_present,
            definitelyAbsent: a.definitely_absent,
            filtersConsulted: a.filters_consulted,
            rangeFpr: a.range_fpr,
            allFalseProbability: a.all_false_probability,
            seenInCount: a.seen_in_count,
            saturatedFilters: a.saturated_filters,
            fillRatio: a.fill_ratio,
            estimatedFpr: a.estimated_fpr,
            pastDesignPoint: a.past_design_point,
            certain: !a.maybe_present && !note,
          },
        },
        verdict,
        h('p', { class: 'muted', text: `${rates} (fullest filter ${percent(a.fill_ratio)} full)` }),
        a.saturated_filters > 0
          ? h('p', {
              class: 'warn',
              text: `${count(a.saturated_filters)} of the filters are so full that they say “maybe” to at least half of all items.`,
            })
          : null,
        a.past_design_point
          ? h('p', {
              id: 'member-warning',
              class: 'warn',
              text: 'Some filters hold more items than they were designed for: their false positives are above the target rate. Size the metric for more items (the agent\'s capacity).',
            })
          : null,
        seen,
        note,
      ),
    );
  }

  /**
   * Shell-style globs exactly as the aggregator reads them (aggregator/src/glob.rs, of
   * which this is a port): `*` any run, `?` any one character, `[abc]`, `[a-z]` and
   * `[!abc]` or `[^abc]` a set; a `]` first in a set is itself, a reversed range (`[z-a]`)
   * matches nothing, and a `[` that no `]` closes is a literal `[`. Characters are code
   * points, as Rust's `char`s.
   */
  function globMatches(glob, text) {
    const pattern = Array.from(glob);
    const name = Array.from(text);
    // Iterative, with one backtrack point for the last `*`: never exponential.
    let p = 0;
    let n = 0;
    let star = null;
    while (n < name.length) {
      if (p < pattern.length) {
        const c = pattern[p];
        if (c === '*') {
          star = [p, n];
          p += 1;
          continue;
        }
        if (c === '?') {
          p += 1;
          n += 1;
          continue;
        }
        if (c === '[') {
          const set = matchSet(pattern, p, name[n]);
          if (set) {
            if (set.hit) {
              p = set.next;
              n += 1;
              continue;
            }
          } else if (name[n] === '[') {
            p += 1;
            n += 1;
            continue;
          }
        } else if (c === name[n]) {
          p += 1;
          n += 1;
          continue;
        }
      }
      if (!star) return false;
      p = star[0] + 1;
      n = star[1] + 1;
      star = [star[0], star[1] + 1];
    }
    return pattern.slice(p).every((c) => c === '*');
  }

  /** Code point order, as Rust compares `char`s. */
  function codePoint(c) {
    return c.codePointAt(0);
  }

  /**
   * Matches `c` against the set at `pattern[start] === '['`: `{ hit, next }` (whether it
   * matched, where the pattern goes on), or null when no `]` closes the set.
   */
  function matchSet(pattern, start, c) {
    let i = start + 1;
    const negate = pattern[i] === '!' || pattern[i] === '^';
    if (negate) i += 1;
    let hit = false;
    let first = true;
    while (i < pattern.length) {
      if (pattern[i] === ']' && !first) return { hit: hit !== negate, next: i + 1 };
      first = false;
      if (i + 2 < pattern.length && pattern[i + 1] === '-' && pattern[i + 2] !== ']') {
        hit = hit || (codePoint(pattern[i]) <= codePoint(c) && codePoint(c) <= codePoint(pattern[i + 2]));
        i += 3;
      } else {
        hit = hit || pattern[i] === c;
        i += 1;
      }
    }
    return null;
  }

  function serverSelected(server, view) {
    const labels = server.labels || {};
    const byName = !view.servers.length || view.servers.some((g) => globMatches(g, server.name));
    const byLabels = view.labels.every((pair) => {
      const at = pair.indexOf('=');
      return at > 0 && labels[pair.slice(0, at)] === pair.slice(at + 1);
    });
    return byName && byLabels;
  }

  const LEVELS = [
    { name: 'ok', text: 'no hour missing' },
    { name: 'some', text: 'up to a quarter of the hours missing' },
    { name: 'many', text: 'more than a quarter missing' },
    { name: 'all', text: 'every hour missing' },
  ];
  const NONE = { name: 'none', text: 'no data: nothing stored that day and no hour missing (no server reported)' };
  const UNKNOWN = {
    name: 'unknown',
    text: `unknown: not named by the API (it names at most ${MAX_MISSING_LISTED} servers per answer), or partitions did not answer`,
  };

  function levelOf(missing, hours) {
    if (missing <= 0) return 'ok';
    if (missing >= hours) return 'all';
    return missing / hours <= 0.25 ? 'some' : 'many';
  }

  /** Servers × days, coloured by the server-hours each day missed. */
  function renderCoverage(reply, servers, view) {
    const range = reply.range;
    const days = (reply.groups || []).map((g) => {
      const day = dayOfGroup(g);
      const start = hourOfDayStart(day);
      const hours = Math.min(range.end_hour, start + 24) - Math.max(range.start_hour, start);
      const missing = new Map((g.coverage.missing || []).map((m) => [m.server, m.hours]));
      // `missing` names at most MAX_MISSING_LISTED servers while `server_hours_missing`
      // counts them all: when the named hours fall short, a server not named may have
      // missed hours too. And when partitions did not answer, what a server sent is not
      // all in the answer. Either way a server not named is unknown, not complete.
      const unnamed = Math.max(0, (g.coverage.server_hours_missing || 0) - listedHours(g.coverage));
      const partitions = g.coverage.partitions_missing || 0;
      // Nothing stored that day and no hour missing: no server reported (none existed
      // yet, or none sent this metric). Not "no hour missing", which claims reports.
      const empty = (g.coverage.sketches_merged || 0) === 0;
      return { day, hours, missing, unnamed, partitions, empty, coverage: g.coverage };
    });
    const names = new Set(servers.filter((sv) => serverSelected(sv, view)).map((sv) => sv.name));
    for (const d of days) for (const name of d.missing.keys()) names.add(name);
    const rows = [...names].sort();

    // Many days: narrower columns, the month only where it starts.
    const compactDays = days.length > 14;
    const head = h('tr', {}, h('th', { class: 'corner', text: 'server' }));
    days.forEach((d, i) => {
      const date = new Date(hourOfDayStart(d.day) * HOUR_MS);
      const month = !compactDays || i === 0 || date.getUTCDate() === 1 ? ` ${MONTHS[date.getUTCMonth()]}` : '';
      head.append(
        h(
          'th',
          { dataset: { day: d.day }, title: d.day },
          h('span', { class: 'weekday', text: compactDays ? WEEKDAYS[date.getUTCDay()][0] : WEEKDAYS[date.getUTCDay()] }),
          h('span', { text: `${date.getUTCDate()}${month}` }),
        ),
      );
    });
    const body = h('tbody');
    let unknownCells = 0;
    let emptyCells = 0;
    for (const name of rows) {
      const tr = h('tr', { dataset: { server: name } }, h('th', { scope: 'row', text: name }));
      for (const d of days) {
        const partitionsText = d.partitions
          ? `${count(d.partitions)} ${d.partitions === 1 ? 'partition' : 'partitions'} of the cluster did not answer`
          : '';
        if (!d.missing.has(name) && (d.unnamed > 0 || d.partitions > 0)) {
          unknownCells += 1;
          const why = [];
          if (d.unnamed > 0) {
            why.push(
              `the API names at most ${MAX_MISSING_LISTED} servers per answer, and ${count(d.unnamed)} server-hours ` +
                'missing that day are of servers it does not name',
            );
          }
          if (partitionsText) why.push(partitionsText);
          tr.append(
            h(
              'td',
              {
                class: 'cell unknown',
                title: `${name}, ${d.day}: unknown: ${why.join('; ')}`,
                dataset: { server: name, day: d.day, hours: d.hours, level: 'unknown' },
              },
              h('span', { text: '?' }),
            ),
          );
          continue;
        }
        const missing = d.missing.get(name) || 0;
        const level = missing === 0 && d.empty ? 'none' : levelOf(missing, d.hours);
        if (level === 'none') emptyCells += 1;
        tr.append(
          h(
            'td',
            {
              class: `cell ${level}`,
              title:
                `${name}, ${d.day}: ${missing ? `${missing} of ${d.hours} hours without data` : level === 'none' ? NONE.text : 'no hour missing'}` +
                (partitionsText ? `; ${partitionsText}` : ''),
              dataset: { server: name, day: d.day, missing, hours: d.hours, level },
            },
            missing ? h('span', { text: String(missing) }) : null,
          ),
        );
      }
      body.append(tr);
    }
    if (!rows.length) {
      body.append(h('tr', {}, h('td', { colspan: days.length + 1, class: 'muted', text: 'no server matches the selection' })));
    }
    $('#coverage-grid').classList.toggle('compact', compactDays);
    $('#coverage-grid').replaceChildren(h('thead', {}, head), body);
    $('#coverage-legend').replaceChildren(
      ...[...LEVELS, ...(emptyCells ? [NONE] : []), ...(unknownCells ? [UNKNOWN] : [])].map((l) =>
        h('li', { dataset: { level: l.name } }, h('span', { class: `swatch cell ${l.name}`, 'aria-hidden': 'true' }), l.text),
      ),
      h('li', { class: 'muted', text: 'numbers: hours without data that day (UTC)' }),
    );
    const missingTotal = reply.coverage.server_hours_missing;
    const warning = coverageWarning(reply.coverage, {
      consequence: unknownCells ? `${count(unknownCells)} cells are unknown (hatched)` : '',
    });
    const summary = $('#coverage-summary');
    summary.className = warning ? 'warn' : 'muted';
    const allEmpty = days.length > 0 && days.every((d) => d.empty);
    summary.textContent = `${rows.length} servers × ${days.length} days; ${warning || (allEmpty ? 'no data in this range' : 'no server-hour missing')}`;
    $('#coverage').dataset.serverHoursMissing = String(missingTotal);
    $('#coverage').dataset.partitionsMissing = String(reply.coverage.partitions_missing || 0);
    $('#coverage').dataset.unknownCells = String(unknownCells);
  }

  function renderServers(servers, view) {
    const table = $('#servers-table');
    const body = h('tbody');
    let selected = 0;
    for (const server of servers) {
      const on = serverSelected(server, view);
      if (on) selected += 1;
      const chips = Object.entries(server.labels || {})
        .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
        .map(([k, v]) =>
          h('button', { type: 'button', class: 'chip', title: `show only ${k}=${v}`, dataset: { label: `${k}=${v}` }, text: `${k}=${v}` }),
        );
      body.append(
        h(
          'tr',
          { class: on ? 'selected' : 'unselected', dataset: { server: server.name, selected: on } },
          h('td', { class: 'name', text: server.name }),
          h('td', { class: 'labels' }, ...chips),
        ),
      );
    }
    if (!servers.length) body.append(h('tr', {}, h('td', { colspan: 2, class: 'muted', text: 'no server has pushed yet' })));
    table.replaceChildren(h('thead', {}, h('tr', {}, h('th', { text: 'server' }), h('th', { text: 'labels' }))), body);
    $('#servers-summary').textContent = `${selected} of ${servers.length} selected`;
  }

  // ---------------------------------------------------------------- loading

  let generation = 0;

  /** Marks the page loading, or ready with the number of errors it shows. */
  function setState(state) {
    const errors = document.querySelectorAll('.error:not([hidden])').length;
    const text =
      state === 'loading' ? 'loading…' : errors ? `${errors} error${errors > 1 ? 's' : ''}: see the message${errors > 1 ? 's' : ''}` : 'ready';
    if (state === 'ready') document.body.dataset.errors = String(errors);
    document.body.dataset.state = state;
    const status = $('#status');
    status.dataset.state = state;
    status.textContent = text;
  }

  /** What each panel shows, emptied when its query fails: no stale numbers beside an error. */
  const CLEAR = {
    distinct: () => {
      chartData = null;
      renderChart();
      $('#distinct-total').replaceChildren();
      $('#range-text').textContent = '';
      $('#chart-readout').textContent = '';
    },
    coverage: () => {
      $('#coverage-grid').replaceChildren();
      $('#coverage-summary').textContent = '';
      $('#coverage-summary').className = 'muted';
    },
    topk: () => {
      $('#topk-table').replaceChildren();
      $('#topk-coverage').replaceChildren();
    },
    membership: () => $('#member-result').replaceChildren(),
    'servers-panel': () => $('#servers-table').replaceChildren(),
  };

  /**
   * Runs `work` for `panel`, showing its error there (unless a newer load has begun:
   * `stale`); resolves to whether it succeeded.
   */
  async function panelTask(panel, stale, work) {
    panel.classList.add('loading');
    try {
      await work();
      if (!stale()) panelError(panel, null);
      return true;
    } catch (e) {
      if (!stale()) {
        CLEAR[panel.id]();
        panelError(panel, e);
      }
      return false;
    } finally {
      if (!stale()) panel.classList.remove('loading');
    }
  }

  function fillMetrics(series, current) {
    const kinds = new Map();
    for (const item of series) {
      if (!kinds.has(item.metric)) kinds.set(item.metric, new Set());
      kinds.get(item.metric).add(item.kind);
    }
    const select = $('#metric');
    const options = [...kinds.keys()].sort().map((m) =>
      h('option', { value: m, title: [...kinds.get(m)].sort().join(', '), text: m }),
    );
    if (current && !kinds.has(current)) options.unshift(h('option', { value: current, text: `${current} (unknown)` }));
    select.replaceChildren(...options);
    return kinds;
  }

  /** Hides panels the view has no use for, with any error they showed. */
  function hidePanels(...ids) {
    for (const id of ids) {
      $(id).hidden = true;
      panelError($(id), null);
    }
  }

  async function load() {
    const mine = ++generation;
    const stale = () => mine !== generation;
    const view = readView();
    viewToForm(view);
    setState('loading');
    $('#error').hidden = true;
    $('#auth').hidden = true;

    let series;
    let servers;
    try {
      [series, servers] = await Promise.all([api('/api/v1/series'), api('/api/v1/servers')]);
    } catch (e) {
      if (stale()) return;
      $('#error').hidden = false;
      $('#error').textContent = `The aggregator's series and servers could not be read: ${e}`;
      hidePanels('#distinct', '#coverage', '#topk', '#membership');
      setState('ready');
      return;
    }
    if (stale()) return;
    servers = servers.servers || [];
    const kinds = fillMetrics(series.series || [], view.metric);
    if (!view.metric) {
      view.metric = kinds.has('visitors') ? 'visitors' : [...kinds.keys()].sort()[0] || '';
      if (view.metric) showView(view, 'replace');
    }
    $('#metric').value = view.metric;
    for (const span of document.querySelectorAll('.metric-name')) span.textContent = view.metric;
    document.title = view.metric ? `${view.metric} · hourglass` : 'hourglass';

    const tasks = [];
    const servePanel = $('#servers-panel');
    tasks.push(panelTask(servePanel, stale, async () => renderServers(servers, view)));

    if (!view.metric) {
      $('#error').hidden = false;
      $('#error').textContent = 'The aggregator holds no series yet: agents have not pushed anything.';
      hidePanels('#distinct', '#coverage', '#topk', '#membership');
    } else {
      const has = kinds.get(view.metric) || new Set(['distinct', 'frequency', 'membership']);
      const grouping = chartGrouping(view);
      const distinctPanel = $('#distinct');
      const coveragePanel = $('#coverage');
      const topkPanel = $('#topk');
      const memberPanel = $('#membership');
      for (const [panel, kind] of [[distinctPanel, 'distinct'], [topkPanel, 'frequency'], [memberPanel, 'membership']]) {
        if (has.has(kind)) panel.hidden = false;
        else hidePanels(`#${panel.id}`);
      }
      coveragePanel.hidden = false;

      // The coverage grid needs the answer per day; the chart shares it when it is per day.
      let daily = null;
      const askDaily = () => {
        if (!daily) {
          const sel = { ...selector(view), group_by: 'day' };
          if (has.has('distinct')) daily = api('/api/v1/distinct', sel);
          else if (has.has('frequency')) daily = api('/api/v1/topk', { ...sel, k: 1 });
          else daily = api('/api/v1/membership', { ...sel, item: view.item });
        }
        return daily;
      };

      if (has.has('distinct')) {
        tasks.push(
          panelTask(distinctPanel, stale, async () => {
            const reply = grouping === 'day' ? await askDaily() : await api('/api/v1/distinct', { ...selector(view), group_by: grouping });
            if (stale()) return;
            $('#range-text').textContent = `${rangeText(reply.range)}, per ${grouping}`;
            $('#chart-readout').textContent =
              'The line is the estimate, the band its 95% interval; orange points miss data (servers without data, or partitions that did not answer: the count may be low). Point at the chart to read a value.';
            renderTotal(reply.answer, reply.coverage);
            chartData = { groups: reply.groups || [], grouping, range: reply.range, metric: view.metric };
            distinctPanel.dataset.grouping = grouping;
            renderChart();
          }),
        );
      } else {
        chartData = null;
      }
      tasks.push(
        panelTask(coveragePanel, stale, async () => {
          const reply = await askDaily();
          if (stale()) return;
          renderCoverage(reply, servers, view);
        }),
      );
      if (has.has('frequency')) {
        tasks.push(
          panelTask(topkPanel, stale, async () => {
            const reply = await api('/api/v1/topk', { ...selector(view), k: view.k });
            if (stale()) return;
            renderTopK(reply);
          }),
        );
      }
      if (has.has('membership')) {
        tasks.push(panelTask(memberPanel, stale, async () => lookUp(view, stale)));
      }
    }

    await Promise.all(tasks);
    if (stale()) return;
    // One cause for every panel (a bad time, an unknown metric): said once, at the top.
    const failed = [...document.querySelectorAll('main .card > .error:not([hidden])')];
    if (failed.length > 1 && failed.every((p) => p.textContent === failed[0].textContent)) {
      $('#error').textContent = failed[0].textContent;
      $('#error').hidden = false;
      for (const p of failed) p.hidden = true;
    }
    setState('ready');
  }

  async function lookUp(view, stale) {
    const box = $('#member-result');
    if (!view.item) {
      box.replaceChildren(h('p', { class: 'muted', text: 'Type an item to look it up over the selected range and servers.' }));
      return;
    }
    const reply = await api('/api/v1/membership', { ...selector(view), item: view.item });
    if (stale()) return;
    renderMembership(view.item, reply);
  }

  // ---------------------------------------------------------------- events

  function init() {
    $('#controls').addEventListener('submit', (event) => {
      event.preventDefault();
      showView(formToView(), 'push');
      load();
    });
    $('#metric').addEventListener('change', () => {
      showView(formToView(), 'push');
      load();
    });
    $('#group-by').addEventListener('change', () => {
      showView(formToView(), 'push');
      load();
    });
    const changeK = (event) => {
      event.preventDefault();
      showView(formToView(), 'push');
      load();
    };
    $('#k-form').addEventListener('submit', changeK);
    $('#k').addEventListener('change', changeK);
    for (const button of document.querySelectorAll('[data-preset]')) {
      button.addEventListener('click', () => {
        $('#from').value = `-${button.dataset.preset}`;
        $('#to').value = 'now';
        showView(formToView(), 'push');
        load();
      });
    }
    $('#member-form').addEventListener('submit', async (event) => {
      event.preventDefault();
      const view = { ...readView(), item: $('#member-item').value };
      showView(view, 'replace');
      const mine = generation;
      const stale = () => mine !== generation;
      setState('loading');
      await panelTask($('#membership'), stale, async () => lookUp(view, stale));
      if (!stale()) setState('ready');
    });
    $('#servers-table').addEventListener('click', (event) => {
      const chip = event.target.closest('[data-label]');
      if (!chip) return;
      const view = readView();
      if (!view.labels.includes(chip.dataset.label)) view.labels.push(chip.dataset.label);
      showView(view, 'push');
      load();
    });
    $('#auth-form').addEventListener('submit', (event) => {
      event.preventDefault();
      try {
        sessionStorage.setItem(TOKEN_KEY, $('#token').value.trim());
      } catch {
        // Storage disabled: the token cannot be kept; the next load asks again.
      }
      $('#token').value = '';
      load();
    });
    $('#token-forget').addEventListener('click', () => {
      try {
        sessionStorage.removeItem(TOKEN_KEY);
      } catch {
        // Nothing kept.
      }
      load();
    });
    window.addEventListener('popstate', load);
    // The chart is drawn at its box's width in pixels (text stays readable): again when
    // that changes (a window resized, a phone turned).
    let drawnWidth = 0;
    const redraw = () => {
      const width = $('#distinct-chart').clientWidth;
      if (width && width !== drawnWidth) {
        drawnWidth = width;
        renderChart();
      }
    };
    if (window.ResizeObserver) new ResizeObserver(redraw).observe($('#distinct-chart'));
    else window.addEventListener('resize', redraw);
    load();
  }

  init();
})();
