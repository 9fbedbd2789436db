// The dashboard's page: one view of a run, fed either live over a WebSocket (launch
// --dashboard) or from the run's files inlined by `peertrain report`
// (window.PEERTRAIN_RUN). Both give the same object:
//   { graph: graph.json, config: {...}, evals: [@eval objects], events: [...],
//     progress: @progress object | null, summary: summary.json | null }
// The graph is drawn as SVG (peers at the spectral layout's places); the curves with
// Chart.js. #stats carries what the browser test reads (counts, states), nothing else.
(function () {
  'use strict';
  const run = { graph: null, config: {}, evals: [], events: [], progress: null, summary: null };
  let mode = 'live', connection = 'connecting', seq = 0, pending = false, resyncing = false;
  const charts = {};
  const $ = (id) => document.getElementById(id);
  const svgNS = 'http://www.w3.org/2000/svg';

  function human(bytes) {
    const units = ['B', 'KB', 'MB', 'GB', 'TB'];
    let u = 0;
    while (bytes >= 1000 && u < units.length - 1) { bytes /= 1000; ++u; }
    return bytes.toPrecision(3) + ' ' + units[u];
  }
  const last = (a, k = 1) => a.length >= k ? a[a.length - k] : null;
  const peerColor = (i, n) => `hsl(${Math.round(360 * i / Math.max(n, 1))}, 65%, 48%)`;

  // ---- what each peer is doing now -------------------------------------------------
  function reportOf(ev, p) { return ev ? ev.peers.find((r) => r.peer === p) : undefined; }

  function peerStates() {
    const n = run.graph ? run.graph.peers.length : 0;
    const now = last(run.evals), before = last(run.evals, 2);
    const states = [];
    for (let p = 0; p < n; ++p) {
      let state = now ? 'training' : 'starting';
      const mine = reportOf(now, p), earlier = reportOf(before, p);
      if (mine && earlier && mine.wall > earlier.wall) {
        const share = (mine.wait - earlier.wait) / (mine.wall - earlier.wall);
        if (share > 0.5) state = 'waiting';
      }
      if (now && (now.lost.includes(p) || !mine)) state = 'lost';
      // launch saw the process end: lost until a later evaluation hears from it again.
      for (const e of run.events)
        if (e.kind === 'lost' && e.peer === p && !run.evals.some((ev) => ev.step > e.after_step && reportOf(ev, p)))
          state = 'lost';
      if (state !== 'lost' && now && now.rejoined.includes(p) && before && (!earlier || before.lost.includes(p)))
        state = 'rejoining';
      if (state !== 'lost' && run.summary && !run.summary.error) state = 'finished';
      states.push(state);
    }
    return states;
  }

  // ---- the graph ---------------------------------------------------------------------
  function drawGraph(states) {
    const svg = document.querySelector('#graph svg');
    const g = run.graph;
    if (!g) return;
    const n = g.peers.length, r = Math.min(0.09, Math.max(0.025, 1.6 / n));
    const now = last(run.evals), before = last(run.evals, 2);
    const rates = g.links.map((l, k) => {
      if (!now || !now.links) return 0;
      const dt = before ? now.wall_s - before.wall_s : now.wall_s;
      const db = Math.max(0, now.links[k] - (before && before.links ? before.links[k] : 0));  // counters restart with a process
      return dt > 0 ? db / dt : 0;
    });
    const top = Math.max(1, ...rates);
    svg.textContent = '';
    g.links.forEach((l, k) => {
      const a = g.peers[l.a], b = g.peers[l.b];
      const line = document.createElementNS(svgNS, 'line');
      line.setAttribute('class', 'link');
      line.setAttribute('x1', a.x); line.setAttribute('y1', a.y);
      line.setAttribute('x2', b.x); line.setAttribute('y2', b.y);
      line.setAttribute('stroke-width', (0.006 + 0.045 * rates[k] / top).toFixed(4));
      line.dataset.throughput = rates[k].toFixed(0);
      const title = document.createElementNS(svgNS, 'title');
      title.textContent = `${l.a}–${l.b}: ${human(rates[k])}/s, W = ${l.w.toFixed(3)}` +
        (l.bandwidth_mbps ? `, capped at ${l.bandwidth_mbps} Mbit/s` : '') + (l.latency_ms ? `, ${l.latency_ms} ms` : '');
      line.appendChild(title);
      svg.appendChild(line);
    });
    g.peers.forEach((p, i) => {
      const group = document.createElementNS(svgNS, 'g');
      const coordinator = now && now.coordinator === i;
      group.setAttribute('class', `peer state-${states[i]}` + (coordinator ? ' coordinator' : ''));
      group.dataset.peer = i;
      group.dataset.state = states[i];
      const c = document.createElementNS(svgNS, 'circle');
      c.setAttribute('cx', p.x); c.setAttribute('cy', p.y); c.setAttribute('r', r);
      c.setAttribute('vector-effect', 'non-scaling-stroke');
      const title = document.createElementNS(svgNS, 'title');
      const mine = reportOf(now, i);
      title.textContent = `peer ${i} (${p.host}): ${states[i]}` + (coordinator ? ', coordinator' : '') +
        (mine ? `, step ${mine.step}, loss ${mine.loss.toFixed(4)}, sent ${human(mine.sent)}` : '') +
        (p.slowdown > 1 ? `, straggler ×${p.slowdown}` : '');
      c.appendChild(title);
      group.appendChild(c);
      if (n <= 64) {
        const t = document.createElementNS(svgNS, 'text');
        t.setAttribute('x', p.x); t.setAttribute('y', p.y);
        t.setAttribute('font-size', (r * 1.1).toFixed(3));
        t.textContent = i;
        group.appendChild(t);
      }
      svg.appendChild(group);
    });
    const total = rates.reduce((s, v) => s + v, 0);
    $('linkinfo').textContent = !now ? 'waiting for the first evaluation' : !now.links ?
      'this run did not record the bytes on each link (written by an older peertrain): links drawn without throughput' :
      `links carry ${human(total)}/s in all since the last evaluation; the busiest ${human(top)}/s (line width is relative to it)`;
  }

  // ---- the curves ----------------------------------------------------------------------
  function chart(id, config) {
    if (!window.Chart) { $('nochart').hidden = false; return null; }
    if (!charts[id]) {
      config.options = Object.assign({ animation: false, maintainAspectRatio: false, parsing: false, normalized: true,
        plugins: { legend: { display: config.legend !== false, labels: { boxWidth: 10, font: { size: 11 } } } } },
        config.options || {});
      charts[id] = new Chart($(id).getContext('2d'), config);
    }
    return charts[id];
  }

  function drawCurves() {
    const g = run.graph, n = g ? g.peers.length : 0, evals = run.evals;
    const text = evals.some((e) => e.avg_bpb !== undefined);
    const lossChart = chart('loss', { type: 'line', data: { datasets: [] }, options: {
      scales: { x: { type: 'linear', title: { display: true, text: 'step' } }, y: { title: { display: true, text: 'loss' } } } } });
    if (lossChart) {
      const perPeer = [];
      if (n <= 32)
        for (let p = 0; p < n; ++p)
          perPeer.push({ label: `peer ${p}`, borderColor: peerColor(p, n), borderWidth: 1, pointRadius: 0,
            data: evals.filter((e) => reportOf(e, p)).map((e) => ({ x: e.step, y: reportOf(e, p).loss })) });
      lossChart.data.datasets = [{ label: 'mean', borderColor: '#111', borderWidth: 3, pointRadius: 2,
        data: evals.map((e) => ({ x: e.step, y: e.loss })) }].concat(perPeer);
      lossChart.options.plugins.legend.display = n <= 8;
      lossChart.update('none');
    }
    $('metric-title').textContent = text ? 'Validation bits per byte of x̄ (the peers\' average)' :
      'Test accuracy of x̄ (the peers\' average) and of the local models';
    const metricChart = chart('metric', { type: 'line', data: { datasets: [] }, options: {
      scales: { x: { type: 'linear', title: { display: true, text: 'step' } } } } });
    if (metricChart) {
      const key = text ? 'avg_bpb' : 'avg_acc';
      const local = evals.map((e) => ({ x: e.step, y: e.peers.reduce((s, r) => s + (text ? r.bpb : r.acc), 0) / Math.max(e.peers.length, 1) }));
      metricChart.data.datasets = [
        { label: text ? 'x̄ bits/byte' : 'x̄ accuracy', borderColor: '#2186eb', borderWidth: 3, pointRadius: 2,
          data: evals.map((e) => ({ x: e.step, y: e[key] })) },
        { label: 'mean of the local models', borderColor: '#9aa5b1', borderDash: [4, 3], pointRadius: 0, data: local }];
      metricChart.update('none');
    }
    const consensusChart = chart('consensus', { type: 'line', data: { datasets: [] }, options: {
      scales: { x: { type: 'linear', title: { display: true, text: 'step' } }, y: { type: 'logarithmic' } } } });
    if (consensusChart) {
      consensusChart.data.datasets = [{ label: 'measured', borderColor: '#7b2cbf', borderWidth: 2, pointRadius: 2,
        data: evals.filter((e) => e.consensus > 0).map((e) => ({ x: e.step, y: e.consensus })) }];
      consensusChart.update('none');
    }
    if (g) $('prediction').textContent = g.spectral_gap > 0 ?
      `Spectral gap ${g.spectral_gap.toPrecision(3)}: gossip alone shrinks the distance by (1 − gap)² = ` +
      `${g.contraction_per_step.toPrecision(3)} per step; in training the gradients hold it at a level that ` +
      `grows as the gap shrinks (experiments/consensus).` : '';
    const timeChart = chart('time', { type: 'bar', data: { labels: [], datasets: [] }, options: {
      indexAxis: 'y', parsing: true, scales: { x: { stacked: true, title: { display: true, text: 'seconds' } }, y: { stacked: true } } } });
    if (timeChart) {
      const now = last(evals), before = last(evals, 2);
      const rows = now ? now.peers.map((r) => {
        const b = reportOf(before, r.peer) || { wall: 0, compute: 0, wait: 0 };
        const wall = r.wall - b.wall, compute = r.compute - b.compute, wait = r.wait - b.wait;
        return { peer: r.peer, compute, wait, other: Math.max(0, wall - compute - wait) };
      }) : [];
      timeChart.data.labels = rows.map((r) => `peer ${r.peer}`);
      timeChart.data.datasets = [
        { label: 'compute', backgroundColor: '#3ebd5d', data: rows.map((r) => r.compute) },
        { label: 'waiting for peers', backgroundColor: '#f0b429', data: rows.map((r) => r.wait) },
        { label: 'other (sending, evaluation, overhead)', backgroundColor: '#9aa5b1', data: rows.map((r) => r.other) }];
      timeChart.update('none');
    }
  }

  // ---- the run: header, configuration, events ------------------------------------------
  function drawRun(states) {
    const g = run.graph, c = run.config || {}, p = run.progress;
    $('title').textContent = `peertrain · ${g ? g.name : ''} · ${c.algorithm || ''} · ${g ? g.peers.length : '?'} peers`;
    let status = mode === 'report' ? 'finished run (report)' : connection;
    if (mode === 'live' && run.summary) status = run.summary.error ? 'failed' : 'finished';
    else if (mode === 'live' && connection === 'connected') status = 'running';
    const s = $('status');
    s.textContent = status;
    s.className = 'status ' + status.split(' ')[0];
    const step = p ? p.step : (last(run.evals) ? last(run.evals).step : 0);
    const total = p ? p.total_steps : (run.summary ? run.summary.steps : 0);
    $('where').textContent = p ? `step ${p.step}/${p.total_steps} · epoch ${Number(p.epoch).toFixed(2)} · ` +
      `${Math.round(p.items_per_s)} items/s` : (total ? `${total} steps` : '');
    document.querySelector('#bar div').style.width = total ? `${Math.min(100, 100 * step / total)}%` : '0';
    if (g) $('gap').textContent = `spectral gap ${g.spectral_gap.toPrecision(3)} · λ₂ ${g.lambda2.toPrecision(3)}`;
    const table = $('config');
    table.textContent = '';
    const rows = Object.entries(c).filter(([, v]) => typeof v !== 'object');
    for (const [k, v] of rows) {
      const tr = table.insertRow();
      tr.insertCell().textContent = k;
      tr.insertCell().textContent = String(v);
    }
    const list = $('events');
    list.textContent = '';
    const lines = [];
    let coordinator = null, lost = new Set();
    for (const ev of run.evals) {
      if (coordinator !== null && ev.coordinator !== coordinator) lines.push(`step ${ev.step}: peer ${ev.coordinator} coordinates (took over from ${coordinator})`);
      coordinator = ev.coordinator;
      for (const q of ev.lost) if (!lost.has(q)) lines.push(`step ${ev.step}: peer ${q} lost`);
      for (const q of ev.rejoined) if (lost.has(q) && !ev.lost.includes(q)) lines.push(`step ${ev.step}: peer ${q} rejoined`);
      lost = new Set(ev.lost);
    }
    for (const e of run.events)
      lines.push(e.kind === 'lost' ? `peer ${e.peer} ${e.reason} (after step ${e.after_step})` : e.text || e.kind);
    if (run.summary && run.summary.error) lines.push(`error: ${run.summary.error}`);
    for (const l of lines.length ? lines : ['none so far']) {
      const li = document.createElement('li');
      li.textContent = l;
      list.appendChild(li);
    }
    const stats = $('stats');
    stats.dataset.peers = document.querySelectorAll('#graph .peer').length;
    stats.dataset.links = document.querySelectorAll('#graph .link').length;
    stats.dataset.evals = run.evals.length;
    stats.dataset.points = charts.loss ? charts.loss.data.datasets[0].data.length : 0;
    stats.dataset.lost = states.map((st, i) => st === 'lost' ? i : -1).filter((i) => i >= 0).join(',');
    stats.dataset.states = states.join(',');
    stats.dataset.step = step;
    stats.dataset.status = status;
  }

  function render() {
    pending = false;
    if (!run.graph) return;
    const states = peerStates();
    drawGraph(states);
    drawCurves();
    drawRun(states);
  }
  function schedule() {
    if (!pending) { pending = true; setTimeout(render, 100); }  // at most ten redraws a second
  }

  // ---- live: a snapshot, then updates; a gap in the sequence asks for a new snapshot ----
  function connect() {
    const token = new URLSearchParams(location.search).get('token') || '';
    const ws = new WebSocket(`${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/ws?token=${encodeURIComponent(token)}`);
    ws.onopen = () => { connection = 'connected'; resyncing = false; schedule(); };
    ws.onmessage = (e) => {
      const m = JSON.parse(e.data);
      if (m.type === 'snapshot') {
        Object.assign(run, { graph: m.graph, config: m.config, evals: m.evals, events: m.events, progress: m.progress, summary: m.summary });
        seq = m.seq;
        resyncing = false;
      } else if (resyncing) {
        return;  // asked for a snapshot already: everything before it is in it
      } else if (m.seq !== seq + 1) {
        resyncing = true;
        ws.send('{"type":"resync"}');  // dropped while we were slow: start again from the whole state
        return;
      } else {
        seq = m.seq;
        if (m.type === 'eval') run.evals.push(m.data);
        else if (m.type === 'event') run.events.push(m.data);
        else if (m.type === 'progress') run.progress = m.data;
        else if (m.type === 'summary') run.summary = m.data;
      }
      schedule();
    };
    ws.onclose = () => {
      connection = run.summary ? connection : 'disconnected';
      schedule();
      if (!run.summary) setTimeout(connect, 1000);
    };
  }

  window.peertrainDashboard = { run, render };
  if (window.PEERTRAIN_RUN) {
    mode = 'report';
    Object.assign(run, window.PEERTRAIN_RUN);
    render();
  } else {
    connect();
  }
})();
