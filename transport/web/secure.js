// Browsers keep some features for pages in a secure context: served over HTTPS, or from
// this computer itself (localhost). Opened over plain HTTP from anywhere else, the page
// goes without them; it says so, and which, rather than have a button do nothing.

const WITHHELD =
  "This page came over plain HTTP from another computer: what you type travels " +
  "unencrypted, and your browser withholds reminder notifications, which it allows only " +
  "on secure pages (HTTPS, or this computer itself). Open it over https:// to have them.";

/** Show `notice` and disable the notifications `button` outside a secure context. */
export function sayWhatIsWithheld(notice, button) {
  if (window.isSecureContext) return;
  notice.textContent = WITHHELD;
  notice.hidden = false;
  button.disabled = true;
}
