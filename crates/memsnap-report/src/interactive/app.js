// memsnap interactive report. Vanilla JavaScript, no library, nothing fetched: everything is
// drawn from the JSON blob in the script element "memsnap-data" (see crates/memsnap-report/src/
// interactive/data.rs for its layout). Text from the snapshot is untrusted: it only ever enters
// the page through textContent, attribute values and canvas text, never as markup.
(function () {
  'use strict';

  var blobEl = document.getElementById('memsnap-data');
  if (!blobEl) return;
  var D;
  try {
    D = JSON.parse(blobEl.textContent);
  } catch (e) {
    console.error('memsnap: the page data does not parse: ' + e);
    return;
  }
  if (!D || D.format !== 1) return;
  document.documentElement.classList.add('ms-js');

  // ---------------------------------------------------------------- constants
  var COLOR = {
    allocated: '#1d3557', band: 'rgba(92,124,184,0.30)', reserved: '#8a8a8a', active: '#2a9d8f',
    peak: '#c01b1b', oom: '#d62828', moment: '#e76f51', suspect: 'rgba(214,40,40,0.22)', suspectLine: '#b3261e',
    iterA: '#e6e9f0', iterB: '#f3f4f8', forward: '#7aa6d8', backward: '#e07a5f', optimizer: '#81b29a',
    eval: '#f4a259', label: '#7b5ea7', annotation: '#b48ead', grid: '#eceef1', axis: '#666',
    segAllocated: '#3b6fb6', segPending: '#f4a259', segFree: '#f2f2f2', highlight: '#d62828'
  };
  var STATE_NONE = 0, STATE_ALLOCATED = 1, STATE_PENDING = 2;
  var PLOT_H = 250, LEFT = 88, RIGHT = 12, TOP = 12, STRIP_H = 14, AXIS_H = 22;
  var ZOOM_TO_EVENTS = 800; // the view 'zoom to the peak' (or to an OOM) opens: events one by one
  var MIN_SPAN = 8; // the narrowest view, in events: single events several hundred pixels wide
  var SEG_ROW = 14, SEG_LABEL = 176, SEG_MAX_ROWS = 400;
  var FLAME_ROW = 17, FLAME_MAX_DEPTH = 80;
  var PICKER_BUTTONS = 16; // devices shown as buttons; more get a drop-down list
  var TABLE_ROWS = 500; // rows a table shows at most (the filter finds the rest)
  var STACK_TIP_FRAMES = 8; // frames of the user's code a tooltip lists
  var LARGEST_SCAN = 50000; // blocks looked at for "the largest allocation in these events"
  var MAX_STRIP_SPANS = 20000; // spans drawn per strip and redraw (narrower ones merge anyway)
  var ACTIONS = { a: 'alloc', f: 'free_requested', c: 'free_completed', S: 'segment_alloc', s: 'segment_free',
    M: 'segment_map', m: 'segment_unmap', n: 'snapshot', O: 'oom', t: 'annotate', x: 'other' };
  var WHO = ['your code', 'library code', 'backward pass', 'before the trace', 'no frames'];

  // ---------------------------------------------------------------- helpers
  function el(tag, attrs) {
    var e = document.createElement(tag);
    if (attrs) {
      for (var k in attrs) {
        if (!Object.prototype.hasOwnProperty.call(attrs, k)) continue;
        var v = attrs[k];
        if (k === 'class') e.className = v;
        else if (k === 'text') e.textContent = v;
        else if (k.slice(0, 2) === 'on') e.addEventListener(k.slice(2), v);
        else e.setAttribute(k, v);
      }
    }
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined) continue;
      e.append(c);
    }
    return e;
  }
  function fmtBytes(b) {
    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    var v = b, u = 0;
    while (v >= 1024 && u + 1 < units.length) { v /= 1024; u++; }
    return u === 0 ? Math.round(b) + ' B' : v.toFixed(2) + ' ' + units[u];
  }
  function fmtCount(n) {
    var s = String(Math.round(n)), neg = s[0] === '-';
    if (neg) s = s.slice(1);
    var out = '';
    while (s.length > 3) { out = ',' + s.slice(-3) + out; s = s.slice(0, -3); }
    return (neg ? '-' : '') + s + out;
  }
  function fmtSeconds(us) {
    var s = us / 1e6;
    if (Math.abs(s) < 1) return (s * 1000).toFixed(1) + ' ms';
    if (Math.abs(s) < 120) return s.toFixed(3) + ' s';
    var m = Math.floor(s / 60);
    return m + ' min ' + (s - m * 60).toFixed(1) + ' s';
  }
  function pct(part, whole) { return whole > 0 ? (100 * part / whole).toFixed(1) + '%' : '0.0%'; }
  function hash(s) {
    var h = 2166136261;
    for (var i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 16777619); }
    return h >>> 0;
  }
  function hsl(h, s, l) { return 'hsl(' + h.toFixed(0) + ',' + s + '%,' + l + '%)'; }
  function siteColor(label) { var h = hash(label); return hsl(h % 360, 55, 58 + (h >>> 9) % 14); }
  function lowerBound(arr, x) { var lo = 0, hi = arr.length; while (lo < hi) { var m = (lo + hi) >> 1; if (arr[m] < x) lo = m + 1; else hi = m; } return lo; }
  function upperBound(arr, x) { var lo = 0, hi = arr.length; while (lo < hi) { var m = (lo + hi) >> 1; if (arr[m] <= x) lo = m + 1; else hi = m; } return lo; }
  var startsCache = new WeakMap();
  // The start events of sorted spans, computed once per list.
  function startsOf(spans) {
    var s = startsCache.get(spans);
    if (!s) { s = spans.map(function (x) { return x[0]; }); startsCache.set(spans, s); }
    return s;
  }
  function shortPath(p) { var parts = p.split('/'); return parts.length > 3 ? parts.slice(-3).join('/') : p; }
  function clamp(v, lo, hi) { return v < lo ? lo : v > hi ? hi : v; }
  function setupCanvas(canvas, w, h) {
    var r = window.devicePixelRatio || 1;
    canvas.width = Math.max(1, Math.round(w * r));
    canvas.height = Math.max(1, Math.round(h * r));
    canvas.style.height = h + 'px';
    var g = canvas.getContext('2d');
    g.setTransform(r, 0, 0, r, 0, 0);
    g.font = '11px system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif';
    g.textBaseline = 'middle';
    return g;
  }
  function fitText(g, s, w) {
    if (w < 8) return '';
    if (g.measureText(s).width <= w) return s;
    var lo = 0, hi = s.length;
    while (lo < hi) { var m = (lo + hi + 1) >> 1; if (g.measureText(s.slice(0, m) + '…').width <= w) lo = m; else hi = m - 1; }
    return lo > 0 ? s.slice(0, lo) + '…' : '';
  }

  // ---------------------------------------------------------------- frames and stacks
  var showAllFrames = false;
  var frameCache = [];
  function frame(i) {
    var f = frameCache[i];
    if (!f) {
      var r = D.frames[i];
      f = { file: D.strings[r[0]], line: r[1], name: D.strings[r[2]], kind: r[3] };
      f.label = f.name + ' (' + shortPath(f.file) + ':' + f.line + ')';
      f.full = f.file + ':' + f.line + ' in ' + f.name;
      frameCache[i] = f;
    }
    return f;
  }
  // Frames of a stack, innermost first: [{frame}|{more: k}].
  function stackFrames(s) {
    if (s === undefined || s < 0 || s >= D.stacks.length) return null;
    var out = [];
    var st = D.stacks[s];
    for (var i = 0; i < st.length; i++) {
      if (st[i] < 0) out.push({ omitted: -st[i] });
      else out.push({ frame: frame(st[i]) });
    }
    return out;
  }
  // An <ol> of a stack, innermost first: the user's frames, the others folded unless shown.
  function stackList(s, limit, full) {
    var frames = stackFrames(s);
    if (frames === null) return el('div', { class: 'ms-note', text: 'stack not embedded (past the page\'s stack budget)' });
    if (frames.length === 0) return el('div', { class: 'ms-note', text: 'no frames recorded' });
    var ol = el('ol');
    var hidden = 0, shown = 0, users = frames.filter(function (f) { return f.frame && f.frame.kind === 0; }).length;
    function flush() {
      if (hidden > 0) ol.append(el('li', { class: 'ms-more', text: '… ' + hidden + (hidden === 1 ? ' library or C++ frame' : ' library or C++ frames') }));
      hidden = 0;
    }
    for (var i = 0; i < frames.length; i++) {
      var f = frames[i];
      if (f.omitted) { flush(); ol.append(el('li', { class: 'ms-more', text: '… ' + f.omitted + ' more frames not embedded' })); continue; }
      var user = f.frame.kind === 0;
      // Without a user frame, the innermost three are shown so the stack says something.
      var show = showAllFrames || user || (users === 0 && i < 3);
      if (!show) { hidden++; continue; }
      flush();
      if (limit && shown >= limit) { ol.append(el('li', { class: 'ms-more', text: '… ' + (frames.length - i) + ' more' })); hidden = 0; break; }
      // Numbered by the frame's place in the stack (1: innermost), whatever is folded.
      ol.append(el('li', { class: user ? 'ms-user' : '', value: String(i + 1), text: full ? f.frame.full : f.frame.label }));
      shown++;
    }
    flush();
    return ol;
  }

  // ---------------------------------------------------------------- tooltip
  var tip = el('div', { class: 'ms-tip ms-hidden', role: 'tooltip', id: 'ms-tip' });
  document.body.append(tip);
  function showTip(evt, nodes) {
    tip.replaceChildren.apply(tip, nodes);
    tip.classList.remove('ms-hidden');
    var x = evt.clientX + 14, y = evt.clientY + 14;
    var r = tip.getBoundingClientRect();
    if (x + r.width > window.innerWidth - 4) x = Math.max(4, evt.clientX - r.width - 14);
    if (y + r.height > window.innerHeight - 4) y = Math.max(4, evt.clientY - r.height - 14);
    tip.style.left = x + 'px';
    tip.style.top = y + 'px';
  }
  function hideTip() { tip.classList.add('ms-hidden'); }
  function line(text, bold) { return el('div', { class: 'ms-l' }, bold ? el('b', { text: text }) : text); }

  // ---------------------------------------------------------------- device model
  function Model(dd) {
    var q = dd.quantum;
    this.d = dd;
    this.N = dd.events;
    // Blocks: absolute events, bytes.
    var B = dd.blocks, nb = B.size.length;
    this.nb = nb;
    var a = new Float64Array(nb), f = new Float64Array(nb), c = new Float64Array(nb);
    var size = new Float64Array(nb), off = new Float64Array(nb), pending = new Uint8Array(nb);
    var prev = -1;
    for (var i = 0; i < nb; i++) {
      prev += B.a[i];
      a[i] = prev;
      f[i] = B.f[i] === null ? Infinity : prev + B.f[i];
      c[i] = B.c[i] === null ? Infinity : prev + B.c[i];
      size[i] = B.size[i] * q;
      off[i] = B.off[i] * q;
    }
    for (var p = 0; p < B.pending.length; p++) pending[B.pending[p]] = 1;
    this.ba = a; this.bf = f; this.bc = c; this.bsize = size; this.boff = off; this.bpending = pending;
    this.bseg = B.seg; this.bstack = B.stack; this.bwho = B.who; this.bsite = B.site; this.bcat = B.cat; this.bpad = B.pad;
    // Pyramid levels (coarsest first), in bytes.
    this.levels = dd.levels.map(function (l) {
      var m = function (v) { var o = new Float64Array(v.length); for (var j = 0; j < v.length; j++) o[j] = v[j] * q; return o; };
      return { bucket: l.bucket, amin: m(l.amin), amax: m(l.amax), rmax: m(l.rmax), xmax: m(l.xmax) };
    });
    // Detailed windows: counters after each event, time since t0.
    this.windows = dd.windows.map(function (w) {
      var n = w.act.length;
      var al = new Float64Array(n), re = new Float64Array(n), ac = new Float64Array(n), t = new Float64Array(n);
      var va = w.start[0] * q, vr = w.start[1] * q, vx = w.start[2] * q, tl = null;
      // dt of the window's first timed event is from t0, of the others from the previous timed
      // one: their running sum is the time since t0.
      for (var j = 0; j < n; j++) {
        va += w.da[j] * q; vr += w.dr[j] * q; vx += w.dx[j] * q;
        al[j] = va; re[j] = vr; ac[j] = vx;
        var dt = w.dt.length ? w.dt[j] : null;
        if (dt === null) t[j] = NaN;
        else { tl = (tl === null ? 0 : tl) + dt; t[j] = tl; }
      }
      return { first: w.first, end: w.first + n, act: w.act, size: w.size, stream: w.stream, stack: w.stack, al: al, re: re, ac: ac, t: t,
        start: [w.start[0] * q, w.start[1] * q, w.start[2] * q] };
    });
    this.windowFirsts = this.windows.map(function (w) { return w.first; });
    // Segments.
    var S = dd.segments;
    this.segs = S.size.map(function (sz, j) {
      return { addr: BigInt('0x' + S.addr[j]), hex: S.addr[j], size: sz, stream: dd.streams[S.stream[j]] || '0',
        pool: dd.pools[S.pool[j]] || '', expandable: S.expandable[j] === 1,
        created: S.created[j] === null ? -1 : S.created[j], released: S.released[j] === null ? Infinity : S.released[j] };
    });
    // Phases, sorted by start.
    var ph = dd.phases;
    var bySpan = function (v) { return v.slice().sort(function (x, y) { return x[0] - y[0] || x[1] - y[1]; }); };
    this.iterations = ph.iterations;
    this.backward = bySpan(ph.backward);
    this.forward = bySpan(ph.forward);
    this.optimizer = bySpan(ph.optimizer);
    this.evals = bySpan(ph.eval);
    this.labels = ph.labels.map(function (l) { return [l[2], l[3] + 1, l[0] + ' "' + l[1] + '"']; }).sort(function (x, y) { return x[0] - y[0]; });
    this.annotations = ph.annotations.map(function (l) { return [l[1], l[2] + 1, 'annotation "' + l[0] + '"']; }).sort(function (x, y) { return x[0] - y[0]; });
    this.eventBlock = null;
  }
  Model.prototype.state = function (i, t) {
    var born = this.ba[i] < 0 || (t >= 0 && this.ba[i] <= t);
    if (!born || (t >= 0 && this.bc[i] <= t)) return STATE_NONE;
    if (this.bpending[i] || (t >= 0 && this.bf[i] <= t)) return STATE_PENDING;
    return STATE_ALLOCATED;
  };
  Model.prototype.windowAt = function (e) {
    var k = upperBound(this.windowFirsts, e) - 1;
    if (k >= 0 && e < this.windows[k].end) return this.windows[k];
    return null;
  };
  Model.prototype.blockOfEvent = function (e) {
    if (!this.eventBlock) {
      var m = new Map();
      for (var i = 0; i < this.nb; i++) {
        if (this.ba[i] >= 0) m.set(this.ba[i], i);
        if (this.bf[i] !== Infinity) m.set(this.bf[i], i);
        if (this.bc[i] !== Infinity && !m.has(this.bc[i])) m.set(this.bc[i], i);
      }
      this.eventBlock = m;
    }
    var b = this.eventBlock.get(e);
    return b === undefined ? -1 : b;
  };
  Model.prototype.finest = function () { return this.levels[this.levels.length - 1]; };
  Model.prototype.iterationSpan = function (k) {
    var it = this.iterations;
    return [it[k], k + 1 < it.length ? it[k + 1] : this.N];
  };
  // Exact counters after event e when it is in a detailed window, else null.
  Model.prototype.countersAt = function (e) {
    var w = this.windowAt(e);
    if (!w) return null;
    var j = e - w.first;
    return { allocated: w.al[j], reserved: w.re[j], active: w.ac[j], time: w.t[j] };
  };
  Model.prototype.segmentLive = function (s, t) {
    var born = s.created < 0 || (t >= 0 && s.created <= t);
    return born && !(t >= 0 && s.released <= t);
  };
  Model.prototype.blockAddress = function (i) {
    var s = this.bseg[i];
    if (s < 0) return null;
    return '0x' + (this.segs[s].addr + BigInt(this.boff[i])).toString(16);
  };

  // ---------------------------------------------------------------- one device's explorer
  function Explorer(section, dd) {
    this.section = section;
    this.m = new Model(dd);
    this.dd = dd;
    var N = this.m.N;
    this.v0 = 0; this.v1 = Math.max(N, 1);
    this.moment = N > 0 ? (dd.peak.allocated_event === null ? N - 1 : dd.peak.allocated_event) : -1;
    this.suspect = -1;
    this.site = -1;
    this.highlight = null;
    this.colorBy = 'state';
    this.flameFocus = [];
    this.flameQuery = '';
    this.siteSort = { key: 'bytes', asc: false };
    this.catSort = { key: 'order', asc: true };
    this.build();
  }

  Explorer.prototype.build = function () {
    var self = this, m = this.m, dd = this.dd, N = m.N;
    var sec = this.section;
    var figs = Array.prototype.slice.call(sec.querySelectorAll('.fig'));
    var staticTimeline = figs.find(function (f) { return f.querySelector('svg.timeline'); });
    var staticFlame = figs.find(function (f) { return f.querySelector('svg.flamegraph'); });
    var staticSegs = figs.filter(function (f) { return f.querySelector('svg.segmap'); });

    // Timeline toolbar.
    this.info = el('span', { class: 'ms-info' });
    this.iterInput = el('input', { class: 'ms-num ms-iter', type: 'number', min: '1', max: String(Math.max(1, m.iterations.length)), value: '1', 'aria-label': 'iteration' });
    var bar = el('div', { class: 'ms-bar' },
      el('button', { class: 'ms-b ms-zoom-out', type: 'button', title: 'zoom out', onclick: function () { self.zoom(2, null); } }, '−'),
      el('button', { class: 'ms-b ms-zoom-in', type: 'button', title: 'zoom in', onclick: function () { self.zoom(0.5, null); } }, '+'),
      el('button', { class: 'ms-b ms-whole', type: 'button', onclick: function () { self.setView(0, N); } }, 'whole run'),
      dd.peak.allocated_event !== null ? el('button', { class: 'ms-b ms-zoom-peak', type: 'button', onclick: function () { self.zoomTo(dd.peak.allocated_event); } }, 'zoom to the peak') : null,
      m.iterations.length ? el('span', null, ' iteration ', this.iterInput, ' ',
        el('button', { class: 'ms-b ms-zoom-iter', type: 'button', onclick: function () { self.zoomIteration(parseInt(self.iterInput.value, 10) - 1); } }, 'zoom to it'),
        ' of ' + fmtCount(m.iterations.length)) : null,
      this.info);

    // Plot.
    this.canvas = el('canvas', { class: 'ms-tl', tabindex: '0', 'aria-label': 'memory over time; wheel or +/− to zoom, drag to pan, click to pick the moment' });
    var plot = el('div', { class: 'ms-plot' }, this.canvas);
    var left = el('div', { class: 'ms-left' }, plot);

    // Side: suspects and details.
    this.panel = el('div', { class: 'ms-panel ms-hidden' });
    var sus = el('div', { class: 'ms-suspects' });
    var mine = [];
    D.suspects.forEach(function (s, i) { if (s.device === dd.device) mine.push(i); });
    if (mine.length) {
      sus.append(el('h4', { text: 'Suspects (click to highlight)' }));
      mine.forEach(function (i) {
        var s = D.suspects[i];
        sus.append(el('button', { class: 'ms-sus', type: 'button', 'data-suspect': String(i), onclick: function () { selectSuspect(i); } },
          s.kind + (s.site ? ' at ' + s.site : '')));
      });
    } else {
      sus.append(el('h4', { text: 'Suspects' }), el('div', { class: 'ms-note', text: 'none on this device' }));
    }
    this.susButtons = sus;
    this.allFrames = el('input', { type: 'checkbox', class: 'ms-allframes' });
    this.allFrames.checked = showAllFrames;
    this.allFrames.addEventListener('change', function () { setShowAll(self.allFrames.checked); });
    this.detailBody = el('div', { class: 'ms-detail-body' }, el('div', { class: 'ms-note', text: 'Click the chart, a block of the segment map or a frame of the flamegraph for its stack.' }));
    this.details = el('div', { class: 'ms-details' }, el('h4', { text: 'Details' }),
      el('label', { class: 'ms-note' }, this.allFrames, ' library and C++ frames'), this.detailBody);
    var side = el('aside', { class: 'ms-side' }, sus, this.panel);

    this.legend = el('div', { class: 'ms-legend' });
    var sw = function (c, t) { return el('span', null, el('span', { class: 'ms-sw', style: 'background:' + c }), t); };
    this.legend.append(sw(COLOR.allocated, 'allocated (band: lowest–highest in a point)'), sw(COLOR.active, 'active'), sw(COLOR.reserved, 'reserved'),
      sw(COLOR.peak, 'peak'), sw(COLOR.oom, 'out of memory'), sw(COLOR.moment, 'selected moment'), sw(COLOR.suspectLine, 'selected suspect\'s blocks'));

    // Moment.
    this.momentNum = el('input', { class: 'ms-num ms-moment-num', type: 'number', min: '0', max: String(Math.max(0, N - 1)), 'aria-label': 'event' });
    this.slider = el('input', { class: 'ms-slider', type: 'range', min: '0', max: String(Math.max(0, N - 1)), step: '1', 'aria-label': 'moment' });
    this.momentInfo = el('div', { class: 'ms-minfo' });
    var momentBar = el('div', { class: 'ms-momentbar' }, el('b', { text: 'Moment' }), ' after event ', this.momentNum, this.slider,
      el('button', { class: 'ms-b', type: 'button', onclick: function () { self.setMoment(-1); } }, 'start'),
      dd.peak.allocated_event !== null ? el('button', { class: 'ms-b ms-at-peak', type: 'button', onclick: function () { self.setMoment(dd.peak.allocated_event); } }, 'peak') : null,
      el('button', { class: 'ms-b ms-at-end', type: 'button', onclick: function () { self.setMoment(N - 1); } }, 'end'),
      dd.ooms.length ? el('button', { class: 'ms-b', type: 'button', onclick: function () { self.setMoment(dd.ooms[dd.ooms.length - 1]); } }, 'OOM') : null,
      this.momentInfo);
    this.slider.addEventListener('input', function () { self.setMoment(parseInt(self.slider.value, 10)); });
    this.momentNum.addEventListener('change', function () { var v = parseInt(self.momentNum.value, 10); if (!isNaN(v)) self.setMoment(clamp(v, -1, N - 1)); });

    var notes = el('div', { class: 'ms-note' });
    var fin = m.levels.length ? m.finest().bucket : 1;
    var noteText = 'Wheel or +/− to zoom, drag to pan, click to pick the moment, click an iteration to zoom to it. ';
    if (dd.windows.length >= dd.windows_total) noteText += 'Every event is embedded.';
    else noteText += 'Embedded event by event: ' + fmtCount(dd.windows.length) + ' of ' + fmtCount(dd.windows_total) + ' windows of ' + fmtCount(D.budgets.window_events) +
      ' events (the peak, its iteration, OOMs, the first and last iteration, the busiest); elsewhere the finest point covers ' + fmtCount(fin) + ' events.';
    notes.append(noteText);

    var explorer = el('div', { class: 'ms-explorer', 'data-device': String(dd.device) },
      el('h3', { text: 'Memory over time, device ' + dd.device }), bar, el('div', { class: 'ms-main' }, left, side), momentBar);
    left.append(this.legend, notes, this.details);
    if (N === 0) {
      explorer.replaceChildren(el('h3', { text: 'Device ' + dd.device + ': no trace' }),
        el('p', { class: 'ms-note', text: 'This device has no trace events: the segment map and flamegraph show the state at dump time.' }), side, this.details);
    }
    if (staticTimeline) { staticTimeline.before(explorer); staticTimeline.classList.add('ms-replaced'); }
    else sec.querySelector('dl.facts') ? sec.querySelector('dl.facts').after(explorer) : sec.append(explorer);

    // At the moment: segment map, flamegraph, tables.
    this.segSummary = el('div', { class: 'ms-segsum' });
    this.segCanvas = el('canvas', { class: 'ms-segmap' });
    this.segNote = el('div', { class: 'ms-note' });
    this.segLegend = el('div', { class: 'ms-legend' });
    var colorSel = el('select', { class: 'ms-colorby', 'aria-label': 'colour blocks by' },
      el('option', { value: 'state', text: 'state' }), el('option', { value: 'category', text: 'category' }), el('option', { value: 'site', text: 'site' }));
    colorSel.addEventListener('change', function () { self.colorBy = colorSel.value; self.drawSegmap(); });
    var segCard = el('div', { class: 'card ms-seg' }, el('h4', { text: 'Segment map' }),
      el('div', { class: 'ms-bar' }, 'colour blocks by ', colorSel), this.segSummary, this.segLegend,
      el('div', { class: 'ms-segscroll' }, this.segCanvas), this.segNote);

    this.flameCanvas = el('canvas', { class: 'ms-flame' });
    this.flameInfo = el('span', { class: 'ms-info' });
    this.flameSearch = el('input', { class: 'ms-text ms-flame-search', type: 'search', placeholder: 'search frames', 'aria-label': 'search frames' });
    this.flameSearch.addEventListener('input', function () { self.flameQuery = self.flameSearch.value; self.drawFlame(); });
    this.nativeBox = el('input', { type: 'checkbox', class: 'ms-native' });
    this.nativeBox.addEventListener('change', function () { self.flameFocus = []; self.computeFlame(); self.drawFlame(); });
    var flameCard = el('div', { class: 'card ms-flamecard' }, el('h4', { text: 'Live memory by stack (click a frame to zoom, the top bar to zoom out)' }),
      el('div', { class: 'ms-bar' }, this.flameSearch,
        el('button', { class: 'ms-b', type: 'button', onclick: function () { self.flameFocus = []; self.drawFlame(); } }, 'reset zoom'),
        el('label', { class: 'ms-note' }, this.nativeBox, ' C++ frames'), this.flameInfo),
      this.flameCanvas);

    this.siteFilter = el('input', { class: 'ms-text ms-site-filter', type: 'search', placeholder: 'filter sites', 'aria-label': 'filter sites' });
    this.siteFilter.addEventListener('input', function () { self.drawTables(); });
    this.siteTable = el('table', { class: 'ms-sites' });
    this.catTable = el('table', { class: 'ms-cats' });
    this.tableNote = el('div', { class: 'ms-note' });
    var tables = el('div', { class: 'ms-tables' },
      el('div', { class: 'card' }, el('h4', { text: 'By site' }), this.siteFilter, el('div', { class: 'ms-tscroll' }, this.siteTable)),
      el('div', { class: 'card' }, el('h4', { text: 'By category' }), el('div', { class: 'ms-tscroll' }, this.catTable), this.tableNote));

    this.atTitle = el('h3');
    var at = el('div', { class: 'ms-at', 'data-device': String(dd.device) }, this.atTitle, segCard, flameCard, tables);
    var anchor = staticFlame || staticSegs[0];
    if (anchor) anchor.before(at); else explorer.after(at);
    if (staticFlame) staticFlame.classList.add('ms-replaced');
    staticSegs.forEach(function (f) { f.classList.add('ms-replaced'); });

    this.bindTimeline();
    this.bindSegmap();
    this.bindFlame();
    var ro = new ResizeObserver(function () { self.drawTimeline(); self.drawSegmap(); self.drawFlame(); });
    ro.observe(plot);
    this.setMoment(this.moment);
  };

  // -------------------------------------------------- timeline geometry and data
  Explorer.prototype.rows = function () {
    var m = this.m, rows = [];
    if (m.iterations.length) rows.push({ name: 'iterations', kind: 'iter' });
    if (m.forward.length || m.backward.length || m.optimizer.length) rows.push({ name: 'fwd·bwd·optim', kind: 'passes' });
    if (m.evals.length) rows.push({ name: 'evaluation', kind: 'eval' });
    if (m.labels.length) rows.push({ name: 'labels', kind: 'labels' });
    if (m.annotations.length) rows.push({ name: 'annotations', kind: 'annotations' });
    rows.push({ name: 'marked', kind: 'suspect' });
    return rows;
  };
  Explorer.prototype.geom = function () {
    var w = this.canvas.parentNode.clientWidth || 800;
    var rows = this.rows();
    return { w: w, W: Math.max(10, w - LEFT - RIGHT), h: TOP + PLOT_H + rows.length * STRIP_H + AXIS_H + 4, rows: rows };
  };
  Explorer.prototype.x = function (e, g) { return LEFT + (e - this.v0) / (this.v1 - this.v0) * g.W; };
  Explorer.prototype.eventAt = function (px, g) { return this.v0 + (px - LEFT) / g.W * (this.v1 - this.v0); };

  // The counters in each pixel column of the view: from the detailed windows when zoomed in
  // past the finest pyramid level, else from the coarsest level whose buckets are under a
  // pixel (or the finest).
  Explorer.prototype.columns = function (g) {
    var m = this.m, W = Math.ceil(g.W), N = m.N;
    var amin = new Float64Array(W).fill(Infinity), amax = new Float64Array(W).fill(-Infinity);
    var rmax = new Float64Array(W).fill(-Infinity), xmax = new Float64Array(W).fill(-Infinity);
    var raw = new Uint8Array(W);
    var v0 = this.v0, span = this.v1 - this.v0;
    var evPerPx = span / g.W;
    var L = null;
    for (var k = 0; k < m.levels.length; k++) { if (m.levels[k].bucket <= Math.max(1, evPerPx)) { L = m.levels[k]; break; } }
    if (!L) L = m.finest();
    var useRaw = evPerPx < L.bucket || L.bucket === 1;
    var lo = Math.max(0, Math.floor(v0)), hi = Math.min(N, Math.ceil(this.v1));
    var col = function (e) { return (e - v0) / span * g.W; };
    var put = function (e0, e1, a0, a1, r, x, isRaw) {
      var c0 = Math.max(0, Math.floor(col(e0))), c1 = Math.min(W - 1, Math.ceil(col(e1)) - 1);
      if (c1 < c0) c1 = c0;
      if (c0 > W - 1) return;
      for (var c = c0; c <= c1; c++) {
        if (a0 < amin[c]) amin[c] = a0;
        if (a1 > amax[c]) amax[c] = a1;
        if (r > rmax[c]) rmax[c] = r;
        if (x > xmax[c]) xmax[c] = x;
        if (isRaw) raw[c] = 1;
      }
    };
    var i = lo, rawEvents = 0;
    while (i < hi) {
      var w = useRaw ? m.windowAt(i) : null;
      if (w) {
        var end = Math.min(w.end, hi);
        for (var e = i; e < end; e++) { var j = e - w.first; put(e, e + 1, w.al[j], w.al[j], w.re[j], w.ac[j], true); }
        rawEvents += end - i;
        i = end;
        continue;
      }
      var b = Math.floor(i / L.bucket);
      var bEnd = Math.min(N, (b + 1) * L.bucket);
      if (useRaw) {
        var nw = lowerBound(m.windowFirsts, i + 1);
        if (nw < m.windows.length && m.windows[nw].first < bEnd) bEnd = m.windows[nw].first;
      }
      if (b < L.amax.length) put(i, bEnd, L.amin[b], L.amax[b], L.rmax[b], L.xmax[b], false);
      i = bEnd;
    }
    return { amin: amin, amax: amax, rmax: rmax, xmax: xmax, raw: raw, level: L, useRaw: useRaw, rawEvents: rawEvents, visible: Math.max(0, hi - lo) };
  };

  // -------------------------------------------------- timeline drawing
  Explorer.prototype.drawTimeline = function () {
    if (this.m.N === 0 || !this.canvas.isConnected || this.section.classList.contains('ms-hidden')) return;
    var m = this.m, dd = this.dd, g = this.geom(), self = this;
    var ctx = setupCanvas(this.canvas, g.w, g.h);
    var cols = this.columns(g);
    this.lastCols = cols;
    var W = cols.amax.length;
    var ymax = 1;
    for (var c = 0; c < W; c++) { ymax = Math.max(ymax, cols.amax[c], cols.rmax[c], cols.xmax[c]); }
    if (dd.peak.allocated_event !== null && dd.peak.allocated_event >= this.v0 && dd.peak.allocated_event < this.v1) ymax = Math.max(ymax, dd.peak.allocated);
    ymax *= 1.08;
    this.ymax = ymax;
    var y = function (v) { return TOP + PLOT_H - v / ymax * PLOT_H; };
    ctx.clearRect(0, 0, g.w, g.h);
    ctx.fillStyle = '#fff';
    ctx.fillRect(0, 0, g.w, g.h);
    // Iterations shaded in the plot when wide enough.
    var it = m.iterations;
    if (it.length) {
      var k0 = Math.max(0, upperBound(it, this.v0) - 1), k1 = lowerBound(it, this.v1);
      if ((k1 - k0) * 3 < g.W) {
        for (var k = k0; k < k1; k++) {
          var sp = m.iterationSpan(k);
          if (k % 2 === 0) { ctx.fillStyle = COLOR.iterB; var xa = Math.max(LEFT, this.x(sp[0], g)), xb = Math.min(LEFT + g.W, this.x(sp[1], g)); ctx.fillRect(xa, TOP, xb - xa, PLOT_H); }
        }
      }
    }
    // Grid and y axis.
    var unit = ymax >= 1073741824 ? [1073741824, 'GiB'] : ymax >= 1048576 ? [1048576, 'MiB'] : ymax >= 1024 ? [1024, 'KiB'] : [1, 'B'];
    var stepRaw = ymax / unit[0] / 5, mag = Math.pow(10, Math.floor(Math.log10(Math.max(stepRaw, 1e-9))));
    var step = [1, 2, 2.5, 5, 10].map(function (s) { return s * mag; }).find(function (s) { return s >= stepRaw; }) * unit[0];
    ctx.strokeStyle = COLOR.grid; ctx.fillStyle = COLOR.axis; ctx.lineWidth = 1; ctx.textAlign = 'right';
    for (var v = 0; v <= ymax; v += step) {
      var yy = Math.round(y(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(LEFT, yy); ctx.lineTo(LEFT + g.W, yy); ctx.stroke();
      var su = step / unit[0], digits = su >= 1 ? 0 : Math.abs(Math.round(su * 10) - su * 10) < 1e-9 ? 1 : 2;
      ctx.fillText((v / unit[0]).toFixed(digits) + ' ' + unit[1], LEFT - 6, yy);
    }
    // Allocated band, then lines.
    ctx.fillStyle = COLOR.band;
    for (c = 0; c < W; c++) {
      if (cols.amax[c] < 0) continue;
      var ya = y(cols.amax[c]), yb = y(cols.amin[c]);
      if (yb - ya >= 1) ctx.fillRect(LEFT + c, ya, 1, yb - ya);
    }
    var poly = function (arr, color, width) {
      ctx.strokeStyle = color; ctx.lineWidth = width; ctx.beginPath();
      var open = false;
      for (var c = 0; c < W; c++) {
        if (arr[c] < 0 || !isFinite(arr[c])) { open = false; continue; }
        var yy = y(arr[c]);
        if (!open) { ctx.moveTo(LEFT + c, yy); open = true; } else ctx.lineTo(LEFT + c, yy);
        ctx.lineTo(LEFT + c + 1, yy);
      }
      ctx.stroke();
    };
    poly(cols.rmax, COLOR.reserved, 1.2);
    poly(cols.xmax, COLOR.active, 1.2);
    poly(cols.amax, COLOR.allocated, 1.6);
    // Selected suspect: its blocks' allocated bytes over time.
    if (this.suspectSteps) {
      var st = this.suspectSteps;
      ctx.fillStyle = COLOR.suspect; ctx.strokeStyle = COLOR.suspectLine; ctx.lineWidth = 1.2;
      ctx.beginPath();
      ctx.moveTo(LEFT, y(0));
      for (c = 0; c < W; c++) {
        var e = Math.floor(this.eventAt(LEFT + c + 1, g));
        var val = st.value(e);
        ctx.lineTo(LEFT + c, y(val)); ctx.lineTo(LEFT + c + 1, y(val));
      }
      ctx.lineTo(LEFT + W, y(0)); ctx.closePath(); ctx.fill(); ctx.stroke();
    }
    // OOMs and the peak.
    ctx.strokeStyle = COLOR.oom; ctx.lineWidth = 1.5;
    dd.ooms.forEach(function (o) {
      if (o < self.v0 || o > self.v1) return;
      var xo = Math.round(self.x(o + 0.5, g)) + 0.5;
      ctx.beginPath(); ctx.moveTo(xo, TOP); ctx.lineTo(xo, TOP + PLOT_H); ctx.stroke();
    });
    var pe = dd.peak.allocated_event;
    if (pe !== null && pe >= this.v0 && pe < this.v1) {
      ctx.fillStyle = COLOR.peak; ctx.beginPath(); ctx.arc(this.x(pe + 0.5, g), y(dd.peak.allocated), 4, 0, 2 * Math.PI); ctx.fill();
      ctx.textAlign = 'left'; ctx.fillText('peak ' + fmtBytes(dd.peak.allocated), Math.min(this.x(pe + 0.5, g) + 6, LEFT + g.W - 110), Math.max(TOP + 6, y(dd.peak.allocated) - 8));
    }
    // The moment.
    if (this.moment >= 0 && this.moment >= this.v0 - 1 && this.moment <= this.v1) {
      var xm = Math.round(this.x(this.moment + 1, g)) + 0.5;
      ctx.strokeStyle = COLOR.moment; ctx.lineWidth = 1.5; ctx.setLineDash([4, 3]);
      ctx.beginPath(); ctx.moveTo(xm, TOP); ctx.lineTo(xm, TOP + PLOT_H + g.rows.length * STRIP_H); ctx.stroke(); ctx.setLineDash([]);
    }
    ctx.strokeStyle = '#9a9a9a'; ctx.lineWidth = 1; ctx.strokeRect(LEFT + 0.5, TOP + 0.5, g.W, PLOT_H);
    // Strips.
    ctx.textAlign = 'right';
    g.rows.forEach(function (row, r) {
      var y0 = TOP + PLOT_H + r * STRIP_H + 2;
      ctx.fillStyle = COLOR.axis; ctx.textAlign = 'right'; ctx.fillText(row.name, LEFT - 6, y0 + STRIP_H / 2 - 1);
      self.drawStrip(ctx, row, y0, STRIP_H - 3, g);
    });
    // x axis: event numbers.
    var ya2 = TOP + PLOT_H + g.rows.length * STRIP_H + 12;
    ctx.fillStyle = COLOR.axis; ctx.textAlign = 'center';
    var span = this.v1 - this.v0, xstepRaw = span / 8, xmag = Math.pow(10, Math.floor(Math.log10(Math.max(xstepRaw, 1))));
    var xstep = Math.max(1, [1, 2, 5, 10].map(function (s) { return s * xmag; }).find(function (s) { return s >= xstepRaw; }));
    for (var ev = Math.ceil(this.v0 / xstep) * xstep; ev <= this.v1; ev += xstep) {
      ctx.fillText(fmtCount(ev), this.x(ev, g), ya2);
    }
    ctx.textAlign = 'left';
    ctx.fillText('event', 4, ya2);
    // What is visible, for the reader and for tests.
    var visible = cols.visible;
    var mode = cols.useRaw ? (cols.rawEvents >= visible ? 'events' : (cols.rawEvents > 0 ? 'mixed' : 'buckets')) : 'buckets';
    var t = fmtCount(visible) + ' events visible (events ' + fmtCount(Math.max(0, Math.floor(this.v0))) + '–' + fmtCount(Math.max(0, Math.min(m.N, Math.ceil(this.v1)) - 1)) + ' of ' + fmtCount(m.N) + ')';
    if (mode === 'events') t += ' · one by one';
    else if (mode === 'mixed') t += ' · one by one where embedded, elsewhere 1 point = ' + fmtCount(cols.level.bucket) + ' events';
    else t += ' · 1 point = ' + fmtCount(Math.max(cols.level.bucket, Math.round(span / g.W))) + ' events';
    this.info.textContent = t;
    var cv = this.canvas;
    cv.dataset.visibleEvents = String(visible);
    cv.dataset.mode = mode;
    cv.dataset.v0 = String(this.v0);
    cv.dataset.v1 = String(this.v1);
    cv.dataset.plotLeft = String(LEFT);
    cv.dataset.plotWidth = String(g.W);
    cv.dataset.plotTop = String(TOP);
    cv.dataset.plotHeight = String(PLOT_H);
    cv.dataset.ymax = String(ymax);
  };

  Explorer.prototype.stripSpans = function (kind) {
    var m = this.m;
    if (kind === 'eval') return [[m.evals, COLOR.eval, 'evaluation window']];
    if (kind === 'labels') return [[m.labels, COLOR.label, null]];
    if (kind === 'annotations') return [[m.annotations, COLOR.annotation, null]];
    if (kind === 'passes') return [[m.forward, COLOR.forward, 'forward pass'], [m.backward, COLOR.backward, 'backward pass'], [m.optimizer, COLOR.optimizer, 'optimizer step']];
    return [];
  };
  Explorer.prototype.drawStrip = function (ctx, row, y0, h, g) {
    var m = this.m, self = this;
    if (row.kind === 'iter') {
      var it = m.iterations, k0 = Math.max(0, upperBound(it, this.v0) - 1), k1 = lowerBound(it, this.v1);
      if (k1 - k0 > g.W * 2) { ctx.fillStyle = COLOR.iterA; ctx.fillRect(LEFT, y0, g.W, h); return; }
      ctx.textAlign = 'center';
      for (var k = k0; k < k1; k++) {
        var sp = m.iterationSpan(k), xa = Math.max(LEFT, this.x(sp[0], g)), xb = Math.min(LEFT + g.W, this.x(sp[1], g));
        ctx.fillStyle = k % 2 ? COLOR.iterA : '#d3d8e3';
        ctx.fillRect(xa, y0, Math.max(1, xb - xa - 0.5), h);
        if (xb - xa > 26) { ctx.fillStyle = '#333'; ctx.fillText(String(k + 1), (xa + xb) / 2, y0 + h / 2); }
      }
      return;
    }
    if (row.kind === 'suspect') {
      var st = this.suspectSteps;
      if (!st) { ctx.fillStyle = '#999'; ctx.textAlign = 'left'; ctx.fillText('click a suspect (or a site in the table) to mark its blocks', LEFT + 4, y0 + h / 2); return; }
      ctx.fillStyle = COLOR.suspectLine;
      var lo = lowerBound(st.allocs, Math.max(0, this.v0)), hi = lowerBound(st.allocs, this.v1), step = Math.max(1, Math.floor((hi - lo) / (g.W * 2)));
      for (var j = lo; j < hi; j += step) ctx.fillRect(Math.floor(this.x(st.allocs[j], g)), y0, 1, h);
      (this.suspectEvents || []).forEach(function (e) { if (e >= self.v0 && e < self.v1) ctx.fillRect(self.x(e, g) - 1, y0, 3, h); });
      return;
    }
    this.stripSpans(row.kind).forEach(function (sp) {
      var spans = sp[0];
      ctx.fillStyle = sp[1];
      var lo = Math.max(0, lowerBound(startsOf(spans), self.v0) - 64), drawn = 0;
      for (var i = lo; i < spans.length && spans[i][0] < self.v1; i++) {
        if (spans[i][1] < self.v0) continue;
        var xa = Math.max(LEFT, self.x(spans[i][0], g)), xb = Math.min(LEFT + g.W, self.x(spans[i][1], g));
        ctx.fillRect(xa, y0, Math.max(1, xb - xa), h);
        if (++drawn > MAX_STRIP_SPANS) break;
      }
    });
  };

  // -------------------------------------------------- timeline interaction
  Explorer.prototype.setView = function (a, b) {
    var N = Math.max(this.m.N, 1);
    var span = clamp(b - a, Math.min(MIN_SPAN, N), N);
    var mid = (a + b) / 2;
    a = mid - span / 2;
    if (a < 0) a = 0;
    if (a + span > N) a = N - span;
    this.v0 = a; this.v1 = a + span;
    this.drawTimeline();
  };
  Explorer.prototype.zoom = function (factor, around) {
    var c = around === null ? (this.v0 + this.v1) / 2 : around;
    var a = c - (c - this.v0) * factor, b = c + (this.v1 - c) * factor;
    this.setView(a, b);
  };
  Explorer.prototype.zoomTo = function (e) { this.setView(e - ZOOM_TO_EVENTS / 2, e + ZOOM_TO_EVENTS / 2); this.setMoment(e); };
  Explorer.prototype.zoomIteration = function (k) {
    var m = this.m;
    if (!(k >= 0 && k < m.iterations.length)) return;
    var sp = m.iterationSpan(k), pad = (sp[1] - sp[0]) * 0.02;
    this.iterInput.value = String(k + 1);
    this.setView(sp[0] - pad, sp[1] + pad);
  };
  Explorer.prototype.bindTimeline = function () {
    var self = this, cv = this.canvas;
    var drag = null;
    cv.addEventListener('wheel', function (evt) {
      evt.preventDefault();
      var g = self.geom(), r = cv.getBoundingClientRect();
      var e = self.eventAt(evt.clientX - r.left, g);
      self.zoom(Math.pow(1.2, evt.deltaY / 100), clamp(e, self.v0, self.v1));
      self.hover(evt);
    }, { passive: false });
    cv.addEventListener('mousedown', function (evt) { drag = { x: evt.clientX, v0: self.v0, v1: self.v1, moved: false }; });
    window.addEventListener('mouseup', function (evt) {
      if (!drag) return;
      var d = drag; drag = null;
      if (!d.moved && evt.target === cv) self.click(evt);
    });
    cv.addEventListener('mousemove', function (evt) {
      if (drag && (evt.buttons & 1)) {
        var g = self.geom(), dx = evt.clientX - drag.x;
        if (Math.abs(dx) > 3) drag.moved = true;
        if (drag.moved) {
          var de = dx / g.W * (drag.v1 - drag.v0);
          self.setView(drag.v0 - de, drag.v1 - de);
        }
        hideTip();
        return;
      }
      self.hover(evt);
    });
    cv.addEventListener('mouseleave', hideTip);
    cv.addEventListener('dblclick', function (evt) {
      var g = self.geom(), r = cv.getBoundingClientRect();
      self.zoom(0.25, self.eventAt(evt.clientX - r.left, g));
    });
    cv.addEventListener('keydown', function (evt) {
      if (evt.key === '+' || evt.key === '=') self.zoom(0.5, null);
      else if (evt.key === '-') self.zoom(2, null);
      else if (evt.key === 'ArrowRight') self.setMoment(Math.min(self.m.N - 1, self.moment + 1));
      else if (evt.key === 'ArrowLeft') self.setMoment(Math.max(-1, self.moment - 1));
      else return;
      evt.preventDefault();
    });
  };
  // Which part of the chart is under the pointer: {area: 'plot'|row kind, e (event, float)}.
  Explorer.prototype.hit = function (evt) {
    var g = this.geom(), r = this.canvas.getBoundingClientRect();
    var px = evt.clientX - r.left, py = evt.clientY - r.top;
    if (px < LEFT || px > LEFT + g.W) return null;
    var e = this.eventAt(px, g);
    if (py >= TOP && py <= TOP + PLOT_H) return { area: 'plot', e: e, px: px, g: g };
    var row = Math.floor((py - TOP - PLOT_H) / STRIP_H);
    if (row >= 0 && row < g.rows.length) return { area: g.rows[row].kind, e: e, px: px, g: g };
    return null;
  };
  Explorer.prototype.click = function (evt) {
    var h = this.hit(evt);
    if (!h) return;
    var e = Math.floor(h.e);
    if (h.area === 'iter') {
      var k = upperBound(this.m.iterations, e) - 1;
      if (k >= 0) this.zoomIteration(k);
      return;
    }
    this.setMoment(clamp(e, 0, this.m.N - 1));
    var info = this.describeAt(h);
    if (info) this.showDetails(info);
  };
  Explorer.prototype.hover = function (evt) {
    var h = this.hit(evt);
    if (!h) { hideTip(); return; }
    var info = this.describeAt(h);
    if (!info) { hideTip(); return; }
    showTip(evt, info.tip);
  };
  // What is at a point of the chart, as tooltip nodes and details nodes.
  Explorer.prototype.describeAt = function (h) {
    var m = this.m;
    var e = clamp(Math.floor(h.e), 0, m.N - 1);
    if (h.area === 'plot') {
      var g = h.g, evPerPx = (this.v1 - this.v0) / g.W;
      var cols = this.lastCols;
      var c = clamp(Math.floor(h.px - LEFT), 0, cols.raw.length - 1);
      if (cols.useRaw && cols.raw[c]) {
        // The events of this pixel column: one, or the largest of a few.
        var e0 = clamp(Math.floor(this.eventAt(LEFT + c, g)), 0, m.N - 1), e1 = clamp(Math.ceil(this.eventAt(LEFT + c + 1, g)), e0 + 1, m.N);
        if (evPerPx <= 1) { e0 = e; e1 = e + 1; }
        return this.describeEvents(e0, e1);
      }
      return this.describeBucket(e, cols.level);
    }
    if (h.area === 'iter') {
      var k = upperBound(m.iterations, e) - 1;
      if (k < 0) return null;
      var sp = m.iterationSpan(k);
      return this.describeSpan('iteration ' + fmtCount(k + 1) + ' of ' + fmtCount(m.iterations.length) + ' (' + this.dd.phases.iterations_by + '); click to zoom to it', sp[0], sp[1]);
    }
    if (h.area === 'suspect') {
      if (this.suspect < 0) return null;
      var s = D.suspects[this.suspect];
      return { tip: [line(s.kind + (s.site ? ' at ' + s.site : ''), true), line(fmtCount(s.blocks.length) + ' blocks marked; ticks at their allocations')], details: null };
    }
    var found = null;
    this.stripSpans(h.area).forEach(function (spx) {
      var spans = spx[0], starts = startsOf(spans);
      // Spans may overlap (labels): look at a few that start at or before e.
      for (var i = upperBound(starts, e) - 1, n = 0; !found && i >= 0 && n < 16; i--, n++) {
        if (e < spans[i][1]) found = [spx[2] || spans[i][2], spans[i][0], spans[i][1]];
      }
    });
    if (!found) return null;
    return this.describeSpan(found[0], found[1], found[2]);
  };
  Explorer.prototype.timeText = function (e) {
    var c = this.m.countersAt(e);
    if (c && !isNaN(c.time)) return ' · +' + fmtSeconds(c.time);
    return '';
  };
  Explorer.prototype.blockLines = function (b, nodes) {
    var m = this.m;
    var site = this.dd.sites[m.bsite[b]];
    var addr = m.blockAddress(b);
    nodes.push(line('block ' + (addr || '(in no embedded segment)') + ': ' + fmtBytes(m.bsize[b]) + (m.bpad[b] ? ' (requested ' + fmtBytes(m.bsize[b] - m.bpad[b]) + ')' : '')));
    var life = (m.ba[b] < 0 ? 'allocated before the trace' : 'allocated at event ' + fmtCount(m.ba[b])) +
      (m.bf[b] === Infinity ? ', not freed in the trace' : ', freed at event ' + fmtCount(m.bf[b]));
    nodes.push(line(life));
    nodes.push(line(WHO[m.bwho[b]] + ': ' + site[0] + ' · ' + D.categories[m.bcat[b]].name));
  };
  Explorer.prototype.describeEvents = function (e0, e1) {
    var m = this.m, w = m.windowAt(e0);
    if (!w) return null;
    // The event of the range that moved most bytes.
    var best = e0, bestSize = -1;
    for (var e = e0; e < e1 && e < w.end; e++) { var sz = w.size[e - w.first]; if (sz > bestSize) { best = e; bestSize = sz; } }
    var j = best - w.first, act = ACTIONS[w.act[j]] || w.act[j];
    var tipNodes = [], det = [];
    var head = (e1 - e0 > 1 ? 'events ' + fmtCount(e0) + '–' + fmtCount(e1 - 1) + '; the largest: ' : '') + 'event ' + fmtCount(best) + ': ' + act + ' ' + fmtBytes(w.size[j]);
    tipNodes.push(line(head, true));
    tipNodes.push(line('stream 0x' + (this.dd.streams[w.stream[j]] || '0') + this.timeText(best)));
    tipNodes.push(line('after it: allocated ' + fmtBytes(w.al[j]) + ' · reserved ' + fmtBytes(w.re[j]) + ' · active ' + fmtBytes(w.ac[j])));
    var b = m.blockOfEvent(best);
    if (b >= 0 && (act === 'alloc' || act === 'free_requested' || act === 'free_completed')) this.blockLines(b, tipNodes);
    det = tipNodes.slice();
    var stackTitle = act === 'alloc' ? 'allocation stack' : act.indexOf('free') === 0 ? 'stack of the free' : 'stack';
    var st = w.stack[j], sf = stackFrames(st);
    if (sf !== null && sf.length === 0 && b >= 0 && m.bwho[b] === 2) {
      // The autograd engine allocates without Python frames: its .backward() call's stack.
      stackTitle = 'no frames of its own; the .backward() call that launched it';
      st = m.bstack[b];
    }
    tipNodes.push(line(stackTitle + ' (your frames):'));
    tipNodes.push(stackList(st, STACK_TIP_FRAMES, false));
    det.push(line(stackTitle + ', innermost first:'));
    det.push({ stack: st });
    if (b >= 0 && act !== 'alloc' && m.bstack[b] !== st) { det.push(line('allocation stack:')); det.push({ stack: m.bstack[b] }); }
    this.canvas.dataset.hoverEvent = String(best);
    return { tip: tipNodes, details: det };
  };
  Explorer.prototype.largestAllocated = function (e0, e1) {
    var m = this.m;
    var lo = lowerBound(m.ba, e0), hi = lowerBound(m.ba, e1), best = -1;
    for (var i = lo; i < hi && i < lo + LARGEST_SCAN; i++) if (best < 0 || m.bsize[i] > m.bsize[best]) best = i;
    return best;
  };
  Explorer.prototype.describeBucket = function (e, L) {
    var m = this.m;
    var k = Math.floor(e / L.bucket), e0 = k * L.bucket, e1 = Math.min(m.N, e0 + L.bucket);
    var nodes = [line('events ' + fmtCount(e0) + '–' + fmtCount(e1 - 1) + ' (' + fmtCount(e1 - e0) + ' events in this point)', true),
      line('allocated ' + fmtBytes(L.amin[k]) + '–' + fmtBytes(L.amax[k]) + ' · reserved up to ' + fmtBytes(L.rmax[k]) + ' · active up to ' + fmtBytes(L.xmax[k]))];
    var b = this.largestAllocated(e0, e1);
    var det = nodes.slice();
    if (b >= 0) {
      nodes.push(line('largest allocation in these events:'));
      this.blockLines(b, nodes);
      nodes.push(stackList(m.bstack[b], STACK_TIP_FRAMES, false));
      det = nodes.slice(0, -1);
      det.push({ stack: m.bstack[b] });
    } else {
      nodes.push(line('zoom in for the events one by one'));
    }
    this.canvas.dataset.hoverEvent = '';
    return { tip: nodes, details: det };
  };
  Explorer.prototype.describeSpan = function (title, a, b) {
    var nodes = [line(title, true), line('events ' + fmtCount(a) + '–' + fmtCount(Math.max(a, b - 1)) + ' (' + fmtCount(b - a) + ' events)')];
    var c0 = this.m.countersAt(a), c1 = this.m.countersAt(Math.max(a, b - 1));
    if (c0 && c1 && !isNaN(c0.time) && !isNaN(c1.time)) nodes.push(line('at +' + fmtSeconds(c0.time) + ' for ' + fmtSeconds(c1.time - c0.time)));
    var blk = this.largestAllocated(a, b);
    var det = nodes.slice();
    if (blk >= 0) {
      nodes.push(line('largest allocation in it:'));
      this.blockLines(blk, nodes);
      nodes.push(stackList(this.m.bstack[blk], STACK_TIP_FRAMES, false));
      det = nodes.slice(0, -1);
      det.push({ stack: this.m.bstack[blk] });
    }
    return { tip: nodes, details: det };
  };
  Explorer.prototype.showDetails = function (info) {
    this.lastDetails = info;
    var body = [];
    (info.details || info.tip).forEach(function (n) {
      if (n && n.stack !== undefined && !(n instanceof Node)) body.push(stackList(n.stack, 0, true));
      else if (n instanceof Node) body.push(n.cloneNode(true));
    });
    this.detailBody.replaceChildren.apply(this.detailBody, body);
  };

  // -------------------------------------------------- the moment
  Explorer.prototype.setMoment = function (t) {
    var self = this, m = this.m;
    this.moment = m.N === 0 ? -1 : clamp(t, -1, m.N - 1);
    this.slider.value = String(Math.max(0, this.moment));
    this.momentNum.value = String(this.moment);
    if (this.pending) return;
    this.pending = true;
    var run = function () { self.pending = false; self.computeMoment(); self.drawTimeline(); self.drawSegmap(); self.computeFlame(); self.drawFlame(); self.drawTables(); };
    if (this.built) requestAnimationFrame(run); else { this.built = true; run(); }
  };
  Explorer.prototype.computeMoment = function () {
    var m = this.m, t = this.moment, n = m.nb;
    var state = new Uint8Array(n), allocated = 0, pending = 0, count = 0;
    for (var i = 0; i < n; i++) {
      var s = m.state(i, t);
      state[i] = s;
      if (s === STATE_ALLOCATED) { allocated += m.bsize[i]; count++; } else if (s === STATE_PENDING) pending += m.bsize[i];
    }
    this.liveState = state;
    this.liveAllocated = allocated;
    this.livePending = pending;
    this.liveCount = count;
    // Segments live at t, contiguous expandable ranges merged (as the replay's state_after).
    var views = [], viewOf = new Int32Array(m.segs.length).fill(-1), baseOf = new Float64Array(m.segs.length);
    var order = m.segs.map(function (_, j) { return j; }).filter(function (j) { return m.segmentLive(m.segs[j], t); });
    order.sort(function (x, y) { var a = m.segs[x].addr, b = m.segs[y].addr; return a < b ? -1 : a > b ? 1 : x - y; });
    order.forEach(function (j) {
      var s = m.segs[j], prev = views[views.length - 1];
      if (prev && prev.expandable && s.expandable && prev.addr + BigInt(prev.size) === s.addr && prev.stream === s.stream && prev.pool === s.pool) {
        viewOf[j] = views.length - 1; baseOf[j] = prev.size; prev.size += s.size;
      } else {
        viewOf[j] = views.length; baseOf[j] = 0;
        views.push({ addr: s.addr, hex: s.hex, size: s.size, stream: s.stream, pool: s.pool, expandable: s.expandable, blocks: [], allocated: 0, pending: 0 });
      }
    });
    for (i = 0; i < n; i++) {
      if (!state[i]) continue;
      var sg = m.bseg[i];
      if (sg < 0 || viewOf[sg] < 0) continue;
      var v = views[viewOf[sg]];
      v.blocks.push({ b: i, off: baseOf[sg] + m.boff[i] });
      if (state[i] === STATE_ALLOCATED) v.allocated += m.bsize[i]; else v.pending += m.bsize[i];
    }
    var reserved = 0;
    views.forEach(function (v) {
      v.blocks.sort(function (x, y) { return x.off - y.off; });
      v.free = Math.max(0, v.size - v.allocated - v.pending);
      var at = 0, gaps = 0, largest = 0;
      v.blocks.forEach(function (x) { if (x.off > at) { gaps++; largest = Math.max(largest, x.off - at); } at = Math.max(at, x.off + m.bsize[x.b]); });
      if (v.size > at) { gaps++; largest = Math.max(largest, v.size - at); }
      v.freeBlocks = gaps; v.largestFree = largest;
      reserved += v.size;
    });
    views.sort(function (x, y) { return y.size - x.size || y.free - x.free || (x.addr < y.addr ? -1 : 1); });
    this.views = views;
    this.liveReserved = reserved;
    // Moment text.
    var dd = this.dd, c = m.countersAt(t);
    var when = t < 0 ? 'before the first event' : 'after event ' + fmtCount(t) + (c && !isNaN(c.time) ? ' (+' + fmtSeconds(c.time) + ')' : '');
    var it = upperBound(m.iterations, t) - 1;
    if (t >= 0 && it >= 0) when += ', in iteration ' + fmtCount(it + 1);
    var exact = dd.blocks_total === m.nb;
    var txt = when + ': ' + fmtBytes(allocated) + ' allocated in ' + fmtCount(count) + ' blocks, ' + fmtBytes(reserved) + ' reserved';
    if (c) txt += ' (the trace says ' + fmtBytes(c.allocated) + ' allocated' + (!exact && c.allocated > allocated ? ', ' + fmtBytes(c.allocated - allocated) + ' of it in blocks not embedded' : '') + ')';
    if (!exact) txt += ' · ' + fmtCount(m.nb) + ' of ' + fmtCount(dd.blocks_total) + ' blocks embedded (the suspects\', those live at the peak and at the end, those of the detailed windows, then the largest); the ' + fmtCount(dd.blocks_total - m.nb) + ' left out are at most ' + fmtBytes(dd.blocks_omitted_largest) + ' each';
    this.momentInfo.textContent = txt;
    this.atTitle.textContent = 'Device ' + dd.device + ' ' + when;
    this.section.dataset.moment = String(t);
  };

  // -------------------------------------------------- segment map
  Explorer.prototype.blockColor = function (b, state) {
    if (state === STATE_PENDING) return COLOR.segPending;
    if (this.colorBy === 'category') return D.categories[this.m.bcat[b]].color;
    if (this.colorBy === 'site') return siteColor(this.dd.sites[this.m.bsite[b]][0]);
    return COLOR.segAllocated;
  };
  Explorer.prototype.segGeom = function () {
    var w = this.segCanvas.parentNode.clientWidth || 800;
    var rows = Math.min(this.views ? this.views.length : 0, SEG_MAX_ROWS);
    return { w: w, bar: Math.max(40, w - SEG_LABEL - 16), rows: rows, h: 6 + rows * SEG_ROW + 4 };
  };
  Explorer.prototype.barLen = function (size, largest, bar) { return Math.max(bar * size / largest, Math.min(bar * 0.12, bar), Math.min(36, bar)); };
  Explorer.prototype.drawSegmap = function () {
    if (!this.views || !this.segCanvas.isConnected || this.section.classList.contains('ms-hidden')) return;
    var m = this.m, views = this.views, g = this.segGeom(), self = this;
    var ctx = setupCanvas(this.segCanvas, g.w, g.h);
    ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, g.w, g.h);
    var largest = views.length ? Math.max(1, views[0].size) : 1;
    var hl = this.highlight, highlighted = 0, drawnBlocks = 0;
    for (var r = 0; r < g.rows; r++) {
      var v = views[r], y = 6 + r * SEG_ROW, len = this.barLen(v.size, largest, g.bar);
      ctx.fillStyle = '#333'; ctx.textAlign = 'right';
      ctx.fillText(fmtBytes(v.size) + ' · ' + pct(v.free, v.size) + ' free', SEG_LABEL, y + SEG_ROW / 2 - 1);
      ctx.fillStyle = COLOR.segFree; ctx.fillRect(SEG_LABEL + 8, y, len, SEG_ROW - 3);
      ctx.strokeStyle = '#9a9a9a'; ctx.lineWidth = 0.6; ctx.strokeRect(SEG_LABEL + 8 + 0.5, y + 0.5, len - 1, SEG_ROW - 4);
      var scale = len / Math.max(1, v.size);
      for (var j = 0; j < v.blocks.length; j++) {
        var x = v.blocks[j], b = x.b, st = this.liveState[b];
        var bx = SEG_LABEL + 8 + x.off * scale, bw = Math.max(0.6, m.bsize[b] * scale);
        ctx.fillStyle = this.blockColor(b, st);
        ctx.fillRect(bx, y + 0.5, bw, SEG_ROW - 4);
        if (bw >= 4) { ctx.strokeStyle = '#fff'; ctx.lineWidth = 0.7; ctx.strokeRect(bx, y + 0.5, bw, SEG_ROW - 4); }
        drawnBlocks++;
        if (hl && hl[b]) {
          highlighted++;
          ctx.strokeStyle = COLOR.highlight; ctx.lineWidth = 2;
          ctx.strokeRect(bx + 1, y + 1.5, Math.max(1, bw - 2), SEG_ROW - 6);
        }
      }
    }
    // Highlighted blocks in rows not drawn still count.
    if (hl) for (r = g.rows; r < views.length; r++) views[r].blocks.forEach(function (x) { if (hl[x.b]) highlighted++; });
    var free = 0, freeBlocks = 0, pending = 0, allocated = 0;
    views.forEach(function (v) { free += v.free; freeBlocks += v.freeBlocks; pending += v.pending; allocated += v.allocated; });
    this.segSummary.textContent = fmtCount(views.length) + (views.length === 1 ? ' segment, ' : ' segments, ') + fmtBytes(this.liveReserved) + ' reserved: ' +
      fmtBytes(allocated) + ' allocated, ' + fmtBytes(pending) + ' pending free, ' + fmtBytes(free) + ' free in ' + fmtCount(freeBlocks) + ' gaps. Largest first; bar length ∝ size.' +
      (hl ? ' ' + fmtCount(highlighted) + ' blocks of the selected suspect live here (outlined red).' : '');
    var cv = this.segCanvas;
    cv.dataset.segments = String(views.length);
    cv.dataset.liveBlocks = String(drawnBlocks);
    cv.dataset.allocated = String(allocated);
    cv.dataset.highlighted = String(hl ? highlighted : 0);
    cv.dataset.moment = String(this.moment);
    var notes = [];
    if (views.length > g.rows) notes.push(fmtCount(views.length - g.rows) + ' smaller segments not drawn.');
    if (this.dd.blocks_total > m.nb) notes.push('Blocks left out of the page (the smallest) show as free space.');
    if (this.dd.segments_total > m.segs.length) notes.push(fmtCount(this.dd.segments_total - m.segs.length) + ' segments left out of the page (the smallest).');
    this.segNote.textContent = notes.join(' ');
    // Legend.
    var sw = function (c, t) { return el('span', null, el('span', { class: 'ms-sw', style: 'background:' + c }), t); };
    var items = [];
    if (this.colorBy === 'state') items.push(sw(COLOR.segAllocated, 'allocated'));
    else if (this.colorBy === 'category') D.categories.forEach(function (c) { items.push(sw(c.color, c.name)); });
    else items.push(el('span', { text: 'one colour per site (hover a block for its site)' }));
    items.push(sw(COLOR.segPending, 'pending free (another stream)'), sw(COLOR.segFree, 'free (cached)'));
    if (hl) items.push(el('span', null, el('span', { class: 'ms-sw', style: 'border:2px solid ' + COLOR.highlight + ';background:#fff' }), 'selected suspect'));
    this.segLegend.replaceChildren.apply(this.segLegend, items);
  };
  Explorer.prototype.segHit = function (evt) {
    if (!this.views) return null;
    var r = this.segCanvas.getBoundingClientRect(), g = this.segGeom();
    var px = evt.clientX - r.left, py = evt.clientY - r.top;
    var row = Math.floor((py - 6) / SEG_ROW);
    if (row < 0 || row >= g.rows) return null;
    var v = this.views[row], largest = Math.max(1, this.views[0].size), len = this.barLen(v.size, largest, g.bar);
    var off = (px - SEG_LABEL - 8) / len * v.size;
    if (off < 0 || off > v.size) return { view: v, block: -1, off: off };
    // The block under the pointer (within half a pixel).
    var tol = v.size / len * 0.5, best = -1, m = this.m;
    for (var j = 0; j < v.blocks.length; j++) {
      var x = v.blocks[j];
      if (x.off - tol <= off && off <= x.off + m.bsize[x.b] + tol) { best = x.b; if (x.off <= off && off <= x.off + m.bsize[x.b]) break; }
    }
    return { view: v, block: best, off: off };
  };
  Explorer.prototype.describeBlock = function (v, b) {
    var m = this.m, nodes = [];
    nodes.push(line((this.liveState[b] === STATE_PENDING ? 'pending free (freed, still used by another stream)' : 'allocated') + ', after event ' + fmtCount(this.moment), true));
    this.blockLines(b, nodes);
    nodes.push(line('segment 0x' + v.hex + ': ' + fmtBytes(v.size) + ' (' + v.pool + ', stream 0x' + v.stream + ')'));
    var tipNodes = nodes.concat([line('allocation stack (your frames):'), stackList(m.bstack[b], STACK_TIP_FRAMES, false)]);
    return { tip: tipNodes, details: nodes.concat([line('allocation stack, innermost first:'), { stack: m.bstack[b] }]) };
  };
  Explorer.prototype.describeSegment = function (v) {
    return { tip: [line('segment 0x' + v.hex + ': ' + fmtBytes(v.size), true), line(v.pool + ', stream 0x' + v.stream),
      line('allocated ' + fmtBytes(v.allocated) + ' (' + pct(v.allocated, v.size) + '), pending free ' + fmtBytes(v.pending) + ', free ' + fmtBytes(v.free) + ' in ' + fmtCount(v.freeBlocks) + ' gaps (largest ' + fmtBytes(v.largestFree) + ')'),
      line(fmtCount(v.blocks.length) + ' live blocks')], details: null };
  };
  Explorer.prototype.bindSegmap = function () {
    var self = this, cv = this.segCanvas;
    cv.addEventListener('mousemove', function (evt) {
      var h = self.segHit(evt);
      if (!h) { hideTip(); return; }
      showTip(evt, (h.block >= 0 ? self.describeBlock(h.view, h.block) : self.describeSegment(h.view)).tip);
    });
    cv.addEventListener('mouseleave', hideTip);
    cv.addEventListener('click', function (evt) {
      var h = self.segHit(evt);
      if (!h) return;
      self.showDetails(h.block >= 0 ? self.describeBlock(h.view, h.block) : self.describeSegment(h.view));
      if (h.block >= 0) self.segCanvas.dataset.clickedBlock = String(h.block);
    });
  };

  // -------------------------------------------------- flamegraph
  Explorer.prototype.computeFlame = function () {
    var m = this.m, state = this.liveState, native = this.nativeBox.checked;
    // Bytes per (stack, kind of attribution) first: far fewer than blocks.
    var by = new Map();
    for (var i = 0; i < m.nb; i++) {
      if (state[i] !== STATE_ALLOCATED) continue;
      var key = m.bwho[i] + ':' + m.bstack[i];
      by.set(key, (by.get(key) || 0) + m.bsize[i]);
    }
    var root = { name: 'all allocated memory', kind: 4, bytes: 0, children: new Map(), parent: null, depth: 0 };
    var keys = Array.from(by.keys()).sort();
    keys.forEach(function (key) {
      var bytes = by.get(key), who = +key.split(':')[0], s = +key.split(':')[1];
      var path = [];
      if (who === 3) path.push({ name: '[allocated before the trace]', kind: 3 });
      else if (who === 4) path.push({ name: '[no frames recorded]', kind: 3 });
      else {
        var frames = stackFrames(s);
        if (frames === null) path.push({ name: '[stack not embedded]', kind: 3 });
        else {
          var fr = frames.filter(function (f) { return f.frame; }).map(function (f) { return f.frame; }).reverse();
          var python = fr.some(function (f) { return f.kind !== 2; });
          if (!native && python) fr = fr.filter(function (f) { return f.kind !== 2; });
          if (fr.length === 0) path.push({ name: '[no frames recorded]', kind: 3 });
          fr.forEach(function (f) { path.push({ name: f.label, kind: f.kind, full: f.full }); });
        }
        if (who === 2) path.push({ name: '[autograd engine]', kind: 3 });
      }
      var node = root;
      root.bytes += bytes;
      path.forEach(function (p) {
        var c = node.children.get(p.name);
        if (!c) { c = { name: p.name, kind: p.kind, full: p.full, bytes: 0, children: new Map(), parent: node, depth: node.depth + 1 }; node.children.set(p.name, c); }
        c.bytes += bytes;
        node = c;
      });
    });
    this.flameRoot = root;
    // Keep the zoom if the same path still exists.
    var names = this.flameFocus, n = root;
    for (var k = 0; k < names.length && n; k++) n = n.children.get(names[k]);
    if (!n) this.flameFocus = [];
  };
  Explorer.prototype.flameColor = function (node, match) {
    if (match) return '#e040fb';
    var h = hash(node.name), a = (h & 0xffff) / 65535, b = ((h >>> 16) & 0xffff) / 65535;
    if (node.kind === 0) return hsl(8 + 32 * a, 82, 56 + 8 * b);
    if (node.kind === 1) return hsl(195 + 30 * a, 32, 76 + 7 * b);
    if (node.kind === 2) return hsl(95 + 30 * a, 18, 76 + 6 * b);
    if (node.kind === 3) return hsl(265 + 20 * a, 30, 78 + 5 * b);
    return '#d6d6d6';
  };
  Explorer.prototype.drawFlame = function () {
    if (!this.flameRoot || !this.flameCanvas.isConnected || this.section.classList.contains('ms-hidden')) return;
    var self = this, root = this.flameRoot;
    var focus = root;
    this.flameFocus.forEach(function (nm) { var c = focus.children.get(nm); if (c) focus = c; });
    var chain = [];
    for (var p = focus; p; p = p.parent) chain.unshift(p);
    // Depth below the focus.
    var depth = 0;
    (function walk(n, d) { if (d > depth) depth = d; if (d >= FLAME_MAX_DEPTH) return; n.children.forEach(function (c) { walk(c, d + 1); }); })(focus, 0);
    var w = this.flameCanvas.parentNode.clientWidth || 800, W = w - 2;
    var rows = chain.length + depth;
    var h = Math.max(FLAME_ROW * 2, rows * FLAME_ROW + 4);
    var ctx = setupCanvas(this.flameCanvas, w, h);
    ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, w, h);
    var q = this.flameQuery.trim().toLowerCase();
    var boxes = [], matched = 0, matchedFrames = 0;
    var draw = function (n, x, y, bw, isMatchAbove) {
      var match = q !== '' && n !== root && n.name.toLowerCase().indexOf(q) >= 0;
      if (match) matchedFrames++;
      if (match && !isMatchAbove) matched += n.bytes;
      ctx.fillStyle = self.flameColor(n, match);
      ctx.fillRect(x, y, Math.max(0.5, bw - 0.5), FLAME_ROW - 1);
      var label = n === root ? root.name + ' after event ' + fmtCount(self.moment) + ': ' + fmtBytes(n.bytes) : n.name;
      ctx.fillStyle = n.kind === 0 ? '#1a1a1a' : '#222';
      ctx.font = (n.kind === 0 ? 'bold ' : '') + '11px system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif';
      ctx.textAlign = 'left';
      var t = fitText(ctx, label, bw - 6);
      if (t) ctx.fillText(t, x + 3, y + FLAME_ROW / 2);
      boxes.push({ n: n, x: x, y: y, w: bw });
      return match || isMatchAbove;
    };
    var above = false;
    chain.forEach(function (n, i) { above = draw(n, 1, 2 + i * FLAME_ROW, W, above) || above; });
    var total = Math.max(1, focus.bytes);
    (function walk(n, x, d, m) {
      if (d >= FLAME_MAX_DEPTH) return;
      var kids = Array.from(n.children.values()).sort(function (a, b) { return a.name < b.name ? -1 : a.name > b.name ? 1 : 0; });
      var cx = x;
      kids.forEach(function (c) {
        var cw = c.bytes / total * W;
        if (cw >= 0.5) { var mm = draw(c, cx, 2 + (chain.length + d) * FLAME_ROW, cw, m); walk(c, cx, d + 1, mm); }
        else if (q !== '') (function count(z, mAbove) { var hit = z.name.toLowerCase().indexOf(q) >= 0; if (hit) matchedFrames++; if (hit && !mAbove) matched += z.bytes; z.children.forEach(function (y) { count(y, mAbove || hit); }); })(c, m);
        cx += cw;
      });
    })(focus, 1, 0, above);
    this.flameBoxes = boxes;
    this.flameInfo.textContent = (q ? 'matched ' + fmtBytes(matched) + ' (' + pct(matched, root.bytes) + ' of all) in ' + fmtCount(matchedFrames) + ' frames · ' : '') +
      (focus === root ? '' : 'zoomed to ' + focus.name + ': ' + fmtBytes(focus.bytes) + ' · ');
    var cv = this.flameCanvas;
    cv.dataset.focus = focus === root ? '' : focus.name;
    cv.dataset.matched = String(matched);
    cv.dataset.total = String(root.bytes);
  };
  Explorer.prototype.flameHit = function (evt) {
    if (!this.flameBoxes) return null;
    var r = this.flameCanvas.getBoundingClientRect(), x = evt.clientX - r.left, y = evt.clientY - r.top;
    for (var i = this.flameBoxes.length - 1; i >= 0; i--) {
      var b = this.flameBoxes[i];
      if (x >= b.x && x <= b.x + b.w && y >= b.y && y < b.y + FLAME_ROW) return b.n;
    }
    return null;
  };
  Explorer.prototype.bindFlame = function () {
    var self = this, cv = this.flameCanvas;
    cv.addEventListener('mousemove', function (evt) {
      var n = self.flameHit(evt);
      if (!n) { hideTip(); return; }
      var total = Math.max(1, self.flameRoot.bytes);
      showTip(evt, [line(n.full || n.name, true), line(fmtBytes(n.bytes) + ' (' + fmtCount(n.bytes) + ' bytes), ' + pct(n.bytes, total) + ' of allocated' +
        (n.parent ? ', ' + pct(n.bytes, n.parent.bytes) + ' of its caller' : '')), line('click to zoom')]);
    });
    cv.addEventListener('mouseleave', hideTip);
    cv.addEventListener('click', function (evt) {
      var n = self.flameHit(evt);
      if (!n) return;
      var path = [];
      for (var p = n; p && p.parent; p = p.parent) path.unshift(p.name);
      self.flameFocus = path;
      self.drawFlame();
    });
  };

  // -------------------------------------------------- tables
  function sortableTable(table, columns, rows, sort, onSort, onRow) {
    var thead = el('thead'), tr = el('tr');
    columns.forEach(function (c) {
      var th = el('th', { class: (c.num ? 'num ' : '') + (sort.key === c.key ? 'ms-sorted' + (sort.asc ? ' ms-asc' : '') : ''), 'data-key': c.key, text: c.title });
      th.addEventListener('click', function () { onSort(c.key); });
      tr.append(th);
    });
    thead.append(tr);
    var col = columns.find(function (c) { return c.key === sort.key; }) || columns[0];
    rows.sort(function (a, b) {
      var x = col.value(a), y = col.value(b), r = x < y ? -1 : x > y ? 1 : 0;
      return (sort.asc ? r : -r) || (a.order - b.order);
    });
    var tbody = el('tbody');
    rows.slice(0, TABLE_ROWS).forEach(function (r) {
      var row = el('tr');
      if (onRow) { row.classList.add('ms-row'); if (onRow.on(r)) row.classList.add('on'); row.addEventListener('click', function () { onRow.click(r); }); }
      columns.forEach(function (c) { row.append(el('td', { class: c.num ? 'num' : 'site', title: c.hover ? c.hover(r) : '', text: c.show(r) })); });
      tbody.append(row);
    });
    if (rows.length > TABLE_ROWS) tbody.append(el('tr', null, el('td', { colspan: String(columns.length), class: 'site', text: fmtCount(rows.length - TABLE_ROWS) + ' more rows (filter to find them)' })));
    table.replaceChildren(thead, tbody);
  }
  Explorer.prototype.drawTables = function () {
    var self = this, m = this.m, state = this.liveState;
    if (!state) return;
    var sites = new Map(), cats = D.categories.map(function (c, j) { return { name: c.name, color: c.color, bytes: 0, blocks: 0, order: j }; });
    for (var i = 0; i < m.nb; i++) {
      if (state[i] !== STATE_ALLOCATED) continue;
      var s = sites.get(m.bsite[i]);
      if (!s) { s = { site: m.bsite[i], bytes: 0, blocks: 0 }; sites.set(m.bsite[i], s); }
      s.bytes += m.bsize[i]; s.blocks++;
      cats[m.bcat[i]].bytes += m.bsize[i]; cats[m.bcat[i]].blocks++;
    }
    var total = Math.max(1, this.liveAllocated);
    var filter = this.siteFilter.value.trim().toLowerCase();
    var rows = Array.from(sites.values()).map(function (s) { var lab = self.dd.sites[s.site]; return { label: lab[0], full: lab[1] || lab[0], bytes: s.bytes, blocks: s.blocks, order: s.site }; })
      .filter(function (r) { return !filter || r.label.toLowerCase().indexOf(filter) >= 0 || r.full.toLowerCase().indexOf(filter) >= 0; });
    sortableTable(this.siteTable, [
      { key: 'label', title: 'site', value: function (r) { return r.label; }, show: function (r) { return r.label; }, hover: function (r) { return r.full; } },
      { key: 'bytes', title: 'bytes', num: true, value: function (r) { return r.bytes; }, show: function (r) { return fmtBytes(r.bytes); }, hover: function (r) { return fmtCount(r.bytes) + ' bytes'; } },
      { key: 'share', title: 'share', num: true, value: function (r) { return r.bytes; }, show: function (r) { return pct(r.bytes, total); } },
      { key: 'blocks', title: 'blocks', num: true, value: function (r) { return r.blocks; }, show: function (r) { return fmtCount(r.blocks); } }
    ], rows, this.siteSort, function (k) { self.siteSort = { key: k, asc: self.siteSort.key === k ? !self.siteSort.asc : k === 'label' }; self.drawTables(); },
    { on: function (r) { return r.order === self.site; }, click: function (r) { self.setSite(r.order); } });
    this.siteTable.dataset.rows = String(rows.length);
    var cached = Math.max(0, this.liveReserved - this.liveAllocated);
    var crow = cats.filter(function (c) { return c.bytes > 0; });
    crow.push({ name: 'cached free (reserved, not allocated)', bytes: cached, blocks: 0, order: 99 });
    sortableTable(this.catTable, [
      { key: 'order', title: 'category', value: function (r) { return r.order; }, show: function (r) { return r.name; } },
      { key: 'bytes', title: 'bytes', num: true, value: function (r) { return r.bytes; }, show: function (r) { return fmtBytes(r.bytes); }, hover: function (r) { return fmtCount(r.bytes) + ' bytes'; } },
      { key: 'share', title: 'of reserved', num: true, value: function (r) { return r.bytes; }, show: function (r) { return pct(r.bytes, self.liveReserved); } }
    ], crow, this.catSort, function (k) { self.catSort = { key: k, asc: self.catSort.key === k ? !self.catSort.asc : k === 'order' }; self.drawTables(); });
    this.tableNote.textContent = this.dd.blocks_total > m.nb ? 'From the embedded blocks only (' + fmtCount(m.nb) + ' of ' + fmtCount(this.dd.blocks_total) + ').' : '';
  };

  // -------------------------------------------------- suspects
  // Mark `blocks` (embedded block indices) on the timeline (their allocated bytes over time,
  // ticks at their allocations) and in the segment map; `events` are marked too.
  Explorer.prototype.mark = function (blocks, events) {
    var m = this.m;
    if (!blocks) { this.highlight = null; this.suspectSteps = null; this.suspectEvents = null; return; }
    var hl = new Uint8Array(m.nb), allocs = [], changes = [];
    blocks.forEach(function (b) {
      hl[b] = 1;
      var a = Math.max(m.ba[b], -1), f = Math.min(m.bf[b], m.bc[b]);
      allocs.push(a);
      changes.push([a, m.bsize[b]]);
      if (f !== Infinity) changes.push([f, -m.bsize[b]]);
    });
    allocs.sort(function (x, y) { return x - y; });
    changes.sort(function (x, y) { return x[0] - y[0]; });
    var at = changes.map(function (c) { return c[0]; }), sum = new Float64Array(changes.length), run = 0;
    changes.forEach(function (c, j) { run += c[1]; sum[j] = run; });
    this.highlight = hl;
    this.suspectEvents = events;
    this.suspectSteps = { allocs: allocs, value: function (e) { var k = upperBound(at, e) - 1; return k >= 0 ? sum[k] : 0; } };
  };
  Explorer.prototype.setSuspect = function (i) {
    var m = this.m;
    this.suspect = i;
    this.site = -1;
    Array.prototype.forEach.call(this.susButtons.querySelectorAll('.ms-sus'), function (b) { b.classList.toggle('on', +b.dataset.suspect === i); });
    this.canvas.dataset.suspect = i < 0 ? '' : String(i);
    this.canvas.dataset.site = '';
    if (i < 0) { this.mark(null); this.panel.classList.add('ms-hidden'); this.setMoment(this.moment); return; }
    var s = D.suspects[i];
    this.mark(s.blocks, s.event !== null ? [s.event] : []);
    var p = [el('h4', { text: s.kind + ' · ' + s.severity }), el('p', null, el('b', { text: s.site ? 'at ' + s.site : 'no line of your code' }))];
    var marked = s.blocks.length ? fmtCount(s.blocks.length) + ' blocks marked (' + fmtBytes(s.blocks.reduce(function (t, b) { return t + m.bsize[b]; }, 0)) + '): those allocated at its lines that are still allocated ' + (s.severity === 'peak' ? 'at the peak' : 'at the end') +
      (s.blocks_matched > s.blocks.length ? '; ' + fmtCount(s.blocks_matched - s.blocks.length) + ' more not embedded' : '') + '.' : (s.event !== null ? 'Marked: the out-of-memory event ' + fmtCount(s.event) + '.' : 'About the allocator\'s layout: see the segment map.');
    p.push(el('p', { class: 'ms-note', text: marked }));
    p.push(el('p', null, el('b', { text: 'Evidence. ' }), s.evidence));
    p.push(el('p', null, el('b', { text: 'Fix. ' }), s.advice));
    this.panel.replaceChildren.apply(this.panel, p);
    this.panel.classList.remove('ms-hidden');
    if (s.event !== null) this.zoomTo(s.event);
    if (s.moment !== null) this.setMoment(s.moment); else this.setMoment(this.moment);
  };
  // Mark every embedded block of one site (a row of the site table): any site gets its band.
  Explorer.prototype.setSite = function (site) {
    var m = this.m;
    if (this.suspect >= 0) { cards.forEach(function (c) { c.classList.remove('ms-on'); }); }
    this.suspect = -1;
    Array.prototype.forEach.call(this.susButtons.querySelectorAll('.ms-sus'), function (b) { b.classList.remove('on'); });
    this.canvas.dataset.suspect = '';
    if (site === this.site || site < 0) { this.site = -1; this.canvas.dataset.site = ''; this.mark(null); this.panel.classList.add('ms-hidden'); this.setMoment(this.moment); return; }
    this.site = site;
    var blocks = [];
    for (var i = 0; i < m.nb; i++) if (m.bsite[i] === site) blocks.push(i);
    this.mark(blocks, []);
    this.canvas.dataset.site = String(site);
    var lab = this.dd.sites[site], bytes = blocks.reduce(function (t, b) { return t + m.bsize[b]; }, 0);
    this.panel.replaceChildren(el('h4', { text: 'site' }), el('p', null, el('b', { text: lab[0] })), el('p', { class: 'ms-note', text: lab[1] }),
      el('p', { class: 'ms-note', text: fmtCount(blocks.length) + ' embedded blocks over the trace (' + fmtBytes(bytes) + ' allocated in all); their live bytes are drawn in red on the chart and outlined in the segment map. Click the row again to clear.' }));
    this.panel.classList.remove('ms-hidden');
    this.setMoment(this.moment);
  };

  // ---------------------------------------------------------------- the page
  var sections = Array.prototype.slice.call(document.querySelectorAll('section.ms-device'));
  var explorers = {};
  function explorerOf(device) {
    if (!explorers[device]) {
      var dd = D.devices.find(function (x) { return x.device === device; });
      var sec = sections.find(function (x) { return +x.dataset.device === device; });
      if (!dd || !sec) return null;
      explorers[device] = new Explorer(sec, dd);
    }
    return explorers[device];
  }
  var current = null;
  var pickerButtons = [], pickerSelect = null;
  function showDevice(device) {
    current = device;
    sections.forEach(function (s) { s.classList.toggle('ms-hidden', +s.dataset.device !== device); });
    pickerButtons.forEach(function (b) { b.classList.toggle('on', +b.dataset.device === device); });
    if (pickerSelect) pickerSelect.value = String(device);
    var ex = explorerOf(device);
    if (ex) { ex.drawTimeline(); ex.drawSegmap(); ex.drawFlame(); }
    document.documentElement.dataset.device = String(device);
    return ex;
  }
  function setShowAll(v) {
    showAllFrames = v;
    Object.keys(explorers).forEach(function (k) { var ex = explorers[k]; ex.allFrames.checked = v; if (ex.lastDetails) ex.showDetails(ex.lastDetails); });
  }
  function selectSuspect(i) {
    var s = D.suspects[i];
    if (!s) return;
    if (current !== s.device) showDevice(s.device);
    var ex = explorerOf(s.device);
    if (!ex) return;
    Object.keys(explorers).forEach(function (k) { if (+k !== s.device) explorers[k].setSuspect(-1); });
    ex.setSuspect(ex.suspect === i ? -1 : i);
    cards.forEach(function (c, j) { c.classList.toggle('ms-on', ex.suspect === j); });
  }
  // The verdict's cards, in the same order as D.suspects.
  var cards = Array.prototype.slice.call(document.querySelectorAll('.verdict .suspect'));
  cards.forEach(function (c, i) {
    if (!D.suspects[i]) return;
    c.classList.add('ms-clickable');
    c.dataset.suspect = String(i);
    c.append(el('button', { class: 'ms-b ms-show-suspect', type: 'button', onclick: function (evt) { evt.stopPropagation(); selectSuspect(i); var ex = explorers[D.suspects[i].device]; if (ex) ex.canvas.scrollIntoView({ block: 'center' }); } }, 'show on the timeline and the segment map'));
    c.addEventListener('click', function (evt) { if (evt.target.closest('summary, a, button')) return; selectSuspect(i); });
  });
  if (D.devices.length > 1) {
    var picker = el('div', { class: 'ms-picker' }, el('b', { text: 'Device' }));
    var label = function (dd) { return 'cuda:' + dd.device + ' · peak ' + fmtBytes(dd.peak.allocated); };
    if (D.devices.length <= PICKER_BUTTONS) {
      D.devices.forEach(function (dd) {
        var b = el('button', { type: 'button', class: 'ms-device-button', 'data-device': String(dd.device), onclick: function () { showDevice(dd.device); } }, label(dd));
        pickerButtons.push(b);
        picker.append(b);
      });
    } else {
      var select = el('select', { class: 'ms-device-select', 'aria-label': 'device' });
      D.devices.forEach(function (dd) { select.append(el('option', { value: String(dd.device), text: label(dd) })); });
      select.addEventListener('change', function () { showDevice(+select.value); });
      picker.append(select);
      pickerSelect = select;
    }
    var firstSection = sections[0];
    if (firstSection) firstSection.before(picker);
  }
  if (D.devices.length) {
    // The device of the first suspect, else the first.
    showDevice(D.suspects.length ? D.suspects[0].device : D.devices[0].device);
  }
  window.memsnap = { data: D, explorer: explorerOf, showDevice: showDevice, selectSuspect: selectSuspect };
  window.memsnapOpenMs = performance.now();
  document.documentElement.dataset.ready = '1';
})();
