// Configurator: on every change, post the form to /configure/quote and show
// the price and what will not work. Without JavaScript, "Update price" does
// the same by reloading the page.
(function () {
  var form = document.getElementById('configurator');
  if (!form) return;
  var url = form.getAttribute('data-quote-url');
  var seq = 0, timer = null;
  function set(id, text) { var el = document.getElementById(id); if (el) el.textContent = text || '—'; }
  function problems(list) {
    var box = document.getElementById('problems');
    box.textContent = '';
    if (!list || !list.length) return;
    var ul = document.createElement('ul');
    ul.className = 'problems';
    list.forEach(function (p) { var li = document.createElement('li'); li.textContent = p; ul.appendChild(li); });
    box.appendChild(ul);
  }
  function update() {
    var mine = ++seq;
    var body = new URLSearchParams(new FormData(form));
    body.delete('public_key'); body.delete('admin_pass');
    fetch(url, { method: 'POST', body: body, credentials: 'same-origin', headers: { 'Accept': 'application/json' } })
      .then(function (r) { return r.json(); })
      .then(function (a) {
        if (mine !== seq) return; // a newer answer is on its way
        set('p-each', a.hourly_each); set('p-hourly', a.hourly); set('p-monthly', a.monthly); set('p-total', a.total);
        problems(a.problems);
        form.setAttribute('data-quoted', String(mine));
      })
      .catch(function () {});
  }
  function soon() { clearTimeout(timer); timer = setTimeout(update, 150); }
  form.addEventListener('input', soon);
  form.addEventListener('change', soon);
})();
