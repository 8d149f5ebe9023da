// souk dashboard: live updates and the login link. No framework, no build step.
// The server renders every page; on a change from the catalog's stream this fetches the
// same page as a fragment and swaps it in, so the script knows nothing of the markup.
"use strict";

(function () {
  const main = document.getElementById("main");
  const live = document.getElementById("live");

  // The login link `souk dev` prints carries the token in the fragment (never sent to a
  // server, kept out of logs): fill the form, drop the fragment, log in.
  const form = document.querySelector("form.login");
  if (form && location.hash.startsWith("#token=")) {
    const token = decodeURIComponent(location.hash.slice("#token=".length));
    history.replaceState(null, "", location.pathname);
    form.querySelector("input[name=token]").value = token;
    form.submit();
    return;
  }
  if (!main || !main.dataset.live || !window.EventSource) return;

  let busy = false;
  let again = false;

  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      const url = new URL(location.href);
      url.searchParams.set("fragment", "1");
      const resp = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (resp.redirected && resp.url.includes("/ui/login")) { location.href = resp.url; return; }
      if (resp.ok) {
        const html = await resp.text();
        const scroll = window.scrollY;
        main.innerHTML = html;
        window.scrollTo(0, scroll);
        main.dataset.updated = String(Date.now());
      }
    } finally {
      busy = false;
      if (again) { again = false; refresh(); }
    }
  }

  function connect() {
    const source = new EventSource(main.dataset.live);
    source.addEventListener("open", () => { live.textContent = "live"; live.classList.add("on"); });
    source.addEventListener("change", () => { refresh(); });
    source.addEventListener("error", () => {
      live.textContent = "reconnecting";
      live.classList.remove("on");
    });
  }
  connect();
})();
