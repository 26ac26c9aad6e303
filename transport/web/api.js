// The person's plain-HTTP APIs (memories, rules, threads), with the protocol's credentials.

import { authHeaders } from "./store.js";

export class ApiError extends Error {
  constructor(status, body) {
    super(body?.message || `HTTP ${status}`);
    this.status = status;
    this.code = body?.code;
  }
}

export async function api(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: { ...authHeaders(), ...(body ? { "Content-Type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
    cache: "no-store",
  });
  const answer = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, answer);
  return answer;
}
