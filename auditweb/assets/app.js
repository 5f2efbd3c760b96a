// cgledger audit page (docs/audit-api.md, "Audit web page"): a read-only
// client of the audit API under /v1. Hand-written, no framework, no build.
//
// The data is untrusted (entries hold whatever agents sent): every string
// reaches the DOM as a text node or through textContent, never as HTML, and
// the Content-Security-Policy (Trusted Types with no policy) makes the
// browser refuse any HTML written from a string. Links are built here from
// "#" and encoded ids only.
'use strict';

(() => {
  const TOKEN_KEY = 'cgledger.audit.jwt';
  const STATUSES = ['success', 'failed', 'canceled', 'timeout', 'partial'];
  const STATES = ['dispatched', 'reported', 'consumed', 'rejected'];
  const CALL_FILTERS = ['tool', 'agent', 'channel', 'status', 'state', 'from', 'to', 'limit'];
  const AS_OF = ['as_of_seq', 'as_of'];

  const q = (sel) => document.querySelector(sel);
  const byTestID = (id) => q('[data-testid="' + id + '"]');
  const main = byTestID('main');

  // ---- DOM, as text only -------------------------------------------------

  // Characters that would hide or reorder what is shown (controls but tab
  // and line feed, bidi overrides, zero-width): shown as \uXXXX escapes.
  const INVISIBLE = /[\u0000-\u0008\u000B-\u001F\u007F-\u009F\u00AD\u061C\u180E\u200B-\u200F\u2028-\u202E\u2060-\u206F\uFEFF\uFFF9-\uFFFB]/g;
  function shown(s) {
    return String(s).replace(INVISIBLE, (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
  }

  function text(s) {
    return document.createTextNode(shown(s));
  }

  // h builds an element: attrs.text sets textContent, testid sets
  // data-testid, data sets data-* attributes, on* adds listeners; children
  // that are not nodes become text nodes.
  function h(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'text') e.textContent = shown(v);
      else if (k === 'testid') e.setAttribute('data-testid', v);
      else if (k === 'class') e.className = v;
      else if (k === 'data') for (const [dk, dv] of Object.entries(v)) { if (dv !== undefined && dv !== null) e.dataset[dk] = String(dv); }
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else if (k === 'href') {
        if (!String(v).startsWith('#')) throw new Error('internal: a link must stay on this page');
        e.setAttribute('href', v);
      } else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === undefined || kid === null || kid === false) continue;
      e.appendChild(kid instanceof Node ? kid : text(kid));
    }
    return e;
  }

  // ---- JSON, as it was written ---------------------------------------------

  // parseJSON parses like JSON.parse and also remembers, for each object and
  // array, its members as written: order, repeated keys and the digits of
  // numbers (JSON.parse rounds 12345678901234567890), so that pretty() shows
  // an entry's data exactly.
  const SOURCE = new WeakMap();

  function parseJSON(src) {
    let i = 0;
    const NUM = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;
    const fail = (what) => { throw new SyntaxError('invalid JSON at offset ' + i + ': ' + what); };
    const ws = () => {
      for (;;) {
        const c = src.charCodeAt(i);
        if (c === 32 || c === 9 || c === 10 || c === 13) i++; else return;
      }
    };
    const put = (obj, k, v) => Object.defineProperty(obj, k, { value: v, writable: true, enumerable: true, configurable: true });
    function str() {
      const start = i;
      for (i++; i < src.length; i++) {
        const c = src[i];
        if (c === '\\') i++;
        else if (c === '"') { i++; return JSON.parse(src.slice(start, i)); }
      }
      return fail('unterminated string');
    }
    function value() {
      ws();
      const c = src[i];
      if (c === '{') {
        i++;
        const v = {}; const m = [];
        ws();
        if (src[i] === '}') { i++; } else {
          for (;;) {
            ws();
            if (src[i] !== '"') fail('expected a key');
            const k = str();
            ws();
            if (src[i] !== ':') fail('expected ":"');
            i++;
            const n = value();
            m.push([k, n]);
            put(v, k, n.v);
            ws();
            if (src[i] === ',') { i++; continue; }
            if (src[i] === '}') { i++; break; }
            fail('expected "," or "}"');
          }
        }
        const node = { t: 'o', m, v };
        SOURCE.set(v, node);
        return node;
      }
      if (c === '[') {
        i++;
        const v = []; const m = [];
        ws();
        if (src[i] === ']') { i++; } else {
          for (;;) {
            const n = value();
            m.push(n);
            v.push(n.v);
            ws();
            if (src[i] === ',') { i++; continue; }
            if (src[i] === ']') { i++; break; }
            fail('expected "," or "]"');
          }
        }
        const node = { t: 'a', m, v };
        SOURCE.set(v, node);
        return node;
      }
      if (c === '"') return { t: 's', v: str() };
      for (const [word, v] of [['true', true], ['false', false], ['null', null]]) {
        if (src.startsWith(word, i)) { i += word.length; return { t: 'l', v }; }
      }
      NUM.lastIndex = i;
      const num = NUM.exec(src);
      if (!num) fail('unexpected ' + (i < src.length ? JSON.stringify(src[i]) : 'end'));
      i = NUM.lastIndex;
      return { t: 'n', src: num[0], v: Number(num[0]) };
    }
    let root;
    try {
      root = value();
      ws();
      if (i !== src.length) fail('trailing data');
    } catch (e) {
      // Nesting deeper than the stack: JSON.parse still reads it (numbers
      // beyond 2^53 then lose digits in pretty()).
      if (e instanceof RangeError) return JSON.parse(src);
      throw e;
    }
    return root.v;
  }

  // nodeOf is the written form of value, or one built from it.
  function nodeOf(v) {
    if (v !== null && typeof v === 'object') {
      const n = SOURCE.get(v);
      if (n) return n;
      if (Array.isArray(v)) return { t: 'a', m: v.map(nodeOf), v };
      return { t: 'o', m: Object.entries(v).map(([k, x]) => [k, nodeOf(x)]), v };
    }
    if (typeof v === 'string') return { t: 's', v };
    if (typeof v === 'number') return { t: 'n', src: String(v), v };
    return { t: 'l', v };
  }

  // member is the written form of obj[key] (the last of repeated keys, as
  // the value itself).
  function member(obj, key) {
    const n = SOURCE.get(obj);
    if (n && n.t === 'o') {
      for (let j = n.m.length - 1; j >= 0; j--) if (n.m[j][0] === key) return n.m[j][1];
    }
    return nodeOf(obj[key]);
  }

  function prettyNode(n, ind) {
    const inner = ind + '  ';
    switch (n.t) {
      case 'o':
        if (n.m.length === 0) return '{}';
        return '{\n' + n.m.map(([k, c]) => inner + JSON.stringify(k) + ': ' + prettyNode(c, inner)).join(',\n') + '\n' + ind + '}';
      case 'a':
        if (n.m.length === 0) return '[]';
        return '[\n' + n.m.map((c) => inner + prettyNode(c, inner)).join(',\n') + '\n' + ind + ']';
      case 's': return JSON.stringify(n.v);
      case 'n': return n.src;
      default: return String(n.v);
    }
  }

  // jsonBlock shows a JSON value in full: indented, wrapped, never cut.
  function jsonBlock(node, testid) {
    return h('pre', { class: 'json', testid }, prettyNode(node, ''));
  }

  // ---- times ---------------------------------------------------------------

  const TIME_RE = /^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$/;

  // utc shows an RFC 3339 time in UTC with every digit of its fraction.
  function utc(s) {
    const m = TIME_RE.exec(String(s));
    if (!m) return String(s);
    if (m[4] === 'Z') return s;
    const ms = Date.parse(m[1] + 'T' + m[2] + m[4]);
    if (Number.isNaN(ms)) return String(s);
    return new Date(ms).toISOString().slice(0, 19) + (m[3] || '') + 'Z';
  }

  function timeEl(s, testid) {
    if (s === undefined || s === null || s === '') return h('span', { class: 'muted', testid }, '—');
    return h('time', { datetime: String(s), testid, class: 'mono' }, utc(s));
  }

  // ---- credential ----------------------------------------------------------

  function token() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch { return ''; }
  }

  // extractJWT takes a whole .creds file or a bare JWT.
  function extractJWT(input) {
    const s = input.trim();
    const m = /-----BEGIN NATS USER JWT-----\s*(\S+)\s*------END NATS USER JWT------/.exec(s);
    let jwt = m ? m[1] : s.replace(/^Bearer\s+/i, '');
    if (!m && /-----BEGIN /.test(s)) throw new Error('no user JWT found: paste the whole .creds file, with its "-----BEGIN NATS USER JWT-----" and "------END NATS USER JWT------" lines, or only the JWT');
    if (jwt === '') throw new Error('paste a credential first');
    if (!/^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/.test(jwt)) throw new Error('this is not a JWT (three base64url parts separated by dots) nor a .creds file');
    return jwt;
  }

  // claims reads what the JWT says about itself, for display only: the
  // server checks it on every request.
  function claims(jwt) {
    try {
      const b64 = jwt.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
      const bytes = Uint8Array.from(atob(b64 + '='.repeat((4 - b64.length % 4) % 4)), (c) => c.charCodeAt(0));
      const c = JSON.parse(new TextDecoder().decode(bytes));
      let grant = {};
      try { grant = JSON.parse(c.name); } catch { /* not a cgledger grant */ }
      return { role: grant.role, project: grant.project, exp: c.exp };
    } catch {
      return {};
    }
  }

  function showAuthState() {
    const tok = token();
    const state = byTestID('auth-state');
    byTestID('signout').hidden = !tok;
    byTestID('signin-open').hidden = !!tok;
    if (!tok) { state.textContent = 'no credential'; return; }
    const c = claims(tok);
    let s = 'credential';
    if (c.role) s += ': ' + c.role + ' of ' + (c.project === '*' ? 'every project (*)' : 'project ' + c.project);
    const exp = new Date(Number(c.exp) * 1000);
    if (c.exp && !Number.isNaN(exp.getTime())) s += ', expires ' + exp.toISOString().replace('.000Z', 'Z') + ' (UTC)';
    state.textContent = shown(s);
  }

  function showSignIn(reason) {
    const panel = byTestID('signin');
    const r = byTestID('signin-reason');
    r.hidden = !reason;
    r.textContent = reason ? shown(reason) : '';
    byTestID('signin-error').hidden = true;
    panel.hidden = false;
    byTestID('signin-input').focus();
  }

  byTestID('signin-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const input = byTestID('signin-input');
    const err = byTestID('signin-error');
    let jwt;
    try {
      jwt = extractJWT(input.value);
    } catch (e) {
      err.textContent = shown(e.message);
      err.hidden = false;
      return;
    }
    try {
      sessionStorage.setItem(TOKEN_KEY, jwt);
    } catch (e) {
      err.textContent = shown('cannot keep the credential in session storage: ' + e.message);
      err.hidden = false;
      return;
    }
    input.value = '';
    byTestID('signin').hidden = true;
    showAuthState();
    render();
  });
  byTestID('signin-cancel').addEventListener('click', () => { byTestID('signin').hidden = true; });
  byTestID('signin-open').addEventListener('click', (ev) => { ev.preventDefault(); showSignIn(''); });
  byTestID('signout').addEventListener('click', (ev) => {
    ev.preventDefault();
    try { sessionStorage.removeItem(TOKEN_KEY); } catch { /* nothing kept */ }
    showAuthState();
    render();
  });

  // ---- the API -------------------------------------------------------------

  class APIError extends Error {
    constructor(status, code, message, violations) {
      super(message);
      this.status = status;
      this.code = code;
      this.violations = violations || [];
    }
  }

  // api GETs a /v1 path with query parameters (empty ones left out), with
  // the credential when there is one.
  async function api(path, params) {
    const url = new URL(path, location.origin);
    for (const [k, v] of params || []) if (v !== '' && v !== undefined && v !== null) url.searchParams.set(k, v);
    const headers = { Accept: 'application/json' };
    const tok = token();
    if (tok) headers.Authorization = 'Bearer ' + tok;
    let resp;
    try {
      resp = await fetch(url, { headers, cache: 'no-store', credentials: 'omit', redirect: 'error' });
    } catch (e) {
      throw new APIError(0, 'network', 'cannot reach the server: ' + e.message);
    }
    const body = await resp.text();
    let v = null;
    try { v = parseJSON(body); } catch { /* not JSON */ }
    if (!resp.ok) {
      // Problem details (RFC 9457: code, detail, violations), or the older
      // {"error": {"code", "message", "violations"}}.
      const p = v && typeof v === 'object' ? v : {};
      const old = p.error && typeof p.error === 'object' ? p.error : {};
      const vs = Array.isArray(p.violations) ? p.violations : Array.isArray(old.violations) ? old.violations : [];
      throw new APIError(resp.status, String(p.code || old.code || 'http_' + resp.status),
        String(p.detail || old.message || p.title || body.trim() || resp.statusText), vs);
    }
    if (v === null || typeof v !== 'object') throw new APIError(resp.status, 'bad_response', 'the server answered ' + url.pathname + ' with something that is not a JSON object');
    return v;
  }

  const enc = encodeURIComponent;

  // violationText shows one {field, code, message}.
  function violationText(x) {
    if (!x || typeof x !== 'object') return String(x);
    return String(x.field ?? '') + ' (' + String(x.code ?? '') + '): ' + String(x.message ?? '');
  }

  function errorBox(e, testid) {
    const vs = (e.violations || []).map((x) => h('li', { testid: 'error-violation' }, violationText(x)));
    return h('div', { class: 'error', testid: testid || 'error', role: 'alert', data: { status: e.status, code: e.code } },
      h('strong', { testid: 'error-code' }, (e.status ? 'HTTP ' + e.status + ' ' : '') + (e.code || 'error')),
      ': ', h('span', { testid: 'error-message' }, e.message),
      vs.length ? h('ul', {}, vs) : null);
  }

  // fetchInto runs api and, on an error other than 401, shows it in view
  // and returns null; a 401 goes up to render, which asks for a credential.
  async function fetchInto(view, path, params, testid) {
    try {
      return await api(path, params);
    } catch (e) {
      if (e.status === 401) throw e;
      view.append(errorBox(e, testid));
      return null;
    }
  }

  // ---- routes --------------------------------------------------------------

  // Routes: #/ (projects), #/chain, #/p/P/calls, #/p/P/turns/T,
  // #/p/P/calls/C; the query after "?" holds filters and as_of_seq/as_of.
  function parseRoute() {
    const raw = location.hash.replace(/^#/, '') || '/';
    const qi = raw.indexOf('?');
    const path = qi < 0 ? raw : raw.slice(0, qi);
    const params = new URLSearchParams(qi < 0 ? '' : raw.slice(qi + 1));
    const seg = path.split('/').filter((s) => s !== '').map((s) => { try { return decodeURIComponent(s); } catch { return s; } });
    const r = { view: 'notfound', params, seg };
    if (seg.length === 0) r.view = 'projects';
    else if (seg.length === 1 && seg[0] === 'chain') r.view = 'chain';
    else if (seg[0] === 'p' && seg.length >= 2) {
      r.project = seg[1];
      if (seg.length === 2 || (seg.length === 3 && seg[2] === 'calls')) r.view = 'calls';
      else if (seg.length === 4 && seg[2] === 'turns') { r.view = 'timeline'; r.turn = seg[3]; }
      else if (seg.length === 4 && seg[2] === 'calls') { r.view = 'story'; r.call = seg[3]; }
    }
    return r;
  }

  function link(segments, params) {
    const p = '#/' + segments.map(enc).join('/');
    const qs = params ? params.toString() : '';
    return qs ? p + '?' + qs : p;
  }

  // asOf keeps only the as-of parameters of params (plus extra ones).
  function asOf(params, extra) {
    const p = new URLSearchParams();
    for (const k of AS_OF) if (params.get(k)) p.set(k, params.get(k));
    for (const [k, v] of Object.entries(extra || {})) if (v) p.set(k, v);
    return p;
  }

  function go(hash) {
    if (location.hash === hash || (hash === '#/' && location.hash === '')) render();
    else location.hash = hash;
  }

  const projectLink = (route, p) => link(['p', p, 'calls'], asOf(route.params));
  const turnLink = (route, p, t) => link(['p', p, 'turns', t], asOf(route.params));
  const callLink = (route, p, c, t) => link(['p', p, 'calls', c], asOf(route.params, { turn: t }));

  // ---- the as-of control ---------------------------------------------------

  const asofInput = byTestID('asof-input');
  byTestID('asof-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    setAsOf(asofInput.value.trim());
  });
  byTestID('asof-clear').addEventListener('click', () => setAsOf(''));

  // setAsOf applies a sequence (digits) or a time (anything else: the
  // server says when it is not RFC 3339) to the current view. A page cursor
  // belongs to the answer it came from, so it is dropped.
  function setAsOf(v) {
    const r = parseRoute();
    const p = new URLSearchParams(r.params);
    for (const k of [...AS_OF, 'cursor']) p.delete(k);
    if (/^\d+$/.test(v)) p.set('as_of_seq', v.replace(/^0+(?=\d)/, ''));
    else if (v !== '') p.set('as_of', v);
    go(link(r.seg, p));
  }

  function showAsOf(route) {
    const seq = route.params.get('as_of_seq');
    const at = route.params.get('as_of');
    asofInput.value = seq || at || '';
    const state = byTestID('asof-state');
    if (seq) state.textContent = shown('asking as of ledger sequence ' + seq + (at ? ' (the sequence wins over as_of ' + at + ')' : ''));
    else if (at) state.textContent = shown('asking as of the last entry at or before ' + at);
    else state.textContent = 'asking for the latest state';
  }

  // answerLine says which sequence an answer is for.
  function answerLine(view, seq) {
    view.dataset.asOfSeq = String(seq);
    return h('p', { class: 'answer' }, 'answer as of ledger sequence ', h('strong', { testid: 'answer-asof', class: 'mono' }, String(seq)));
  }

  // ---- views ---------------------------------------------------------------

  function fields(obj, special) {
    const dl = h('dl', { class: 'fields' });
    for (const [k, v] of Object.entries(obj)) {
      let dd;
      if (special && special[k]) dd = special[k](v);
      else if (/_at$/.test(k) || k === 'time') dd = timeEl(v);
      else if (v !== null && typeof v === 'object') dd = jsonBlock(member(obj, k));
      else dd = h('span', { class: 'mono' }, member(obj, k).t === 'n' ? member(obj, k).src : String(v));
      dl.append(h('dt', {}, k + (/_at$/.test(k) || k === 'time' ? ' (UTC)' : '')), h('dd', { testid: 'field-' + k }, dd));
    }
    return dl;
  }

  async function viewProjects(route, view) {
    view.append(h('h1', {}, 'Projects'));
    const input = h('input', { testid: 'project-input', id: 'project-input', spellcheck: 'false', required: true, placeholder: 'demo' });
    view.append(h('form', {
      class: 'inline', testid: 'project-form', onsubmit: (ev) => {
        ev.preventDefault();
        const p = input.value.trim();
        if (p) go(projectLink(route, p));
      },
    }, h('label', { for: 'project-input' }, 'project id', input), h('button', { type: 'submit', testid: 'project-open' }, 'open')));

    const p = asOf(route.params);
    if (route.params.get('cursor')) p.set('cursor', route.params.get('cursor'));
    let res;
    try {
      res = await api('/v1/projects', p);
    } catch (e) {
      if (e.status === 401) throw e;
      if (e.status === 404) view.append(h('p', { class: 'note', testid: 'projects-unavailable' }, 'This server does not list projects (GET /v1/projects: ' + e.message + '): open a project by its id.'));
      else {
        view.append(errorBox(e, 'projects-error'));
        if (e.status === 403) view.append(h('p', { class: 'note' }, 'Listing projects needs a credential of every project ("*"); open the project of your credential by its id above.'));
      }
      view.dataset.count = '0';
      return;
    }
    view.append(answerLine(view, res.as_of_seq));
    const items = Array.isArray(res.items) ? res.items : [];
    view.dataset.count = String(items.length);
    if (items.length === 0) view.append(h('p', { testid: 'projects-empty' }, 'No projects as of this sequence.'));
    const ul = h('ul', { testid: 'projects-list' });
    for (const it of items) {
      const rest = Object.entries(it).filter(([k]) => k !== 'project_id')
        .map(([k, v]) => /_(at|time)$/.test(k) ? k + ' ' + utc(v) + ' (UTC)'
          : k + ' ' + (v !== null && typeof v === 'object' ? JSON.stringify(v) : String(v)));
      ul.append(h('li', { testid: 'project-row', data: { project: it.project_id } },
        h('a', { href: projectLink(route, String(it.project_id)), testid: 'project-link' }, String(it.project_id)),
        rest.length ? h('span', { class: 'note' }, ' — ' + rest.join(', ')) : null));
    }
    view.append(ul);
    if (res.next_cursor) {
      const next = asOf(route.params, { cursor: res.next_cursor });
      if (!next.get('as_of_seq') && !next.get('as_of')) next.set('as_of_seq', String(res.as_of_seq));
      view.append(h('p', { class: 'pager' }, h('a', { href: link([], next), testid: 'projects-next' }, 'more projects')));
    }
  }

  function select(name, options, value) {
    return h('select', { name, testid: 'filter-' + name, id: 'filter-' + name },
      h('option', { value: '' }, 'any'),
      options.map((o) => h('option', { value: o, selected: o === value }, o)));
  }

  function callsFilterForm(route) {
    const v = (k) => route.params.get(k) || '';
    const inp = (name, label, extra) => h('label', { for: 'filter-' + name }, label,
      h('input', Object.assign({ name, id: 'filter-' + name, testid: 'filter-' + name, value: v(name), spellcheck: 'false' }, extra || {})));
    const form = h('form', { class: 'inline', testid: 'filter-form' },
      inp('tool', 'tool'),
      inp('agent', 'agent'),
      inp('channel', 'channel'),
      h('label', { for: 'filter-status' }, 'status (result)', select('status', STATUSES, v('status'))),
      h('label', { for: 'filter-state' }, 'state (lifecycle)', select('state', STATES, v('state'))),
      inp('from', 'dispatched from (RFC 3339)', { class: 'time', placeholder: '2026-11-22T00:00:00Z' }),
      inp('to', 'dispatched to (RFC 3339)', { class: 'time', placeholder: '2026-11-22T23:59:59Z' }),
      inp('limit', 'page size', { class: 'narrow', placeholder: '100', inputmode: 'numeric' }),
      h('button', { type: 'submit', testid: 'filter-apply' }, 'filter'),
      h('button', { type: 'button', testid: 'filter-reset', onclick: () => go(link(route.seg, asOf(route.params))) }, 'clear filters'));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const p = asOf(route.params);
      for (const k of CALL_FILTERS) {
        const x = form.elements[k].value.trim();
        if (x) p.set(k, x);
      }
      go(link(route.seg, p));
    });
    return form;
  }

  function openForms(route) {
    const turn = h('input', { id: 'open-turn', testid: 'open-turn-input', spellcheck: 'false', required: true });
    const call = h('input', { id: 'open-call', testid: 'open-call-input', spellcheck: 'false', required: true });
    return h('div', { class: 'inline-forms' },
      h('form', {
        class: 'inline', testid: 'open-turn-form', onsubmit: (ev) => {
          ev.preventDefault();
          if (turn.value.trim()) go(turnLink(route, route.project, turn.value.trim()));
        },
      }, h('label', { for: 'open-turn' }, 'turn id', turn), h('button', { type: 'submit', testid: 'open-turn' }, 'open timeline')),
      h('form', {
        class: 'inline', testid: 'open-call-form', onsubmit: (ev) => {
          ev.preventDefault();
          if (call.value.trim()) go(callLink(route, route.project, call.value.trim(), ''));
        },
      }, h('label', { for: 'open-call' }, 'call id', call), h('button', { type: 'submit', testid: 'open-call' }, 'open call')));
  }

  const seqCell = (st) => ['dispatched_seq', 'reported_seq', 'wakeup_seq', 'consumed_seq', 'rejected_seq']
    .filter((k) => st[k]).map((k) => k.replace('_seq', '') + ' ' + st[k]).join(', ');

  async function viewCalls(route, view) {
    const p = route.project;
    view.append(h('h1', {}, 'Calls of project ', h('span', { class: 'mono', testid: 'project-id' }, p)));
    view.append(openForms(route));
    view.append(h('h2', {}, 'Filter'), callsFilterForm(route));
    const params = asOf(route.params);
    for (const k of [...CALL_FILTERS, 'cursor']) if (route.params.get(k)) params.set(k, route.params.get(k));
    const res = await fetchInto(view, '/v1/projects/' + enc(p) + '/calls', params, 'calls-error');
    if (!res) return;
    view.append(answerLine(view, res.as_of_seq));
    const items = Array.isArray(res.items) ? res.items : [];
    view.dataset.count = String(items.length);
    view.append(h('p', { testid: 'calls-count' }, items.length + (items.length === 1 ? ' call' : ' calls') + ' on this page, by dispatch time'));
    if (items.length > 0) {
      const rows = items.map((st) => h('tr', { testid: 'call-row', data: { call: st.tool_call_id, turn: st.agent_turn_id, status: st.status || '', state: st.state } },
        h('td', {}, timeEl(st.dispatched_at)),
        h('td', {}, h('a', { href: turnLink(route, p, st.agent_turn_id), testid: 'turn-link' }, st.agent_turn_id)),
        h('td', {}, h('a', { href: callLink(route, p, st.tool_call_id, st.agent_turn_id), testid: 'call-link' }, st.tool_call_id)),
        h('td', { class: 'mono' }, st.tool_name || ''),
        h('td', { class: 'mono' }, st.agent_id || ''),
        h('td', { class: 'mono' }, st.channel_id || ''),
        h('td', { testid: 'call-state' }, st.state || ''),
        h('td', { testid: 'call-status' }, st.status || ''),
        h('td', { class: 'mono' }, seqCell(st)),
        h('td', {}, String(st.rejections ?? 0), st.last_rejection ? ' (' + st.last_rejection + ')' : ''),
        h('td', {}, String(st.duplicates ?? 0))));
      view.append(h('div', { class: 'table-wrap' }, h('table', { testid: 'calls-table' },
        h('thead', {}, h('tr', {}, ['dispatched at (UTC)', 'turn', 'call', 'tool', 'agent', 'channel', 'state', 'status', 'sequences', 'rejections', 'duplicates'].map((c) => h('th', {}, c)))),
        h('tbody', {}, rows))));
    } else {
      view.append(h('p', { testid: 'calls-empty' }, 'No call on this page matches.'));
    }
    const pager = h('p', { class: 'pager' });
    if (route.params.get('cursor')) {
      const first = new URLSearchParams(route.params);
      first.delete('cursor');
      pager.append(h('a', { href: link(route.seg, first), testid: 'calls-first' }, 'first page'));
    }
    if (res.next_cursor) {
      // The next page continues this answer: it keeps its sequence.
      const next = new URLSearchParams(route.params);
      next.set('cursor', res.next_cursor);
      if (!next.get('as_of_seq') && !next.get('as_of')) next.set('as_of_seq', String(res.as_of_seq));
      pager.append(h('button', { type: 'button', testid: 'calls-next', onclick: () => go(link(route.seg, next)) }, 'next page'),
        h('span', { class: 'note' }, items.length === 0 ? 'this page examined its share of the index without a match: more may follow' : ''));
    }
    view.append(pager);
  }

  // What an entry says about its turn and call, where the projector reads
  // it: the entry's headers, its data, and for a rejection the refused
  // request's headers (any case) or body.
  function header(headers, name) {
    if (!headers || typeof headers !== 'object') return '';
    const want = name.toLowerCase();
    for (const [k, v] of Object.entries(headers)) {
      if (k.toLowerCase() === want && Array.isArray(v) && v.length) return String(v[0]);
    }
    return '';
  }
  function field(obj, name) {
    return obj && typeof obj === 'object' && typeof obj[name] === 'string' ? obj[name] : '';
  }
  function entryID(item, headerName, fieldName) {
    const req = item.kind === 'rejection' && item.data && typeof item.data === 'object' ? item.data.request : null;
    return header(item.headers, headerName) || field(item.data, fieldName) ||
      (req && typeof req === 'object' ? header(req.headers, headerName) || field(req.data, fieldName) : '');
  }
  const entryTurn = (item) => entryID(item, 'CG-Agent-Turn-Id', 'agent_turn_id');
  const entryCall = (item) => entryID(item, 'CG-Tool-Call-Id', 'tool_call_id');

  // rejectionBlock lists a rejection entry's code, message and every violation.
  function rejectionBlock(item) {
    const d = item.data;
    if (item.kind !== 'rejection' || !d || typeof d !== 'object') return null;
    const vs = Array.isArray(d.violations) ? d.violations : [];
    return h('div', { class: 'error', testid: 'rejection' },
      h('strong', {}, 'rejected ' + (d.op ? d.op + ' ' : '') + '(' + String(d.code ?? '') + ')'), ': ', String(d.message ?? ''),
      vs.length ? h('ul', {}, vs.map((x) => h('li', { testid: 'violation' }, violationText(x)))) : null);
  }

  function entryHead(item) {
    return [
      h('span', { class: 'seq', testid: 'entry-seq' }, 'seq ' + item.seq),
      timeEl(item.time, 'entry-time'),
      h('span', { class: 'kind kind-' + item.kind, testid: 'entry-kind' }, String(item.kind)),
      h('span', { class: 'subject', testid: 'entry-subject' }, String(item.subject ?? '')),
    ];
  }

  function entryBody(route, item, links) {
    const body = h('div', { class: 'entry-body' });
    if (links.length) body.append(h('div', { class: 'links' }, links));
    if (item.reason) body.append(h('p', { testid: 'entry-reason' }, 'reason: ', String(item.reason)));
    if (item.skip_seq) body.append(h('p', {}, 'skipped by the skip entry at seq ' + item.skip_seq));
    const rejection = rejectionBlock(item);
    if (rejection) body.append(rejection);
    body.append(h('div', { class: 'note' }, 'data'), jsonBlock(member(item, 'data'), 'entry-data'));
    if (item.headers) body.append(h('details', {}, h('summary', {}, 'headers'), jsonBlock(member(item, 'headers'), 'entry-headers')));
    return body;
  }

  async function viewTimeline(route, view) {
    const { project: p, turn: t } = route;
    view.append(h('h1', {}, 'Timeline of turn ', h('span', { class: 'mono', testid: 'turn-id' }, t), ' in project ',
      h('a', { href: projectLink(route, p), class: 'mono' }, p)));
    const res = await fetchInto(view, '/v1/projects/' + enc(p) + '/turns/' + enc(t) + '/timeline', asOf(route.params), 'timeline-error');
    if (!res) return;
    view.append(answerLine(view, res.as_of_seq));
    const items = Array.isArray(res.items) ? res.items : [];
    view.dataset.count = String(items.length);
    view.append(h('p', { testid: 'timeline-count' }, items.length + ' entries in ledger order; times in UTC'));
    const ol = h('ol', { class: 'entries', testid: 'timeline' });
    for (const item of items) {
      const call = entryCall(item);
      const links = call ? [h('a', { href: callLink(route, p, call, t), testid: 'entry-call-link' }, 'call ' + call)] : [];
      ol.append(h('li', { class: 'entry', testid: 'timeline-entry', data: { seq: item.seq, kind: item.kind } },
        h('div', { class: 'entry-head' }, entryHead(item)), entryBody(route, item, links)));
    }
    view.append(ol);
  }

  async function viewStory(route, view) {
    const { project: p, call: c } = route;
    const turn = route.params.get('turn') || '';
    view.append(h('h1', {}, 'Call ', h('span', { class: 'mono', testid: 'call-id' }, c),
      turn ? [' of turn ', h('a', { href: turnLink(route, p, turn), class: 'mono', testid: 'story-turn-link' }, turn)] : '',
      ' in project ', h('a', { href: projectLink(route, p), class: 'mono' }, p)));
    if (turn) view.append(h('p', {}, h('a', { href: callLink(route, p, c, ''), testid: 'story-all-turns' }, 'this call id in every turn')));
    const params = asOf(route.params, { turn });
    const res = await fetchInto(view, '/v1/projects/' + enc(p) + '/calls/' + enc(c), params, 'story-error');
    if (!res) return;
    view.append(answerLine(view, res.as_of_seq));
    const items = Array.isArray(res.items) ? res.items : [];
    const calls = Array.isArray(res.calls) ? res.calls : [];
    view.dataset.count = String(items.length);
    view.append(h('h2', {}, calls.length === 1 ? 'State' : 'States (one per turn)'));
    for (const st of calls) {
      // rejected_seq is the call's first rejection; last_rejection the code
      // of its latest, whose entry is shown with its violations.
      const rejections = items.filter((it) => it.kind === 'rejection' && entryTurn(it) === st.agent_turn_id && entryCall(it) === st.tool_call_id);
      const rejected = rejections.length ? rejections[rejections.length - 1] : null;
      view.append(h('section', { class: 'state', testid: 'story-state', data: { turn: st.agent_turn_id, state: st.state } },
        h('h3', {}, 'turn ', h('a', { href: turnLink(route, p, st.agent_turn_id), testid: 'state-turn-link' }, st.agent_turn_id), ': ', st.state, st.status ? ', ' + st.status : ''),
        fields(st, {
          agent_turn_id: (v) => h('a', { href: turnLink(route, p, v) }, v),
          last_rejection: (v) => h('div', { testid: 'last-rejection' }, String(v),
            rejected ? [' (entry at seq ' + rejected.seq + ')', rejectionBlock(rejected)] : null),
        })));
    }
    view.append(h('h2', {}, items.length + ' entries in ledger order; times in UTC'));
    const toggle = (open) => () => { for (const d of view.querySelectorAll('details.entry')) d.open = open; };
    view.append(h('div', { class: 'toolbar' },
      h('button', { type: 'button', testid: 'expand-all', onclick: toggle(true) }, 'expand all'),
      h('button', { type: 'button', testid: 'collapse-all', onclick: toggle(false) }, 'collapse all')));
    const list = h('div', { class: 'entries', testid: 'story' });
    for (const item of items) {
      const t = entryTurn(item);
      const links = t ? [h('a', { href: turnLink(route, p, t), testid: 'entry-turn-link' }, 'turn ' + t)] : [];
      const rej = item.kind === 'rejection' && item.data && typeof item.data === 'object' ? ' — ' + String(item.data.code ?? '') + ': ' + String(item.data.message ?? '') : '';
      list.append(h('details', { class: 'entry', testid: 'story-entry', data: { seq: item.seq, kind: item.kind } },
        h('summary', { class: 'entry-head', testid: 'entry-summary' }, entryHead(item), rej ? h('span', {}, rej) : null),
        entryBody(route, item, links)));
    }
    view.append(list);
  }

  async function viewChain(route, view) {
    view.append(h('h1', {}, 'Hash chain'));
    view.append(h('p', { class: 'note' }, 'The digest and the verification are of the ledger now: the as-of control does not apply to them. With an as-of sequence, the chain link the views recorded at that sequence is shown too. Both need a credential of every project ("*").'));
    view.append(h('h2', {}, 'Digest'));
    const d = await fetchInto(view, '/v1/digest', [], 'digest-error');
    if (d) {
      view.append(h('dl', { class: 'fields', testid: 'digest' },
        h('dt', {}, 'applied_seq'), h('dd', { class: 'mono', testid: 'digest-applied' }, String(d.applied_seq)),
        h('dt', {}, 'digest'), h('dd', { class: 'mono', testid: 'digest-value' }, String(d.digest)),
        h('dt', {}, 'chain_head'), h('dd', { class: 'mono', testid: 'digest-head' }, String(d.chain_head))));
    }
    const seq = route.params.get('as_of_seq');
    if (seq) {
      view.append(h('h2', {}, 'Chain link at sequence ' + seq));
      const l = await fetchInto(view, '/v1/chain/' + enc(seq), [], 'link-error');
      if (l) view.append(h('p', { class: 'mono', testid: 'chain-link' }, 'seq ' + l.seq + ': ' + l.link));
    } else if (route.params.get('as_of')) {
      view.append(h('p', { class: 'note' }, 'An as-of time has no chain link: give a sequence to see the link at it.'));
    }
    view.append(h('h2', {}, 'Verify'));
    const out = h('div', { testid: 'verify-out' });
    const btn = h('button', {
      type: 'button', testid: 'verify-run', onclick: async () => {
        btn.disabled = true;
        out.replaceChildren(h('p', { class: 'note', testid: 'verify-running' }, 'verifying the live stream against the views…'));
        try {
          const v = await api('/v1/verify', []);
          const ok = v.ok === true;
          out.replaceChildren(
            h('p', { class: ok ? 'ok' : 'error', testid: 'verify-result', data: { ok: String(ok) } },
              ok ? 'OK: the chain verifies (' + v.count + ' entries, through seq ' + v.last_seq + ')'
                : 'BROKEN at seq ' + v.first_bad_seq + ': ' + v.reason),
            fields(v));
        } catch (e) {
          if (e.status === 401) { render(); return; }
          out.replaceChildren(errorBox(e, 'verify-error'));
        } finally {
          btn.disabled = false;
        }
      },
    }, 'verify');
    view.append(h('p', {}, btn, ' checks every entry of the live stream against the hash chain the views recorded (it reads the whole stream).'), out);
  }

  const VIEWS = { projects: viewProjects, calls: viewCalls, timeline: viewTimeline, story: viewStory, chain: viewChain };

  // ---- rendering -----------------------------------------------------------

  let rendering = 0;

  async function render() {
    const mine = ++rendering;
    const route = parseRoute();
    showAsOf(route);
    showAuthState();
    byTestID('nav-projects').setAttribute('href', link([], asOf(route.params)));
    byTestID('nav-chain').setAttribute('href', link(['chain'], asOf(route.params)));
    const navCalls = byTestID('nav-calls');
    navCalls.hidden = !route.project;
    if (route.project) {
      navCalls.setAttribute('href', projectLink(route, route.project));
      navCalls.textContent = shown('calls of ' + route.project);
    }
    const view = h('section', { testid: 'view', data: { view: route.view } });
    byTestID('loading').hidden = false;
    main.setAttribute('aria-busy', 'true');
    try {
      const fn = VIEWS[route.view];
      if (fn) await fn(route, view);
      else view.append(h('p', { class: 'error', testid: 'notfound' }, 'No such page: ' + location.hash), h('p', {}, h('a', { href: '#/' }, 'projects')));
      view.dataset.ready = 'true';
    } catch (e) {
      if (mine !== rendering) return;
      if (e.status === 401) {
        let reason = e.message;
        if (token()) {
          try { sessionStorage.removeItem(TOKEN_KEY); } catch { /* nothing kept */ }
          reason = 'the server refused the credential: ' + e.message;
          showAuthState();
        }
        showSignIn(reason);
        view.replaceChildren(h('p', { testid: 'signin-needed' }, 'Sign in above to see this page.'));
        view.dataset.view = 'signin';
      } else {
        view.append(errorBox(e instanceof APIError ? e : new APIError(0, 'page_error', String(e && e.message || e))));
      }
    }
    if (mine !== rendering) return;
    byTestID('loading').hidden = true;
    main.removeAttribute('aria-busy');
    main.replaceChildren(view);
  }

  window.addEventListener('hashchange', render);
  render();
})();
