// The admin API, with the token kept in sessionStorage (this tab only, gone when it closes).

const KEY = "stillhere.admin-token";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

/** GET a path of the admin API with the token; JSON (or text), or an ApiError. */
export async function get(path, { as = "json", given = token.get() } = {}) {
  let response;
  try {
    response = await fetch(path, {
      headers: { Authorization: `Bearer ${given || ""}` },
      cache: "no-store",
    });
  } catch (error) {
    throw new ApiError(0, "unreachable", "The server does not answer (is it running?)");
  }
  if (!response.ok) {
    let code = `http_${response.status}`;
    let message = response.statusText;
    try {
      const body = await response.json();
      code = body.code || code;
      message = body.message || message;
    } catch (ignored) {
      // not JSON: keep the status
    }
    throw new ApiError(response.status, code, message);
  }
  return as === "text" ? response.text() : response.json();
}
