// Servers: live status without a reload, and the Windows password
// decrypted in the browser. The pages work without it.
"use strict";
(function () {
  var every = 2000;
  function get(url, ok) {
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (d) { if (d) { ok(d); } })
      .catch(function () {})
      .finally(function () { setTimeout(function () { tick(url, ok); }, every); });
  }
  function tick(url, ok) {
    if (document.hidden) { setTimeout(function () { tick(url, ok); }, every); return; }
    get(typeof url === "function" ? url() : url, ok);
  }
  function later(url, ok) { setTimeout(function () { tick(url, ok); }, every); }

  // The list: ask for what changed since the last answer, update the cells.
  var table = document.querySelector("table[data-status-url]");
  if (table) {
    var since = table.getAttribute("data-since");
    later(function () { return table.getAttribute("data-status-url") + "?since=" + encodeURIComponent(since); }, function (d) {
      since = d.since;
      Object.keys(d.servers).forEach(function (id) {
        var row = table.querySelector('tr[data-id="' + CSS.escape(id) + '"]'), s = d.servers[id];
        if (!row) { return; }
        var cell = row.querySelector(".status");
        cell.textContent = s.text;
        cell.className = "status " + s.status;
        cell.setAttribute("data-status", s.status);
        cell.setAttribute("data-task", s.task);
      });
    });
  }

  // The server's page: reload when its state changes, so that its actions
  // and login details are the new state's.
  var st = document.querySelector("[data-server]"), leaving = false;
  if (st) {
    var id = st.getAttribute("data-server");
    // A form on its way must not be cut short by a reload (one answered
    // in another tab, the console's, leaves this page as it is).
    document.addEventListener("submit", function (e) { if (!e.defaultPrevented && e.target.target !== "_blank") { leaving = true; } });
    later("/servers/status.json?id=" + encodeURIComponent(id), function (d) {
      var s = d.servers[id];
      if (s && !leaving && (s.status !== st.getAttribute("data-status") || s.task !== st.getAttribute("data-task"))) {
        if (s.status === "DELETED") { location.href = "/servers"; } else { location.reload(); }
      }
    });
  }

  // Windows password: RSA PKCS #1 v1.5 with the pasted private key, as
  // "nova get-password" does. The key never leaves this page.
  var box = document.querySelector(".pw-reveal");
  if (box) {
    var btn = document.getElementById("pw-reveal"), out = document.getElementById("pw-out");
    btn.addEventListener("click", function () {
      var key;
      try { key = parseKey(document.getElementById("pw-key").value); } catch (e) { key = null; }
      if (!key) { out.textContent = box.getAttribute("data-bad-key"); return; }
      var pw = decrypt(key, b64(box.getAttribute("data-password")));
      out.textContent = pw === null ? box.getAttribute("data-bad-pw") : pw;
    });
  }

  function b64(s) {
    var bin = atob(s.replace(/\s+/g, "")), b = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { b[i] = bin.charCodeAt(i); }
    return b;
  }
  function big(bytes) {
    var h = "0";
    for (var i = 0; i < bytes.length; i++) { h += (bytes[i] < 16 ? "0" : "") + bytes[i].toString(16); }
    return BigInt("0x" + h);
  }
  // parseKey reads n and d from a PKCS #1 or PKCS #8 PEM, or an
  // unencrypted OpenSSH private key.
  function parseKey(text) {
    var m = /-----BEGIN ([A-Z ]+)-----([\s\S]+?)-----END \1-----/.exec(text);
    if (!m) { return null; }
    var der = b64(m[2]);
    if (m[1] === "OPENSSH PRIVATE KEY") { return openssh(der); }
    var top = seq(der, 0);
    if (m[1] === "PRIVATE KEY") {
      // PrivateKeyInfo: version, algorithm, OCTET STRING of RSAPrivateKey.
      var v = tlv(der, top.start), alg = tlv(der, v.end), oct = tlv(der, alg.end);
      if (oct.tag !== 4) { return null; }
      der = der.subarray(oct.start, oct.end);
      top = seq(der, 0);
    } else if (m[1] !== "RSA PRIVATE KEY") { return null; }
    // RSAPrivateKey: version, n, e, d, …
    var ver = tlv(der, top.start), n = tlv(der, ver.end), e = tlv(der, n.end), d = tlv(der, e.end);
    return { n: big(der.subarray(n.start, n.end)), d: big(der.subarray(d.start, d.end)) };
  }
  function seq(b, at) { var t = tlv(b, at); if (t.tag !== 0x30) { throw new Error("not a sequence"); } return t; }
  // tlv reads one DER element at at: its tag and where its content is.
  function tlv(b, at) {
    var tag = b[at], len = b[at + 1], p = at + 2;
    if (len & 0x80) {
      var k = len & 0x7f; len = 0;
      for (var i = 0; i < k; i++) { len = len * 256 + b[p++]; }
    }
    if (p + len > b.length) { throw new Error("short"); }
    return { tag: tag, start: p, end: p + len };
  }
  function openssh(b) {
    var p = 0;
    function u32() { var v = ((b[p] << 24) >>> 0) + (b[p + 1] << 16) + (b[p + 2] << 8) + b[p + 3]; p += 4; return v; }
    function str() { var n = u32(), s = b.subarray(p, p + n); p += n; if (p > b.length) { throw new Error("short"); } return s; }
    function text(s) { return String.fromCharCode.apply(null, s); }
    if (text(b.subarray(0, 15)) !== "openssh-key-v1\0") { return null; }
    p = 15;
    if (text(str()) !== "none") { return null; } // a passphrase: not here
    str(); str(); // kdf name and options
    if (u32() !== 1) { return null; }
    str(); // the public key
    b = str(); p = 8; // the private section, after its two check words
    if (text(str()) !== "ssh-rsa") { return null; }
    var n = big(str()); str(); // e
    return { n: n, d: big(str()) };
  }
  function modpow(base, exp, mod) {
    var r = 1n;
    base %= mod;
    while (exp > 0n) {
      if (exp & 1n) { r = r * base % mod; }
      base = base * base % mod;
      exp >>= 1n;
    }
    return r;
  }
  // decrypt is RSAES-PKCS1-v1_5: m = c^d mod n, then 00 02 PS 00 M.
  function decrypt(key, c) {
    var k = (key.n.toString(16).length + 1) >> 1;
    if (c.length !== k) { return null; }
    var h = modpow(big(c), key.d, key.n).toString(16);
    while (h.length < 2 * k) { h = "0" + h; }
    var em = new Uint8Array(k);
    for (var i = 0; i < k; i++) { em[i] = parseInt(h.substr(2 * i, 2), 16); }
    if (em[0] !== 0 || em[1] !== 2) { return null; }
    var sep = em.indexOf(0, 2);
    if (sep < 10) { return null; }
    try { return new TextDecoder("utf-8", { fatal: true }).decode(em.subarray(sep + 1)); } catch (e) { return null; }
  }
})();
