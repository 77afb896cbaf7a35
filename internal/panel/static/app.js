// Nimbus panel: small progressive enhancements. Every page works without it.
"use strict";
document.addEventListener("click", function (e) {
  // Copy buttons: <button data-copy="#id">.
  var b = e.target.closest("[data-copy]");
  if (b) {
    var el = document.querySelector(b.getAttribute("data-copy"));
    if (el && navigator.clipboard) { navigator.clipboard.writeText(el.textContent.trim()); b.textContent = "✓"; }
  }
});
document.addEventListener("submit", function (e) {
  // Forms with data-confirm ask first.
  var f = e.target, msg = f.getAttribute("data-confirm");
  if (msg && !window.confirm(msg)) { e.preventDefault(); }
});
