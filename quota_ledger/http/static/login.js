// The sign-in page's only script, inlined into it (its hash is in the page's CSP). A token in
// the address is never accepted; take it out of the address bar and the history.
"use strict";
(function () {
  const address = new URL(window.location.href);
  if (address.searchParams.has("token")) {
    address.searchParams.delete("token");
    window.history.replaceState(null, "", address.toString());
  }
})();
