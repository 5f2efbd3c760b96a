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
      const at = i;
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
        const node = { t: 'o', m, v, a: at, b: i, raw: src };
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
        const node = { t: 'a', m, v, a: at, b: i, raw: src };
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

  // rawText is the exact text an object or array was parsed from (its
  // bytes as the server sent them), or null when it was not parsed here.
  function rawText(v) {
    const n = v !== null && typeof v === 'object' ? SOURCE.get(v) : null;
    return n && n.raw !== undefined ? n.raw.slice(n.a, n.b) : null;
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
      return { role: grant.role, project: grant.project, approver: grant.approver, exp: c.exp };
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
    if (c.role) s += ': ' + c.role + (c.approver ? ' ' + c.approver : '') + ' of ' + (c.project === '*' ? 'every project (*)' : 'project ' + c.project);
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
  // the credential when there is one; opts.body makes it a POST of that
  // JSON (the approvals pane's decisions, the page's only writes).
  async function api(path, params, opts) {
    const url = new URL(path, location.origin);
    for (const [k, v] of params || []) if (v !== '' && v !== undefined && v !== null) url.searchParams.set(k, v);
    const headers = { Accept: 'application/json' };
    const tok = token();
    if (tok) headers.Authorization = 'Bearer ' + tok;
    let resp;
    try {
      const init = { headers, cache: 'no-store', credentials: 'omit', redirect: 'error' };
      if (opts && opts.body !== undefined) {
        init.method = 'POST';
        init.body = JSON.stringify(opts.body);
        headers['Content-Type'] = 'application/json';
      }
      resp = await fetch(url, init);
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
  // #/p/P/calls/C, #/p/P/overview, #/p/P/approvals; the query after "?"
  // holds filters and as_of_seq/as_of.
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
      else if (seg.length === 3 && seg[2] === 'overview') r.view = 'overview';
      else if (seg.length === 3 && seg[2] === 'approvals') r.view = 'approvals';
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

  // ---- the picture of a turn: one row per call, its phases as bars ----------

  // tns is an RFC 3339 time as nanoseconds since 1970 (a BigInt: a Number
  // would lose the nanoseconds), or null.
  function tns(s) {
    const m = TIME_RE.exec(String(s || ''));
    if (!m) return null;
    const ms = Date.parse(m[1] + 'T' + m[2] + m[4]);
    if (Number.isNaN(ms)) return null;
    return BigInt(ms) * 1000000n + BigInt(((m[3] || '.').slice(1) + '000000000').slice(0, 9));
  }

  // dur shows a duration in nanoseconds.
  function dur(ns) {
    const n = Number(ns);
    if (n < 1e3) return n + ' ns';
    if (n < 1e6) return (n / 1e3).toFixed(n < 1e4 ? 1 : 0) + ' µs';
    if (n < 1e9) return (n / 1e6).toFixed(n < 1e7 ? 2 : 1) + ' ms';
    if (n < 60e9) return (n / 1e9).toFixed(2) + ' s';
    if (n < 3600e9) return Math.floor(n / 60e9) + ' min ' + Math.round((n % 60e9) / 1e9) + ' s';
    return Math.floor(n / 3600e9) + ' h ' + Math.round((n % 3600e9) / 60e9) + ' min';
  }

  // The phases of a call, each from one entry to the next (docs/audit-api.md,
  // "Audit web page"): the first entry of each kind marks the event.
  const PHASES = [
    { name: 'dispatch', from: ['call'], to: ['held', 'command'], doc: 'tool.call card to dispatch (command, or held for approval)' },
    { name: 'approval', from: ['held'], to: ['approval'], doc: 'held to the approval decision' },
    { name: 'run', from: ['command'], to: ['result', 'report'], doc: 'command to the tool.result card' },
    { name: 'report', from: ['result'], to: ['report'], doc: 'tool.result card to the report entry' },
    { name: 'wakeup', from: ['report'], to: ['wakeup', 'wakeup_skipped'], doc: 'report to the wakeup (or wakeup_skipped)' },
    { name: 'consume', from: ['wakeup'], to: ['consumed'], doc: 'wakeup to the worker consuming the result' },
  ];

  // eventOf names what an entry marks in its call's life.
  function eventOf(item) {
    const d = item.data && typeof item.data === 'object' ? item.data : {};
    switch (item.kind) {
      case 'card':
        if (d.type === 'tool.call') return 'call';
        if (d.type === 'tool.result') return 'result';
        return '';
      case 'wakeup':
        // A wakeup with a phase (prepared, approved) is not the result's.
        return d.phase ? 'wakeup_' + String(d.phase) : 'wakeup';
      case 'command': case 'held': case 'approval': case 'report':
      case 'wakeup_skipped': case 'consumed': case 'cancel': case 'attempt':
        return item.kind;
      default:
        return '';
    }
  }

  // callRows groups a turn's (or a story's) entries by call, in the order
  // each call first appears, with the events, status and tool of each.
  function callRows(items) {
    const rows = new Map();
    for (const item of items) {
      const turn = entryTurn(item);
      const call = entryCall(item);
      if (!call) continue;
      const k = turn + '/' + call;
      let r = rows.get(k);
      if (!r) {
        r = { key: k, turn, call, entries: [], events: {}, rejections: [], duplicates: [], tool: '', status: '' };
        rows.set(k, r);
      }
      r.entries.push(item);
      const t = tns(item.time);
      const ev = eventOf(item);
      if (ev && !r.events[ev]) r.events[ev] = { t, item };
      if (item.kind === 'rejection') r.rejections.push({ t, item });
      if (item.kind === 'duplicate') r.duplicates.push({ t, item });
      const d = item.data && typeof item.data === 'object' ? item.data : {};
      if (!r.tool) r.tool = String(d.tool_name || d.function_name || (d.content && typeof d.content === 'object' && d.content.tool_name) || '');
      if (item.kind === 'report' && d.status) r.status = String(d.status);
      if (item.kind === 'approval' && d.decision) r.decision = String(d.decision);
    }
    for (const r of rows.values()) {
      if (r.status) continue;
      const e = r.events;
      if (e.held && !e.approval) r.status = 'awaiting_approval';
      else if (e.command) r.status = e.cancel ? 'canceling' : 'running';
      else if (r.rejections.length) r.status = 'rejected';
      else r.status = e.approval ? String(r.decision || 'decided') : 'pending';
    }
    return [...rows.values()];
  }

  // phasesOf are a row's bars: [{name, start, end, open}] (end null while
  // the phase is still under way as of the answer).
  function phasesOf(r) {
    const out = [];
    const first = (names) => { for (const n of names) if (r.events[n]) return r.events[n]; return null; };
    for (const ph of PHASES) {
      const a = first(ph.from);
      if (!a || a.t === null) continue;
      const b = first(ph.to);
      if (ph.name === 'consume' && !b && r.events.wakeup_skipped) continue;
      if (ph.name === 'approval' && !b && r.status !== 'awaiting_approval') continue;
      if (ph.name === 'dispatch' && !b) continue;
      if (ph.name === 'run' && !b && r.events.approval && r.decision && r.decision !== 'approved') continue;
      out.push({ name: ph.name, doc: ph.doc, start: a.t, end: b && b.t !== null && b.t >= a.t ? b.t : null, from: a.item, to: b ? b.item : null });
    }
    return out;
  }

  function axisOf(items) {
    let lo = null; let hi = null;
    for (const it of items) {
      const t = tns(it.time);
      if (t === null) continue;
      if (lo === null || t < lo) lo = t;
      if (hi === null || t > hi) hi = t;
    }
    if (lo === null) { lo = 0n; hi = 1n; }
    if (hi === lo) hi = lo + 1n;
    return { lo, hi, span: Number(hi - lo) };
  }

  const pct = (axis, t) => Math.max(0, Math.min(100, Number(t - axis.lo) / axis.span * 100));

  // placed positions an element on the axis (CSSOM: the CSP forbids style
  // attributes, not style properties set by the page's own script).
  function placed(e, axis, a, b) {
    const l = pct(axis, a);
    e.style.left = l + '%';
    if (b !== undefined) e.style.width = Math.max(pct(axis, b) - l, 0) + '%';
    return e;
  }

  function axisHead(axis) {
    const ticks = h('div', { class: 'track axis', testid: 'axis' });
    for (const f of [0, 0.25, 0.5, 0.75, 1]) {
      const tick = h('span', { class: 'tick' + (f === 1 ? ' last' : '') }, '+' + dur(Math.round(axis.span * f)));
      tick.style.left = (f * 100) + '%';
      ticks.append(tick);
    }
    return h('div', { class: 'lane-head' },
      h('span', { class: 'lane-label' }, 'tool'), h('span', { class: 'lane-label' }, 'call'), h('span', { class: 'lane-label' }, 'status'),
      ticks, h('span', { class: 'lane-label' }, 'total'));
  }

  function legend() {
    return h('p', { class: 'legend', testid: 'legend' }, PHASES.map((ph) =>
      h('span', { class: 'legend-item', title: ph.doc }, h('span', { class: 'swatch phase-' + ph.name }), ph.name)),
    h('span', { class: 'legend-item' }, h('span', { class: 'swatch marker-rejection' }), 'rejection'),
    h('span', { class: 'legend-item' }, h('span', { class: 'swatch marker-duplicate' }), 'duplicate'),
    h('span', { class: 'note' }, ' striped: still under way as of the answer; the raw entries of a call are one click away on its row'));
  }

  // callLane is one call's row: tool, call, status, its bars and markers on
  // the shared axis, the total; opening it shows each phase's duration and
  // the call's raw entries (built on first open: a turn of a thousand calls
  // stays light).
  function callLane(route, p, r, axis, bodyFn) {
    const phases = phasesOf(r);
    const track = h('div', { class: 'track' });
    for (const ph of phases) {
      const end = ph.end === null ? axis.hi : ph.end;
      const ns = ph.end === null ? null : ph.end - ph.start;
      track.append(placed(h('span', {
        class: 'bar phase-' + ph.name + (ph.end === null ? ' open' : ''), testid: 'bar',
        data: { phase: ph.name, ns: ns === null ? '' : String(ns) },
        title: ph.name + ': ' + (ns === null ? 'under way' : dur(ns)) + ' (' + ph.doc + ')',
      }), axis, ph.start, end));
    }
    for (const [list, kind] of [[r.rejections, 'rejection'], [r.duplicates, 'duplicate']]) {
      for (const x of list) {
        if (x.t === null) continue;
        const d = x.item.data && typeof x.item.data === 'object' ? x.item.data : {};
        track.append(placed(h('span', { class: 'marker marker-' + kind, testid: 'marker', data: { kind, seq: x.item.seq },
          title: kind + ' at seq ' + x.item.seq + (d.code ? ': ' + d.code : '') }), axis, x.t));
      }
    }
    const ts = [];
    for (const ph of phases) { ts.push(ph.start); if (ph.end !== null) ts.push(ph.end); }
    const total = ts.length ? ts.reduce((a, b) => (b > a ? b : a)) - ts.reduce((a, b) => (b < a ? b : a)) : null;
    const details = h('details', { class: 'lane status-' + r.status, testid: 'call-lane', data: { call: r.call, turn: r.turn, status: r.status, tool: r.tool, key: r.key } });
    details.append(h('summary', { class: 'lane-row' },
      h('span', { class: 'mono lane-tool', testid: 'lane-tool' }, r.tool || '—'),
      h('span', { class: 'mono lane-call' }, r.call),
      h('span', { class: 'badge status-' + r.status, testid: 'lane-status' }, r.status.replaceAll('_', ' ')),
      track,
      h('span', { class: 'mono lane-total', testid: 'lane-total' }, total === null ? '' : dur(total))));
    let built = false;
    details.addEventListener('toggle', () => {
      if (!details.open || built) return;
      built = true;
      const body = h('div', { class: 'lane-body', testid: 'lane-body' });
      body.append(h('table', { class: 'phases', testid: 'phase-table' },
        h('thead', {}, h('tr', {}, ['phase', 'from', 'to', 'duration'].map((c) => h('th', {}, c)))),
        h('tbody', {}, phases.map((ph) => h('tr', { testid: 'phase-row', data: { phase: ph.name } },
          h('td', {}, h('span', { class: 'swatch phase-' + ph.name }), ph.name),
          h('td', { class: 'mono' }, ph.from.kind + ' seq ' + ph.from.seq),
          h('td', { class: 'mono' }, ph.to ? ph.to.kind + ' seq ' + ph.to.seq : 'under way'),
          h('td', { class: 'mono', testid: 'phase-duration' }, ph.end === null ? '—' : dur(ph.end - ph.start)))))));
      body.append(h('p', { class: 'links' },
        h('a', { href: callLink(route, p, r.call, r.turn), testid: 'lane-story-link' }, 'story of call ' + r.call),
        h('a', { href: turnLink(route, p, r.turn), testid: 'lane-turn-link' }, 'turn ' + r.turn)));
      body.append(bodyFn(r));
      details.append(body);
    });
    return details;
  }

  // picture draws the calls of items on one time axis.
  function picture(route, p, items, bodyFn) {
    const axis = axisOf(items);
    const rows = callRows(items);
    const box = h('div', { class: 'picture', testid: 'picture', data: { rows: rows.length } });
    box.append(legend(), axisHead(axis));
    const lanes = h('div', { class: 'lanes', testid: 'lanes' });
    for (const r of rows) lanes.append(callLane(route, p, r, axis, bodyFn));
    box.append(lanes);
    return { box, rows };
  }

  // entriesFold is a fold of raw entries, built when first opened.
  function entriesFold(testid, label, build) {
    const d = h('details', { class: 'fold', testid, data: { key: testid } }, h('summary', { testid: testid + '-open' }, label));
    let built = false;
    d.addEventListener('toggle', () => {
      if (d.open && !built) { built = true; d.append(build()); }
    });
    return d;
  }

  function rawList(route, p, items, t) {
    const ol = h('ol', { class: 'entries', testid: 'timeline' });
    for (const item of items) {
      const call = entryCall(item);
      const links = call ? [h('a', { href: callLink(route, p, call, entryTurn(item) || t), testid: 'entry-call-link' }, 'call ' + call)] : [];
      ol.append(h('li', { class: 'entry', testid: 'timeline-entry', data: { seq: item.seq, kind: item.kind } },
        h('div', { class: 'entry-head' }, entryHead(item)), entryBody(route, item, links)));
    }
    return ol;
  }

  function statusChips(rows, testid) {
    const counts = {};
    for (const r of rows) counts[r.status] = (counts[r.status] || 0) + 1;
    return h('p', { class: 'chips', testid }, Object.entries(counts).map(([s, n]) =>
      h('span', { class: 'badge status-' + s, data: { status: s, n } }, s.replaceAll('_', ' ') + ' ' + n)));
  }

  // laneEntries lists a call's raw entries, each folded to its head line.
  function laneEntries(route, p) {
    return (r) => h('div', { class: 'entries', testid: 'lane-entries' }, r.entries.map((item) => {
      const rej = item.kind === 'rejection' && item.data && typeof item.data === 'object' ? ' — ' + String(item.data.code ?? '') + ': ' + String(item.data.message ?? '') : '';
      return h('details', { class: 'entry', testid: 'lane-entry', data: { seq: item.seq, kind: item.kind } },
        h('summary', { class: 'entry-head' }, entryHead(item), rej ? h('span', {}, rej) : null), entryBody(route, item, []));
    }));
  }

  async function viewTimeline(route, view) {
    const { project: p, turn: t } = route;
    view.append(h('h1', {}, 'Turn ', h('span', { class: 'mono', testid: 'turn-id' }, t), ' in project ',
      h('a', { href: projectLink(route, p), class: 'mono' }, p)));
    const asked = performance.now();
    const res = await fetchInto(view, '/v1/projects/' + enc(p) + '/turns/' + enc(t) + '/timeline', asOf(route.params), 'timeline-error');
    if (!res) return;
    view.append(answerLine(view, res.as_of_seq));
    const items = Array.isArray(res.items) ? res.items : [];
    view.dataset.count = String(items.length);
    view.dataset.sig = items.length + ':' + (items.length ? items[items.length - 1].seq : 0);
    const started = performance.now();
    const { box, rows } = picture(route, p, items, laneEntries(route, p));
    view.dataset.calls = String(rows.length);
    view.append(h('p', { testid: 'timeline-count' }, rows.length + (rows.length === 1 ? ' call, ' : ' calls, ') + items.length + ' entries in ledger order; times in UTC'),
      statusChips(rows, 'timeline-statuses'), box,
      entriesFold('all-entries', 'all ' + items.length + ' entries of the turn, raw, in ledger order', () => rawList(route, p, items, t)));
    view.dataset.renderMs = String(Math.round(performance.now() - started));
    // A large turn is polled less often: at most a fifth of the time goes
    // to fetching, reading and drawing it.
    view.dataset.live = String(Math.max(2000, Math.round(5 * (performance.now() - asked) / 1000) * 1000));
  }

  async function viewStory(route, view) {
    const { project: p, call: c } = route;
    const turn = route.params.get('turn') || '';
    view.append(h('h1', {}, 'Call ', h('span', { class: 'mono', testid: 'call-id' }, c),
      turn ? [' of turn ', h('a', { href: turnLink(route, p, turn), class: 'mono', testid: 'story-turn-link' }, turn)] : '',
      ' in project ', h('a', { href: projectLink(route, p), class: 'mono' }, p)));
    if (turn) view.append(h('p', {}, h('a', { href: callLink(route, p, c, ''), testid: 'story-all-turns' }, 'this call id in every turn')));
    const params = asOf(route.params, { turn });
    const asked = performance.now();
    const res = await fetchInto(view, '/v1/projects/' + enc(p) + '/calls/' + enc(c), params, 'story-error');
    if (!res) return;
    view.dataset.live = String(Math.max(2000, Math.round(5 * (performance.now() - asked) / 1000) * 1000));
    view.append(answerLine(view, res.as_of_seq));
    const items = Array.isArray(res.items) ? res.items : [];
    const calls = Array.isArray(res.calls) ? res.calls : [];
    view.dataset.count = String(items.length);
    view.dataset.sig = items.length + ':' + (items.length ? items[items.length - 1].seq : 0);
    const { box } = picture(route, p, items, laneEntries(route, p));
    view.append(box);

    // Every rejection and duplicate, each with what it says.
    const incidents = items.filter((it) => it.kind === 'rejection' || it.kind === 'duplicate');
    view.append(h('h2', {}, incidents.length + (incidents.length === 1 ? ' rejection or duplicate' : ' rejections and duplicates')));
    if (incidents.length) {
      view.append(h('ul', { class: 'incidents', testid: 'incidents' }, incidents.map((it) => {
        const d = it.data && typeof it.data === 'object' ? it.data : {};
        return h('li', { testid: 'incident', data: { kind: it.kind, seq: it.seq } },
          h('span', { class: 'kind kind-' + it.kind }, it.kind), ' seq ' + it.seq + ' at ', timeEl(it.time),
          it.kind === 'duplicate' ? ' — a repeated report' + (d.source_id ? ' from ' + String(d.source_id) : '') + (d.status ? ' (' + String(d.status) + ')' : '') +
            (d.original_seq ? ', the original at seq ' + d.original_seq : '') : null,
          rejectionBlock(it));
      })));
    }

    view.append(h('h2', {}, calls.length === 1 ? 'State' : 'States (one per turn)'));
    for (const st of calls) {
      // rejected_seq is the call's first rejection; last_rejection the code
      // of its latest, whose entry is shown with its violations.
      const rejections = items.filter((it) => it.kind === 'rejection' && entryTurn(it) === st.agent_turn_id && entryCall(it) === st.tool_call_id);
      const rejected = rejections.length ? rejections[rejections.length - 1] : null;
      view.append(h('details', { class: 'state', testid: 'story-state', data: { turn: st.agent_turn_id, state: st.state, key: 'state-' + st.agent_turn_id } },
        h('summary', {}, h('strong', {}, 'turn ', h('a', { href: turnLink(route, p, st.agent_turn_id), testid: 'state-turn-link' }, st.agent_turn_id), ': ', st.state, st.status ? ', ' + st.status : ''),
          ' (every field)'),
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
      list.append(h('details', { class: 'entry', testid: 'story-entry', data: { seq: item.seq, kind: item.kind, key: 'entry-' + item.seq } },
        h('summary', { class: 'entry-head', testid: 'entry-summary' }, entryHead(item), rej ? h('span', {}, rej) : null),
        entryBody(route, item, links)));
    }
    view.append(list);
  }

  // ---- the project overview ------------------------------------------------

  const WINDOWS = { '1h': 3600e3, '24h': 86400e3, '7d': 7 * 86400e3, all: 0 };
  const STATUS_ORDER = ['success', 'failed', 'timeout', 'canceled', 'partial', 'dispatched', 'awaiting_approval', 'reported', 'consumed', 'rejected'];
  const byStatusOrder = (a, b) => {
    const i = STATUS_ORDER.indexOf(a); const j = STATUS_ORDER.indexOf(b);
    return (i < 0 ? 99 : i) - (j < 0 ? 99 : j) || (a < b ? -1 : a > b ? 1 : 0);
  };
  const ms = (v) => (v === undefined || v === null ? '—' : dur(Math.round(Number(v) * 1e6)));

  async function viewOverview(route, view) {
    const p = route.project;
    const win = WINDOWS[route.params.get('window')] !== undefined ? route.params.get('window') : '24h';
    view.append(h('h1', {}, 'Overview of project ', h('span', { class: 'mono', testid: 'project-id' }, p)));
    view.append(h('p', { class: 'inline-forms', testid: 'windows' }, 'calls dispatched in the last ', Object.keys(WINDOWS).map((w) =>
      w === win ? h('strong', { testid: 'window-' + w }, w === 'all' ? 'all time' : w)
        : h('a', { href: link(route.seg, asOf(route.params, { window: w })), testid: 'window-' + w }, w === 'all' ? 'all time' : w))));
    const params = asOf(route.params);
    if (WINDOWS[win]) params.set('from', new Date(Date.now() - WINDOWS[win]).toISOString());
    if (route.params.get('from')) params.set('from', route.params.get('from'));
    params.set('buckets', '40');
    const res = await fetchInto(view, '/v1/projects/' + enc(p) + '/overview', params, 'overview-error');
    if (!res) return;
    view.append(answerLine(view, res.as_of_seq));
    view.dataset.count = String(res.calls);
    view.dataset.sig = JSON.stringify([res.calls, res.by_status, res.rejections, res.duplicates, res.tools]);
    view.dataset.live = '5000';
    const statuses = Object.keys(res.by_status || {}).sort(byStatusOrder);
    view.append(h('div', { class: 'cards', testid: 'overview-totals' },
      h('div', { class: 'card' }, h('div', { class: 'big', testid: 'overview-calls' }, String(res.calls)), 'calls'),
      statuses.map((s) => h('div', { class: 'card status-' + s, testid: 'overview-status', data: { status: s } },
        h('div', { class: 'big' }, String(res.by_status[s])), s.replaceAll('_', ' '))),
      h('div', { class: 'card' }, h('div', { class: 'big', testid: 'overview-rejections' }, String(res.rejections)), 'rejections'),
      h('div', { class: 'card' }, h('div', { class: 'big', testid: 'overview-duplicates' }, String(res.duplicates)), 'duplicates')));
    if (res.truncated) {
      view.append(h('p', { class: 'error', testid: 'overview-truncated' }, 'More calls than one overview reads (' + res.calls + ' examined): this covers up to ' + utc(res.next_from) + ' (UTC). ',
        h('a', { href: link(route.seg, asOf(route.params, { window: win, from: res.next_from })) }, 'the calls after')));
    }
    const buckets = Array.isArray(res.buckets) ? res.buckets : [];
    if (buckets.length) {
      view.append(h('h2', {}, 'Calls per status over time'),
        h('p', { class: 'note' }, 'from ' + utc(res.from) + ' to ' + utc(res.to) + ' (UTC), ' + buckets.length + ' buckets of ' + dur(Number(res.bucket_ms) * 1e6)));
      const peak = Math.max(1, ...buckets.map((b) => b.calls));
      const chart = h('div', { class: 'chart', testid: 'overview-chart' });
      for (const b of buckets) {
        const col = h('div', { class: 'col', testid: 'overview-bucket', data: { calls: b.calls }, title: utc(b.start) + ': ' + b.calls + ' calls' });
        for (const s of Object.keys(b.by_status || {}).sort(byStatusOrder)) {
          const seg = h('div', { class: 'seg status-' + s, title: s + ': ' + b.by_status[s] });
          seg.style.height = (b.by_status[s] / peak * 100) + '%';
          col.append(seg);
        }
        chart.append(col);
      }
      view.append(chart, h('p', { class: 'legend' }, statuses.map((s) => h('span', { class: 'legend-item' }, h('span', { class: 'swatch status-' + s }), s))));
      const tools = (res.tools || []).map((t) => t.tool_name);
      const grid = h('table', { class: 'heat', testid: 'overview-heat' },
        h('tbody', {}, tools.map((tool) => {
          const peakTool = Math.max(1, ...buckets.map((b) => (b.by_tool || {})[tool] || 0));
          return h('tr', {}, h('th', { class: 'mono' }, tool), buckets.map((b) => {
            const n = (b.by_tool || {})[tool] || 0;
            const cell = h('td', { class: n ? 'hot' : '', title: tool + ' at ' + utc(b.start) + ': ' + n });
            if (n) cell.style.opacity = String(0.25 + 0.75 * n / peakTool);
            return cell;
          }));
        })));
      view.append(h('h2', {}, 'Calls per tool over time'), h('div', { class: 'table-wrap' }, grid));
    }
    view.append(h('h2', {}, 'Tools'));
    view.append(h('div', { class: 'table-wrap' }, h('table', { testid: 'overview-tools' },
      h('thead', {}, h('tr', {}, ['tool', 'calls', 'by status', 'reported', 'p50', 'p95', 'max', 'rejections'].map((c) => h('th', {}, c)))),
      h('tbody', {}, (res.tools || []).map((t) => h('tr', { testid: 'overview-tool', data: { tool: t.tool_name } },
        h('td', {}, h('a', { href: link(['p', p, 'calls'], asOf(route.params, { tool: t.tool_name })), class: 'mono' }, t.tool_name)),
        h('td', { testid: 'tool-calls' }, String(t.calls)),
        h('td', {}, Object.keys(t.by_status || {}).sort(byStatusOrder).map((s) => h('span', { class: 'badge status-' + s }, s.replaceAll('_', ' ') + ' ' + t.by_status[s]))),
        h('td', {}, String(t.reported)),
        h('td', { class: 'mono', testid: 'tool-p50' }, ms(t.p50_ms)),
        h('td', { class: 'mono', testid: 'tool-p95' }, ms(t.p95_ms)),
        h('td', { class: 'mono' }, ms(t.max_ms)),
        h('td', {}, String(t.rejections))))))));
    view.append(h('p', { class: 'note' }, 'Durations are from dispatch to report, over the reported calls; p50 and p95 by nearest rank.'));
    const codes = Object.entries(res.rejections_by_code || {});
    view.append(h('h2', {}, 'Rejections'), h('p', {}, res.rejections + ' rejections on these calls' + (codes.length ? '; calls by the code of their latest rejection:' : '.')));
    if (codes.length) {
      view.append(h('ul', { testid: 'overview-rejection-codes' }, codes.map(([code, n]) => h('li', { data: { code } }, h('span', { class: 'mono' }, code), ': ' + n))));
    }
    view.append(h('p', { class: 'note' }, 'A call whose every dispatch was refused was never dispatched: it is not counted here; ',
      h('a', { href: link(['p', p, 'calls'], asOf(route.params, { state: 'rejected' })) }, 'the rejected calls'), '.'));
  }

  // ---- approvals -----------------------------------------------------------

  // approvalsServed remembers, per project and credential, whether GET
  // /v1/projects/P/approvals answers (it is 404 on a server without
  // approvals): the pane and its link are hidden when it does not.
  const approvalsServed = new Map();

  async function probeApprovals(p) {
    const k = p + '\u0000' + token();
    if (!approvalsServed.has(k)) {
      approvalsServed.set(k, api('/v1/projects/' + enc(p) + '/approvals', [['state', 'pending'], ['limit', '1']])
        .then(() => true, (e) => e.status !== 404 && e.status !== 401 && e.status !== 403 ? true : false));
    }
    return approvalsServed.get(k);
  }

  async function sha256(s) {
    const d = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(s));
    return 'sha256:' + [...new Uint8Array(d)].map((b) => b.toString(16).padStart(2, '0')).join('');
  }

  // mayDecide says whether the signed-in credential is an approver the
  // item lists (an empty list: any approver of the project). The server
  // decides; this only orders the pane.
  function mayDecide(item) {
    const c = claims(token());
    if (c.role !== 'approver') return false;
    const list = Array.isArray(item.approvers) ? item.approvers : [];
    return list.length === 0 || list.includes(c.approver);
  }

  // decisionPanel shows exactly what a decision acts on (the card, its
  // arguments as the server sent them, their digest, checked here) and
  // only then offers approve and deny.
  function decisionPanel(route, p, item) {
    const panel = h('div', { class: 'decision', testid: 'decision' });
    const check = h('span', { testid: 'digest-check', class: 'note' }, 'checking the digest…');
    const raw = rawText(item.arguments);
    if (raw === null) check.textContent = 'the digest cannot be checked here (the arguments are not a JSON object or array)';
    else {
      sha256(raw).then((d) => {
        const ok = d === String(item.arguments_digest);
        check.className = ok ? 'ok' : 'error';
        check.dataset.ok = String(ok);
        check.textContent = ok ? 'recomputed in this page from the arguments shown: it matches'
          : 'recomputed in this page from the arguments shown: ' + d + ', which DIFFERS: do not approve';
      }, (e) => { check.textContent = 'the digest cannot be checked here: ' + e.message; });
    }
    const reason = h('textarea', { testid: 'decision-reason', rows: '2', spellcheck: 'false', placeholder: 'reason (recorded with the decision)' });
    const out = h('div', { testid: 'decision-out' });
    const decide = (op) => async () => {
      for (const b of panel.querySelectorAll('button')) b.disabled = true;
      out.replaceChildren(h('p', { class: 'note' }, op === 'approve' ? 'approving…' : 'denying…'));
      try {
        const res = await api('/v1/projects/' + enc(p) + '/approvals/' + enc(item.agent_turn_id) + '/' + enc(item.tool_call_id) + '/' + op, [],
          { body: { tool_call_card_id: item.tool_call_card_id, arguments_digest: item.arguments_digest, reason: reason.value } });
        // Done: the view stays as it is (not polled) until the user goes
        // back to the list, so that the answer can be read.
        panel.setAttribute('data-testid', 'decision-done');
        out.replaceChildren(h('div', { class: 'ok', testid: 'decision-result', data: { op } }, op === 'approve' ? 'approved' : 'denied', ': ',
          jsonBlock(nodeOf(res)), h('button', { type: 'button', testid: 'decision-back', onclick: () => render() }, 'back to the list')));
      } catch (e) {
        if (e.status === 401) { render(); return; }
        out.replaceChildren(errorBox(e, 'decision-error'));
        for (const b of panel.querySelectorAll('button')) b.disabled = false;
      }
    };
    panel.append(
      h('p', {}, 'You are deciding call ', h('span', { class: 'mono' }, item.tool_call_id), ' of turn ', h('span', { class: 'mono' }, item.agent_turn_id),
        ' (tool ', h('span', { class: 'mono' }, item.tool_name || ''), ') on exactly these arguments:'),
      jsonBlock(member(item, 'arguments'), 'decision-arguments'),
      h('dl', { class: 'fields' },
        h('dt', {}, 'tool_call_card_id'), h('dd', { class: 'mono', testid: 'decision-card' }, String(item.tool_call_card_id ?? '')),
        h('dt', {}, 'arguments_digest'), h('dd', { class: 'mono', testid: 'decision-digest' }, String(item.arguments_digest ?? ''), ' ', check)),
      h('label', {}, 'reason', reason),
      h('p', { class: 'toolbar' },
        h('button', { type: 'button', class: 'approve', testid: 'decision-approve', onclick: decide('approve') }, 'approve these arguments'),
        h('button', { type: 'button', class: 'deny', testid: 'decision-deny', onclick: decide('deny') }, 'deny')),
      out);
    return panel;
  }

  async function viewApprovals(route, view) {
    const p = route.project;
    const state = ['pending', 'decided', 'all'].includes(route.params.get('state')) ? route.params.get('state') : 'pending';
    view.append(h('h1', {}, 'Approvals in project ', h('span', { class: 'mono', testid: 'project-id' }, p)));
    view.append(h('p', { class: 'inline-forms' }, ['pending', 'decided', 'all'].map((s) => s === state ? h('strong', {}, s)
      : h('a', { href: link(route.seg, asOf(route.params, { state: s })), testid: 'approvals-' + s }, s))));
    const params = asOf(route.params, { state });
    if (route.params.get('cursor')) params.set('cursor', route.params.get('cursor'));
    let res;
    try {
      res = await api('/v1/projects/' + enc(p) + '/approvals', params);
    } catch (e) {
      if (e.status === 401) throw e;
      view.dataset.available = String(e.status !== 404);
      view.append(e.status === 404 ? h('p', { class: 'note', testid: 'approvals-unavailable' }, 'This server has no approvals (GET /v1/projects/' + p + '/approvals: ' + e.message + ').')
        : errorBox(e, 'approvals-error'));
      return;
    }
    view.dataset.available = 'true';
    view.append(answerLine(view, res.as_of_seq));
    const items = Array.isArray(res.items) ? res.items : [];
    view.dataset.count = String(items.length);
    view.dataset.sig = JSON.stringify(items.map((it) => [it.agent_turn_id, it.tool_call_id, it.state, it.decision_seq]));
    view.dataset.live = '3000';
    const c = claims(token());
    if (c.role !== 'approver') view.append(h('p', { class: 'note', testid: 'approvals-readonly' }, 'Deciding needs an approver credential (cgledger creds issue --role approver --project ' + p + ' --approver NAME); this one can only read.'));
    const mine = items.filter(mayDecide);
    const rest = items.filter((it) => !mayDecide(it));
    const card = (item) => {
      const pending = item.state === 'pending';
      const sec = h('section', { class: 'approval state-' + item.state, testid: 'approval-item', data: { turn: item.agent_turn_id, call: item.tool_call_id, state: item.state, key: 'approval-' + item.agent_turn_id + '/' + item.tool_call_id } },
        h('h3', {}, h('span', { class: 'mono' }, item.tool_name || ''), ' · call ',
          h('a', { href: callLink(route, p, item.tool_call_id, item.agent_turn_id), testid: 'approval-call-link' }, item.tool_call_id),
          ' · ', h('span', { class: 'badge status-' + (pending ? 'awaiting_approval' : item.state) }, item.state)),
        fields(Object.fromEntries(['agent_id', 'agent_turn_id', 'requested_by', 'approvers', 'requested_at', 'expires_at', 'approver', 'reason', 'decided_at', 'held_seq', 'decision_seq']
          .filter((k) => item[k] !== undefined && item[k] !== '').map((k) => [k, item[k]])), {
          approvers: (v) => h('span', { class: 'mono', testid: 'approval-approvers' }, Array.isArray(v) && v.length ? v.join(', ') : 'any approver of the project'),
        }));
      if (pending && mayDecide(item)) {
        const slot = h('div', {});
        const open = h('button', { type: 'button', testid: 'approval-review', onclick: () => { open.hidden = true; slot.replaceChildren(decisionPanel(route, p, item)); } }, 'review the arguments to decide…');
        sec.append(open, slot);
      } else {
        sec.append(h('details', {}, h('summary', {}, 'arguments (' + String(item.arguments_digest ?? '') + ')'), jsonBlock(member(item, 'arguments'), 'approval-arguments')));
      }
      return sec;
    };
    if (c.role === 'approver') {
      view.append(h('h2', {}, mine.length + ' for you (' + (c.approver || 'approver') + ')'), h('div', { testid: 'approvals-mine' }, mine.map(card)));
      if (rest.length) view.append(h('h2', {}, rest.length + ' for other approvers'), h('div', { testid: 'approvals-others' }, rest.map(card)));
    } else {
      view.append(h('div', { testid: 'approvals-all' }, items.map(card)));
    }
    if (items.length === 0) view.append(h('p', { testid: 'approvals-empty' }, 'None ' + state + '.'));
    if (res.next_cursor) {
      const next = new URLSearchParams(route.params);
      next.set('cursor', res.next_cursor);
      view.append(h('p', { class: 'pager' }, h('a', { href: link(route.seg, next), testid: 'approvals-next' }, 'more')));
    }
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

  const VIEWS = { projects: viewProjects, calls: viewCalls, timeline: viewTimeline, story: viewStory, chain: viewChain, overview: viewOverview, approvals: viewApprovals };

  // ---- rendering -----------------------------------------------------------

  let rendering = 0;

  function setNav(id, route, segs, label) {
    const a = byTestID(id);
    a.setAttribute('href', link(segs, asOf(route.params)));
    a.textContent = shown(label);
  }

  async function render() {
    const mine = ++rendering;
    const route = parseRoute();
    showAsOf(route);
    showAuthState();
    byTestID('nav-projects').setAttribute('href', link([], asOf(route.params)));
    byTestID('nav-chain').setAttribute('href', link(['chain'], asOf(route.params)));
    for (const id of ['nav-calls', 'nav-overview', 'nav-approvals']) byTestID(id).hidden = !route.project;
    if (route.project) {
      setNav('nav-calls', route, ['p', route.project, 'calls'], 'calls of ' + route.project);
      setNav('nav-overview', route, ['p', route.project, 'overview'], 'overview');
      setNav('nav-approvals', route, ['p', route.project, 'approvals'], 'approvals');
      byTestID('nav-approvals').hidden = true;
      probeApprovals(route.project).then((ok) => { if (mine === rendering) byTestID('nav-approvals').hidden = !ok; });
    }
    const view = h('section', { testid: 'view', data: { view: route.view } });
    byTestID('loading').hidden = false;
    main.setAttribute('aria-busy', 'true');
    try {
      const fn = VIEWS[route.view];
      if (fn) await fn(route, view);
      else view.append(h('p', { class: 'error', testid: 'notfound' }, 'No such page: ' + location.hash), h('p', {}, h('a', { href: '#/' }, 'projects')));
      view.dataset.ready = 'true';
      // Answered with the credential kept (it may have been given in
      // another view): no reason to keep asking for one.
      if (token()) byTestID('signin').hidden = true;
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
    live(mine, route, view);
  }

  // ---- live ------------------------------------------------------------------

  // live polls the current view's answer again while it is of the latest
  // state (no as-of), every view.dataset.live milliseconds, while the tab
  // is visible; when the view's signature (its entries, or its counts)
  // changed, the new one replaces it, with the same folds open. A view the
  // user is typing in, or deciding an approval in, is left alone until
  // that is done. docs/decisions.md says why polling.
  function live(mine, route, view) {
    const state = byTestID('live-state');
    const every = Number(view.dataset.live || 0);
    if (!every || route.params.get('as_of_seq') || route.params.get('as_of') || view.dataset.view === 'signin') {
      state.textContent = every ? 'not live: as of an earlier state' : '';
      state.dataset.live = 'false';
      return;
    }
    state.dataset.live = 'true';
    state.textContent = shown('live: checked every ' + every / 1000 + ' s');
    setTimeout(async function tick() {
      if (mine !== rendering) return;
      const again = () => { if (mine === rendering) setTimeout(tick, every); };
      const busy = main.querySelector('[data-testid=decision], [data-testid=decision-done]') || (document.activeElement && main.contains(document.activeElement) && /^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement.tagName));
      if (document.hidden || busy) { again(); return; }
      const fresh = h('section', { testid: 'view', data: { view: route.view } });
      try {
        await VIEWS[route.view](route, fresh);
      } catch (e) {
        if (mine !== rendering) return;
        if (e.status === 401) { render(); return; }
        state.textContent = shown('live: the last check failed (' + e.message + '); trying again');
        again();
        return;
      }
      if (mine !== rendering) return;
      const now = new Date().toISOString().slice(11, 19);
      const current = main.querySelector('[data-testid=view]');
      if (current && fresh.dataset.sig && fresh.dataset.sig !== current.dataset.sig) {
        const open = new Set([...current.querySelectorAll('details[open][data-key]')].map((d) => d.dataset.key));
        fresh.dataset.ready = 'true';
        fresh.dataset.updates = String(Number(current.dataset.updates || 0) + 1);
        main.replaceChildren(fresh);
        for (const d of fresh.querySelectorAll('details[data-key]')) if (open.has(d.dataset.key)) d.open = true;
        state.textContent = shown('live: updated at ' + now + ' UTC; checked every ' + every / 1000 + ' s');
      } else {
        state.textContent = shown('live: checked at ' + now + ' UTC, no change; checked every ' + every / 1000 + ' s');
      }
      again();
    }, every);
  }

  window.addEventListener('hashchange', render);
  render();
})();
